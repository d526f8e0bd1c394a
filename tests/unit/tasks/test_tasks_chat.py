"""Chat-phrased tasks for an instruct model: the prompts, and answer extraction on free text, first on
real SmolLM2-135M-Instruct replies (tests/data/smollm2_replies.json, recorded by
tests/data/record_smollm2_replies.py through the project's own generator) whose expected answers were
read off by hand, then on the rules' edge cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerl.tasks import build_task
from scalerl.tasks.arithmetic import chat_integer
from scalerl.tasks.countdown import chat_expression
from scalerl.verifier.verifier import Verifier

REPLIES = json.loads((Path(__file__).parents[2] / "data" / "smollm2_replies.json").read_text())
# reply -> the integer a reader takes as its answer (the final "Answer:" if any, else the last number).
READ_BY_HAND = {
    "7 + 8 = 15": 15,
    'I\'m finding the answer for the question "What number is left after 7 and 8?" using an online integer '
    "calculator.": 8,
    "1 + 5 = 6": 6,
    "1 + 5 = 6.": 6,
    "4 + 3 = 7": 7,
    "Was an oversimplification, as the answer 4 + 3 is not a trivial number.": 3,
    "The answer to this classic math problem is 18.": 18,
    "1The answer would be 2.": 2,
    "2 + 38 = 69": 69,
    "2 + 38 is  22. Answer: 27.": 27,
    "49 + 65 = 112.": 112,
    "112.": 112,
    "40 + 7 = 11. Answer: 11": 11,
    "Answer: 12.": 12,
}


def test_real_replies_are_read_as_a_person_reads_them():
    assert len(REPLIES) == len(READ_BY_HAND)
    task = build_task("addition", digits=1, eval_size=4, train_size=10, phrasing="chat")
    verifier = Verifier(task, reward_correct=1.0, reward_incorrect=-1.0)
    right = 0
    for r in REPLIES:
        want = READ_BY_HAND[r["reply"]]
        assert chat_integer(r["reply"]) == want, r["reply"]
        assert task.extract_answer(r["reply"]) == str(want)
        ok = want == int(r["answer"])
        assert task.is_correct(r["reply"], r["answer"]) is ok
        assert verifier.is_correct(r["reply"], r["answer"], r["finish_reason"]) is ok
        right += ok
    assert right == 4  # "7 + 8 = 15", "1 + 5 = 6" twice, "4 + 3 = 7"


def test_chat_prompts_are_natural_language():
    add = build_task("addition", digits=2, eval_size=3, train_size=5, phrasing="chat").problems("eval")[0]
    assert add.prompt.startswith("What is ") and add.prompt.endswith("End your reply with 'Answer: <number>'.")
    assert add.solution == ""
    mul = build_task("multiplication", digits=2, eval_size=3, train_size=5, phrasing="chat").problems("eval")[0]
    a, b = mul.prompt.removeprefix("What is ").split("?")[0].split(" * ")
    assert int(mul.answer) == int(a) * int(b)
    cd = build_task("countdown", eval_size=2, train_size=4, countdown_numbers=3, phrasing="chat").problems("eval")[0]
    assert cd.prompt.startswith("Using the numbers ") and "Answer: <expression>" in cd.prompt
    symbolic = build_task("addition", digits=2, eval_size=3, train_size=5).problems("eval")[0]
    assert symbolic.prompt.endswith("=") and symbolic.solution.startswith("<think>")


@pytest.mark.parametrize(("reply", "want"), [
    ("I think 12. Answer: 15. Double-checking gives 16", 15),  # the Answer: line wins over the last number
    ("so \\boxed{1,024} is it, not 3", 1024),
    ("<think>5+5 is 11</think> The sum is 10.", 10),  # after the last </think>
    ("Okay, time is up. Let me stop thinking and formulate a final answer now. </think> 42", 42),
    ("no number here", None),
    ("Answer: -7", -7),
])
def test_integer_rules(reply, want):
    assert chat_integer(reply) == want


@pytest.mark.parametrize(("reply", "want"), [
    ("Try 25*5 = 125 first... Answer: (50+25) * 5 - 250 = 125", "(50+25) * 5 - 250"),
    ("We can do 3 × 4 + 7, which gives 19.", "3 * 4 + 7"),
    ("\\boxed{50 / 2 + 7}", "50 / 2 + 7"),
    ("I cannot find one.", None),
])
def test_countdown_expression_rules(reply, want):
    assert chat_expression(reply) == want


def test_countdown_chat_reward_uses_the_games_rules():
    task = build_task("countdown", eval_size=2, train_size=4, countdown_numbers=3, phrasing="chat")
    assert task.is_correct("Answer: 3 * 4 + 7", "3 4 7 -> 19")
    assert not task.is_correct("Answer: 3 * 4 + 7 + 7", "3 4 7 -> 19"), "7 used twice"


def test_jsonl_chat_asks_for_a_boxed_answer(tmp_path):
    data = tmp_path / "m.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} squared?", "answer": i * i}) + "\n"
                            for i in range(6)))
    task = build_task("jsonl", train_path=data, eval_size=2, phrasing="chat")
    p = task.problems("eval")[0]
    assert p.prompt.endswith("Put your final answer in \\boxed{}.")
    assert task.is_correct(f"It is \\boxed{{{p.answer}}}.", p.answer)
