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
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra_session import ENV_FILE, REPO, in_dir, read_env_file, running_servers, time_first_setup

RESTART_KAFKA = REPO / "scripts" / "infra" / "restart_kafka.sh"
UP_TIMEOUT_S = float(os.environ.get("SCALERL_INFRA_UP_TIMEOUT", "1500"))


# kafka-python loads its protocol schemas with importlib.resources APIs deprecated in Python 3.11
_QUIET = [pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
          pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning")]


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if in_dir(item, here):
            for mark in _QUIET:
                item.add_marker(mark)
    time_first_setup(items, here, "infra", UP_TIMEOUT_S + 300)
    time_first_setup(items, here, "observability", UP_TIMEOUT_S + 300)


@dataclass(frozen=True)
class Infra:
    kafka_bootstrap: str
    s3_endpoint: str
    s3_access_key: str
    s3_secret_key: str
    s3_region: str
    values: dict[str, str]

    def s3_env(self) -> dict[str, str]:
        return {"S3_ENDPOINT": self.s3_endpoint, "S3_ACCESS_KEY": self.s3_access_key,
                "S3_SECRET_KEY": self.s3_secret_key, "S3_REGION": self.s3_region}


def _infra_from(values: dict[str, str]) -> Infra:
    return Infra(values["KAFKA_BOOTSTRAP"], values["S3_ENDPOINT"], values["S3_ACCESS_KEY"],
                 values["S3_SECRET_KEY"], values.get("S3_REGION", "us-east-1"), values)


def _kafka_problem(bootstrap: str) -> str | None:
    try:
        from kafka import KafkaAdminClient
    except ImportError:
        return "kafka-python is not installed (pip install kafka-python)"
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000,
                                 bootstrap_timeout_ms=5000, client_id="scalerl-it-probe")
    except Exception as exc:
        return f"Kafka at {bootstrap} unreachable: {exc!r}"
    try:
        admin.list_topics()
    except Exception as exc:
        return f"Kafka at {bootstrap} cannot list topics: {exc!r}"
    finally:
        admin.close()
    return None


def _minio_problem(endpoint: str) -> str | None:
    try:
        import minio  # noqa: F401
    except ImportError:
        return "the minio client is not installed (pip install minio)"
    try:
        with urllib.request.urlopen(endpoint.rstrip("/") + "/minio/health/ready", timeout=5) as r:
            if r.status != 200:
                return f"MinIO at {endpoint} not ready (HTTP {r.status})"
    except OSError as exc:
        return f"MinIO at {endpoint} unreachable: {exc!r}"
    return None


def _problem(values: dict[str, str]) -> str | None:
    if not values:
        return f"{ENV_FILE} is missing or empty"
    missing = [k for k in ("KAFKA_BOOTSTRAP", "S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY")
               if not values.get(k)]
    if missing:
        return f"{ENV_FILE} lacks {', '.join(missing)}"
    return _kafka_problem(values["KAFKA_BOOTSTRAP"]) or _minio_problem(values["S3_ENDPOINT"])


@pytest.fixture(scope="session")
def infra() -> Iterator[Infra]:
    with running_servers("real infrastructure", (), _problem, UP_TIMEOUT_S) as values:
        yield _infra_from(values)


@dataclass(frozen=True)
class Observability:
    prometheus_url: str
    file_sd: Path  # Prometheus reads scrape targets from <file_sd>/*.json (one file per test)
    jaeger_query_url: str
    jaeger_otlp_grpc: str


def _http_problem(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return None if r.status == 200 else f"{url} answered HTTP {r.status}"
    except OSError as exc:
        return f"{url} unreachable: {exc!r}"


def _observability_problem(values: dict[str, str]) -> str | None:
    missing = [k for k in ("PROMETHEUS_URL", "PROMETHEUS_FILE_SD", "JAEGER_QUERY_URL", "JAEGER_OTLP_GRPC")
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
                            values["JAEGER_QUERY_URL"], values["JAEGER_OTLP_GRPC"])


@pytest.fixture
def s3_env(infra: Infra, monkeypatch: pytest.MonkeyPatch) -> Infra:
    """The S3_* variables of the running MinIO, set in os.environ for `open_store("s3://...")`."""
    for k, v in infra.s3_env().items():
        monkeypatch.setenv(k, v)
    return infra


@pytest.fixture
def unique() -> str:
    """A fresh name for this test's topics / bucket prefix, so tests never share state."""
    return f"it-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def restart_kafka(infra: Infra) -> Callable[..., float]:
    """Restart the broker on the same port and data dir; returns the seconds it took.
    `restart_kafka(kill=True)` crashes it with SIGKILL instead of a clean shutdown."""

    def restart(kill: bool = False, down_for_s: float = 0.0) -> float:
        args = ["bash", str(RESTART_KAFKA), "--down-for", str(down_for_s)] + (["--kill"] if kill else [])
        t0 = time.monotonic()
        proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            pytest.fail(f"restart_kafka.sh failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        new = read_env_file()
        assert new["KAFKA_BOOTSTRAP"] == infra.kafka_bootstrap, "broker came back on another port"
        return time.monotonic() - t0

    return restart


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
