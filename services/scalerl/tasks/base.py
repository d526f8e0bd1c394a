"""The verifiable-task interface: a `Task` hands out `Problem`s and decides whether a completion is right.

A task is two things the rest of the stack needs and nothing more:

- **prompts with references** (`problems("train" | "eval")`): the curriculum owns them, the SFT stage
  trains on `Problem.solution`, the evaluator scores the held-out split;
- **a verifier** (`extract_answer` + `is_correct`): the verifier role turns a completion into a
  reward with it. It must never raise on model output, however malformed.

Conventions shared by every task:

1. The model thinks inside `<think>...</think>` and writes its final answer after the **last**
   `</think>` (the ScaleRL interruption phrase ends with `</think>`, so a cut completion still has
   one). `answer_after_think` is that rule.
2. `Problem.solution` is the gold completion for SFT, `"<think>...</think>" + answer text`, without
   `<eos>` (the SFT code appends it) and without the prompt.
3. `phrasing` (every task): "symbolic" is the compact prompt the tiny model learns from scratch
   (`357+468=`), its answer strictly the text after `</think>`; "chat" asks in natural language for an
   instruct model and reads the answer from free text (`final_answer_text`: after the last `</think>`
   when there is one, the last `Answer: ...` line, else the last `\boxed{...}`; each task states its
   fallback, e.g. the last number). Rewards are the verifier's either way.
4. Generated tasks draw train and eval problems from separate, seeded random streams
   (`sample_disjoint`): eval is drawn first and every train draw that collides with an eval problem
   is rejected, so no eval prompt appears in train, and the eval set does not change with
   `train_size`.
"""

from __future__ import annotations

import hashlib
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from scalerl.model.tokenizer import THINK_CLOSE

Split = Literal["train", "eval"]
Phrasing = Literal["symbolic", "chat"]
PHRASINGS: tuple[Phrasing, ...] = ("symbolic", "chat")
_ANSWER_LINE = re.compile(r"answer\s*[:：]\s*(.+)", re.IGNORECASE)
SPLITS: tuple[Split, ...] = ("train", "eval")
K = TypeVar("K", bound=Hashable)

# Draws in a row that may be rejected as duplicates before we decide the problem space is exhausted.
_MAX_REJECTS_IN_A_ROW = 2_000


@dataclass(frozen=True, slots=True)
class Problem:
    """One prompt with its reference answer and gold solution."""

    id: str
    """Stable and unique within the task, e.g. `"add3-train-000017"`."""
    prompt: str
    """Text the model sees, after a `<bos>` the caller adds."""
    answer: str
    """Reference answer in canonical form (what `is_correct` compares against)."""
    solution: str
    """Gold completion for SFT: `"<think>...</think>" + final answer` (no `<eos>`); `""` if none."""


@dataclass(frozen=True, slots=True)
class Grade:
    """A verifier's decision on one completion, with what a person checking a task wants to see."""

    correct: bool
    verdict: str
    """Why: `correct`/`wrong`/`no_answer` for answer tasks; code tasks add `pass`, `fail`, `error`, `timeout`,
    `memory`, `forbidden`, ... (tasks/code_grading.py)."""
    seconds: float = 0.0
    """Time spent deciding (for code: the sandboxed execution's wall time)."""
    metrics: dict[str, float] | None = None
    """Task-specific numbers, e.g. code's `tests_passed` (fraction of asserts passed)."""
    detail: str = ""


class Task(ABC):
    """A family of verifiable problems. Subclasses are cheap to build and pure after construction."""

    name: str
    grading_is_bounded: bool = False
    """Whether `grade` finishes in a time bounded by the completion's length whatever the text (the built-in
    arithmetic and Countdown checks; code, under the sandbox's limits). A task that does not say so is
    graded in a child process with `task.grade_time_limit_s` per completion (scalerl/verifier/guard.py)."""
    concurrent_grading: int = 1
    """How many completions the verifier may grade at once (a task whose grading waits on a subprocess,
    such as code in the sandbox, sets more)."""

    @abstractmethod
    def problems(self, split: Split) -> list[Problem]:
        """All problems of `split`, deterministic given the task's seed; train ∩ eval prompts = ∅."""

    @property
    def has_solutions(self) -> bool:
        """Whether the train problems carry gold solutions (`Problem.solution`) for SFT to imitate. A spec
        asking for SFT (`sft.steps > 0` and no `model.init_checkpoint`) of a task without them is refused
        when it is checked. This default generates the train split and looks at it; a task that knows
        without generating (or for which generating is costly) overrides it."""
        return any(p.solution for p in self.problems("train"))

    def tool_demonstration(self, problem: Problem, tools: Sequence[str]) -> list[str] | None:
        """A gold episode of `problem` with `tools` (`environment.tools`) for SFT to imitate: the model's
        turns, each but the last ending with one call (`tool_call`) whose answer the tool supplies between
        them when the example is built; the last turn closes `</think>` and answers. None (this default):
        the task has none for these tools, and SFT imitates `Problem.solution` instead."""
        return None

    def extract_answer(self, completion: str) -> str | None:
        """The final answer text after the last `</think>` (stripped); None if there is none."""
        return answer_after_think(completion)

    @abstractmethod
    def is_correct(self, completion: str, answer: str) -> bool:
        """The verifier's decision for `completion` against the reference `answer`. Never raises."""

    def grade(self, completion: str, answer: str) -> Grade:
        """`is_correct` with its verdict: `correct`, `wrong`, or `no_answer` when `extract_answer` finds none.
        Tasks with more to say (code: the tests' verdict and the fraction passed) override it."""
        if self.is_correct(completion, answer):
            return Grade(True, "correct")
        return Grade(False, "wrong" if self.extract_answer(completion) is not None else "no_answer")


