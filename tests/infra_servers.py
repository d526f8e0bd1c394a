"""The Kafka + MinIO session fixture `infra` and the per-test `unique` name, shared by tests/integration
and tests/vllm_cpu (whose tests run in the vLLM environment, outside tests/integration's conftest).

`infra` reads build/infra.env. If the file is missing, or the servers it names do not answer, it runs
scripts/infra/up.sh (which builds into the cache on first use and starts them) and stops them again at
the end of the session (SCALERL_INFRA_KEEP=1 keeps them; SCALERL_INFRA_AUTOSTART=0 never starts
anything). When they still cannot be reached, the tests fail if CI is set and are skipped otherwise.
"""

from __future__ import annotations

import os
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from infra_session import ENV_FILE, running_servers

UP_TIMEOUT_S = float(os.environ.get("SCALERL_INFRA_UP_TIMEOUT", "1500"))


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


@pytest.fixture
def unique() -> str:
    """A fresh name for this test's topics / bucket prefix, so tests never share state."""
    return f"it-{uuid.uuid4().hex[:10]}"
