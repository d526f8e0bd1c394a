"""Fixtures for tests against the real servers (Kafka, MinIO) of scripts/infra/up.sh.

The session fixture `infra` reads build/infra.env. If the file is missing, or the servers it names do
not answer, it runs scripts/infra/up.sh (which builds into the cache on first use and starts them)
and stops them again at the end of the session (set SCALERL_INFRA_KEEP=1 to keep them running;
SCALERL_INFRA_AUTOSTART=0 never starts anything). Servers that were already up are left running.
When they still cannot be reached, the tests fail if the environment variable CI is set (never a
silent skip in CI) and are skipped otherwise (tests/infra_session.py, shared with tests/k8s).
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra_servers import UP_TIMEOUT_S, Infra
from infra_session import ENV_FILE, QUIET_KAFKA, REPO, in_dir, read_env_file, running_servers, time_first_setup

RESTART_KAFKA = REPO / "scripts" / "infra" / "restart_kafka.sh"


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if in_dir(item, here):
            for mark in QUIET_KAFKA:
                item.add_marker(mark)
    time_first_setup(items, here, "infra", UP_TIMEOUT_S + 300)
    time_first_setup(items, here, "observability", UP_TIMEOUT_S + 300)
    time_first_setup(items, here, "grpcurl", UP_TIMEOUT_S + 300)


@dataclass(frozen=True)
class Observability:
    prometheus_url: str
    file_sd: Path  # Prometheus reads scrape targets from <file_sd>/*.json (one file per test)
    scrape_token_file: Path  # the bearer token Prometheus presents to /metrics (SCALERL_METRICS_TOKEN_FILE)
    jaeger_query_url: str
    jaeger_otlp_grpc: str


def _http_problem(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return None if r.status == 200 else f"{url} answered HTTP {r.status}"
    except OSError as exc:
        return f"{url} unreachable: {exc!r}"


def _observability_problem(values: dict[str, str]) -> str | None:
    missing = [k for k in ("PROMETHEUS_URL", "PROMETHEUS_FILE_SD", "PROMETHEUS_SCRAPE_TOKEN_FILE", "JAEGER_QUERY_URL",
                           "JAEGER_OTLP_GRPC")
               if not values.get(k)]
    if missing:
        return f"{ENV_FILE} lacks {', '.join(missing)}"
    return (_http_problem(values["PROMETHEUS_URL"] + "/-/ready")
            or _http_problem(values["JAEGER_QUERY_URL"] + "/api/services"))


@pytest.fixture(scope="session")
def observability() -> Iterator[Observability]:
    """The Prometheus and Jaeger v2 of scripts/infra/up.sh (started like `infra` when not running)."""
    with running_servers("Prometheus and Jaeger", ("prometheus", "jaeger"), _observability_problem,
                         UP_TIMEOUT_S) as values:
        yield Observability(values["PROMETHEUS_URL"], Path(values["PROMETHEUS_FILE_SD"]),
                            Path(values["PROMETHEUS_SCRAPE_TOKEN_FILE"]), values["JAEGER_QUERY_URL"],
                            values["JAEGER_OTLP_GRPC"])


def _grpcurl_problem(values: dict[str, str]) -> str | None:
    path = values.get("GRPCURL_BIN")
    if not path:
        return f"{ENV_FILE} lacks GRPCURL_BIN (scripts/infra/up.sh k8s builds it)"
    return None if os.access(path, os.X_OK) else f"grpcurl {path} is not an executable"


@pytest.fixture(scope="session")
def grpcurl() -> Iterator[str]:
    """The path of the grpcurl a user runs against a role's endpoint (built with the k8s group's clients)."""
    with running_servers("grpcurl", ("k8s",), _grpcurl_problem, UP_TIMEOUT_S) as values:
        yield values["GRPCURL_BIN"]


@pytest.fixture
def s3_env(infra: Infra, monkeypatch: pytest.MonkeyPatch) -> Infra:
    """The S3_* variables of the running MinIO, set in os.environ for `open_store("s3://...")`."""
    for k, v in infra.s3_env().items():
        monkeypatch.setenv(k, v)
    return infra


@dataclass(frozen=True)
class PrivateKafka:
    """A broker of its own (scripts/infra/up.sh under its own state dir), for the tests that restart it: the
    session's broker keeps serving whatever runs beside them (another pytest process, a developer's run)."""

    bootstrap: str
    env: dict[str, str]  # SCALERL_INFRA_STATE / SCALERL_INFRA_ENV for the scripts

    def restart(self, kill: bool = False, down_for_s: float = 0.0) -> float:
        """Restart it on the same port and data dir; returns the seconds it took. `kill=True`: SIGKILL, not a
        clean shutdown."""
        args = ["bash", str(RESTART_KAFKA), "--down-for", str(down_for_s)] + (["--kill"] if kill else [])
        t0 = time.monotonic()
        proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300, env=self.env)
        if proc.returncode != 0:
            pytest.fail(f"restart_kafka.sh failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        new = read_env_file(Path(self.env["SCALERL_INFRA_ENV"]))
        assert new["KAFKA_BOOTSTRAP"] == self.bootstrap, "broker came back on another port"
        return time.monotonic() - t0


@pytest.fixture(scope="module")
def private_kafka(infra: Infra, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateKafka]:
    """A broker for this module alone, started from the cached build (about 15 s) and stopped after it."""
    state = tmp_path_factory.mktemp("kafka-private")
    env = {**os.environ, "SCALERL_INFRA_STATE": str(state), "SCALERL_INFRA_ENV": str(state / "infra.env")}
    up = subprocess.run(["bash", str(REPO / "scripts" / "infra" / "up.sh"), "kafka"], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=UP_TIMEOUT_S)
    if up.returncode != 0:
        pytest.fail(f"a private broker did not start (rc {up.returncode}):\n{up.stderr[-3000:]}")
    try:
        yield PrivateKafka(read_env_file(state / "infra.env")["KAFKA_BOOTSTRAP"], env)
    finally:
        subprocess.run(["bash", str(REPO / "scripts" / "infra" / "down.sh"), "kafka"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)


@pytest.fixture
def restart_kafka(private_kafka: PrivateKafka) -> Callable[..., float]:
    """`private_kafka.restart`: the test talks to `private_kafka.bootstrap`."""
    return private_kafka.restart


def poll_until(consumer: Any, n: int, timeout_s: float = 30.0, max_records: int = 1000) -> list[Any]:
    """Poll until `n` records arrived (never more than `n`) or the timeout; returns what came."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out += consumer.poll(timeout_s=min(1.0, max(0.0, deadline - time.monotonic())),
                             max_records=min(max_records, n - len(out)))
    return out


@pytest.fixture(name="poll_until")
def poll_until_fixture() -> Callable[..., list[Any]]:
    return poll_until


@pytest.fixture
def bus(infra: Infra, unique: str) -> Iterator[Any]:
    """A KafkaBus on the test broker; the test's topics (`<unique>.*`) are deleted afterwards."""
    from scalerl.bus.kafka import KafkaBus
    from waiting import delete_topics_and_wait

    b = KafkaBus(infra.kafka_bootstrap, client_id="scalerl-it")
    try:
        yield b
        delete_topics_and_wait(b, f"{unique}.")  # keep the broker small; deletion finishes asynchronously
    finally:
        b.close()
