"""Multi-turn episodes (`scalerl.generator.episode`).

With a scripted engine (the loop's own logic): turns and observations join in order, the loss mask is
False on exactly the observation tokens, the thinking count and cut carry from turn to turn, max_turns
and the observation cap hold. With the tiny model and the torch engine: every model token's recorded
log-prob is the one the learner computes on the whole episode (as tight as a single turn), and a weight
swap between turns stamps the next turn's tokens with the new version.
"""

from __future__ import annotations

import time

import torch

from scalerl.environment.tools import Toolbox, tool_limits
from scalerl.generator.engine import GenerationEngine, LengthControl, SamplingParams
from scalerl.generator.episode import EpisodeRunner
from scalerl.generator.role import encode_prompt
from scalerl.generator.torch_engine import TorchEngine
from scalerl.messages import Completion
from scalerl.model.factory import completion_logprobs
from scalerl.model.text import text_ids

NEVER = 10**6
GREEDY = SamplingParams(temperature=0.0)


class ScriptedEngine(GenerationEngine):
    """Answers the k-th turn of a row with script[row][k] (tokens, each with log-prob -1 and this
    engine's version); records the prompts and resumes it was given."""

    def __init__(self, tokenizer, scripts):
        self.tokenizer, self.scripts = tokenizer, scripts
        self.version, self.swaps_in_flight = 0, 0
        self.turn = {}
        self.calls = []
        self.started = []  # time.monotonic() at each generate call

    @property
    def max_positions(self):
        return 4096

    def generate(self, prompt_ids, sampling, length, *, policy_source=None, resume=None):
        self.calls.append((prompt_ids, resume, length))
        self.started.append(time.monotonic())
        out = []
        for p, r in zip(prompt_ids, resume, strict=True):
            row = next(i for i, s in enumerate(self.scripts) if p[:len(s["prompt"])] == s["prompt"])
            k = self.turn.get(row, 0)
            self.turn[row] = k + 1
            ids = list(text_ids(self.tokenizer, self.scripts[row]["turns"][k]))
            closed = "</think>" in self.scripts[row]["turns"][k]
            out.append(Completion(token_ids=ids, logprobs=[-1.0] * len(ids), versions=[self.version] * len(ids),
                                  loss_mask=[True] * len(ids), finish_reason="stop", text="",
                                  thinking_tokens=r.thinking_used + (len(ids) if not closed else 3)))
        return out

    def load_weights(self, state_dict, version):
        self.version = version

    def reseed(self, seed):
        pass

    def decode(self, token_ids):
        return self.tokenizer.decode(token_ids)


def _length(tokenizer, **kw):
    return LengthControl(thinking_budget=kw.pop("thinking_budget", 200), answer_budget=20,
                         think_close_ids=tuple(text_ids(tokenizer, "</think>")), eos_id=2, **kw)


def test_turns_and_observations_join_with_the_mask_off_exactly_on_observations(tokenizer):
    scripts = [
        {"prompt": [1, 50, 51], "turns": ['<tool name="calculator">\n12*(3+4)\n</tool>',
                                          '<tool name="python">\nprint(sum(range(4)))\n</tool>', "</think>84"]},
        {"prompt": [1, 60], "turns": ["</think>7"]},
    ]
    engine = ScriptedEngine(tokenizer, scripts)
    runner = EpisodeRunner(engine, tokenizer, Toolbox(("calculator", "python")), max_turns=4,
                           max_observation_tokens=64)
    engine.load_weights({}, 3)
    first, second = runner.generate([s["prompt"] for s in scripts], GREEDY, _length(tokenizer))
    obs1 = list(text_ids(tokenizer, "<result>\n84\n</result>\n"))
    obs2 = list(text_ids(tokenizer, "<result>\n6\n</result>\n"))
    turns = [list(text_ids(tokenizer, t)) for t in scripts[0]["turns"]]
    assert first.token_ids == turns[0] + obs1 + turns[1] + obs2 + turns[2]
    assert first.loss_mask == [True] * len(turns[0]) + [False] * len(obs1) + [True] * len(turns[1]) \
        + [False] * len(obs2) + [True] * len(turns[2])
    masked = [lp for lp, m in zip(first.logprobs, first.loss_mask, strict=True) if not m]
    assert masked == [0.0] * (len(obs1) + len(obs2))
    assert set(first.versions) == {3}
    assert first.thinking_tokens == len(turns[0]) + len(turns[1]) + 3  # observations are not thinking
    assert second.token_ids == list(text_ids(tokenizer, "</think>7")) and all(second.loss_mask)
    # each later turn continues its row's sequence, with the thinking it counted and its first cut
    (p1, r1, rules), (p2, r2, _), (p3, r3, _) = engine.calls
    assert len(p1) == 2 and len(p2) == len(p3) == 1
    assert p2[0] == scripts[0]["prompt"] + turns[0] + obs1
    assert [r.thinking_used for r in r1] == [0, 0] and r2[0].thinking_used == len(turns[0])
    assert r1[0].cut == r2[0].cut == r3[0].cut == 200  # no interruption: the budget itself
    assert tuple(text_ids(tokenizer, "</tool>")) in rules.stop_sequences
    assert runner.calls == 2


