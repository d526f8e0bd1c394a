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
                 "--tree-method", "beam,unique", "--tree-budget", "16,64",
                 "--scorer-steps", "20", "--scorer-prompts", "8", "--json", "--quiet"]) == 0
    rec = json.loads(capsys.readouterr().out)["checkpoints"][0]
    assert rec["problems"] == 6 and (ckpt / "scorer" / "scorer.json").is_file()
    rows = {r["beam_width"]: r for r in rec["tree"] if r["method"] == "beam"}
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
    # the search without replacement, read at two budgets of one run
    unique = {r["budget"]: r for r in rec["tree"] if r["method"] == "unique"}
    assert set(unique) == {16, 64}
    assert unique[16]["gen_tokens_per_problem"] <= 16 and unique[64]["gen_tokens_per_problem"] <= 64
    assert unique[16]["accuracy"] <= unique[64]["accuracy"]
    assert rec["tree_unique_fit"]["fits"] is False  # two budgets: too few points for the 3-parameter curve
    run = rec["tree_unique_run"]
    assert run["budget"] == 64 and run["gen_tokens_per_problem"] == pytest.approx(unique[64]["gen_tokens_per_problem"])
    # every chain ends in exactly one of the outcomes, and each problem pays its prompt + <think> per model call
    assert sum(run["chain_outcomes_per_problem"].values()) == pytest.approx(run["chains_per_problem"])
    assert run["prefill_tokens_per_problem"] >= (prompt_tokens + 1) * (run["gen_tokens_per_problem"]
                                                                       - run["forced_tokens_per_problem"]
                                                                       - run["chains_per_problem"])


def test_unique_search_refuses_the_whole_step_mode(tiny_spec, tiny_model, tokenizer, tmp_path, capsys):
    spec = tiny_spec.model_copy(deep=True)
    spec.task.kind = "countdown"
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_000001"
    save_model_and_tokenizer(tiny_model, tokenizer, ckpt)
    (run / "spec.yaml").write_text(dump_spec(spec))
    for extra, message in [(["--no-calculator"], "--no-calculator: the unique tree search always computes"),
                           (["--tree-method", "mcts"], "--tree-method: 'mcts'; allowed: unique, beam"),
                           (["--tree-budget", "0"], "--tree-budget:")]:
        assert main(["eval", str(ckpt), "--strategy", "tree", *extra, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
