"""What tests/integration/conftest.py and tests/k8s/conftest.py share: reading build/infra.env,
starting the servers of scripts/infra/up.sh for a test session, and the rule for servers that cannot
be reached — the tests FAIL when the environment variable CI is set (never a silent skip in CI) and
are skipped otherwise.

SCALERL_INFRA_AUTOSTART=0 never starts anything; SCALERL_INFRA_KEEP=1 keeps running what a session
started. Servers that were already up are always left running. SCALERL_INFRA_UP_PID (set by
scripts/test_suite.sh): the pid of an up.sh running in the background; a session fixture whose servers
are not up yet waits for it instead of failing at once.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]
ENV_FILE = REPO / "build" / "infra.env"
UP = REPO / "scripts" / "infra" / "up.sh"
DOWN = REPO / "scripts" / "infra" / "down.sh"


# kafka-python loads its protocol schemas with importlib.resources APIs deprecated in Python 3.11
QUIET_KAFKA = [pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
               pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning")]


def read_env_file(path: Path = ENV_FILE) -> dict[str, str]:
    """The KEY=VALUE lines of build/infra.env; {} when it does not exist."""
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                values[key.strip()] = value.strip()
    return values


def unavailable(what: str, reason: str, up_cmd: str) -> NoReturn:
    msg = f"{what} unavailable: {reason} (start it with {up_cmd})"
    if os.environ.get("CI"):
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


SASL_KEYS = ("KAFKA_SASL_BOOTSTRAP", "KAFKA_SASL_MECHANISM", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD",
             "KAFKA_SSL_CAFILE")


def sasl_listener(lookup: Callable[[str], str | None]) -> dict[str, str]:
    """The test broker's SASL_SSL listener (SASL_KEYS, looked up in build/infra.env's values); fails in CI,
    skips elsewhere, when up.sh has not written them."""
    values = {k: lookup(k) or "" for k in SASL_KEYS}
    missing = [k for k, v in values.items() if not v]
    if missing:
        unavailable("the broker's SASL_SSL listener", f"build/infra.env lacks {', '.join(missing)}",
                    "scripts/infra/up.sh kafka")
    return values

@contextmanager
def running_servers(what: str, services: Sequence[str], problem: Callable[[dict[str, str]], str | None],
                    timeout_s: float) -> Iterator[dict[str, str]]:
    """build/infra.env once `problem(values)` finds nothing wrong. When it does, runs
    `scripts/infra/up.sh SERVICES` (which builds into the cache on first use) and stops what it
    started on exit; servers still unreachable after that are `unavailable`."""
    up_cmd = " ".join(["scripts/infra/up.sh", *services])
    values = read_env_file()
    reason = problem(values)
    if reason is not None:
        values, reason = _wait_for_background_up(values, reason, problem, timeout_s)
    started = False
    if reason is not None and os.environ.get("SCALERL_INFRA_AUTOSTART", "1") != "0":
        t0 = time.monotonic()
        try:
            proc = subprocess.run(["bash", str(UP), *services], cwd=REPO, capture_output=True, text=True,
                                  timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            unavailable(what, f"{reason}; {up_cmd} did not finish: {exc}", up_cmd)
        if proc.returncode != 0:
            unavailable(what, f"{reason}; {up_cmd} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}", up_cmd)
        started = True
        print(f"\n[infra] {what} started by the test session in {time.monotonic() - t0:.1f}s")
        values = read_env_file()
        reason = problem(values)
    if reason is not None:
        unavailable(what, reason, up_cmd)
    try:
        yield values
    finally:
        if started and os.environ.get("SCALERL_INFRA_KEEP") != "1":
            subprocess.run(["bash", str(DOWN), *services], cwd=REPO, capture_output=True, timeout=120, check=False)


# How long a session fixture waits for the background up.sh of `make test` at most: a cold run builds every
# server first (the cold CI run of 2026-11-28: all of them up 57 minutes in).
BACKGROUND_UP_WAIT_S = 7200.0


def _up_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not yet reaped by scripts/test_suite.sh) has finished
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_for_background_up(values: dict[str, str], reason: str, problem: Callable[[dict[str, str]], str | None],
                            timeout_s: float) -> tuple[dict[str, str], str | None]:
    """While the scripts/infra/up.sh that `make test` started in the background (its pid in
    SCALERL_INFRA_UP_PID) still runs, wait for it to bring these servers up (it writes build/infra.env
    as each group comes up), so the tests that need servers start beside the builds of the others."""
    pid = int(os.environ.get("SCALERL_INFRA_UP_PID", "0") or 0)
    deadline = time.monotonic() + max(timeout_s, BACKGROUND_UP_WAIT_S)  # (the wait ends with up.sh, well before)
    t0 = time.monotonic()
    while pid > 0 and reason is not None and _up_running(pid) and time.monotonic() < deadline:
        time.sleep(5.0)
        values = read_env_file()
        reason = problem(values)
    if pid > 0 and reason is None and time.monotonic() - t0 > 5:
        print(f"\n[infra] waited {time.monotonic() - t0:.0f} s for the background scripts/infra/up.sh")
    if reason is not None and pid > 0:  # it finished (or gave up) without them: a last look at what it wrote
        values = read_env_file()
        reason = problem(values)
    return values, reason


def in_dir(item: pytest.Item, here: Path) -> bool:
    return Path(str(item.fspath)).resolve().parent == here


def time_first_setup(items: list[pytest.Item], here: Path, fixture: str, timeout_s: float) -> None:
    """The first test in `here` that uses `fixture` gets `timeout_s`: the session fixture may build
    the servers cold during its setup (needs pytest-timeout; run as a trylast collection hook, after
    -k / -m deselection)."""
    if os.environ.get("SCALERL_INFRA_UP_PID"):  # it may wait for make test's background up.sh
        timeout_s = max(timeout_s, BACKGROUND_UP_WAIT_S + 300)
    for item in items:
        if in_dir(item, here) and fixture in getattr(item, "fixturenames", ()) and \
                item.config.pluginmanager.hasplugin("timeout"):
            item.add_marker(pytest.mark.timeout(timeout_s), append=False)  # before its own timeout mark
            return


def sasl_bus(values: dict[str, str]) -> Any:
    """A KafkaBus of the test process on the broker's SASL_SSL listener (SASL_KEYS in `values`)."""
    from scalerl.bus.kafka import KafkaBus
    from scalerl.bus.security import KafkaSecurity

    return KafkaBus(values["KAFKA_SASL_BOOTSTRAP"], request_timeout_s=10, security=KafkaSecurity(
        protocol="SASL_SSL", mechanism=values["KAFKA_SASL_MECHANISM"], username=values["KAFKA_SASL_USERNAME"],
        password=values["KAFKA_SASL_PASSWORD"], ca_file=values["KAFKA_SSL_CAFILE"]))
