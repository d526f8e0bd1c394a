"""set_condition moves lastTransitionTime only on a status flip; is_ready needs the current generation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from scalerl_operator.api import conditions as c

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_new_condition_is_appended_with_the_time_and_generation() -> None:
    out = c.set_condition([], c.READY, "False", c.REASON_ROLES_NOT_READY, "0/2 generators", 1, T0)
    assert out == [{"type": "Ready", "status": "False", "reason": "RolesNotReady", "message": "0/2 generators",
                    "lastTransitionTime": "2025-03-01T12:00:00Z", "observedGeneration": 1}]


def test_same_status_keeps_the_transition_time_but_takes_reason_message_generation() -> None:
    first = c.set_condition(None, c.READY, "False", c.REASON_ROLES_NOT_READY, "0/2", 1, T0)
    again = c.set_condition(first, c.READY, "False", c.REASON_WAITING_FOR_POLICY, "1/2", 2, T1)
    assert again[0]["lastTransitionTime"] == "2025-03-01T12:00:00Z"
    assert (again[0]["reason"], again[0]["message"], again[0]["observedGeneration"]) == \
        ("WaitingForPolicy", "1/2", 2)
    assert first[0]["reason"] == "RolesNotReady"  # the input list is not modified


def test_a_flip_moves_the_transition_time_and_keeps_the_others_in_order() -> None:
    conds = c.set_condition([], c.PROGRESSING, "True", c.REASON_RECONCILING, "", 1, T0)
    conds = c.set_condition(conds, c.READY, "False", c.REASON_ROLES_NOT_READY, "", 1, T0)
    # a non-UTC clock is converted: 13:05+01:00 is 12:05Z
    flipped = c.set_condition(conds, c.READY, "True", c.REASON_ALL_ROLES_READY, "", 1,
                              T1.astimezone(timezone(timedelta(hours=1))))
    assert [x["type"] for x in flipped] == ["Progressing", "Ready"]
    assert flipped[1]["lastTransitionTime"] == "2025-03-01T12:05:00Z"
    assert flipped[0] == conds[0]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="True, False or Unknown"):
        c.set_condition([], c.READY, "yes", "X", "", 1, T0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reason must not be empty"):
        c.set_condition([], c.READY, "True", "", "", 1, T0)
    with pytest.raises(ValueError, match="timezone-aware"):
        c.set_condition([], c.READY, "True", "X", "", 1, datetime(2025, 1, 1))


def test_is_ready_needs_the_current_generation_and_ready_true() -> None:
    ready = c.set_condition([], c.READY, "True", c.REASON_ALL_ROLES_READY, "", 3, T0)
    obj = {"metadata": {"generation": 3}, "status": {"observedGeneration": 3, "conditions": ready}}
    assert c.is_ready(obj)
    assert not c.is_ready({**obj, "metadata": {"generation": 4}})  # the spec moved on
    not_ready = c.set_condition(ready, c.READY, "False", c.REASON_ROLES_NOT_READY, "", 3, T1)
    assert not c.is_ready({**obj, "status": {"observedGeneration": 3, "conditions": not_ready}})
    assert not c.is_ready({"metadata": {"generation": 1}})
    assert c.get_condition(ready, c.FAILED) is None and not c.is_true(ready, c.FAILED)


def test_condition_types_and_reasons_are_valid_metav1_values() -> None:
    import re

    reasons = [v for k, v in vars(c).items() if k.startswith("REASON_")]
    assert len(reasons) == len(set(reasons))
    assert all(re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", r) for r in reasons)
    assert len(c.CONDITION_TYPES) == 12 and len(set(c.CONDITION_TYPES)) == 12
