"""The distributed curriculum's flow control counts issued groups that were dead-lettered before they
reached `scored` (by a generator or a verifier) as decided, each once, across a restart too (#27 finding 5:
before, each such group held one of the `max_inflight` slots for good, so the run slowly deadlocked).
Its state is written ahead of publishing: a round whose publish failed is published again, by a retry or
after a restart, under the same issue numbers (the learner's record of decided groups relies on it)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from scalerl.bus.dlq import dead_letter
from scalerl.bus.memory import MemoryBus
from scalerl.messages import RolloutGroup, ScoredGroup
from scalerl.runtime.curriculum_service import CurriculumService
from scalerl.runtime.roles import ServiceContext


def _service(spec, store_url: str, bus: MemoryBus | None = None) -> CurriculumService:
    svc = CurriculumService(ServiceContext(spec, "memory://", store_url, "curriculum-0"))
    if bus is not None:  # a restart: the same log (the memory bus lives in this process only)
        svc.bus = bus
        svc.scored = bus.consumer([svc.topics.scored], svc.topics.group("curriculum"), dead_letters=False)
        svc.policy.close()
        svc.dead_letters.close()
        from scalerl.bus.background import BackgroundConsumer
        svc.policy = BackgroundConsumer(bus.reader([svc.topics.policy]), name="policy-reader")
        svc.dead_letters = BackgroundConsumer(bus.reader([svc.topics.dlq]), name="dlq-reader")
    return svc


def _wait_step(svc: CurriculumService, until) -> int:
    issued = 0
    for _ in range(50):  # the dead-letter reader runs in the background
        issued += svc.step(timeout_s=0.05)
        if until(issued):
            break
    return issued


def test_dead_lettered_prompts_and_rollouts_free_their_in_flight_slots(tiny_spec, tmp_path):
    spec = tiny_spec.model_copy(deep=True)
    spec.train.prompts_per_step = 2
    spec.off_policy.k = 2  # max_inflight = k x B = 4
    svc = _service(spec, f"file://{tmp_path}")
    assert svc.step(timeout_s=0.0) == 4 and svc.step(timeout_s=0.0) == 0  # the cap holds
    bus, topics = svc.bus, svc.topics
    issued = [r for r in bus._logs[topics.prompts]]
    # a generator dead-letters one prompt, a verifier one rollout; a scored group dead-lettered by the learner is
    # the learner's to count (it reached scored), and a dead letter of a prompt never issued counts for nothing
    dead_letter(bus, topics.dlq, issued[0], "too_long: the prompt is 999 tokens", "job.generators")
    rollout = RolloutGroup(task=issued[1].value, prompt_token_ids=[1], completions=[], generator_id="g")
    bus.publish(topics.rollouts, rollout, key=rollout.task.prompt_id)
    dead_letter(bus, topics.dlq, bus._logs[topics.rollouts][0], "step_failed: the verifier raised", "v")
    scored = ScoredGroup(rollout=RolloutGroup(task=issued[2].value, prompt_token_ids=[1], completions=[],
                                              generator_id="g"), rewards=[], correct=[])
    bus.publish(topics.dlq, scored, key="x")
    bus.publish(topics.dlq, dataclasses.replace(issued[3].value, epoch=900), key="foreign")

    assert _wait_step(svc, lambda n: n >= 2) == 2  # (today's code: 0, and never more)
    assert svc.dead_upstream == 2 and svc.outstanding() == 4
    # the same dead letters read again after a restart are not counted twice
    again = _service(spec, f"file://{tmp_path}", bus)
    assert again.dead_upstream == 2
    assert _wait_step(again, lambda n: False) == 0 and again.dead_upstream == 2


def test_a_round_whose_publish_failed_is_published_again_under_the_same_numbers(tiny_spec, tmp_path):
    spec = tiny_spec.model_copy(deep=True)
    spec.train.prompts_per_step = 2
    spec.off_policy.k = 2  # max_inflight = 4
    svc = _service(spec, f"file://{tmp_path}")
    bus, topics = svc.bus, svc.topics
    failures = [OSError("broker down")]
    flushes: list[int] = []

    def flush() -> None:
        flushes.append(1)
        if failures:
            raise failures.pop()
    bus.flush = flush  # type: ignore[method-assign]
    with pytest.raises(OSError):
        svc.step(timeout_s=0.0)
    saved = json.loads(svc.store.get_bytes("curriculum/state.json"))
    assert [t["seq"] for t in saved["unconfirmed"]] == [1, 2, 3, 4]  # saved before it was published
    # the retried round: no new prompt, nothing published again (the bus sends the failed sends with the
    # next flush), and a flush for them
    assert svc.step(timeout_s=0.0) == 0 and len(flushes) == 2
    first = [(r.value.seq, r.value.prompt_id) for r in bus._logs[topics.prompts]]
    assert [s for s, _ in first] == [1, 2, 3, 4]
    assert svc.step(timeout_s=0.0) == 0 and len(flushes) == 2  # nothing changed, nothing unconfirmed: no flush
    assert len(bus._logs[topics.prompts]) == 4

    # killed after saving a round, before the bus confirmed it: the restart publishes it again
    state = json.loads(svc.store.get_bytes("curriculum/state.json"))
    state["unconfirmed"] = state["curriculum"]["pending"][2:]
    svc.store.put_bytes("curriculum/state.json", json.dumps(state).encode())
    again = _service(spec, f"file://{tmp_path}", bus)
    assert again.issued == 4 and again.step(timeout_s=0.0) == 0
    after = [(r.value.seq, r.value.prompt_id) for r in bus._logs[topics.prompts]][4:]
    assert after == first[2:4]
    assert again.step(timeout_s=0.0) == 0 and len(bus._logs[topics.prompts]) == 6  # once
