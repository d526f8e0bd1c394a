"""Beam search over Countdown steps, with a scripted generator (the search logic alone): legality
pruning, state merging, selection by the scorer, the verifier at leaves, and exact token accounting
(discarded continuations included); whole steps first, then the calculator mode (forced results,
early rejection, duplicate re-sampling), the sample+calc chains and the chain diagnostics."""

from __future__ import annotations

from scalerl.evaluation.scorer import Scores
from scalerl.evaluation.tree_search import (
    TreeSearchConfig,
    _Node,
    beam_search,
    calc_chains,
    classify_head,
    step_length_control,
)
from scalerl.generator.role import encode_prompt
from scalerl.messages import Completion
from scalerl.tasks import CountdownTask, Problem, arithmetic_only_failure, solvable_state, step_result

PROMPT = "3 5 7 -> 22:"  # 5*3=15, 15+7=22
WHOLE_STEPS = TreeSearchConfig(beam_width=1, expansions=4, calculator=False, resample_rounds=0)
SCRIPT = {  # prefix -> continuations, in the order the generator returns them
    "<think>": ["9+9=18,", "7+5=12,", "5*3=15,", "3*5=15,"],  # illegal; legal; legal; same state as 5*3
    "<think>5*3=15,": ["15+7=22</think>", "15*7=100,", "15-7=8</think>", "15+7=22</think>"],  # won; wrong
    "<think>5*3=15,15+7=22</think>": ["5*3+7"],  # the answer              # product; ends on 8, not 22; won
}


class ScriptedGenerator:
    """Replies from `script`: the i-th call with a prefix gets its i-th option (cycling)."""

    script = SCRIPT

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.calls = []
        self.seen: dict[str, int] = {}

    def finish(self, prefix: str, text: str) -> str:
        if prefix.endswith("</think>"):  # an answer: ends with EOS
            return "stop"
        return "stop" if text.endswith((",", "</think>")) else "length"  # a step: "," or </think>, else cut

    def __call__(self, inputs, sampling, length):
        self.calls.append(length)
        out = []
        for ids in inputs:
            prefix = self.tok.decode(ids, skip_special_tokens=False).split(":", 1)[1]
            i = self.seen.get(prefix, 0)
            self.seen[prefix] = i + 1
            options = self.script[prefix]
            text = options[i % len(options)]
            ids_ = list(self.tok(text, add_special_tokens=False)["input_ids"])
            if prefix.endswith("</think>"):
                ids_.append(self.tok.eos_token_id)
            out.append(Completion(token_ids=ids_, logprobs=[0.0] * len(ids_), versions=[0] * len(ids_),
                                  loss_mask=[True] * len(ids_), finish_reason=self.finish(prefix, text), text=text,
                                  thinking_tokens=len(ids_)))
        return out


class PrefixScorer:
    """Likes the 5*3 line: value 1 for prefixes containing it, else 0."""

    name = "prefix"

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.scored: list[str] = []

    def score(self, prompts, completions):
        self.scored += list(completions)
        return Scores(values=[1.0 if "5*3" in c else 0.0 for c in completions],
                      forward_tokens=[len(encode_prompt(self.tok, p)) + len(self.tok(c, add_special_tokens=False)
                                                                            ["input_ids"])
                                      for p, c in zip(prompts, completions, strict=True)])


def _tokens(tok, text):
    return len(tok(text, add_special_tokens=False)["input_ids"])


