"""The verifier: completions -> rewards (ScaleRL §2: +1 correct, −1 incorrect; no KL, no shaping).

Decisions:
1. A truncated completion (finish "length") is incorrect whatever its text: it never finished its
   answer, and counting it wrong is what makes truncations visible as lost reward.
2. With `length_control: length_penalty` (the loo-lp variant), correct completions get the DAPO
   overlong penalty clip((L_max − |y|)/L_cache − 1, −1, 0) added (App. A.11, Eq. 9).
"""

from __future__ import annotations

from scalerl.config import LengthPenaltyConfig
from scalerl.messages import RolloutGroup, ScoredGroup
from scalerl.tasks import Task


def length_penalty(n_tokens: int, cfg: LengthPenaltyConfig) -> float:
    """DAPO overlong penalty in [−1, 0] for a completion of `n_tokens` tokens."""
    return min(0.0, max(-1.0, (cfg.max_tokens - n_tokens) / cfg.cache_tokens - 1.0))


class Verifier:
    def __init__(self, task: Task, *, reward_correct: float = 1.0, reward_incorrect: float = -1.0,
                 penalty: LengthPenaltyConfig | None = None) -> None:
        self.task = task
        self.reward_correct = reward_correct
        self.reward_incorrect = reward_incorrect
        self.penalty = penalty

    def is_correct(self, text: str, answer: str, finish_reason: str = "stop") -> bool:
        return finish_reason != "length" and self.task.is_correct(text, answer)

    def score(self, rollout: RolloutGroup) -> ScoredGroup:
        correct, rewards = [], []
        for c in rollout.completions:
            ok = self.is_correct(c.text, rollout.task.answer, c.finish_reason)
            r = self.reward_correct if ok else self.reward_incorrect
            if ok and self.penalty is not None:
                r += length_penalty(len(c.token_ids), self.penalty)
            correct.append(ok)
            rewards.append(r)
        return ScoredGroup(rollout=rollout, rewards=rewards, correct=correct)
