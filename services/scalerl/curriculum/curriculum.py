"""The curriculum: epochs over the training prompts, No-Positive-Resampling, flow control.

- Each epoch visits the eligible prompts in a fresh seeded permutation.
- No-Positive-Resampling (ScaleRL §2.7): a prompt whose *cumulative* training pass rate reaches the
  threshold (0.9) is retired permanently, from the **next** epoch on — the eligible set is frozen at
  each epoch boundary, never changed mid-epoch.
- Flow control: at most `max_inflight` prompts are outstanding (issued, not yet consumed by the
  learner). Outstanding prompts are part of the checkpointed state and are re-issued first on resume,
  so a restart neither loses nor repeats a prompt.

The pass-rate history is updated from the scored groups the learner consumed (including
zero-variance and stale-dropped groups: they are still observations of the policy).
"""

from __future__ import annotations

import random
from typing import Any

from scalerl.messages import PromptTask, ScoredGroup
from scalerl.recipe import PassRateHistory, npr_keep
from scalerl.tasks import Problem


class CurriculumExhausted(RuntimeError):
    """Every training prompt has been retired by No-Positive-Resampling."""


class Curriculum:
    def __init__(self, problems: list[Problem], *, task_name: str, group_size: int, seed: int,
                 max_inflight: int, npr: bool = True, npr_threshold: float = 0.9,
                 limit_prompts: int | None = None) -> None:
        if limit_prompts is not None:
            problems = problems[:limit_prompts]
        if not problems:
            raise ValueError("the training set is empty")
        self.problems = {p.id: p for p in problems}
        self.order_ids = [p.id for p in problems]
        self.task_name = task_name
        self.group_size = group_size
        self.seed = seed
        self.max_inflight = max_inflight
        self.npr = npr
        self.npr_threshold = npr_threshold
        self.history = PassRateHistory()
        self.epoch = -1
        self.cursor = 0
        self.epoch_order: list[str] = []
        self.pending: dict[str, PromptTask] = {}  # key: prompt_id@epoch
        self.reissue: list[PromptTask] = []
        self.retired_count = 0
        self.seq = 0  # the last issue number given (PromptTask.seq: 1, 2, 3, ...; scalerl.bus.dedup)
        self._start_epoch()

    def _start_epoch(self) -> None:
        self.epoch += 1
        eligible = list(self.order_ids)
        if self.npr and self.epoch > 0:
            eligible = npr_keep(eligible, self.history, threshold=self.npr_threshold)
        self.retired_count = len(self.order_ids) - len(eligible)
        if not eligible:
            raise CurriculumExhausted(
                f"all {len(self.order_ids)} training prompts retired by No-Positive-Resampling "
                f"(pass rate >= {self.npr_threshold}) at epoch {self.epoch}")
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
        rng.shuffle(eligible)
        self.epoch_order = eligible
        self.cursor = 0

    def _task(self, pid: str) -> PromptTask:
        p = self.problems[pid]
        self.seq += 1
        return PromptTask(prompt_id=pid, epoch=self.epoch, prompt=p.prompt, answer=p.answer,
                          group_size=self.group_size, task=self.task_name, seq=self.seq)

    @staticmethod
    def key(task: PromptTask) -> str:
        return task.group_id

    def next_tasks(self, outstanding: int | None = None) -> list[PromptTask]:
        """Tasks to issue now: re-issues first (under their issue numbers), then new ones, each numbered,
        up to the in-flight cap.

        `outstanding`: prompts issued and not yet consumed by the learner, when the caller counts them
        (the distributed curriculum: issued − B × learner steps); default: the pending ones.
        """
        out: list[PromptTask] = []
        base = 0 if outstanding is None else outstanding - len(self.pending)
        while base + len(self.pending) < self.max_inflight:
            if self.reissue:
                task = self.reissue.pop(0)
            else:
                if self.cursor >= len(self.epoch_order):
                    self._start_epoch()
                task = self._task(self.epoch_order[self.cursor])
                self.cursor += 1
            self.pending[self.key(task)] = task
            out.append(task)
        return out

    def consumed(self, groups: list[ScoredGroup]) -> int:
        """The learner consumed these groups: update the history, free their in-flight slots.

        Returns how many were duplicates (already consumed) — they are ignored, never double-counted.
        """
        dup = 0
        for g in groups:
            if self.pending.pop(self.key(g.rollout.task), None) is None:
                dup += 1
                continue
            self.history.update(g.rollout.task.prompt_id, n_correct=sum(g.correct), n_total=len(g.correct))
        return dup

    @property
    def active_prompts(self) -> int:
        return len(self.epoch_order)

    # -- checkpoint ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch, "cursor": self.cursor, "epoch_order": list(self.epoch_order),
            "history": self.history.state_dict(),
            "pending": [task_dict(t) for t in [*self.reissue, *self.pending.values()]],
            "retired_count": self.retired_count, "seq": self.seq,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self.epoch_order = list(state["epoch_order"])
        self.history.load_state_dict(state["history"])
        self.retired_count = int(state.get("retired_count", 0))
        self.seq = int(state.get("seq", 0))
        self.pending = {}
        self.reissue = [PromptTask(**t) for t in state["pending"]]


def task_dict(t: PromptTask) -> dict[str, Any]:
    """A task as JSON (the curriculum's saved state)."""
    return {"prompt_id": t.prompt_id, "epoch": t.epoch, "prompt": t.prompt, "answer": t.answer,
            "group_size": t.group_size, "task": t.task, "split": t.split, "seq": t.seq}
