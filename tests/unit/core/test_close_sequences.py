"""`</think>` as a token sequence: the torch engine ends thinking on the token that completes any
spelling (one token, several tokens, or an alternative spelling), forces the whole sequence under
budget forcing, and masks the interruption phrase whatever its length."""

from __future__ import annotations

import torch

from scalerl.generator.engine import LengthControl, SamplingParams, budget_forcing, budget_forcing_of, close_end
from scalerl.generator.role import encode_prompt
from scalerl.generator.torch_engine import CloseMatcher, TorchEngine

NEVER = 10**6
GREEDY = SamplingParams(temperature=0.0)


def _free_run(engine, prompt, n):
    """The greedy continuation of `prompt` with no delimiter and no EOS: n tokens."""
    length = LengthControl(thinking_budget=n, answer_budget=1, think_close_ids=(NEVER,), eos_id=NEVER)
    return engine.generate([prompt], GREEDY, length)[0].token_ids


def _first_new_window(tokens, width):
    """(start, window) of the first `width`-token window that did not occur earlier in `tokens`."""
    for start in range(2, len(tokens) - width):
        window = tuple(tokens[start:start + width])
        if all(tuple(tokens[i:i + width]) != window for i in range(start)) and window[-1] not in tokens[:start]:
            return start, window
    raise AssertionError("no fresh window in the greedy run")


def test_matcher_reports_the_token_that_completes_a_spelling():
    m = CloseMatcher(((7, 8, 9), (5,)), rows=3, device=torch.device("cpu"))
    got = []
    for step in ([7, 1, 7], [8, 5, 8], [9, 9, 1]):
        tok = torch.tensor(step)
        got.append(m.completes(tok).tolist())
        m.push(tok)
    assert got == [[False, False, False], [False, True, False], [True, False, False]]


def test_close_end_finds_any_spelling():
    length = LengthControl(thinking_budget=5, answer_budget=2, think_close_ids=(7, 8), eos_id=0,
                           think_close_alts=((6, 8),))
    assert close_end([1, 7, 8, 3], length) == 3
    assert close_end([1, 6, 8, 3], length) == 3
    assert close_end([1, 8, 7, 3], length) is None


def test_engine_ends_thinking_on_one_and_on_several_tokens(tiny_model, tokenizer):
    engine = TorchEngine(tiny_model, tokenizer, seed=0)
    prompt = encode_prompt(tokenizer, "12+34=")
    tokens = _free_run(engine, prompt, 40)
    for width in (1, 3):
        start, close = _first_new_window(tokens, width)
        length = LengthControl(thinking_budget=40, answer_budget=4, think_close_ids=close, eos_id=NEVER)
        c = engine.generate([prompt], GREEDY, length)[0]
        assert c.thinking_tokens == start + width, (width, close)
        assert c.token_ids[:start + width] == tokens[:start + width]
        assert len(c.token_ids) == start + width + 4 and c.finish_reason == "length"  # the answer budget


def test_alternative_spelling_also_ends_thinking(tiny_model, tokenizer):
    engine = TorchEngine(tiny_model, tokenizer, seed=0)
    prompt = encode_prompt(tokenizer, "7+8=")
    tokens = _free_run(engine, prompt, 40)
    start, alt = _first_new_window(tokens, 2)
    length = LengthControl(thinking_budget=40, answer_budget=3, think_close_ids=(NEVER, NEVER + 1), eos_id=NEVER,
                           think_close_alts=(alt,))
    assert engine.generate([prompt], GREEDY, length)[0].thinking_tokens == start + 2


def test_budget_forcing_forces_the_whole_multi_token_delimiter(tiny_model, tokenizer):
    close, prefix = (11, 12, 13), (20, 21)
    base = LengthControl(thinking_budget=30, answer_budget=3, think_close_ids=close, eos_id=NEVER,
                         interruption_ids=(40, 11, 12, 13), window=(20, 30))
    forced = budget_forcing(base, max_thinking=5, answer_prefix_ids=prefix)
    assert forced.interruption_ids == (*close, *prefix)
    assert budget_forcing_of(forced) == {"max_thinking": 5, "answer_prefix_ids": prefix, "min_thinking": 0,
                                         "wait_ids": (), "max_waits": 0}
    engine = TorchEngine(tiny_model, tokenizer, seed=0)
    c = engine.generate([encode_prompt(tokenizer, "5+5=")], GREEDY, forced)[0]
    assert c.token_ids[5:10] == [*close, *prefix]
    assert c.loss_mask == [True] * 5 + [False] * 5 + [True] * (len(c.token_ids) - 10)
    assert c.finish_reason in ("interrupted", "length")


def test_minimum_replaces_the_completing_token_of_a_multi_token_close(tiny_model, tokenizer):
    """An early multi-token `</think>`: its last token becomes "Wait" (masked), thinking goes on."""
    engine = TorchEngine(tiny_model, tokenizer, seed=0)
    prompt = encode_prompt(tokenizer, "12+34=")
    tokens = _free_run(engine, prompt, 40)
    start, close = _first_new_window(tokens, 2)
    wait = (50, 51)
    length = LengthControl(thinking_budget=40, answer_budget=2, think_close_ids=close, eos_id=NEVER,
                           min_thinking=start + 30, wait_ids=wait, max_waits=1)
    c = engine.generate([prompt], GREEDY, length)[0]
    at = start + 1  # the position of the token that would have completed the delimiter
    assert c.token_ids[:at] == tokens[:at] and tuple(c.token_ids[at:at + 2]) == wait
    assert c.loss_mask[at:at + 2] == [False, False] and all(c.loss_mask[:at])
