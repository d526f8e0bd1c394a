"""`make bench` section "environment": the latency of a tool call through the environment service
(`scalerl.v1.Environment`, mutual TLS, a replica in its own process as in a run) beside the physical
limit, the same call executed directly in this process (`Toolbox.execute`: what a generator without the
service pays), at rising load.

Per tool (python `print(1)`: one sandboxed process each; calculator: no process, so the RPC's own cost)
and per load (how many calls are in flight at once: 1, the replica's slots, and twice its slots + queue,
where the replica refuses calls and the client retries), --n calls: latency p50 / p99 in milliseconds
(from the call to its observation, retries included), calls per second, and the replica's refusals.
`ratio_p50_service_over_direct` = service p50 / direct p50 at load 1: what the RPC adds.

    .venv/bin/python bench/environment_bench.py --out bench/results.json [--n 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from results_file import merge_sections
from scalerl.environment.tools import TOOL_LIMITS, Toolbox, ToolCall

CALLS = {"python": ToolCall("python", "print(1)"), "calculator": ToolCall("calculator", "(12+34)*56/7")}
SLOTS, QUEUE = 4, 16


def serve(tls_dir: str, port_file: str) -> None:
    """The replica: an environment service on a free port (written to `port_file`) until killed."""
    from scalerl.environment.service import EnvironmentServicer
    from scalerl.rpc.security import RpcSecurity
    from scalerl.rpc.server import serve_grpc

    servicer = EnvironmentServicer(Toolbox(("python", "calculator"), TOOL_LIMITS), replica_id="bench",
                                   slots=SLOTS, queue_limit=QUEUE)
    server, port = serve_grpc(0, servicer, security=RpcSecurity(tls_dir), host="127.0.0.1",
                              max_workers=8 + SLOTS + QUEUE)
    Path(port_file).write_text(json.dumps({"port": port}))
    server.wait()


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"p50_ms": round(1000 * q[49], 3), "p99_ms": round(1000 * q[98], 3), "max_ms": round(1000 * ordered[-1], 2)}


def timed(call: Any, n: int, load: int) -> dict[str, Any]:
    """`n` calls of `call()`, `load` at a time: latency percentiles and calls per second."""
    def one(_: int) -> float:
        t0 = time.perf_counter()
        call()
        return time.perf_counter() - t0

    with ThreadPoolExecutor(load) as pool:
        list(pool.map(one, range(load)))  # warm-up: connections, page cache
        t0 = time.perf_counter()
        latencies = list(pool.map(one, range(n)))
    wall = time.perf_counter() - t0
    return {"calls": n, "in_flight": load, **percentiles(latencies), "calls_per_s": round(n / wall, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results.json")
    ap.add_argument("--n", type=int, default=200, help="calls per tool and load")
    ap.add_argument("--serve", nargs=2, metavar=("TLS_DIR", "PORT_FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(*args.serve)
        return 0

    from scalerl.environment.remote import RemoteToolbox
    from scalerl.rpc.certs import new_ca, write_tls_dir
    from scalerl.rpc.security import RpcSecurity

    work = Path(tempfile.mkdtemp(prefix="env-bench-"))
    ca = new_ca("bench")
    server_dir = write_tls_dir(work / "verifier", ca.issue("verifier"), ca)
    client_dir = write_tls_dir(work / "generator", ca.issue("generator"), ca)
    port_file = work / "port.json"
    replica = subprocess.Popen([sys.executable, __file__, "--serve", str(server_dir), str(port_file)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if time.monotonic() > deadline or replica.poll() is not None:
                raise RuntimeError("the environment replica did not start")
            time.sleep(0.1)
        port = json.loads(port_file.read_text())["port"]
        local = Toolbox(("python", "calculator"), TOOL_LIMITS, workers=SLOTS)
        section: dict[str, Any] = {
            "machine": {"cores": os.cpu_count(), "loadavg_1min_at_start": os.getloadavg()[0]},
            "replica": {"slots": SLOTS, "queue_limit": QUEUE, "security": "mutual TLS", "process": "its own"},
            "units": {"p50_ms/p99_ms/max_ms": "latency of one call, from the call to its observation (ms), "
                                              "retries after a refusal included",
                      "calls_per_s": "calls answered per wall second at that load",
                      "ratio_p50_service_over_direct": "service p50 / direct p50, one call at a time"},
        }
        with RemoteToolbox(("python", "calculator"), f"127.0.0.1:{port}", security=RpcSecurity(str(client_dir)),
                           limits=TOOL_LIMITS, attempts=8) as remote:
            for tool, call in CALLS.items():
                row: dict[str, Any] = {}
                print(f"bench: environment, {tool}: direct...", file=sys.stderr)
                row["direct"] = timed(lambda c=call: local.execute(c), args.n, 1)
                for load in (1, SLOTS, 2 * (SLOTS + QUEUE)):
                    print(f"bench: environment, {tool}: service, {load} in flight...", file=sys.stderr)
                    before = remote.retries
                    row[f"service_in_flight_{load}"] = {**timed(lambda c=call: remote.execute(c), args.n, load),
                                                        "retries_after_refusal": remote.retries - before}
                row["ratio_p50_service_over_direct"] = round(
                    row["service_in_flight_1"]["p50_ms"] / row["direct"]["p50_ms"], 2)
                section[tool] = row
                s1, sl = row["service_in_flight_1"], row[f"service_in_flight_{SLOTS}"]
                print(f"environment {tool}: direct p50 {row['direct']['p50_ms']:.1f} ms; service p50/p99 "
                      f"{s1['p50_ms']:.1f}/{s1['p99_ms']:.1f} ms one at a time "
                      f"({row['ratio_p50_service_over_direct']:.2f}x), {sl['p50_ms']:.1f}/{sl['p99_ms']:.1f} ms "
                      f"with {SLOTS} in flight ({sl['calls_per_s']:.0f} calls/s)")
    finally:
        replica.kill()
        replica.wait()
    print(f"wrote the environment section of {merge_sections(args.out, {'environment': section})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
