"""`scalerl serve` against a bus nobody listens on (127.0.0.1:1), as a real process: it gives up after
`--max-outage` with exit 1 and one line, and SIGTERM ends it with exit 0 at every phase of the wait
(during the blocking connect, and between retries) instead of after the retry limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

SPEC = "name: unreachable\ntask:\n  kind: addition\n  digits: 2\n"
# the SIGTERM tests wait out one 30 s connect attempt (the retry limit bounds an attempt: about 1 s below)
pytestmark = pytest.mark.slow

GENEROUS_S = 240  # far below the --max-outage 600 a SIGTERM must cut short; far above a prompt exit


def _start(tmp_path: Path, max_outage: float) -> tuple[subprocess.Popen[str], list[str], threading.Event,
                                                       threading.Event]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "scalerl.cli", "serve", "verifier", "--job", str(spec), "--bus", "kafka://127.0.0.1:1",
         "--store", f"file://{tmp_path / 'store'}", "--grpc-port", "-1", "--http-port", "-1",
         "--max-outage", str(max_outage)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    connecting, retrying = threading.Event(), threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "connecting to kafka://127.0.0.1:1" in line:
                connecting.set()
            if "failed" in line and "retrying" in line:
                retrying.set()

    threading.Thread(target=read, daemon=True).start()
    return proc, lines, connecting, retrying


def _wait(proc: subprocess.Popen[str], lines: list[str]) -> int:
    try:
        return proc.wait(timeout=GENEROUS_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("serve did not exit: " + "".join(lines[-5:]))


def test_retry_limit_exits_1_with_one_line(tmp_path):
    proc, lines, _, _ = _start(tmp_path, max_outage=1)
    assert _wait(proc, lines) == 1
    proc.wait()
    errors = [ln for ln in lines if ln.startswith("scalerl serve: error:")]
    assert len(errors) == 1 and "did not answer for 1 s" in errors[0], "".join(lines)
    assert not any("Traceback" in ln for ln in lines)


@pytest.mark.parametrize("phase", ["connecting", "between retries"])
def test_sigterm_while_connecting_exits_0(tmp_path, phase):
    proc, lines, connecting, retrying = _start(tmp_path, max_outage=600)
    reached = (connecting if phase == "connecting" else retrying).wait(timeout=GENEROUS_S)
    assert reached, "".join(lines)
    proc.send_signal(signal.SIGTERM)
    assert _wait(proc, lines) == 0, "".join(lines)
    assert not any("Traceback" in ln for ln in lines), "".join(lines)
    assert any("stopped before verifier started" in ln for ln in lines), "".join(lines)
