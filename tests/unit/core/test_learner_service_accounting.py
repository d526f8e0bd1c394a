"""The distributed learner's accounting over a bus shared by a "dead" and a "resumed" learner (the memory
bus, which keeps committed offsets as Kafka does; the real broker is tests/integration). #27:
- finding 1: a learner with no checkpoint reads `scored` from the beginning, not from a dead learner's
  committed offsets (whose groups were otherwise never counted: the curriculum's in-flight cap filled and the
  run deadlocked), starts its run files afresh and writes a step-0 checkpoint;
- finding 5 (the learner's side): a group the learner dead-letters counts as decided, once across a restart;
- finding 7: with k = 1 and generators slow to load the newest weights, the batch the learner waits with
  counts as consumed, so the curriculum issues the prompts whose rollouts end the wait; chaos seed 13: so
  does every other group it holds while it waits (those prompts, too, can come back from the old weights).
"""

from __future__ import annotations

import math
import threading
import time

import pytest

from scalerl.bus import TopicNames
from scalerl.bus.memory import MemoryBus
from scalerl.learner.checkpoint import load_trainer_state
from scalerl.messages import Completion, PolicyVersion, PromptTask, RolloutGroup, ScoredGroup
from scalerl.model.text import encode_prompt, text_ids
from scalerl.parts import make_task
from scalerl.runtime import learner_service
from scalerl.runtime.learner_service import LearnerService
from scalerl.runtime.roles import ServiceContext
from scalerl.store import open_store
from scalerl.store.checkpoints import download_latest_checkpoint

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def job(tiny_spec, tmp_path, monkeypatch):
    """(spec, shared bus, ServiceContext factory): every learner of the test opens the same bus."""
    spec = tiny_spec.model_copy(deep=True)
    spec.off_policy.mode = "pipeline"
    spec.train.prompts_per_step = 2
    spec.train.checkpoint_every = 50
    spec.eval.every_steps = 50
    bus = MemoryBus()
    monkeypatch.setattr(learner_service, "open_bus", lambda url: bus)
    bus.close = lambda: None  # a learner's close() must not end the shared log

    def ctx() -> ServiceContext:
        return ServiceContext(spec, "memory://", f"file://{tmp_path / 'store'}", "learner-0", tmp_path / "out")
    return spec, bus, ctx


