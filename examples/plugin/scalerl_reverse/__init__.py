"""`reverse`: write a word of lowercase letters backwards. A scalerl task plugin (docs/guides/own-task.md).

Symbolic prompt (the tiny model learns it from scratch):

    rev abcd=

Gold solution (for SFT; the model thinks, then answers after `</think>`):

    <think>d c b a</think>dcba

Chat phrasing asks in words and reads the answer from an `Answer:` line or `\\boxed{}`.
The verifier is an exact match of the answer text: `dcba` is right, `dcb a` and `DCBA` are not.

Settings come from the job spec's `task` section: `task.data_seed` (the `seed` here), `task.train_size`,
`task.eval_size`, `task.phrasing`, and this plugin's own `task.options`, checked by `Options` when the
spec is loaded (`task.options.length: Input should be less than or equal to 12` for a bad value).
This module imports no torch, so a spec with a bad option is refused at once.
"""

from __future__ import annotations

import string
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field

from scalerl.tasks import Problem, Split, Task
from scalerl.tasks.base import answer_after_think, check_split, final_answer_text, sample_disjoint


class Options(BaseModel):
    """`task.options` of the reverse task."""

    model_config = ConfigDict(extra="forbid")  # a misspelt option is refused, never ignored

    length: int = Field(4, ge=1, le=12, description="Letters per word.")
    letters: int = Field(26, ge=2, le=26, description="Alphabet size: words use the first N lowercase letters.")


class ReverseTask(Task):
    """Reverse a word; the entry point `reverse = "scalerl_reverse:ReverseTask"` names this class."""

    Options = Options  # scalerl validates `task.options` with this model and passes the instance

    def __init__(self, *, seed: int, train_size: int, eval_size: int, phrasing: str, options: Options) -> None:
        if phrasing not in ("symbolic", "chat"):
            raise ValueError(f"phrasing must be 'symbolic' or 'chat', got {phrasing!r}")
        self.name = f"reverse{options.length}"
        self.seed, self.train_size, self.eval_size = seed, train_size, eval_size
        self.phrasing, self.options = phrasing, options
        space = options.letters ** options.length
        if eval_size >= space:  # refused when the spec is checked, before anything runs
            raise ValueError(f"eval_size={eval_size} must be smaller than the {space} words of "
                             f"{options.length} letters from {options.letters}")

    @cached_property
    def _splits(self) -> dict[Split, list[Problem]]:
        """Both splits, generated on first use: no eval word appears in train (`sample_disjoint`)."""
        alphabet = string.ascii_lowercase[:self.options.letters]
        train, held = sample_disjoint(lambda rng: "".join(rng.choice(alphabet) for _ in range(self.options.length)),
                                      stream=f"{self.name}/{self.seed}", train_size=self.train_size,
                                      eval_size=self.eval_size)
        return {"train": [self._problem(w, "train", i) for i, w in enumerate(train)],
                "eval": [self._problem(w, "eval", i) for i, w in enumerate(held)]}

    def _problem(self, word: str, split: Split, i: int) -> Problem:
        answer = word[::-1]
        prompt = (f"rev {word}=" if self.phrasing == "symbolic" else
                  f"Write the word '{word}' backwards. End with a line 'Answer: <the reversed word>'.")
        return Problem(id=f"{self.name}-{split}-{i:06d}", prompt=prompt, answer=answer,
                       solution=f"<think>{' '.join(answer)}</think>{answer}")

    def problems(self, split: Split) -> list[Problem]:
        return list(self._splits[check_split(split)])

    @property
    def has_solutions(self) -> bool:
        """Every word has its gold solution (SFT may imitate it); known without generating the words."""
        return True

    def extract_answer(self, completion: str) -> str | None:
        if self.phrasing == "symbolic":
            return answer_after_think(completion)
        return final_answer_text(completion)

    def is_correct(self, completion: str, answer: str) -> bool:
        """The verifier: exact match of the stated answer (never raises)."""
        got = self.extract_answer(completion)
        return got is not None and got.strip().strip("'\".") == answer
