"""The verifier: completions -> rewards (ScaleRL §2: +1 correct, −1 incorrect; no KL, no shaping).

Decisions:
1. A truncated completion (finish "length") is incorrect whatever its text: it never finished its
   answer, and counting it wrong is what makes truncations visible as lost reward (verdict `truncated`;
   it is not graded).
2. With `length_control: length_penalty` (the loo-lp variant), correct completions get the DAPO
   overlong penalty clip((L_max − |y|)/L_cache − 1, −1, 0) added (App. A.11, Eq. 9).
3. Each completion is graded by `Task.grade`: its verdict counted in `verdicts`, code tasks' fraction of
   tests passed summed in `tests_passed_sum`. A task whose grading is not bounded by construction
   (`Task.grading_is_bounded`) grades in a child process with a time limit per completion
   (`Verifier.from_spec`, verifier/guard.py). A task whose grading waits on a process (code: the
   sandbox) sets `Task.concurrent_grading`: a group's completions are graded that many at a time.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from scalerl.config import JobSpec, LengthPenaltyConfig
from scalerl.messages import RolloutGroup, ScoredGroup
from scalerl.tasks import Task
from scalerl.tasks.base import Grade
from scalerl.verifier.guard import GuardedGrader

TRUNCATED = Grade(False, "truncated")


def length_penalty(n_tokens: int, cfg: LengthPenaltyConfig) -> float:
    """DAPO overlong penalty in [−1, 0] for a completion of `n_tokens` tokens."""
    return min(0.0, max(-1.0, (cfg.max_tokens - n_tokens) / cfg.cache_tokens - 1.0))


class Verifier:
    def __init__(self, task: Task, *, reward_correct: float = 1.0, reward_incorrect: float = -1.0,
                 penalty: LengthPenaltyConfig | None = None, guard: GuardedGrader | None = None) -> None:
        self.task = task
        self.guard = guard
        self.reward_correct = reward_correct
        self.reward_incorrect = reward_incorrect
        self.penalty = penalty
        self.verdicts: Counter[str] = Counter()  # completions graded, by verdict
        self.grading_seconds = 0.0  # summed Grade.seconds (code: sandboxed execution time)
        self.tests_passed_sum = 0.0  # summed Grade.metrics["tests_passed"] (code tasks)
        self._lock = threading.Lock()  # Score calls over gRPC grade beside the bus loop
        workers = max(1, int(getattr(task, "concurrent_grading", 1)))
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="grade") if workers > 1 else None

    @classmethod
    def from_spec(cls, spec: JobSpec, task: Task) -> Verifier:
        """The verifier of a job: its task's rewards and, with length_control: length_penalty, the penalty."""
        g = spec.generation
        guard = None if task.grading_is_bounded else GuardedGrader(spec.task.model_dump(mode="json"),
                                                                   spec.task.grade_time_limit_s)
        return cls(task, reward_correct=spec.task.reward_correct, reward_incorrect=spec.task.reward_incorrect,
                   penalty=g.length_penalty if g.length_control == "length_penalty" else None, guard=guard)

    def grade(self, text: str, answer: str, finish_reason: str = "stop") -> Grade:
        if finish_reason == "length":
            g = TRUNCATED
        else:
            g = self.guard.grade(text, answer) if self.guard is not None else self.task.grade(text, answer)
        with self._lock:
            self.verdicts[g.verdict] += 1
            self.grading_seconds += g.seconds
            self.tests_passed_sum += (g.metrics or {}).get("tests_passed", 0.0)
        return g

    def close(self) -> None:
        """End the guarded grader's child process, if any (it also ends with this process)."""
        if self.guard is not None:
            self.guard.close()

    def is_correct(self, text: str, answer: str, finish_reason: str = "stop") -> bool:
        return self.grade(text, answer, finish_reason).correct

    def grade_all(self, items: Sequence[tuple[str, str, str]]) -> list[Grade]:
        """`grade` of each (text, answer, finish_reason), as many at once as the task allows
        (`Task.concurrent_grading`), in order."""
        return list(self._pool.map(lambda a: self.grade(*a), items)) if self._pool else [self.grade(*a) for a in items]

    def score(self, rollout: RolloutGroup) -> ScoredGroup:
        answer = rollout.task.answer
        grades = self.grade_all([(c.text, answer, c.finish_reason) for c in rollout.completions])
        correct, rewards = [], []
        for c, g in zip(rollout.completions, grades, strict=True):
            r = self.reward_correct if g.correct else self.reward_incorrect
            if g.correct and self.penalty is not None:
                r += length_penalty(len(c.token_ids), self.penalty)
            correct.append(g.correct)
            rewards.append(r)
        return ScoredGroup(rollout=rollout, rewards=rewards, correct=correct)