def test_beam_search_prunes_merges_selects_and_counts(tokenizer):
    task = CountdownTask(num_numbers=3, max_number=25, seed=0, train_size=1, eval_size=1)
    problem = Problem(id="p0", prompt=PROMPT, answer="3 5 7 -> 22", solution="")
    gen, scorer = ScriptedGenerator(tokenizer), PrefixScorer(tokenizer)
    (r,) = beam_search([problem], task, generate=gen, tokenizer=tokenizer, scorer=scorer, cfg=WHOLE_STEPS,
                       sampling=None, answer_budget=8)
    assert r.solved and r.completion == "<think>5*3=15,15+7=22</think>5*3+7"
    # depth 1: 4 expansions of the root; depth 2: 4 of 5*3=15 (kept by the scorer over 7+5=12), two of
    # which end thinking on 22 (one won state, answered once)
    assert r.expansions == 8 and r.depth == 2 and r.leaves == 1
    assert r.illegal_steps == 2  # 9+9 (no 9s), 15*7=100 (wrong arithmetic)
    assert r.lost_states == 1  # 15-7=8 ends thinking on 8, not 22: dropped before any answer is written
    assert r.duplicate_steps == 1  # the second 15+7=22</think> (not re-sampled: resample_rounds=0)
    # every continuation's tokens count, discarded ones included; the answer ends with EOS
    expected = sum(_tokens(tokenizer, t) for t in SCRIPT["<think>"] + SCRIPT["<think>5*3=15,"])
    expected += _tokens(tokenizer, "5*3+7") + 1
    assert r.gen_tokens == expected
    # the scorer rated the two distinct legal children of the root (3*5=15 merged into 5*3=15)
    assert scorer.scored == ["<think>7+5=12,", "<think>5*3=15,"]
    p_len = len(encode_prompt(tokenizer, PROMPT))
    assert r.scorer_tokens == sum(p_len + _tokens(tokenizer, c) for c in scorer.scored)
    # prefill: the prompt plus the prefix, once per call row
    prefixes = list(SCRIPT)
    assert r.prefill_tokens == sum(n * (p_len + _tokens(tokenizer, pre)) for n, pre in zip((4, 4, 1), prefixes,
                                                                                             strict=True))
    # steps stop at "," or </think> within 16 tokens; the answer runs to EOS within the answer budget
    step, answer = gen.calls[0], gen.calls[-1]
    assert step.stop_ids == (tokenizer.convert_tokens_to_ids(","), tokenizer.convert_tokens_to_ids("</think>"))
    assert step.thinking_budget == 16 and step == step_length_control(WHOLE_STEPS, answer_budget=8,
                                                                        tokenizer=tokenizer)
    assert answer.stop_ids == () and answer.thinking_budget == 8


def test_search_without_a_solution_reports_unsolved(tokenizer):
    task = CountdownTask(num_numbers=3, max_number=25, seed=0, train_size=1, eval_size=1)
    problem = Problem(id="p0", prompt=PROMPT, answer="3 5 7 -> 22", solution="")

    class Worse(PrefixScorer):
        def score(self, prompts, completions):  # prefers 7+5=12, from which 22 cannot be made
            s = super().score(prompts, completions)
            return Scores([1.0 - v for v in s.values], s.forward_tokens)

    gen = ScriptedGenerator(tokenizer)
    extra = {"<think>7+5=12,": ["12*3=36,", "12+3=15</think>", "</think>", "1+1=2,"]}
    SCRIPT.update(extra)
    try:
        (r,) = beam_search([problem], task, generate=gen, tokenizer=tokenizer, scorer=Worse(tokenizer),
                           cfg=WHOLE_STEPS, sampling=None, answer_budget=8)
    finally:
        for key in extra:
            del SCRIPT[key]
    assert not r.solved and r.completion is None and r.leaves == 0
    assert r.illegal_steps == 2  # 9+9; 1+1=2 (no 1 in the pool)
    assert r.lost_states == 3  # [36]: one number, not 22; thinking ended on [15] and on [3, 12]
    assert r.expansions == 8  # nothing left to expand after depth 2


# Calculator mode: the generator is called for "a op" (stops at an operator or </think>), then for "b="
# (stops at "=", "," or </think>); the result is fed by the search. Keys: the text before each call.
CALC_SCRIPT = {
    "<think>": ["9+", "5*", "5*", "7+"],  # 9 is not in the pool: rejected at "9+"
    "<think>5*": ["3="],
    "<think>7+": ["5="],
    "<think>5*3=15": [",15+", ",15-", ",15+", ",7+"],
    "<think>5*3=15,15+": ["7="],
    "<think>5*3=15,15-": ["7="],
    "<think>5*3=15,7+": ["15="],
    "<think>5*3=15,15+7=22</think>": ["5*3+7"],
}


class CalcGenerator(ScriptedGenerator):
    """Calculator mode: every call stops at a stop id (the engine's stop ids end each piece)."""

    script = CALC_SCRIPT

    def finish(self, prefix: str, text: str) -> str:
        return "stop"


def test_step_result_and_rule_breaks(tokenizer):
    assert step_result([3, 5, 7], 5, "*", 3) == "15"
    assert step_result([5, 5], 5, "/", 5) == "1"
    assert step_result([5, 7], 5, "/", 5) is None  # one 5 only
    assert step_result([3, 5, 7], 9, "+", 3) is None  # no 9
    assert step_result([3, 5], 3, "-", 5) is None  # not positive
    assert step_result([4, 6], 6, "/", 4) is None  # not an integer
    assert len(tokenizer("390625", add_special_tokens=False)["input_ids"]) == 6  # forced tokens: one per digit
    root, deeper = _Node("<think>", [3, 5, 7]), _Node("<think>5*3=15", [7, 15])
    assert classify_head(root, "5*", "stop") == ("head", 5)
    assert classify_head(root, "9+", "stop") == ("illegal", None)
    assert classify_head(deeper, ",15+", "stop") == ("head", 15)
    assert classify_head(deeper, "5+", "stop") == ("dead", None)  # no separator: it extends the result "15"
    assert classify_head(deeper, "</think>", "stop") == ("close", None)
    assert classify_head(deeper, ",15", "length") == ("dead", None)


