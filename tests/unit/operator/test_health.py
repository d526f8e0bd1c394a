"""The operator's own health endpoint (scalerl_operator.control.health): what each state answers, and the
flag check of `python -m scalerl_operator --liveness`."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from scalerl_operator.__main__ import EXIT_BAD_INPUT, main
from scalerl_operator.control.health import HealthState, parse_endpoint, serve


def test_report_per_state() -> None:
    h = HealthState(startup_grace_s=120.0)
    assert h.report() == (200, "standby")
    h.set("starting")
    t0 = h.since_s
    assert h.report(now_s=t0 + 119.0) == (200, "starting")
    assert h.report(now_s=t0 + 130.0) == (500, "kopf not ready after 130s")
    h.set("leader")
    assert h.report(now_s=h.since_s + 10_000.0) == (200, "leader")  # no grace once kopf is up
    h.set("stopping")
    assert h.report() == (500, "stopping")


def test_parse_endpoint() -> None:
    assert parse_endpoint("http://0.0.0.0:8080/healthz") == ("0.0.0.0", 8080)
    assert parse_endpoint("http://127.0.0.1:9/") == ("127.0.0.1", 9)
    for bad in ("0.0.0.0:8080", "https://0.0.0.0:8080/healthz", "http://host/healthz"):
        with pytest.raises(ValueError, match="--liveness"):
            parse_endpoint(bad)


def test_bad_liveness_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--liveness", "localhost:8080"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("scalerl-operator: error: --liveness:")


def test_served_paths() -> None:
    h = HealthState()
    server = serve(h, "127.0.0.1", 0)
    port = server.server_address[1]
    try:
        for p in ("/healthz", "/readyz"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{p}", timeout=5) as r:
                assert (r.status, r.read()) == (200, b"standby")
        h.set("stopping")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert exc.value.code == 500
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert exc.value.code == 404
    finally:
        server.shutdown()
