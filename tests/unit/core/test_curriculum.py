"""Curriculum: epochs, No-Positive-Resampling from the next epoch only, flow control, exact resume."""

from __future__ import annotations

from scalerl.curriculum.curriculum import Curriculum
from scalerl.messages import Completion, PromptTask, RolloutGroup, ScoredGroup
from scalerl.tasks import Problem


def _problems(n: int) -> list[Problem]:
    return [Problem(f"p{i}", f"{i}+0=", str(i), "") for i in range(n)]


def _scored(task: PromptTask, n_correct: int, g: int = 4) -> ScoredGroup:
    c = Completion([1], [0.0], [0], [True], "stop", "x")
    correct = [i < n_correct for i in range(g)]
    return ScoredGroup(RolloutGroup(task, [1], [c] * g), [1.0 if ok else -1.0 for ok in correct], correct)


def test_flow_control_and_epochs():
    cur = Curriculum(_problems(5), task_name="t", group_size=4, seed=0, max_inflight=3)
    first = cur.next_tasks()
    assert len(first) == 3 and cur.next_tasks() == []  # capped at 3 outstanding
    cur.consumed([_scored(first[0], 1)])
    more = cur.next_tasks()
    assert len(more) == 1
    seen = [t.prompt_id for t in first + more]
    cur.consumed([_scored(t, 1) for t in first[1:] + more])
    rest = cur.next_tasks()
    # epoch 0 has 5 prompts: 4 issued, 1 left, then epoch 1 starts
    assert [t.epoch for t in rest] == [0, 1, 1]
    assert sorted([*seen, rest[0].prompt_id]) == [f"p{i}" for i in range(5)]


def test_npr_retires_from_the_next_epoch_only():
    cur = Curriculum(_problems(4), task_name="t", group_size=4, seed=1, max_inflight=4)
    tasks = cur.next_tasks()
    easy = tasks[0]
    cur.consumed([_scored(easy, 4)] + [_scored(t, 1) for t in tasks[1:]])  # easy: 4/4 >= 0.9
    assert cur.retired_count == 0  # mid-epoch: nothing retired yet
    nxt = cur.next_tasks()  # epoch 0 exhausted -> epoch 1 (and 2) built without the easy prompt
    assert [t.epoch for t in nxt] == [1, 1, 1, 2]
    assert easy.prompt_id not in [t.prompt_id for t in nxt]
    assert cur.retired_count == 1


def test_npr_off_keeps_every_prompt():
    cur = Curriculum(_problems(3), task_name="t", group_size=4, seed=1, max_inflight=3, npr=False)
    tasks = cur.next_tasks()
    cur.consumed([_scored(t, 4) for t in tasks])
    assert len(cur.next_tasks()) == 3


def test_duplicates_are_not_double_counted():
    cur = Curriculum(_problems(3), task_name="t", group_size=4, seed=0, max_inflight=2)
    t = cur.next_tasks()[0]
    assert cur.consumed([_scored(t, 2)]) == 0
    assert cur.consumed([_scored(t, 2)]) == 1  # redelivered: ignored
    assert cur.history.pass_rate(t.prompt_id) == 0.5


def test_state_round_trip_reissues_outstanding_prompts_first():
    cur = Curriculum(_problems(6), task_name="t", group_size=4, seed=2, max_inflight=3)
    issued = cur.next_tasks()
    cur.consumed([_scored(issued[0], 3)])
    state = cur.state_dict()
    again = Curriculum(_problems(6), task_name="t", group_size=4, seed=2, max_inflight=3)
    again.load_state_dict(state)
    resumed = again.next_tasks()
    # the two outstanding prompts come back first (nothing lost), then the epoch continues
    assert [t.prompt_id for t in resumed[:2]] == [t.prompt_id for t in issued[1:]]
    assert cur.next_tasks()[0].prompt_id == resumed[2].prompt_id
    assert again.history.pass_rate(issued[0].prompt_id) == 0.75