def tool_call(name: str, text: str) -> str:
    """A tool call as the model writes it (`scalerl.environment.tools` parses it and tells the model so):
    `<tool name="calculator">\n12+7\n</tool>`."""
    return f'<tool name="{name}">\n{text}\n</tool>'


def answer_after_think(completion: str) -> str | None:
    """Text after the last `</think>`, stripped; None when `</think>` is absent or nothing follows."""
    _, sep, tail = completion.rpartition(THINK_CLOSE)
    if not sep:
        return None
    tail = tail.strip()
    return tail or None


def problem_set_fingerprint(problems: Sequence[Problem]) -> str:
    """A 16-hex-digit SHA-256 digest of `problems` in order (id, prompt and reference answer of each).

    Ids alone do not identify a held-out set (they are positions, `add3-eval-000017`, the same for every
    data seed), so the prompt and answer text go in too. Runs whose eval records carry equal fingerprints
    were evaluated on the same prompts; `scalerl compare` warns when they differ.
    """
    digest = hashlib.sha256()
    for p in problems:
        for part in (p.id, p.prompt, p.answer):
            digest.update(part.encode("utf-8"))
            digest.update(b"\x1f")  # unit separator: ("ab", "c") and ("a", "bc") hash differently
        digest.update(b"\x1e")
    return digest.hexdigest()[:16]


def answer_region(completion: str) -> str:
    """Where a chat-phrased answer is looked for: the text after the last `</think>`, else all of it."""
    return completion.rpartition(THINK_CLOSE)[2]


def final_answer_text(completion: str) -> str | None:
    """The stated final answer of a free-text reply, or None: in `answer_region`, the rest of the last
    line containing `Answer:` (any case), else the content of the last `\boxed{...}`."""
    from scalerl.tasks.math_answer import last_boxed  # math_answer imports this module

    region = answer_region(completion)
    lines = _ANSWER_LINE.findall(region)
    if lines and lines[-1].strip():
        return str(lines[-1]).strip()
    return last_boxed(region)


def check_phrasing(phrasing: str) -> Phrasing:
    if phrasing not in PHRASINGS:
        raise ValueError(f"phrasing must be one of {list(PHRASINGS)}, got {phrasing!r}")
    return phrasing  # type: ignore[return-value]


def check_split(split: str) -> Split:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    return split  # type: ignore[return-value]


def check_range(name: str, value: int, lo: int, hi: int) -> int:
    """`value` if `lo <= value <= hi` (and an int), else a ValueError naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def sample_disjoint(
    draw: Callable[[random.Random], K], *, stream: str, train_size: int, eval_size: int
) -> tuple[list[K], list[K]]:
    """Draw `(train_keys, eval_keys)` with no key in both; eval keys are unique.

    `draw(rng)` returns one random problem key. Eval comes from `Random(stream + "/eval")` and train
    from `Random(stream + "/train")` (string seeds are hashed with SHA-512: stable across processes).
    Train keys are unique too while the space allows; once `_MAX_REJECTS_IN_A_ROW` draws in a row
    were duplicates, train repeats problems (tiny spaces such as 1-digit addition) but still never
    takes an eval key. Raises ValueError when the space cannot hold `eval_size` distinct problems
    plus at least one train problem.
    """
    eval_rng, train_rng = random.Random(f"{stream}/eval"), random.Random(f"{stream}/train")
    eval_keys: dict[K, None] = {}  # insertion-ordered set
    rejects = 0
    while len(eval_keys) < eval_size:
        key = draw(eval_rng)
        if key in eval_keys:
            rejects += 1
            if rejects > _MAX_REJECTS_IN_A_ROW:
                raise ValueError(f"eval_size={eval_size} is more than the {len(eval_keys)} distinct "
                                 f"problems found for {stream!r}; lower eval_size or widen the task")
            continue
        rejects = 0
        eval_keys[key] = None
    train_keys: list[K] = []
    seen: set[K] = set()
    rejects, allow_repeats = 0, False
    while len(train_keys) < train_size:
        key = draw(train_rng)
        if key in eval_keys or (key in seen and not allow_repeats):
            rejects += 1
            if rejects > _MAX_REJECTS_IN_A_ROW:
                if not seen:
                    raise ValueError(f"eval_size={eval_size} leaves no training problems for {stream!r}")
                allow_repeats = True
            continue
        rejects = 0
        seen.add(key)
        train_keys.append(key)
    return train_keys, list(eval_keys)
