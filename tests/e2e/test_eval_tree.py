"""`scalerl eval --strategy tree` end to end on a Countdown checkpoint, through the real torch engine
(one step per call, stopped at ","), the learned scorer and the verifier. The policy is an untrained
tiny model, so this checks the plumbing and the cost accounting; the search logic is unit-tested with
a scripted generator, and the measured comparison on an SFT'd policy is in the README."""

from __future__ import annotations

import json

import pytest

from scalerl.cli import main
from scalerl.config import dump_spec
from scalerl.model.factory import save_model_and_tokenizer


@pytest.mark.timeout(300)
def test_tree_search_through_the_cli(tiny_spec, tiny_model, tokenizer, tmp_path, capsys):
    spec = tiny_spec.model_copy(deep=True)
    spec.task.kind = "countdown"
    spec.task.countdown_numbers = 3
    spec.task.countdown_max_number = 10
    spec.task.train_size = 40
    spec.task.eval_size = 6
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_000001"
    save_model_and_tokenizer(tiny_model, tokenizer, ckpt)
    (run / "spec.yaml").write_text(dump_spec(spec))
    assert main(["eval", str(ckpt), "--strategy", "tree", "--n", "1,2,4", "--beam", "1,2", "--expansions", "2",
                 "--scorer-steps", "20", "--scorer-prompts", "8", "--json", "--quiet"]) == 0
    rec = json.loads(capsys.readouterr().out)["checkpoints"][0]
    assert rec["problems"] == 6 and (ckpt / "scorer" / "scorer.json").is_file()
    rows = {r["beam_width"]: r for r in rec["tree"]}
    assert set(rows) == {1, 2}
    prompt_tokens = 1 + len("1 2 3 -> 10:")  # BOS + the shortest possible 3-number prompt (a token a character)
    for width, r in rows.items():
        # the root is expanded width x 2 times, then at most width x 2 expansions per depth, 3 depths (3 numbers)
        assert 2 <= r["expansions_per_problem"] <= width * 2 * 3
        assert r["gen_tokens_per_problem"] >= r["expansions_per_problem"]  # >= 1 token per expansion
        assert r["prefill_tokens_per_problem"] >= r["expansions_per_problem"] * (prompt_tokens + 1)  # + "<think>"
        assert r["accuracy"] * 6 == pytest.approx(round(r["accuracy"] * 6))  # solved or not, per problem
    verified = {p["k"]: p for p in rec["verified_sampling"]}
    assert set(verified) == {1, 2, 4}
    for k in (2, 4):  # stopping at the first accepted sample never costs more than k full samples
        assert verified[k]["gen_tokens_per_problem"] <= k * verified[1]["gen_tokens_per_problem"] + 1e-9
