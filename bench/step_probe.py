"""`make bench` section "step probe": how large may one policy update be before the pass rate falls?

From one policy (the SFT start), one on-policy batch is sampled and scored, and the gradient of the
job's objective (`assemble` -> `sequence_logprobs` -> `policy_loss`: the learner's path, the job's loss,
aggregation and normalisation) is taken once. The policy is then moved along three directions and its
pass rate measured again:

- **gradient**: θ + s · g / ‖g‖ for L2 step lengths s (plain gradient ascent on the objective);
- **adam**: θ + lr · sign(g), which is AdamW's first update at learning rate lr (bias-corrected moments
  m̂ = g, v̂ = g², so m̂ / (√v̂ + ε) = sign(g) up to ε; weight decay left out), its L2 length
  lr · √(parameters with a nonzero gradient);
- **random**: a Gaussian direction scaled to each gradient step's length (the control: what moving that
  far does when the direction carries no reward signal).

Pass rate = fraction of correct samples, on the batch's own prompts and on held-out prompts, `--samples`
per prompt, drawn with the same generator seed for every probed policy (common random numbers: the
differences between rows are not sampling noise of independent draws). The largest step whose pass rate
is not below the start's tells how far one update may go; `adam` rows translate that into a learning
rate for the job's optimizer (README, "Does the forecast hold?").

    PYTHONPATH=services python bench/step_probe.py --spec examples/forecast.yaml --init runs/x/sft
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

GRADIENT_STEPS = (0.002, 0.005, 0.01, 0.02, 0.05)
"""L2 lengths of the probed gradient steps."""
ADAM_LRS = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4)
"""Learning rates of the probed AdamW first updates."""


def objective_gradient(spec: Any, model: Any, pad_id: int, groups: Sequence[Any]) -> list[torch.Tensor]:
    """∇θ of the job's objective (−loss) on `groups`, through the learner's batch assembly and loss.
    Returns one tensor per parameter (zeros where no gradient reached)."""
    from scalerl.learner.batch import assemble
    from scalerl.model.factory import sequence_logprobs
    from scalerl.recipe import policy_loss

    s = spec
    asm = assemble(list(groups), version=0, k=s.off_policy.k, pad_id=pad_id,
                   zero_variance_filter=s.loss.zero_variance_filter, normalization=s.loss.advantage_normalization)
    if asm.batch is None:
        raise ValueError("every probed group has equal rewards: no gradient (choose a start with mixed rewards)")
    b = asm.batch.to(next(model.parameters()).device)
    model.train()
    model.zero_grad(set_to_none=True)
    logp, _ = sequence_logprobs(model, b.input_ids, b.attention_mask, b.targets, fp32_head=s.model.fp32_lm_head,
                                temperature=s.generation.temperature, where=b.loss_mask)
    loss, _ = policy_loss(logp, b.logp_gen, b.advantages, b.loss_mask, b.group_ids, loss_type=s.loss.type,
                          aggregation=s.loss.aggregation, clip_low=s.loss.ppo_clip_low,
                          clip_high=s.loss.ppo_clip_high, cispo_eps_max=s.loss.cispo_eps_max)
    (-loss).backward()
    grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    model.eval()
    return grads


def l2(tensors: Sequence[torch.Tensor]) -> float:
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in tensors))


def moved(model: Any, direction: Sequence[torch.Tensor], scale: float) -> Any:
    """A copy of `model` with θ + scale · direction."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p, d in zip(out.parameters(), direction, strict=True):
            p.add_(d.to(p.dtype), alpha=scale)
    return out.eval()


