"""The end of a learner's run (issue #26): with `--when-finished wait` a finished learner stays up (servers
answering, status `finished`) until SIGTERM instead of exiting into its StatefulSet's restart, on every
torchrun rank; a stopped one still returns at once; the flag is refused for a role that never finishes."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from scalerl.cli import main
from scalerl.runtime import learner_ranks, serve
from scalerl.runtime.roles import ServiceContext

pytestmark = pytest.mark.timeout(60)


class FakeRole:
    """A role whose loop returns `result` at once (a dict: the learner's summary, finished)."""

    def __init__(self, result: Any) -> None:
        self.result = result

    def run(self, stop: threading.Event) -> Any:
        return self.result

    def ready(self) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        return {}


def _serve_in_thread(monkeypatch: pytest.MonkeyPatch, tiny_spec: Any, result: Any,
                     wait: bool) -> tuple[threading.Thread, threading.Event, dict[str, Any]]:
    monkeypatch.setattr(serve, "build_service", lambda role, ctx, show_progress=False: FakeRole(result))
    stop, out = threading.Event(), {}
    ctx = ServiceContext(tiny_spec, "memory://", "file:///tmp/x", "verifier-0")

    def target() -> None:
        out["result"] = serve.serve("verifier", ctx, stop=stop, wait_when_finished=wait)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, stop, out


def test_a_finished_learner_waits_for_sigterm(monkeypatch: pytest.MonkeyPatch, tiny_spec: Any) -> None:
    thread, stop, out = _serve_in_thread(monkeypatch, tiny_spec, {"final_pass_rate": 0.5}, wait=True)
    thread.join(1.0)
    assert thread.is_alive(), "a finished learner exited (its StatefulSet would restart it)"
    stop.set()  # SIGTERM
    thread.join(5.0)
    assert not thread.is_alive() and out["result"] == {"final_pass_rate": 0.5}


@pytest.mark.parametrize(("result", "wait"), [({"final_pass_rate": 0.5}, False), (None, True)])
def test_without_the_flag_or_when_stopped_it_returns_at_once(monkeypatch: pytest.MonkeyPatch, tiny_spec: Any,
                                                              result: Any, wait: bool) -> None:
    thread, _, out = _serve_in_thread(monkeypatch, tiny_spec, result, wait=wait)
    thread.join(5.0)
    assert not thread.is_alive() and out["result"] == result


def test_followers_learn_whether_the_run_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    told: list[Any] = []
    monkeypatch.setattr(learner_ranks, "_broadcast", lambda obj: told.append(obj) or obj)

    class OneRank:
        world_size = 2
        version = 0

    ranks = learner_ranks.Ranks.__new__(learner_ranks.Ranks)
    ranks.learner, ranks.rank, ranks.world_size = OneRank(), 0, 2  # type: ignore[assignment]
    ranks.stop(finished=True)
    assert told == [(learner_ranks.STOP, True)]
    for payload, finished in ((True, True), (None, False), (False, False)):
        status = learner_ranks.FollowerStatus(1)
        monkeypatch.setattr(learner_ranks, "_broadcast", lambda obj, p=payload: (learner_ranks.STOP, p))
        learner_ranks.follow(OneRank(), status)  # type: ignore[arg-type]
        assert status.finished is finished and status.status()["finished"] is finished


def test_when_finished_wait_is_refused_for_a_role_that_never_finishes(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: t\noff_policy:\n  mode: pipeline\n")
    code = main(["serve", "generator", "--job", str(spec), "--bus", "kafka://k:9092", "--store", "file:///tmp/s",
                 "--when-finished", "wait"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == ("scalerl serve: error: --when-finished wait: only the learner finishes; a generator runs until "
                   "stopped\n")