def _group(spec, tokenizer, i: int, version: int, *, epoch: int = 0, reward_nan: bool = False) -> ScoredGroup:
    problem = make_task(spec).problems("train")[i]
    task = PromptTask(problem.id, epoch, problem.prompt, problem.answer, spec.generation.group_size, spec.task.kind)
    ids = [*text_ids(tokenizer, "7"), tokenizer.eos_token_id]
    comps = [Completion(ids, [-1.0] * len(ids), [version] * len(ids), [True] * len(ids), "stop", "7")
             for _ in range(spec.generation.group_size)]
    rewards = [1.0, -1.0] * (spec.generation.group_size // 2)
    if reward_nan:
        rewards[0] = math.nan
    return ScoredGroup(RolloutGroup(task, encode_prompt(tokenizer, problem.prompt), comps), rewards,
                       [r > 0 for r in rewards])


def _publish(bus: MemoryBus, spec, groups: list[ScoredGroup]) -> None:
    for g in groups:
        bus.publish(TopicNames.of(spec).scored, g, key=g.rollout.task.prompt_id)


def test_a_learner_without_checkpoint_reads_scored_from_the_beginning(job, tokenizer):
    spec, bus, ctx = job
    topics = TopicNames.of(spec)
    _publish(bus, spec, [_group(spec, tokenizer, i, 0) for i in range(4)])
    dead = bus.consumer([topics.scored], topics.group("learner"))  # the dead learner: read 4, committed 4
    assert len(dead.poll()) == 4
    dead.commit()
    out = ctx().out_dir
    out.mkdir(parents=True)
    (out / "train.jsonl").write_text('{"kind": "step", "step": 1}\n{"kind": "step", "step": 2}\n')

    svc = LearnerService(ctx())
    svc.build()
    assert not (out / "train.jsonl").exists()  # no step numbers of the dead timeline are appended to
    ckpt = download_latest_checkpoint(open_store(ctx().store_url), out / "fetched")
    assert ckpt is not None and ckpt.name == "step_000000"
    state = load_trainer_state(ckpt)
    assert state["bus_positions"] == {f"{topics.scored}:0": 0}
    svc._poll_scored(threading.Event())
    assert len(svc.buffer) == 4  # (today's code: 0 — it started from the dead learner's offset 4)
    svc.close()


def test_a_dead_lettered_group_is_decided_once_across_a_restart(job, tokenizer):
    spec, bus, ctx = job
    topics = TopicNames.of(spec)
    svc = LearnerService(ctx())
    svc.build()
    # a valid group waits in the buffer (so the safe position stays before the bad one), then a bad one
    _publish(bus, spec, [_group(spec, tokenizer, 0, 0), _group(spec, tokenizer, 1, 0, reward_nan=True)])
    svc._poll_scored(threading.Event())
    assert svc._consumed() == 1 and len(bus._logs[topics.dlq]) == 1  # (today's code: 0 consumed)
    svc._checkpoint()
    svc.close()

    again = LearnerService(ctx())
    again.build()
    again._poll_scored(threading.Event())
    assert len(again.buffer) == 1 and again._consumed() == 1
    assert len(bus._logs[topics.dlq]) == 1  # read again after the restart, not dead-lettered twice
    again.close()


def _announced_consumed(bus: MemoryBus, spec) -> list[int]:
    return [int(r.headers["learner_consumed"]) for r in bus._logs.get(TopicNames.of(spec).policy, [])
            if isinstance(r.value, PolicyVersion) and "learner_consumed" in r.headers]


def test_the_batch_held_while_waiting_for_fresher_rollouts_counts_as_consumed(job, tokenizer):
    spec, bus, ctx = job
    spec.off_policy.k = 1
    spec.train.steps = 2
    svc = LearnerService(ctx())
    stop = threading.Event()
    result: dict[str, object] = {}
    thread = threading.Thread(target=lambda: result.update(summary=svc.run(stop)), daemon=True)
    thread.start()
    try:
        _publish(bus, spec, [_group(spec, tokenizer, i, 0) for i in range(2)])
        _wait(lambda: 2 in _announced_consumed(bus, spec), "step 1")
        # generators slow to load version 1: two more groups of version 0; the learner takes them and waits
        _publish(bus, spec, [_group(spec, tokenizer, i, 0) for i in range(2, 4)])
        _wait(lambda: 4 in _announced_consumed(bus, spec), "the waiting batch counted as consumed")
        assert svc.learner.version == 1  # still waiting: (today's code announced 2 and the run deadlocked)
        _publish(bus, spec, [_group(spec, tokenizer, 4, 1)])  # what the curriculum could then issue
        thread.join(timeout=120)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert result.get("summary") is not None and svc.learner.version == 2


def test_every_group_held_while_waiting_for_fresher_rollouts_counts_as_consumed(job, tokenizer):
    """Chaos seed 13: the prompts issued for the waiting batch came back generated by the old weights too (a
    generator slow to load them; there, a curriculum round re-issued after a crash as well). They waited in the
    buffer, held the in-flight slots, and the curriculum issued nothing more: no fresher rollout could ever
    end the wait. Every group held while waiting counts as consumed, so the curriculum keeps issuing."""
    spec, bus, ctx = job
    spec.off_policy.k = 1
    spec.train.steps = 2
    svc = LearnerService(ctx())
    stop = threading.Event()
    result: dict[str, object] = {}
    thread = threading.Thread(target=lambda: result.update(summary=svc.run(stop)), daemon=True)
    thread.start()
    try:
        _publish(bus, spec, [_group(spec, tokenizer, i, 0) for i in range(2)])
        _wait(lambda: 2 in _announced_consumed(bus, spec), "step 1")
        _publish(bus, spec, [_group(spec, tokenizer, i, 0) for i in range(2, 4)])  # the waiting batch
        _wait(lambda: 4 in _announced_consumed(bus, spec), "the waiting batch counted as consumed")
        # the 2 prompts the curriculum then issued (6 issued, 2 = k x B in flight), generated by version 0 again
        _publish(bus, spec, [_group(spec, tokenizer, i, 0) for i in range(4, 6)])
        _wait(lambda: len(svc.buffer) == 2, "the learner holds them")
        # today's code: still 4, so the curriculum (6 issued, 4 consumed, 2 in flight) never issues again
        _wait(lambda: _announced_consumed(bus, spec)[-1] == 6, "the held groups counted as consumed", 30)
        assert svc.learner.version == 1
        _publish(bus, spec, [_group(spec, tokenizer, 6, 1)])  # what the curriculum could then issue
        thread.join(timeout=120)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert result.get("summary") is not None and svc.learner.version == 2


def _wait(predicate, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_learner_outlived_by_its_replacement_is_fenced(job, tokenizer, tiny_model):
    """#27 finding 7: two live learners (a force-deleted Pod still running): the newer one's epoch wins; the
    older stops before its next upload, and readers of `policy` ignore its announcements."""
    from scalerl.bus.fencing import FenceFilter
    from scalerl.bus.validate import Limits
    from scalerl.generator.role import GeneratorRole
    from scalerl.generator.torch_engine import TorchEngine
    from scalerl.store.fencing import Fenced

    spec, bus, ctx = job
    old = LearnerService(ctx())
    old.build()
    new = LearnerService(ctx())
    new.build()
    assert (old.epoch, new.epoch) == (1, 2)
    with pytest.raises(Fenced, match="epoch 1, the store says 2"):
        old._publish()
    with pytest.raises(Fenced):
        old._checkpoint()
    # a zombie announcement that got out before the check (the same object again, with its old epoch)
    bus.publish(TopicNames.of(spec).policy, old.announced, key="policy", headers=old._policy_headers())
    fence = FenceFilter()
    admitted = [r.value for r in bus._logs[TopicNames.of(spec).policy] if fence.admits(r.headers)]
    assert admitted[-1] == new.announced and fence.fenced == 1
    generator = GeneratorRole(spec, TorchEngine(tiny_model, tokenizer, seed=0), tokenizer, bus,
                              open_store(ctx().store_url), TopicNames.of(spec),
                              Limits(vocab_size=10_000, group_size=spec.generation.group_size,
                                     max_completion_tokens=10_000), group="job.generators")
    assert generator.poll_policy() is not None
    assert generator.loaded == new.announced and generator.fence.fenced == 1  # not the zombie's, announced last
    new.close()


def test_a_restore_from_the_step_0_checkpoint_drops_the_dead_timelines_run_files(job):
    """The step-0 checkpoint holds no train.jsonl: a learner killed at step 2 and restored from it must not
    append its redone steps to the dead process's records (found by the chaos run: steps 1, 2, 3 twice)."""
    _, _, ctx = job
    first = LearnerService(ctx())
    first.build()
    out = ctx().out_dir
    (out / "train.jsonl").write_text('{"kind": "step", "step": 1}\n{"kind": "step", "step": 2}\n')
    first.close()  # (killed: nothing more is checkpointed)
    resumed = LearnerService(ctx())
    resumed.build()
    assert not (out / "train.jsonl").exists()
    resumed.close()


def test_a_finished_run_uploads_its_files_and_logs_each_step(job, tokenizer, caplog):
    """#26: summary.json and report.html live in the pod's emptyDir: the learner uploads them (and metrics.jsonl,
    train.jsonl) to <store>/run/ before it announces `done` (which says how many); one log line per step."""
    from scalerl.messages import MetricRecord

    spec, bus, ctx = job
    spec.train.steps = 1
    svc = LearnerService(ctx())
    _publish(bus, spec, [_group(spec, tokenizer, i, 0) for i in range(2)])
    with caplog.at_level("INFO", logger="scalerl"):
        summary = svc.run(threading.Event())
    assert summary is not None and svc.learner.version == 1
    store = open_store(ctx().store_url)
    uploaded = {k for k in store.list("run/")}
    assert {"run/summary.json", "run/metrics.jsonl", "run/train.jsonl"} <= uploaded
    assert store.get_bytes("run/summary.json") == (ctx().out_dir / "summary.json").read_bytes()
    done = [r.value for r in bus._logs[TopicNames.of(spec).metrics]
            if isinstance(r.value, MetricRecord) and r.value.kind == "done"]
    assert len(done) == 1 and done[0].values["run_files"] == len(uploaded)
    assert done[0].values["report_html"] == float("run/report.html" in uploaded)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 1/1: loss ")]
    assert len(lines) == 1 and "rollouts/s" in lines[0] and "(bound k=" in lines[0], caplog.text