def probe(spec: Any, model: Any, tok: Any, task: Any, *, prompts: int, samples: int, seed: int = 0,
          gradient_steps: Sequence[float] = GRADIENT_STEPS, adam_lrs: Sequence[float] = ADAM_LRS) -> dict[str, Any]:
    """Sample one batch of `prompts` groups from `model`, take the objective's gradient once, and measure the
    pass rate after each probed update. Returns the JSON-able section."""
    import random

    from scalerl.generator.engine import SamplingParams
    from scalerl.generator.role import encode_prompt, length_control
    from scalerl.generator.torch_engine import TorchEngine
    from scalerl.messages import PromptTask, RolloutGroup
    from scalerl.parts import make_verifier

    t0 = time.perf_counter()
    verifier = make_verifier(spec, task)
    length = length_control(spec, tok)
    sampling = SamplingParams(spec.generation.temperature, spec.generation.top_p)
    train = random.Random(seed).sample(task.problems("train"), prompts)
    heldout = task.problems("eval")[:prompts]

    def sample(policy: Any, problems: Sequence[Any], n: int, sample_seed: int) -> list[Any]:
        ids = [encode_prompt(tok, p.prompt) for p in problems]
        comps = TorchEngine(policy, tok, fp32_head=spec.model.fp32_lm_head, seed=sample_seed).generate(
            [x for x in ids for _ in range(n)], sampling, length)
        return [verifier.score(RolloutGroup(PromptTask(p.id, 0, p.prompt, p.answer, n, spec.task.kind), ids[i],
                                            comps[i * n:(i + 1) * n])) for i, p in enumerate(problems)]

    def pass_rates(policy: Any) -> dict[str, float]:
        out = {}
        for name, problems in (("batch_prompts", train), ("heldout", heldout)):
            correct = [ok for g in sample(policy, problems, samples, 10_000 + seed) for ok in g.correct]
            out[name] = sum(correct) / len(correct)
        return out

    groups = sample(model, train, spec.generation.group_size, seed + 1)
    grads = objective_gradient(spec, model, tok.pad_token_id, groups)
    g_norm = l2(grads)
    sign = [g.sign() for g in grads]
    gen = torch.Generator().manual_seed(seed)
    noise = [torch.randn(g.shape, generator=gen, dtype=torch.float32) for g in grads]
    noise_norm = l2(noise)
    rows: list[dict[str, Any]] = [{"direction": "start", "step_l2": 0.0, "lr": None, **pass_rates(model)}]
    # (direction, L2 length, lr or None, vector, scale): the probed policy is θ + scale · vector
    todo: list[tuple[str, float, float | None, list[torch.Tensor], float]] = []
    todo += [("gradient", s, None, grads, s / g_norm) for s in gradient_steps]
    todo += [("random", s, None, noise, s / noise_norm) for s in gradient_steps]
    todo += [("adam", lr * l2(sign), lr, sign, lr) for lr in adam_lrs]
    for i, (direction, step, lr, vector, scale) in enumerate(todo):
        policy = moved(model, vector, scale)
        rows.append({"direction": direction, "step_l2": step, "lr": lr, **pass_rates(policy)})
        elapsed = time.perf_counter() - t0
        print(f"step probe: {i + 1}/{len(todo)} updates probed, {elapsed:.0f} s, "
              f"ETA {elapsed / (i + 1) * (len(todo) - i - 1):.0f} s", file=sys.stderr, flush=True)
    batch_pass = sum(ok for g in groups for ok in g.correct) / sum(len(g.correct) for g in groups)
    start = rows[0]["batch_prompts"]
    return {"prompts": prompts, "samples_per_prompt": samples, "batch_pass_rate": batch_pass,
            "gradient_l2": g_norm, "parameters_with_gradient": int(sum(int((g != 0).sum()) for g in grads)),
            "rows": rows, "largest_safe_gradient_step": _largest_safe(rows, "gradient", start),
            "largest_safe_adam_lr": _largest_safe(rows, "adam", start, key="lr"),
            "wall_s": time.perf_counter() - t0}


def _largest_safe(rows: Sequence[dict[str, Any]], direction: str, start: float, key: str = "step_l2") -> float | None:
    """The largest probed step of `direction` whose batch-prompt pass rate is not below `start`'s."""
    ok = [r[key] for r in rows if r["direction"] == direction and r["batch_prompts"] >= start]
    return max(ok) if ok else None


_ROW_NAMES = {"start": "none (start)", "gradient": "gradient step", "random": "random direction",
              "adam": "AdamW first update, lr {lr:g}"}


def format_table(result: dict[str, Any]) -> str:
    """Markdown table of the probed updates."""
    start = result["rows"][0]
    lines = [f"one on-policy batch of {result['prompts']} prompts (batch pass rate {result['batch_pass_rate']:.3f}), "
             f"gradient L2 norm {result['gradient_l2']:.3g}; pass rate = fraction correct over "
             f"{result['samples_per_prompt']} samples per prompt",
             "",
             "| update | L2 length | pass rate, batch's prompts (Δ) | pass rate, held-out (Δ) |",
             "|---|---|---|---|"]
    for r in result["rows"]:
        name = _ROW_NAMES[r["direction"]].format(lr=r["lr"])
        lines.append(f"| {name} | {r['step_l2']:.3g} | {r['batch_prompts']:.3f} "
                     f"({r['batch_prompts'] - start['batch_prompts']:+.3f}) | {r['heldout']:.3f} "
                     f"({r['heldout'] - start['heldout']:+.3f}) |")
    safe_lr = result["largest_safe_adam_lr"]
    lines.append("")
    lines.append(f"largest probed AdamW learning rate that does not lower the batch's pass rate: "
                 f"{'none' if safe_lr is None else format(safe_lr, 'g')}")
    return "\n".join(lines)


def main() -> int:
    from results_file import merge_sections
    from scalerl.config import load_spec
    from scalerl.console import quiet_third_party_bars
    from scalerl.model.factory import load_model_and_tokenizer
    from scalerl.parts import make_task, seed_everything

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default="examples/forecast.yaml", help="job spec (loss, task, sampling)")
    ap.add_argument("--init", required=True, metavar="DIR", help="model folder to probe (e.g. a run's sft/)")
    ap.add_argument("--prompts", type=int, default=64, help="prompts in the batch and in the held-out probe")
    ap.add_argument("--samples", type=int, default=32, help="samples per prompt for each pass rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results.json", help="results file; the section goes under 'step_probe'")
    args = ap.parse_args()
    for name in ("spec",):
        if not Path(getattr(args, name)).is_file():
            print(f"--{name}: {getattr(args, name)} is not a file; give a job spec YAML", file=sys.stderr)
            return 2
    if not (Path(args.init) / "config.json").is_file():
        print(f"--init: {args.init} holds no config.json; give a saved model folder (e.g. a run's sft/)",
              file=sys.stderr)
        return 2
    if args.prompts < 1 or args.samples < 1:
        print("--prompts and --samples must be >= 1", file=sys.stderr)
        return 2
    quiet_third_party_bars()
    spec = load_spec(args.spec)
    seed_everything(args.seed)
    model, tok = load_model_and_tokenizer(spec.model, spec.seed, args.init)
    result = {"spec": args.spec, "init": args.init,
              **probe(spec, model.eval(), tok, make_task(spec), prompts=args.prompts, samples=args.samples,
                      seed=args.seed)}
    merge_sections(Path(args.out), {"step_probe": result})
    print(format_table(result))
    print(f"wrote {args.out} (key 'step_probe')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