def test_an_episode_ends_at_max_turns_and_observations_are_cut(tokenizer):
    call = '<tool name="python">\nprint("x" * 500)\n</tool>'
    engine = ScriptedEngine(tokenizer, [{"prompt": [1, 50], "turns": [call] * 5}])
    runner = EpisodeRunner(engine, tokenizer, Toolbox(("python",)), max_turns=2, max_observation_tokens=40)
    (c,) = runner.generate([[1, 50]], GREEDY, _length(tokenizer))
    assert runner.calls == 2 and len(engine.calls) == 3  # two observed calls, then a third it may not make
    assert c.finish_reason == "length"
    runs, n = [], 0
    for m in c.loss_mask:  # lengths of the masked runs: the observations
        if not m:
            n += 1
        elif n:
            runs, n = [*runs, n], 0
    assert runs == [40, 40]
    text = tokenizer.decode(c.token_ids)
    assert text.count("\n[cut]\n</result>\n") == 2


def test_a_slow_call_holds_up_only_its_own_row(tokenizer):
    """Row 0's program sleeps 4 s, rows 1 and 2 ask the calculator: their second turns start together,
    well before row 0's call returns (not after the slowest call of the turn), and row 0 goes on alone."""
    scripts = [
        {"prompt": [1, 50], "turns": ['<tool name="python">\nimport time\ntime.sleep(4)\nprint(1)\n</tool>',
                                      "</think>1"]},
        {"prompt": [1, 60], "turns": ['<tool name="calculator">\n2+2\n</tool>', "</think>4"]},
        {"prompt": [1, 70], "turns": ['<tool name="calculator">\n3*3\n</tool>', "</think>9"]},
    ]
    engine = ScriptedEngine(tokenizer, scripts)
    runner = EpisodeRunner(engine, tokenizer, Toolbox(("calculator", "python"), tool_limits(10.0, 256)),
                           max_turns=2, max_observation_tokens=32)
    out = runner.generate([s["prompt"] for s in scripts], GREEDY, _length(tokenizer))
    rows = [[next(i for i, s in enumerate(scripts) if p[:2] == s["prompt"]) for p in ps] for ps, _, _ in engine.calls]
    assert rows == [[0, 1, 2], [1, 2], [0]]
    second, third = (t - engine.started[0] for t in engine.started[1:])
    assert second < 3.0 <= 4.0 <= third  # rows 1 and 2 went on while row 0's program slept
    for c, answer, value in zip(out, ("1", "4", "9"), ("1", "4", "9"), strict=True):  # in the prompts' order
        assert tokenizer.decode(c.token_ids).endswith(f"<result>\n{value}\n</result>\n</think>{answer}")
    assert runner.calls == 3


def test_interruption_cuts_are_drawn_once_per_episode(tokenizer):
    turns = ['<tool name="calculator">1+1</tool>', "</think>2"]
    engine = ScriptedEngine(tokenizer, [{"prompt": [1, 50], "turns": turns}])
    runner = EpisodeRunner(engine, tokenizer, Toolbox(("calculator",)), max_turns=2, max_observation_tokens=32)
    length = _length(tokenizer, interruption_ids=(9, 10), window=(50, 150))
    runner.generate([[1, 50]], GREEDY, length)
    (_, r1, _), (_, r2, _) = engine.calls
    assert 50 <= r1[0].cut <= 150 and r2[0].cut == r1[0].cut


def _window_after(engine, prompt, start, width):
    """The greedy continuation's tokens [start, start + width): a stop sequence the model will emit."""
    free = LengthControl(thinking_budget=start + width + 5, answer_budget=1, think_close_ids=(NEVER,), eos_id=NEVER)
    tokens = engine.generate([prompt], GREEDY, free)[0].token_ids
    return tuple(tokens[start:start + width])


def test_model_tokens_keep_their_log_probs_and_versions_across_turns(tiny_model, tokenizer):
    engine = TorchEngine(tiny_model, tokenizer, seed=0)
    prompt = encode_prompt(tokenizer, "12+34=")
    runner = EpisodeRunner(engine, tokenizer, Toolbox(("calculator",)), max_turns=3, max_observation_tokens=48)
    runner.stop_sequences = (_window_after(engine, prompt, 6, 3),)  # the model "calls" where it emits these
    weights = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    swapped = []

    def source():  # one swap, after the first turn (the first poll of the second generate call)
        if runner.calls and not swapped:
            swapped.append(True)
            return 1, weights
        return None

    length = LengthControl(thinking_budget=40, answer_budget=4, think_close_ids=(NEVER,), eos_id=NEVER)
    (c,) = runner.generate([prompt], GREEDY, length, policy_source=source)
    assert runner.calls >= 1 and swapped
    first_obs = c.loss_mask.index(False)
    obs_len = c.loss_mask[first_obs:].index(True)
    assert tokenizer.decode(c.token_ids[first_obs:first_obs + obs_len]).startswith("<result>\nerror: ")
    # the versions: 0 up to and through the first observation, 1 from the second turn's first sampled
    # token on (the swap happens between decode steps, after that turn's first token)
    assert set(c.versions[:first_obs + obs_len]) == {0}
    assert c.versions[first_obs + obs_len + 1:] and set(c.versions[first_obs + obs_len + 1:]) == {1}
    # step 0 (same weights): the learner's log-probs over the whole episode equal the recorded ones
    learner = completion_logprobs(tiny_model, prompt, c.token_ids)
    mask = torch.tensor(c.loss_mask)
    worst = float((learner - torch.tensor(c.logprobs))[mask].abs().max())
    assert worst < 1e-4, worst
    assert c.thinking_tokens == int(mask.sum())  # every model token is thinking here (no </think>)
