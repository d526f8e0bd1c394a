"""Multi-turn tool use for real: the python tool runs the model's program in the sandbox, and an embedded
`scalerl run` with tools trains on episodes whose observations are masked out of the loss."""

from __future__ import annotations

import json

import pytest

import scalerl.generator.episode as episode_mod
from scalerl.config import spec_from_dict
from scalerl.environment.tools import Toolbox, ToolCall
from scalerl.runtime.embedded import EmbeddedRun
from scalerl.sandbox import Limits

FAST = Limits(wall_s=3.0, cpu_s=2, memory_bytes=256 << 20, output_bytes=4096)


def test_the_python_tool_answers_with_what_the_program_prints():
    box = Toolbox(("python",), FAST)
    assert box.run(ToolCall("python", "print(sum(range(10)))\nprint('done')")) == "45\ndone"


def test_a_failing_program_shows_the_end_of_its_traceback_and_its_verdict():
    out = Toolbox(("python",), FAST).run(ToolCall("python", "print('before')\n1/0"))
    lines = out.splitlines()
    assert lines[0] == "before" and lines[-1] == "[error]" and "ZeroDivisionError: division by zero" in lines[-2]


@pytest.mark.parametrize(("source", "verdict"), [
    ("while True:\n    pass", "[timeout]"),
    ("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)", "[forbidden]"),
    ("print('x' * 100000)", "[output_limit]"),
])
def test_hostile_programs_end_with_their_verdict_and_the_tool_goes_on(source, verdict):
    box = Toolbox(("python",), FAST)
    assert box.run(ToolCall("python", source)).endswith(verdict)
    assert box.run(ToolCall("python", "print(6 * 7)")) == "42"


def test_calls_of_one_turn_run_side_by_side():
    box = Toolbox(("python", "calculator"), FAST)
    calls = [ToolCall("python", "import time\ntime.sleep(1)\nprint(1)")] * 4 + [ToolCall("calculator", "6*7"), None]
    import time

    t0 = time.perf_counter()
    out = box.run_many(calls)
    assert out[:5] == ["1", "1", "1", "1", "42"] and out[5].startswith("error: ")
    assert time.perf_counter() - t0 < 3.5  # four 1-s programs, four workers (serially: over 4 s)


@pytest.mark.timeout(900)
def test_an_embedded_run_with_tools_trains_on_episodes(tiny_spec, tmp_path, monkeypatch):
    """The untrained tiny model never writes `</tool>`; here any digit it samples while thinking ends its
    turn as a call (the stop sequences are the digits), so its episodes have several turns and error
    observations, and the whole run — generation, the verifier, the learner, the evaluation — takes them."""
    tok_digits = {}

    def digits(tokenizer, tag):
        tok_digits.update({d: tokenizer.convert_tokens_to_ids(d) for d in "0123456789"})
        return tuple((i,) for i in tok_digits.values())

    monkeypatch.setattr(episode_mod, "tag_spellings", digits)
    tree = tiny_spec.model_dump()
    tree["train"].update(steps=2, checkpoint_every=2)
    tree["eval"].update(every_steps=2)
    tree["environment"] = {"tools": ["calculator"], "max_turns": 2, "max_observation_tokens": 48}
    tree["model"]["tiny"]["max_positions"] = 512
    tree["loss"] = {"zero_variance_filter": False}  # the untrained model fails every prompt: train anyway
    run = EmbeddedRun(spec_from_dict(tree), tmp_path / "run", show_progress=False)
    seen = []
    original = episode_mod.EpisodeRunner.generate

    def spy(self, prompt_ids, *args, **kwargs):
        out = original(self, prompt_ids, *args, **kwargs)
        seen.extend(zip(prompt_ids, out, strict=True))
        return out

    monkeypatch.setattr(episode_mod.EpisodeRunner, "generate", spy)
    summary = run.run()
    assert summary["steps"] == 2
    decode = run.generator.engine.decode
    multi = [(p, c) for p, c in seen if "<result>\n" in decode(c.token_ids)]
    assert len(multi) > len(seen) // 4, (len(multi), len(seen))
    phrase = run.spec.generation.interruption.phrase
    for prompt, c in multi:
        text = run.generator.engine.decode(c.token_ids)
        assert "<result>\nerror: " in text
        assert Toolbox(("calculator",)).instructions() in decode(prompt)
        # the masked runs are exactly the observations (each decodes to one <result>...</result>) and the
        # interruption phrase at the cut
        start = None
        for i, m in enumerate([*c.loss_mask, True]):
            if not m and start is None:
                start = i
            elif m and start is not None:
                piece = decode(c.token_ids[start:i])
                assert piece == phrase or (piece.startswith("<result>\n") and piece.endswith("</result>\n")), piece
                start = None
    records = [json.loads(line) for name in ("train.jsonl", "metrics.jsonl")
               for line in (tmp_path / "run" / name).read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2] and all(r["train_tokens"] > 0 for r in steps)
    # step 1 trains on episodes sampled by the weights it starts from: ρ = 1 on every model token, which
    # holds only if the learner's sequence and mask line up with what the engine recorded, turn by turn
    assert abs(steps[0]["ratio_max"] - 1.0) < 1e-3 and abs(steps[0]["ratio_mean"] - 1.0) < 1e-4
    evals = [r for r in records if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, 2] and all(e["n_prompts"] == 8 for e in evals)
