"""mean@k's record of what the verifier said: verdicts per sample and the means of a task's own numbers.

The engine is scripted (this tests the bookkeeping, not generation); the code task and its sandbox are real.
"""

from __future__ import annotations

import json

from scalerl.evaluation import evaluate_mean_at_k
from scalerl.generator.engine import LengthControl, SamplingParams
from scalerl.messages import Completion
from scalerl.model.tokenizer import build_char_tokenizer
from scalerl.tasks.code import CodeTask
from scalerl.verifier.verifier import Verifier

PROMPT = 'def add(a, b):\n    """Return a + b."""\n'
TESTS = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n"
# (body, finish): all asserts pass; the first passes and the second fails (returns 3); none; cut at the budget
SCRIPT = [("    return a + b\n", "stop"), ("    return 3\n", "stop"), ("    return -1\n", "stop"),
          ("    return a + b\n", "length")]


class ScriptedEngine:
    """Returns SCRIPT's completions in turn, whatever the prompts."""

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams, length: LengthControl,
                 **_: object) -> list[Completion]:
        return [Completion(token_ids=[1] * 5, logprobs=[0.0] * 5, versions=[0] * 5, loss_mask=[True] * 5,
                           finish_reason=SCRIPT[i % len(SCRIPT)][1], text=SCRIPT[i % len(SCRIPT)][0])  # type: ignore[arg-type]
                for i in range(len(prompt_ids))]


def test_eval_counts_verdicts_and_averages_tests_passed_over_all_samples(tmp_path) -> None:
    data = tmp_path / "add.jsonl"
    rows = [{"prompt": PROMPT, "tests": TESTS, "entry_point": "add", "id": f"add/{i}"} for i in range(2)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = CodeTask(seed=0, train_size=2, eval_size=None, eval_path=data)
    verifier = Verifier(task)
    try:
        length = LengthControl(64, 16, (1,), 2)
        res = evaluate_mean_at_k(ScriptedEngine(), build_char_tokenizer(), task.problems("eval"),  # type: ignore[arg-type]
                                 verifier, k=4, sampling=SamplingParams(), length=length, prompts_per_batch=2)
    finally:
        verifier.close()
    # each prompt: one pass, two fails, one truncated (not graded)
    assert res.verdicts == {"pass": 2, "fail": 4, "truncated": 2} and res.truncation_rate == 2 / 8
    assert res.prompt_pass_rates == [0.25, 0.25] and res.pass_rate == 0.25
    # asserts passed per sample: 2/2, 1/2, 0/2 and the truncated one 0, over 4 samples of each prompt
    assert res.task_metrics == {"tests_passed": (1.0 + 0.5 + 0.0 + 0.0) / 4}