def test_calculator_search_forces_results_rejects_early_and_resamples_duplicates(tokenizer):
    task = CountdownTask(num_numbers=3, max_number=25, seed=0, train_size=1, eval_size=1)
    problem = Problem(id="p0", prompt=PROMPT, answer="3 5 7 -> 22", solution="")
    gen, scorer = CalcGenerator(tokenizer), PrefixScorer(tokenizer)
    cfg = TreeSearchConfig(beam_width=1, expansions=4, resample_rounds=1)
    (r,) = beam_search([problem], task, generate=gen, tokenizer=tokenizer, scorer=scorer, cfg=cfg, sampling=None,
                       answer_budget=8)
    assert r.solved and r.completion == "<think>5*3=15,15+7=22</think>5*3+7"
    # depth 1: 4 heads (9+ rejected), 3 tails (the second 5*3 a duplicate), then 1 re-sample: 9+ again.
    # depth 2: 4 heads, 4 tails: 15+7 (won), 15-7 (lost on 8), 15+7 (duplicate), 7+15 (a new step, same pool
    # as 15+7: merged); 1 re-sample: ",15+", stopped there: 15+7 is the only legal step it can start.
    # depth 3: the won state's </think> (forced) and its answer.
    assert r.expansions == 10 and r.illegal_steps == 2 and r.duplicate_steps == 3 and r.lost_states == 1
    assert r.leaves == 1 and r.depth == 2
    generated = ["9+", "5*", "5*", "7+", "3=", "3=", "5=", "9+",
                 ",15+", ",15-", ",15+", ",7+", "7=", "7=", "7=", "15=", ",15+", "5*3+7"]
    forced = ["15", "12", "22", "8", "22", "</think>"]  # a duplicate's result is never paid for
    assert r.forced_tokens == sum(_tokens(tokenizer, t) for t in forced) == 10
    assert r.gen_tokens == sum(_tokens(tokenizer, t) for t in generated) + 1 + r.forced_tokens  # + EOS
    assert scorer.scored == ["<think>5*3=15", "<think>7+5=12", "<think>5*3=15,15+7=22"]  # every child
    assert r.states == ["<think>5*3=15", "<think>5*3=15,15+7=22"]
    head, tail = gen.calls[0], gen.calls[1]
    ids = tokenizer.convert_tokens_to_ids
    assert head.stop_ids == (*(ids(c) for c in "+-*/"), ids("</think>"))
    assert tail.stop_ids == (ids("="), ids(","), ids("</think>"))


def test_calc_chains_are_the_sampling_baseline(tokenizer):
    task = CountdownTask(num_numbers=3, max_number=25, seed=0, train_size=1, eval_size=1)
    problem = Problem(id="p0", prompt=PROMPT, answer="3 5 7 -> 22", solution="")
    gen = CalcGenerator(tokenizer)
    (samples,), (chains,) = calc_chains([problem], task, n=2, generate=gen, tokenizer=tokenizer,
                                        cfg=TreeSearchConfig(), sampling=None, answer_budget=8)
    # one batch: chain 1 gets the root's first script line (9+, rejected), chain 2 the second: 5*3=15,
    # then 15+7=22 (won: </think> forced), then its answer, verified
    assert samples.correct == [False, True] and [c.expansions for c in chains] == [1, 2]
    assert chains[1].completion == "<think>5*3=15,15+7=22</think>5*3+7"
    assert samples.tokens == [2, _tokens(tokenizer, "5*3=15,15+7=22</think>5*3+7") + 1]  # + EOS
    assert samples.forced_tokens == [0, 5]  # "15", "22", </think>
    assert chains[1].states == ["<think>5*3=15", "<think>5*3=15,15+7=22"]


def test_arithmetic_only_failures():
    assert arithmetic_only_failure(PROMPT, "<think>5*3=16,16+7=22</think>5*3+7")  # results wrong, all else legal
    assert not arithmetic_only_failure(PROMPT, "<think>5*3=15,15+7=22</think>5*3+7")  # nothing wrong
    assert not arithmetic_only_failure(PROMPT, "<think>9+9=18,18+3=22</think>9+9+3")  # no 9s
    assert not arithmetic_only_failure(PROMPT, "<think>3-5=2</think>")  # not positive


def test_solvable_state_reads_both_prefix_forms():
    assert solvable_state(PROMPT, "<think>5*3=15") and solvable_state(PROMPT, "<think>5*3=15,")
    assert not solvable_state(PROMPT, "<think>7+5=12,")  # 12 and 3 cannot make 22
