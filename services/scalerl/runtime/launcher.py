"""`scalerl run --distributed`: every role as its own local process, over Kafka and a shared store.

For a user without Kubernetes: one curriculum, N generators, M verifiers and one learner, each started
as `scalerl serve ROLE` with its log in `<out>/logs/<id>.log`. The run ends when the learner finishes
its steps; the other roles are then stopped with SIGTERM (they hand back in-flight work and exit).
A role that dies is reported (and, within `max_restarts`, started again: a learner resumes from its
last checkpoint, a generator's uncommitted prompts go to the others).

With `runtime.weight_sync.broadcast` on, the learner's rendezvous is on 127.0.0.1 at a port the launcher
finds free (the spec's address and port are for a cluster).

With `environment.tools` and no `environment.service`, the verifiers serve the tool calls
(`scalerl.environment.service`): each listens on a port chosen free at the start and kept across its
restarts, and `environment.service` names them all (`ipv4:127.0.0.1:P0,127.0.0.1:P1`), so a generator's
call to a killed verifier is retried on another.

Compute: the launcher keeps `<out>/pool.json` (`runtime.devices`) current — every role process that is
running, with the devices `runtime.role_devices` gives its role (a learner: per rank × its ranks) — and
points the job's `runtime.pool_file` at it, so the learner integrates what the job holds over time.

The roles' gRPC ports are mutual TLS under a CA made for this run (`scalerl.rpc.certs`; its key stays in
the launcher's memory): each role gets `<out>/tls/<role>/` (its certificate and key, 0600, and the CA) as
SCALERL_RPC_TLS_DIR, and `<out>/tls/client/` holds identity `client` for the user's own calls (`scalerl
eval --engine grpc`, grpcurl), allowed as an extra identity. The side ports are HTTPS with the same
certificates, /metrics behind a scrape token (`scalerl.rpc.sidetls`): the one in the file that
SCALERL_METRICS_TOKEN_FILE names (e.g. your Prometheus's `credentials_file`), else a new one in
`<out>/tls/metrics-token` (0600). With SCALERL_RPC_PLAINTEXT=true in the environment no certificate is made
and both ports are plain text (local development).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl.config import JobSpec, dump_spec
from scalerl.runtime.devices import POOL_FILE, DevicePool, RolePool, write_pool_file


@dataclass
class RoleProcess:
    role: str
    role_id: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    restarts: int = 0


@dataclass
class LocalCluster:
    """The roles of one job as local processes. `spec` is written once to `<out>/job.yaml` and every
    process reads that file, so they all run the same job."""

    spec: JobSpec
    out: Path
    bus_url: str
    store_url: str
    generators: int = 2
    verifiers: int = 2
    role_threads: int = 1
    learner_ranks: int = 1
    """> 1: the learner runs under torchrun with this many processes (FSDP over gloo on CPU)."""
    max_restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)
    faults: Path | None = None
    """A fault plan (`scalerl.faults.plan`) every role process fires from (fault-injection tests)."""
    procs: dict[str, RoleProcess] = field(default_factory=dict)
    rpc_env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per role: the environment that protects its gRPC port (empty in plain text)."""
    verifier_ports: list[int] = field(default_factory=list)
    """The verifiers' gRPC ports when they serve the job's tool calls (`environment.service`), else empty."""

    def __post_init__(self) -> None:
        if not self.bus_url.startswith("kafka://"):
            raise ValueError(f"runtime.bus: separate processes need a shared bus, kafka://HOST:PORT (got "
                             f"{self.bus_url!r}); `make infra-up` starts a local broker")
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        self.pool_file = (self.out / POOL_FILE).resolve()
        runtime = self.spec.runtime.model_copy(update={"pool_file": str(self.pool_file),
                                                       "weight_sync": self._weight_sync()})
        self.spec = self.spec.model_copy(update={"runtime": runtime, "environment": self._environment()})
        self.job_file = self.out / "job.yaml"
        self.job_file.write_text(dump_spec(self.spec))
        self._pool: DevicePool | None = None
        self.update_pool()
        self.rpc_env = self.issue_certificates()

    def _weight_sync(self) -> Any:
        """`runtime.weight_sync` for these processes: with broadcast on, the learner's rendezvous on this host
        at a port free now (the spec's may be another local run's)."""
        ws = self.spec.runtime.weight_sync
        if not ws.broadcast.enabled:
            return ws
        port = _free_port()
        return ws.model_copy(update={"broadcast": ws.broadcast.model_copy(update={"address": "127.0.0.1",
                                                                                 "port": port})})

    def _environment(self) -> Any:
        """`environment` for these processes: with tools and no service given, the verifiers serve the tool
        calls, each on a port free now (kept across its restarts), and every generator is told all of them."""
        env = self.spec.environment
        if not env.tools or env.service or self.verifiers < 1:
            return env
        self.verifier_ports = [_free_port() for _ in range(self.verifiers)]
        return env.model_copy(update={"service": "ipv4:" + ",".join(f"127.0.0.1:{p}" for p in self.verifier_ports)})

    def issue_certificates(self) -> dict[str, dict[str, str]]:
        """A CA for this run and a certificate per role and for `client` (see the module docstring)."""
        from scalerl.rpc.security import ENV_CLIENTS, ENV_TLS_DIR, plaintext_requested

        if plaintext_requested({**os.environ, **self.env}):
            return {}
        from scalerl.rpc.certs import new_ca, write_tls_dir
        from scalerl.rpc.sidetls import ENV_TOKEN_FILE, new_token, read_token_file, write_token_hash
        from scalerl.runtime import ROLES

        ca = new_ca(self.spec.name)
        env = {}
        for identity in (*ROLES, "client"):
            folder = write_tls_dir(self.out / "tls" / identity, ca.issue(identity), ca)
            env[identity] = {ENV_TLS_DIR: str(folder.resolve()), ENV_CLIENTS: "client"}
        token_file = {**os.environ, **self.env}.get(ENV_TOKEN_FILE, "")
        if token_file:  # `scalerl run --distributed` checked it before any work (token_file_problems)
            token = read_token_file(token_file)
        else:
            token = new_token()
            fd = os.open(self.out / "tls" / "metrics-token", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
        for identity in ROLES:
            write_token_hash(self.out / "tls" / identity, token)
        return env

    def devices_per_process(self, role: str) -> int:
        """Devices one process of `role` holds: `runtime.role_devices` (the learner: per rank × ranks)."""
        d = self.spec.runtime.role_devices
        if role == "learner":
            return d.learner_rank * self.learner_ranks
        return int(getattr(d, role))

    def pool(self) -> DevicePool:
        """The devices of the role processes running now."""
        running: dict[str, int] = {}
        for p in self.procs.values():
            if p.popen.poll() is None:
                running[p.role] = running.get(p.role, 0) + 1
        return DevicePool({role: RolePool(n, self.devices_per_process(role)) for role, n in running.items()})

    def update_pool(self) -> None:
        """Rewrite pool.json when the running processes changed."""
        pool = self.pool()
        if pool != self._pool:
            write_pool_file(self.pool_file, pool)
            self._pool = pool

    def command(self, role: str, role_id: str) -> list[str]:
        launch = [sys.executable]
        if role == "learner" and self.learner_ranks > 1:  # rank 0 serves; the others follow it
            launch += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(self.learner_ranks)]
        grpc_port = 0
        if role == "verifier" and self.verifier_ports:  # the environment service's replicas: fixed ports
            grpc_port = self.verifier_ports[int(role_id.rsplit("-", 1)[1]) % len(self.verifier_ports)]
        cmd = [*launch, "-m", "scalerl.cli", "serve", role, "--job", str(self.job_file), "--bus", self.bus_url,
               "--store", self.store_url, "--id", role_id, "--out", str(self.out), "--grpc-port", str(grpc_port),
               "--http-port", "0"]
        if role != "learner":
            cmd += ["--set", f"runtime.threads={self.role_threads}"]
        if self.faults is not None:
            cmd += ["--faults", str(self.faults)]
        return cmd

    def start(self, role: str, role_id: str) -> RoleProcess:
        log_path = self.out / "logs" / f"{role_id}.log"
        env = {**os.environ, **self.env, **self.rpc_env.get(role, {}), "PYTHONUNBUFFERED": "1"}
        with log_path.open("ab") as log_file:
            popen = subprocess.Popen(self.command(role, role_id), stdout=log_file, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        old = self.procs.get(role_id)
        proc = RoleProcess(role, role_id, popen, log_path, restarts=old.restarts + 1 if old else 0)
        self.procs[role_id] = proc
        self.update_pool()
        return proc

    def start_all(self) -> None:
        self.start("learner", "learner-0")  # creates the topics, publishes policy v0 after SFT
        self.start("curriculum", "curriculum-0")
        for i in range(self.verifiers):
            self.start("verifier", f"verifier-{i}")
        for i in range(self.generators):
            self.start("generator", f"generator-{i}")

    def kill(self, role_id: str, sig: int = signal.SIGKILL) -> None:
        """`sig` to the role's process and all its descendants (torchrun and its ranks, for a multi-rank
        learner)."""
        proc = self.procs[role_id]
        # torchrun starts its ranks in sessions of their own: collect them before their parent goes
        pids = [proc.popen.pid, *_descendants(proc.popen.pid)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        proc.popen.wait(timeout=60)
        self.update_pool()

    def stop_all(self, timeout_s: float = 60.0) -> dict[str, int | None]:
        """SIGTERM every running role, wait for them; SIGKILL what is still there after `timeout_s`."""
        for p in self.procs.values():
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in self.procs.values():
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(p.role_id)  # the whole tree: torchrun's ranks live in sessions of their own
        return {rid: p.popen.returncode for rid, p in self.procs.items()}

    def wait_learner(self, timeout_s: float, poll_s: float = 0.5) -> int:
        """Wait for the learner to exit; restart crashed roles within `max_restarts`. Returns its code."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rc = self.check_roles()
            if rc is not None:
                return rc
            time.sleep(poll_s)
        raise TimeoutError(f"the learner did not finish within {timeout_s:.0f} s; logs in {self.out / 'logs'}")

    def check_roles(self) -> int | None:
        """One look at the roles: restart those that exited, within `max_restarts`; the learner's exit code once
        it finished (0) or exited for good, else None."""
        self.update_pool()  # a role that exited stops counting
        for rid, p in list(self.procs.items()):
            rc = p.popen.poll()
            if rc is None:
                continue
            if p.role == "learner" and rc == 0:
                return 0
            if p.restarts < self.max_restarts:
                print(f"scalerl: {rid} exited with {rc}; restarting ({p.restarts + 1}/{self.max_restarts})",
                      file=sys.stderr)
                self.start(p.role, rid)
            elif p.role == "learner":
                return rc
        return None

    def tail(self, role_id: str, lines: int = 30) -> str:
        text = self.procs[role_id].log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def summary(self) -> dict[str, Any]:
        return dict(json.loads((self.out / "summary.json").read_text()))


def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def reset_job(spec: JobSpec, bus_url: str, store_url: str) -> None:
    """Delete the job's topics and stored objects (a fresh run of a job name used before)."""
    from scalerl.bus import TopicNames, open_bus
    from scalerl.store import open_store

    bus = open_bus(bus_url)
    try:
        delete, listing = getattr(bus, "delete_topics", None), getattr(bus, "list_topics", None)
        if delete is not None and listing is not None:
            topics = TopicNames.of(spec)
            delete(topics.all())
            deadline = time.monotonic() + 60
            while listing(f"{topics.job}.") and time.monotonic() < deadline:  # deletion is asynchronous
                time.sleep(0.2)
    finally:
        bus.close()
    store = open_store(store_url)
    for key in store.list(""):
        store.delete(key)


def _free_port() -> int:
    """A TCP port on 127.0.0.1 free now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
