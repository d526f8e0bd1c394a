"""The semantic rules every consumer applies (scalerl.bus.validate), one hand-made record per rule, and
the one dead-letter header schema (scalerl.bus.dlq) on the memory bus."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from scalerl.bus.base import Record, TopicNames
from scalerl.bus.dlq import DLQ_HEADERS, DeadLetters, replay_headers
from scalerl.bus.memory import MemoryBus
from scalerl.bus.validate import REASON_CODES, InvalidRecord, Limits, check_scored, reason_for
from scalerl.messages import Completion, PolicyVersion, PromptTask, RolloutGroup, ScoredGroup

LIMITS = Limits(vocab_size=10, group_size=2, max_completion_tokens=5, prompt_ids=frozenset({"p1", "p2"}))


def _completion(n: int = 3, version: int = 1) -> Completion:
    return Completion(list(range(1, n + 1)), [-0.5] * n, [version] * n, [True] * n, "stop", "x")


def _scored(**change) -> ScoredGroup:
    task = PromptTask("p1", 0, "1+1=", "2", group_size=2, task="addition")
    group = ScoredGroup(RolloutGroup(task, [1, 2], [_completion(), _completion()]), [1.0, -1.0], [True, False])
    for path, value in change.items():
        obj = group
        *parents, last = path.split("__")
        for name in parents:
            obj = obj[int(name)] if name.isdigit() else getattr(obj, name)
        if last.isdigit():
            obj[int(last)] = value
        else:
            setattr(obj, last, value)
    return group


def test_a_valid_group_passes_every_rule() -> None:
    assert reason_for(_scored(), ScoredGroup, LIMITS, current_version=1) is None
    assert reason_for(_scored().rollout, RolloutGroup, LIMITS) is None
    assert reason_for(_scored().rollout.task, PromptTask, LIMITS) is None


@pytest.mark.parametrize(("change", "code", "names"), [
    ({"rollout__task__prompt_id": "p9"}, "unknown_prompt", "'p9'"),
    ({"rollout__task__group_size": 3}, "group_size", "task.group_size = 3"),
    ({"rollout__completions": [_completion()]}, "reward_count", "2 rewards"),
    ({"rewards": [1.0], "correct": [True], "rollout__completions": [_completion()]}, "group_size", "1 completions"),
    ({"rollout__completions__1__logprobs": [-0.5, -0.5]}, "array_lengths", "logprobs 2"),
    ({"rollout__completions__0__versions": [1, 1, 1, 1]}, "array_lengths", "versions 4"),
    ({"rollout__completions__0__loss_mask": [True]}, "array_lengths", "loss_mask 1"),
    ({"rollout__completions__1": _completion(n=6)}, "too_long", "6 tokens, allowed at most 5"),
    ({"rollout__completions__1__token_ids": [1, 50_000, 2]}, "token_out_of_range", "token 1 = 50000"),
    ({"rollout__completions__0__token_ids": [-1, 2, 3]}, "token_out_of_range", "[0, 10)"),
    ({"rollout__prompt_token_ids": [1, 10]}, "token_out_of_range", "prompt token 1 = 10"),
    ({"rollout__completions__0__logprobs": [-0.5, math.nan, -0.5]}, "non_finite_logprob", "logprob 1 = nan"),
    ({"rollout__completions__1__logprobs": [-math.inf, -0.5, -0.5]}, "non_finite_logprob", "= -inf"),
    ({"rewards": [math.nan, 1.0]}, "non_finite_reward", "reward 0 = nan"),
    ({"rewards": [1.0, math.inf]}, "non_finite_reward", "reward 1 = inf"),
    ({"rollout__completions__1": _completion(version=2)}, "version_out_of_range", "policy version 2, allowed [0, 1]"),
    ({"rollout__completions__0__versions": [1, -1, 1]}, "version_out_of_range", "token 1 has policy version -1"),
])
def test_each_rule_names_what_was_wrong(change, code, names) -> None:
    reason = reason_for(_scored(**copy.deepcopy(change)), ScoredGroup, LIMITS, current_version=1)
    assert reason is not None and reason.startswith(f"{code}: ") and names in reason, reason
    assert code in REASON_CODES


def test_the_version_bound_is_checked_only_when_the_consumer_knows_the_current_version() -> None:
    future = _scored(rollout__completions__1=_completion(version=7))
    assert reason_for(future, ScoredGroup, LIMITS) is None  # the verifier cannot know
    with pytest.raises(InvalidRecord) as exc:
        check_scored(future, LIMITS, current_version=6)
    assert exc.value.code == "version_out_of_range"


def test_a_record_of_another_type_is_named() -> None:
    pv = PolicyVersion(3, "s3://b/k", "ab")
    assert reason_for(pv, ScoredGroup, LIMITS) == "wrong_type: expected ScoredGroup, got PolicyVersion"


def test_limits_from_the_spec_cover_the_budgets_and_the_phrase(tiny_spec) -> None:
    limits = Limits.from_spec(tiny_spec, vocab_size=102, prompt_ids=["a"])
    g = tiny_spec.generation
    assert limits.max_completion_tokens == 24 + 6 + len(g.interruption.phrase.encode())
    assert limits.group_size == 4 and limits.vocab_size == 102 and set(limits.prompt_ids or ()) == {"a"}


def test_dead_letters_carry_one_header_schema_and_are_counted_by_code() -> None:
    bus = MemoryBus()
    topics = TopicNames("j")
    gate = DeadLetters(bus, topics.dlq, "j.learner")
    rec = Record("j.scored", 1, 42, "p1", _scored(), {"traceparent": "t", "reason": "forged"})
    gate.send(rec, "token_out_of_range: completion 1 token 1 = 50000, allowed [0, 10)")
    gate.send(rec, "non_finite_reward: reward 0 = nan, allowed finite")
    gate.send(rec, "non_finite_reward: reward 1 = nan, allowed finite")
    (first, *_) = bus.reader([topics.dlq]).poll()
    assert set(DLQ_HEADERS) <= set(first.headers)
    assert first.headers["reason"].startswith("token_out_of_range: ")
    assert (first.headers["source_topic"], first.headers["source_partition"], first.headers["source_offset"],
            first.headers["role"]) == ("j.scored", "1", "42", "j.learner")
    assert first.headers["traceparent"] == "t" and int(first.headers["dead_lettered_ms"]) > 0
    assert first.value == rec.value
    assert gate.counts == {"token_out_of_range": 1, "non_finite_reward": 2} and gate.total == 3


def test_replay_headers_drop_the_dead_letter_ones_and_name_the_dlq_offset() -> None:
    raw = {"reason": b"x", "source_topic": b"j.scored", "traceparent": b"t", "replayed_from_dlq_offset": b"1"}
    assert replay_headers(raw, 7) == [("traceparent", b"t"), ("replayed_from_dlq_offset", b"7")]


def test_the_learner_probe_raises_on_the_group_a_step_would_crash_on_and_changes_nothing(tiny_spec, tiny_model,
                                                                                         tokenizer) -> None:
    from scalerl.learner.learner import Learner

    learner = Learner(tiny_spec, tiny_model, pad_id=tokenizer.pad_token_id)
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    good = _scored(rollout__task__group_size=2)
    learner.probe(good)
    bad = _scored(rollout__completions__1__token_ids=[1, 50_000, 2])
    with pytest.raises(IndexError):
        learner.probe(bad)
    assert learner.version == 0
    assert all(torch.equal(before[k], v) for k, v in tiny_model.state_dict().items())


@pytest.mark.parametrize(("argv", "expect"), [
    (["dlq", "list", "--bus", "memory://", "--job", "j"], "--bus 'memory://': expected kafka://HOST:PORT"),
    (["dlq", "list", "--bus", "kafka://", "--job", "j"], "--bus 'kafka://': expected kafka://HOST:PORT"),
    (["dlq", "list", "--bus", "kafka://h:1", "--job", "a b"], "--job 'a b': expected the job's topic prefix"),
    (["dlq", "replay", "--bus", "kafka://h:1", "--job", "j"], "give exactly one of --offset N"),
    (["dlq", "replay", "--bus", "kafka://h:1", "--job", "j", "--all", "--offset", "3"], "give exactly one of"),
])
def test_scalerl_dlq_rejects_bad_input_with_one_line_and_exit_2(argv, expect, capsys) -> None:
    from scalerl.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect in err, err
