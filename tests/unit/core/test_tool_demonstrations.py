"""SFT on tool demonstrations (`scalerl.runtime.setup.sft_demonstrations`, `scalerl.learner.sft`).

A job with `environment.tools` warm-starts on episodes that call the tools: the example holds exactly the
tokens an episode of the same turns holds (prompt with the tools' instructions, the turns, the tool's real
answer as observation tokens), the loss is on the model's tokens only, and the calculator's answer in it is
the sum computed here.
"""

from __future__ import annotations

import torch

from scalerl.config import spec_from_dict
from scalerl.generator.engine import SamplingParams
from scalerl.generator.episode import episode_runner
from scalerl.generator.role import encode_prompt
from scalerl.learner.sft import run_sft
from scalerl.model.factory import build_tiny_model
from scalerl.parts import make_task
from scalerl.runtime.setup import sft_demonstrations
from unit.core.test_episodes import ScriptedEngine, _length


def _spec(tiny_spec, **environment):
    tree = tiny_spec.model_dump(mode="json")
    tree["model"]["tiny"]["max_positions"] = 384  # the tools' instructions are appended to every prompt
    tree["environment"] = environment
    return spec_from_dict(tree)


def test_a_demonstration_calls_the_calculator_and_answers_with_its_result(tiny_spec, tokenizer):
    spec = _spec(tiny_spec, tools=["calculator"])
    examples, encode = sft_demonstrations(spec, make_task(spec), tokenizer)
    prompt, turns = examples[0]
    a, b = (int(x) for x in make_task(spec).problems("train")[0].prompt.removesuffix("=").split("+"))
    assert prompt.startswith(f"{a}+{b}=") and "calculator" in prompt and len(turns) == 2
    assert turns == [f'<think><tool name="calculator">\n{a}+{b}\n</tool>', f"</think>{a + b}"]
    ids, mask = encode(examples[0])
    heard = tokenizer.decode([t for t, on in zip(ids, mask, strict=True) if not on])
    said = tokenizer.decode([t for t, on in zip(ids, mask, strict=True) if on], skip_special_tokens=False)
    assert heard.endswith(f"<result>\n{a + b}\n</result>\n")  # the calculator's answer, out of the loss
    assert said == f'<think><tool name="calculator">\n{a}+{b}\n</tool></think>{a + b}<eos>'


def test_the_example_holds_the_tokens_an_episode_of_the_same_turns_holds(tiny_spec, tokenizer):
    spec = _spec(tiny_spec, tools=["calculator", "python"])
    examples, encode = sft_demonstrations(spec, make_task(spec), tokenizer)
    problem = make_task(spec).problems("train")[3]
    prompt, turns = examples[3]
    ids, mask = encode(examples[3])

    engine = ScriptedEngine(tokenizer, [])
    runner = episode_runner(spec, engine, tokenizer)
    assert prompt == runner.prompt(problem.prompt)
    head = encode_prompt(tokenizer, prompt)
    engine.scripts = [{"prompt": head, "turns": turns}]
    [c] = runner.generate([head], SamplingParams(temperature=0.0), _length(tokenizer))
    assert ids == [*head, *c.token_ids, tokenizer.eos_token_id]
    assert mask == [False] * len(head) + c.loss_mask + [True]
    assert not all(c.loss_mask) and runner.calls == 1


def test_without_tools_the_plain_gold_solution_on_the_plain_prompt(tiny_spec, tokenizer):
    spec = _spec(tiny_spec)
    examples, _ = sft_demonstrations(spec, make_task(spec), tokenizer)
    problems = make_task(spec).problems("train")
    assert examples == [(p.prompt, [p.solution]) for p in problems]


def test_the_loss_is_on_the_model_tokens_alone(tiny_spec, tokenizer):
    """One SFT step's loss (taken before the update) is the mean NLL of the tokens whose mask is on,
    computed here from the model's logits: the observation's tokens are left out."""
    spec = _spec(tiny_spec, tools=["calculator"])
    torch.manual_seed(0)
    model = build_tiny_model(spec.model, tokenizer, seed=0).eval()
    examples, encode = sft_demonstrations(spec, make_task(spec), tokenizer)
    ids, mask = encode(examples[0])
    with torch.no_grad():
        logits = model(torch.tensor([ids[:-1]])).logits[0].float()
    nll = -torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    on = torch.tensor(mask[1:])
    expected = float(nll[on].mean())
    everything = float(nll[int(on.nonzero()[0, 0]):].mean())  # every target from the first model token on
    sft = spec.sft.model_copy(update={"steps": 1, "batch_size": 2})
    [loss] = run_sft(model, tokenizer, examples[:1], sft, seed=0, encode=encode)
    assert abs(loss - expected) < 1e-4 * max(1.0, expected)
    assert abs(everything - expected) > 1e-3  # the observation's tokens would change it


def test_with_python_alone_the_demonstration_prints_the_sum_in_the_sandbox(tiny_spec, tokenizer):
    spec = _spec(tiny_spec, tools=["python"])
    examples, encode = sft_demonstrations(spec, make_task(spec), tokenizer)
    problem = make_task(spec).problems("train")[1]
    a, b = (int(x) for x in problem.prompt.removesuffix("=").split("+"))
    assert examples[1][1] == [f'<think><tool name="python">\nprint({a}+{b})\n</tool>', f"</think>{a + b}"]
    ids, mask = encode(examples[1])
    heard = tokenizer.decode([t for t, on in zip(ids, mask, strict=True) if not on])
    assert heard.endswith(f"<result>\n{a + b}\n</result>\n")  # what the sandboxed program printed
