"""OOM kills of a job's containers: found in the pods' statuses once, reported once (control.podfaults)."""

from __future__ import annotations

from typing import Any

from scalerl_operator.control import gang
from scalerl_operator.control.podfaults import MAX_KILLS, kills_status, new_kills, oom_kills


def _pod(name: str, role: str, *, last: dict[str, Any] | None = None, state: dict[str, Any] | None = None,
         restarts: int = 0, limit: str | None = "96Mi", uid: str | None = None) -> dict[str, Any]:
    resources = {"limits": {"memory": limit}} if limit else {}
    return {"metadata": {"name": name, "uid": uid or f"uid-{name}", "labels": {"app.kubernetes.io/component": role}},
            "spec": {"containers": [{"name": role, "resources": resources}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": role, "restartCount": restarts, "lastState": last or {}, "state": state or {"running": {}}}]}}


def _oom(at: str) -> dict[str, Any]:
    return {"terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": at}}


def test_an_oom_kill_in_last_state_is_found_with_its_limit_and_reported_once() -> None:
    pods = [_pod("j-verifier-a", "verifier", last=_oom("2026-11-28T05:40:01Z"), restarts=1),
            _pod("j-generator-b", "generator", last={"terminated": {"reason": "Error", "exitCode": 1,
                                                                      "finishedAt": "2026-11-28T05:40:00Z"}},
                 restarts=1)]
    kills = new_kills(pods, [])
    assert [(k.pod, k.role, k.container, k.exit_code, k.memory_limit, k.restarts) for k in kills] == [
        ("j-verifier-a", "verifier", "verifier", 137, "96Mi", 1)]
    msg = kills[0].message()
    assert "verifier pod j-verifier-a" in msg and "memory limit 96Mi" in msg and "OOMKilled" in msg
    recorded = kills_status([], kills)
    assert recorded[0]["reason"] == "OOMKilled" and recorded[0]["finishedAt"] == "2026-11-28T05:40:01Z"
    # the next pass sees the same termination: nothing new
    assert new_kills(pods, recorded) == []
    # killed again later: a new kill of the same container
    again = [_pod("j-verifier-a", "verifier", last=_oom("2026-11-28T05:41:30Z"), restarts=2)]
    assert [k.finished_at for k in new_kills(again, recorded)] == ["2026-11-28T05:41:30Z"]


def test_a_container_not_restarted_yet_and_one_without_a_limit() -> None:
    pods = [_pod("j-learner-0", "learner", state=_oom("2026-11-28T05:40:05Z"), limit=None)]
    (kill,) = oom_kills(pods)
    assert kill.memory_limit is None and "no limit set" in kill.message()


def test_the_status_keeps_the_newest_kills() -> None:
    recorded: list[dict[str, Any]] = []
    for i in range(MAX_KILLS + 3):
        pods = [_pod(f"p{i}", "verifier", last=_oom(f"2026-11-28T05:{i:02d}:00Z"), restarts=1)]
        recorded = kills_status(recorded, new_kills(pods, recorded))
    assert len(recorded) == MAX_KILLS and recorded[-1]["pod"] == f"p{MAX_KILLS + 2}" and recorded[0]["pod"] == "p3"


def test_a_learner_group_restart_names_the_oom_kill() -> None:
    pods = [_pod("j-learner-0", "learner", last=_oom("2026-11-28T05:40:05Z"), restarts=1, limit="2Gi")]
    why = gang.failure(pods)
    assert why is not None and "restarted 1 time(s)" in why and "OOMKilled: over its memory limit 2Gi" in why
    plain = [_pod("j-learner-0", "learner", last={"terminated": {"reason": "Error", "exitCode": 1}}, restarts=1)]
    assert "OOMKilled" not in (gang.failure(plain) or "")
