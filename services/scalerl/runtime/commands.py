"""CLI glue for the process modes: `scalerl serve ROLE`, `scalerl run --distributed`, and `scalerl fetch-run`
(a finished run's files from the store, where the learner left them: scalerl.store.run_files)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from scalerl.runtime import ROLES

if TYPE_CHECKING:
    from scalerl.config import JobSpec
    from scalerl.rpc.security import RpcSecurity
    from scalerl.store.base import Store

EXIT_BAD_INPUT = 2
EXIT_OUTAGE = 1


def _fail(command: str, problems: str | list[str]) -> int:
    """Print every problem as `scalerl COMMAND: error: PROBLEM`, one line each; the exit status of bad input."""
    for line in problems.splitlines() if isinstance(problems, str) else problems:
        print(f"scalerl {command}: error: {line}", file=sys.stderr)
    return EXIT_BAD_INPUT


def check_urls(args: argparse.Namespace, spec_bus: str, spec_store: str | None,
               default_store: str = "") -> tuple[str, str, str | None]:
    """(bus, store, problem): the addresses a role process will use (the flag, else the spec's field) and
    a one-line reason to refuse them, checked before any work."""
    from scalerl.endpoints import bus_problem, store_problem

    bus, store = args.bus or spec_bus, args.store or spec_store or default_store
    if not args.bus and bus == "memory://":  # the spec's default: a bus inside one process
        return bus, store, ("--bus: missing; with every role in its own process the roles meet on Kafka: give "
                            "--bus kafka://HOST:PORT, or set runtime.bus: kafka://HOST:PORT in the spec (its "
                            "runtime.bus 'memory://' lives in one process)")
    problem = (bus_problem("--bus" if args.bus else "runtime.bus", bus, allow_memory=False)
               or store_problem("--store" if args.store else "runtime.store", store))
    if problem is None and bus.startswith("kafka://"):
        from scalerl.bus.security import kafka_security_problem

        problem = kafka_security_problem()
    if problem is None and store.startswith("s3://"):
        from scalerl.store.s3_settings import s3_settings_problem

        problem = s3_settings_problem()
    return bus, store, problem


def fault_plan_problem(path: str) -> str | None:
    """Why `--faults PATH` cannot be used (a readable plan of `scalerl.faults.plan`), or None."""
    from scalerl.faults.plan import FaultPlan

    try:
        FaultPlan.load(Path(path))
    except OSError as exc:
        return f"--faults {path}: cannot read the fault plan ({exc.strerror or exc})"
    except (ValueError, KeyError, TypeError) as exc:
        return f"--faults {path}: not a fault plan ({exc}); see scalerl.faults.plan"
    return None


def _rpc_security(args: argparse.Namespace, problems: list[str]) -> RpcSecurity | None:
    """How the gRPC port is protected (mutual TLS, or plain text only when asked for); None without a
    port. A malformed or missing setting is added to `problems`."""
    if args.grpc_port < 0:
        return None
    from scalerl.rpc.security import RpcSecurity, RpcSecurityError

    try:
        return RpcSecurity.from_env()
    except RpcSecurityError as exc:
        problems += str(exc).splitlines()
        return None


def cmd_serve(args: argparse.Namespace) -> int:
    from scalerl.config import SpecError, load_spec
    from scalerl.endpoints import output_dir_problem
    from scalerl.generator.factory import engine_problem

    problems = []
    if args.out and (problem := output_dir_problem("--out", args.out)):
        problems.append(problem)
    if not args.max_outage > 0:
        problems.append(f"--max-outage {args.max_outage:g}: expected seconds > 0")
    if args.faults and (problem := fault_plan_problem(args.faults)):
        problems.append(problem)
    try:
        spec = load_spec(args.job, args.set)
    except SpecError as exc:
        return _fail("serve", [*str(exc).splitlines(), *problems])
    bus, store, problem = check_urls(args, spec.runtime.bus, spec.runtime.store)
    for why in (engine_problem(spec) if args.role == "generator" else None, problem):
        problems += [why] if why else []
    if args.when_finished == "wait" and args.role != "learner":
        problems.append(f"--when-finished wait: only the learner finishes; a {args.role} runs until stopped")
    rpc_security = _rpc_security(args, problems)
    if args.role == "learner" and spec.off_policy.mode != "pipeline":
        problems.append(f"off_policy.mode: the distributed learner runs 'pipeline' (PipelineRL-k), got "
                        f"{spec.off_policy.mode!r}")
    if problems:
        return _fail("serve", problems)
    from scalerl.runtime.roles import PROCESS_RETRY, OutageTooLong, ServiceContext
    from scalerl.runtime.serve import install_stop_signals, serve

    PROCESS_RETRY.max_outage_s = args.max_outage
    if args.faults:
        from scalerl.faults.points import activate

        activate(Path(args.faults), args.role, args.id or f"{args.role}-0")

    out = Path(args.out) if args.out else Path("runs") / spec.name
    ctx = ServiceContext(spec, bus, store, args.id or f"{args.role}-0", out, rpc_security=rpc_security)
    import threading

    stop = threading.Event()
    install_stop_signals(stop)
    logging.getLogger("scalerl").setLevel(logging.INFO)
    logging.getLogger("kafka").setLevel(logging.ERROR)  # reconnect chatter; errors still show
    from scalerl.console import quiet_third_party_bars

    quiet_third_party_bars()
    # the standard OpenTelemetry variables, as the operator sets them in the pods; without an endpoint the
    # spans are not exported but the records still carry their trace context (scalerl.telemetry.tracing)
    try:
        from scalerl.telemetry.tracing import setup_tracing
    except ImportError:  # no OpenTelemetry SDK (a plain install): records pass their headers on unchanged
        pass
    else:
        setup_tracing(os.environ.get("OTEL_SERVICE_NAME") or f"scalerl-{args.role}",
                      otlp_endpoint=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None)
    try:
        result = serve(args.role, ctx, grpc_port=None if args.grpc_port < 0 else args.grpc_port,
                       http_port=None if args.http_port < 0 else args.http_port, stop=stop,
                       on_ready=lambda ports: print(json.dumps({"role": args.role, "id": ctx.role_id, **ports}),
                                                    flush=True),
                       wait_when_finished=args.when_finished == "wait")
    except OutageTooLong as exc:  # exit 1: the supervisor (Kubernetes, the local launcher) restarts the role
        print(f"scalerl serve: error: {exc}", file=sys.stderr)
        return EXIT_OUTAGE
    if isinstance(result, dict):
        print(json.dumps({"summary": str(out / "summary.json"), "final_pass_rate": result.get("final_pass_rate")}))
    return 0


def cmd_fetch_run(args: argparse.Namespace) -> int:
    """Copy a finished run's files (summary.json, report.html, metrics.jsonl, train.jsonl) from the store."""
    from scalerl.endpoints import output_dir_problem, store_problem
    from scalerl.store.run_files import PREFIX, download_run_files, job_store_url

    url = job_store_url(args.uri)
    problems = [p for p in (store_problem("URI", args.uri), output_dir_problem("--out", args.out)) if p]
    if not problems and url.startswith("s3://"):
        from scalerl.store.s3_settings import s3_settings_problem

        problems += [p for p in (s3_settings_problem(),) if p]
    if problems:
        return _fail("fetch-run", problems)
    from scalerl.store.base import StoreError

    try:
        written = download_run_files(_open_existing_store(url), Path(args.out))
    except (StoreError, OSError) as exc:
        print(f"scalerl fetch-run: error: {url}/{PREFIX}: {exc}", file=sys.stderr)
        return EXIT_OUTAGE
    if not written:
        print(f"scalerl fetch-run: error: no run files under {url}/{PREFIX}/ (the run has not finished yet, or "
              "its learner predates the upload: status.report of the RLJob is set once they are there)",
              file=sys.stderr)
        return EXIT_OUTAGE
    for path in written:
        print(f"{path}  ({path.stat().st_size} bytes)")
    return 0


def _open_existing_store(url: str) -> Store:
    """The store at `url`, creating nothing (an S3 bucket that does not exist is an error, not made)."""
    if url.startswith("s3://"):
        from scalerl.store.s3 import S3Store  # type: ignore[import-not-found,unused-ignore]
        from scalerl.store.s3_settings import s3_settings

        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        return S3Store.from_settings(s3_settings(), bucket, prefix, create_bucket=False)
    from scalerl.store import open_store

    return open_store(url)


def _distributed(spec: JobSpec, out: Path, args: argparse.Namespace) -> tuple[str, str, list[str]]:
    """(bus, store, every reason `scalerl run --distributed` cannot start), checked before any work."""
    bus, store, problem = check_urls(args, spec.runtime.bus, spec.runtime.store, f"file://{(out / 'store').resolve()}")
    problems = [f"{problem} (run --distributed)"] if problem else []
    if spec.off_policy.mode != "pipeline":
        problems.append(f"off_policy.mode: --distributed runs 'pipeline' (PipelineRL-k), got {spec.off_policy.mode!r}")
    if args.learner_ranks < 1:
        problems.append(f"--learner-ranks {args.learner_ranks}: expected 1 or more processes")
    from scalerl.rpc.sidetls import token_file_problems

    problems += token_file_problems(os.environ)
    return bus, store, problems


def distributed_problems(spec: JobSpec, out: Path, args: argparse.Namespace) -> list[str]:
    """Every reason `scalerl run --distributed` cannot start (bus, store, off-policy mode, learner ranks)."""
    return _distributed(spec, out, args)[2]


def run_distributed(spec: JobSpec, out: Path, args: argparse.Namespace,
                    show_summary: Callable[[Path, dict[str, object]], None]) -> int:
    """Start every role as its own process, wait for the learner, stop the rest; `show_summary(out, summary)`
    prints the finished run (the CLI's, which imports this module: it is passed in, not imported)."""
    from scalerl.runtime.launcher import LocalCluster, reset_job

    logging.getLogger("kafka").setLevel(logging.ERROR)  # the launcher's own client: its chatter, not the user's
    bus, store, problems = _distributed(spec, out, args)
    if problems:
        return _fail("run", problems)
    if args.overwrite:
        reset_job(spec, bus, store)
    cluster = LocalCluster(spec, out, bus, store, generators=args.generators, verifiers=args.verifiers,
                           learner_ranks=args.learner_ranks, max_restarts=args.max_restarts)
    cluster.start_all()
    print(f"scalerl: {len(cluster.procs)} role processes started; logs in {out / 'logs'}", file=sys.stderr)
    try:
        rc = cluster.wait_learner(timeout_s=args.timeout)
    finally:
        cluster.stop_all()
    if rc != 0:
        print(cluster.tail("learner-0"), file=sys.stderr)
        return rc
    show_summary(out, cluster.summary())
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sp = sub.add_parser("serve", help="run one role as a service (gRPC + /healthz /readyz /metrics)")
    sp.add_argument("role", choices=ROLES)
    sp.add_argument("--job", required=True, help="job spec YAML")
    sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    sp.add_argument("--bus", help="kafka://HOST:PORT (default: runtime.bus of the spec)")
    sp.add_argument("--store", help="s3://BUCKET/PREFIX or file:///PATH (default: runtime.store of the spec)")
    sp.add_argument("--id", help="replica id, e.g. generator-1 (default ROLE-0)")
    sp.add_argument("--max-outage", type=float, default=120.0, metavar="SECONDS",
                    help="wait out an unreachable bus/store this long (plus the call in flight, at most the "
                    "30 s request timeout), then exit 1 for the supervisor to restart the role (default 120)")
    sp.add_argument("--out", help="learner: run folder for metrics/report (default runs/<name>)")
    sp.add_argument("--when-finished", choices=("exit", "wait"), default="exit",
                    help="learner: after the last step exit 0 (exit, the default), or stay up, ready and "
                         "reporting finished, until SIGTERM (wait: under a supervisor that restarts exited "
                         "containers, as the operator's StatefulSet does)")
    sp.add_argument("--faults", metavar="PLAN.json",
                    help="for fault-injection tests only: fire the faults of this plan (scalerl.faults.plan) in "
                         "this process, each once per run")
    sp.add_argument("--grpc-port", type=int, default=50051, help="gRPC port (0: a free one; -1: none)")
    sp.add_argument("--http-port", type=int, default=9090,
                    help="side port for /healthz /readyz /metrics (0: a free one; -1: none)")
    sp.set_defaults(func=cmd_serve)
    fr = sub.add_parser("fetch-run", help="copy a finished run's files (summary.json, report.html, metrics.jsonl, "
                        "train.jsonl) from its store",
                        description="The learner uploads a finished run's files to <store>/run/ (an RLJob's "
                        "status.report.uri). S3 endpoint and keys come from S3_ENDPOINT, S3_ACCESS_KEY and "
                        "S3_SECRET_KEY, as for the roles. Exit 1 when no run files are there yet.")
    fr.add_argument("uri", help="status.report.uri of the RLJob (s3://BUCKET/PREFIX/run), or the job's store "
                    "(spec.store.uri); file:///PATH for a local store")
    fr.add_argument("--out", required=True, help="folder to write the files into (created if missing)")
    fr.set_defaults(func=cmd_fetch_run)


def add_distributed_args(run: argparse.ArgumentParser) -> None:
    g = run.add_argument_group("distributed (every role its own local process)")
    g.add_argument("--distributed", action="store_true", help="run the roles as separate processes over Kafka")
    g.add_argument("--bus", help="kafka://HOST:PORT (default: runtime.bus)")
    g.add_argument("--store", help="s3://BUCKET/PREFIX or file:///PATH (default: runtime.store or <out>/store)")
    g.add_argument("--generators", type=int, default=2, help="generator processes (default 2)")
    g.add_argument("--verifiers", type=int, default=2, help="verifier processes (default 2)")
    g.add_argument("--learner-ranks", type=int, default=1,
                   help="learner processes under torchrun, FSDP-sharded; rank 0 serves (default 1)")
    g.add_argument("--max-restarts", type=int, default=1, help="restarts allowed per crashed role (default 1)")
    g.add_argument("--timeout", type=float, default=6 * 3600, help="give up after this many seconds")
