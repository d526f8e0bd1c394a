"""Beam search over Countdown steps, with a scripted generator (the search logic alone): legality
pruning, state merging, selection by the scorer, the verifier at leaves, and exact token accounting
(discarded continuations included)."""

from __future__ import annotations

from scalerl.evaluation.scorer import Scores
from scalerl.evaluation.tree_search import TreeSearchConfig, beam_search, step_length_control
from scalerl.generator.role import encode_prompt
from scalerl.messages import Completion
from scalerl.tasks import CountdownTask, Problem

PROMPT = "3 5 7 -> 22:"  # 5*3=15, 15+7=22
SCRIPT = {  # prefix -> continuations, in the order the generator returns them
    "<think>": ["9+9=18,", "7+5=12,", "5*3=15,", "3*5=15,"],  # illegal; legal; legal; same state as 5*3
    "<think>5*3=15,": ["15+7=22</think>", "15*7=100,", "15-7=8</think>", "15+7=22</think>"],  # won; wrong
    "<think>5*3=15,15+7=22</think>": ["5*3+7"],  # the answer              # product; ends on 8, not 22; won
}


class ScriptedGenerator:
    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.calls = []
        self.seen: dict[str, int] = {}

    def __call__(self, inputs, sampling, length):
        self.calls.append(length)
        out = []
        for ids in inputs:
            prefix = self.tok.decode(ids, skip_special_tokens=False).split(":", 1)[1]
            i = self.seen.get(prefix, 0)
            self.seen[prefix] = i + 1
            options = SCRIPT[prefix]
            text = options[i % len(options)]
            ids_ = list(self.tok(text, add_special_tokens=False)["input_ids"])
            if prefix.endswith("</think>"):  # an answer: ends with EOS
                ids_.append(self.tok.eos_token_id)
                finish = "stop"
            else:  # a step: stops at "," or </think>, else was cut
                finish = "stop" if text.endswith((",", "</think>")) else "length"
            out.append(Completion(token_ids=ids_, logprobs=[0.0] * len(ids_), versions=[0] * len(ids_),
                                  loss_mask=[True] * len(ids_), finish_reason=finish, text=text,
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
    (r,) = beam_search([problem], task, generate=gen, tokenizer=tokenizer, scorer=scorer,
                       cfg=TreeSearchConfig(beam_width=1, expansions=4), sampling=None, answer_budget=8)
    assert r.solved and r.completion == "<think>5*3=15,15+7=22</think>5*3+7"
    # depth 1: 4 expansions of the root; depth 2: 4 of 5*3=15 (kept by the scorer over 7+5=12), two of
    # which end thinking on 22 (one won state, answered once)
    assert r.expansions == 8 and r.depth == 2 and r.leaves == 1
    assert r.illegal_steps == 2  # 9+9 (no 9s), 15*7=100 (wrong arithmetic)
    assert r.lost_states == 1  # 15-7=8 ends thinking on 8, not 22: dropped before any answer is written
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
    assert step.thinking_budget == 16 and step == step_length_control(TreeSearchConfig(), answer_budget=8,
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
                           cfg=TreeSearchConfig(beam_width=1, expansions=4), sampling=None, answer_budget=8)
    finally:
        for key in extra:
            del SCRIPT[key]
    assert not r.solved and r.completion is None and r.leaves == 0
    assert r.illegal_steps == 2  # 9+9; 1+1=2 (no 1 in the pool)
    assert r.lost_states == 3  # [36]: one number, not 22; thinking ended on [15] and on [3, 12]
    assert r.expansions == 8  # nothing left to expand after depth 2
