"""Synthetic pass-rate curves for the scaling tests.

Noise model: mean@16 on 1,000 held-out prompts, i.e. a binomial mean over 16,000 samples
(std = sqrt(p(1 − p) / 16000) ≈ 0.004 at p = 0.6), as in the paper's evaluation (spec §1.2).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.special import expit

from scalerl.scaling import sigmoid

# Table 1 of the paper (spec §4.1): (A, B, C_mid in GPU-hours)
TABLE1 = {
    "scalerl-8b": (0.610, 1.92, 2542.0),
    "bs2048-100k": (0.645, 1.70, 10909.0),
    "scout": (0.710, 1.65, 4242.0),
}
R0_TRUE = 0.30
SAMPLES = 16 * 1000  # mean@16 over 1,000 prompts


def synth(
    A: float,
    B: float,
    C_mid: float,
    *,
    seed: int,
    n: int = 61,
    span: float = 4.0,
    spacing: str = "linear",
    r0: float = R0_TRUE,
    samples: int = SAMPLES,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute [n], noisy pass rate [n], true pass rate [n]); compute[0] = 0 is the step-0 eval."""
    rng = np.random.default_rng(seed)
    if spacing == "linear":
        c = np.linspace(0.0, span * C_mid, n)
    else:
        c = np.concatenate([[0.0], np.geomspace(C_mid / 20, span * C_mid, n - 1)])
    p = sigmoid(c, A=A, B=B, C_mid=C_mid, R0=r0)
    return c, rng.binomial(samples, p) / samples, p


def prompt_level(
    A: float,
    B: float,
    C_mid: float,
    *,
    seed: int,
    n: int = 61,
    n_prompts: int = 1000,
    k: int = 16,
    r0: float = R0_TRUE,
) -> tuple[np.ndarray, np.ndarray]:
    """(compute [n], per-prompt pass rates [n, n_prompts]) from a population whose mean follows the curve.

    Prompt i at compute C is solved with probability expit(θ_i + g(C)), θ_i ~ N(0, 1.5²) drawn once per
    eval set; g(C) makes the *population* mean equal the sigmoid, so a finite eval set's own ceiling
    differs from A by prompt sampling — the uncertainty a prompt bootstrap has to cover.
    """
    rng = np.random.default_rng(seed)
    theta = rng.normal(0.0, 1.5, n_prompts)
    x, wq = np.polynomial.hermite_e.hermegauss(64)  # E over θ ~ N(0, 1.5²) by Gauss–Hermite quadrature
    wq = wq / wq.sum()
    c = np.linspace(0.0, 4 * C_mid, n)
    target = sigmoid(c, A=A, B=B, C_mid=C_mid, R0=r0)
    lo, hi = np.full(n, -15.0), np.full(n, 15.0)
    for _ in range(50):  # bisection for g per eval point
        mid = (lo + hi) / 2
        below = expit(1.5 * x[None, :] + mid[:, None]) @ wq < target
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    g = (lo + hi) / 2
    rates = rng.binomial(k, expit(theta[None, :] + g[:, None])) / k
    return c, rates


def eval_records(c: np.ndarray, y: np.ndarray, prompts: np.ndarray | None = None) -> list[dict[str, Any]]:
    out = []
    for i in range(c.size):
        rec: dict[str, Any] = {
            "kind": "eval",
            "step": 10 * i,
            "compute": float(c[i]),
            "gen_tokens": 1000 * i,
            "train_tokens": 800 * i,
            "pass_rate": float(y[i]) if prompts is None else float(prompts[i].mean()),
            "k": 16,
            "n_prompts": 1000,
            "wall_s": 3.0 * i,
        }
        if prompts is not None:
            rec["prompt_pass_rates"] = prompts[i].tolist()
        out.append(rec)
    return out


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[..., Path]:
    """Factory: a run folder with metrics.jsonl (+ train.jsonl and summary.json) from a known curve."""

    def make(
        name: str = "run",
        *,
        A: float = 0.61,
        B: float = 1.92,
        C_mid: float = 2542.0,
        n: int = 41,
        seed: int = 0,
        train: bool = True,
        scale: float = 1.0,
    ) -> Path:
        d = tmp_path / name
        d.mkdir()
        c, y, _ = synth(A, B, C_mid, seed=seed, n=n)
        recs = eval_records(c * scale, y)
        write_jsonl(d / "metrics.jsonl", recs)
        if train:
            rng = np.random.default_rng(seed)
            steps = [
                {
                    "kind": "step",
                    "step": s,
                    "compute": float(s) * 0.01,
                    "loss": float(1 / (1 + s)),
                    "effective_batch": int(rng.integers(20, 32)),
                    "dropped_stale": int(rng.integers(0, 3)),
                    "truncation_rate": float(rng.uniform(0, 0.1)),
                    "entropy": float(2 - s / 500),
                    "clip_frac": float(rng.uniform(0, 0.05)),
                    "staleness_mean": float(rng.uniform(0, 2)),
                    "staleness_max": int(rng.integers(2, 8)),
                }
                for s in range(0, 400, 5)
            ]
            fits = [
                {
                    "kind": "fit",
                    "step": 100 * j,
                    "compute": float(c[j] * scale),
                    "A": 0.6 + 0.001 * j,
                    "B": 1.9,
                    "C_mid": C_mid,
                    "R0": 0.3,
                    "r2": 0.99,
                    "ci": {"A": [0.58 + 0.001 * j, 0.62 + 0.001 * j]},
                    "forecast": [],
                }
                for j in range(5, n, 5)
            ]
            write_jsonl(d / "train.jsonl", steps + fits)
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "name": name,
                    "initial_pass_rate": float(y[0]),
                    "final_pass_rate": float(y[-1]),
                    "steps": 10 * (n - 1),
                    "compute": float(c[-1] * scale),
                    "wall_s": 123.4,
                    "fit": None,
                }
            )
        )
        return d

    return make


@pytest.fixture
def synth_curve() -> Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """`synth` as a fixture (test modules do not import conftest)."""
    return synth


@pytest.fixture
def prompt_curve() -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    return prompt_level


@pytest.fixture
def records_of() -> Callable[..., list[dict[str, Any]]]:
    return eval_records


@pytest.fixture
def table1() -> dict[str, tuple[float, float, float]]:
    return dict(TABLE1)


@pytest.fixture
def run_cli() -> Callable[..., tuple[int, str, str]]:
    """`run_cli(argv, capsys)`: the scaling commands (`scalerl.report.commands`) parsed and run in this
    process; (exit status, stdout, stderr)."""
    import argparse

    from scalerl.report import commands

    def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
        parser = argparse.ArgumentParser(prog="scalerl")
        commands.register(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(argv)
        rc = args.func(args)
        out, err = capsys.readouterr()
        return rc, out, err
    return run
