"""Each eval generation phase draws from its own stream of the eval seed: the completions the selection
strategies share do not depend on which other phases (greedy decoding) ran first.

Regression: greedy decoding still draws the interruption cut points from the engine's generator, so
`--strategy greedy,sample,best-of-n` once sampled other completions than `--strategy best-of-n` from the
same checkpoint and seed, and a reused saved scorer seemed to select worse than when it was trained.
A tiny untrained model and the real torch engine; only the backend records what it returned.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scalerl.console import Progress
from scalerl.evaluation.runner import Context, EmbeddedBackend, EvalOptions, evaluate_checkpoint, stream_seed
from scalerl.generator.engine import LengthControl, SamplingParams
from scalerl.generator.torch_engine import TorchEngine
from scalerl.messages import Completion
from scalerl.parts import configure_threads, make_task, make_verifier


@pytest.fixture
def spec_threads(tiny_spec):
    """`scalerl eval` runs under the spec's thread count (1); more threads than free cores crawl."""
    before = torch.get_num_threads()
    configure_threads(tiny_spec)
    yield tiny_spec
    torch.set_num_threads(before)


class RecordingBackend(EmbeddedBackend):
    """The embedded backend, keeping (n, temperature, token ids of every completion) per call."""

    def __init__(self, engine: TorchEngine, *, seed: int) -> None:
        super().__init__(engine, seed=seed)
        self.calls: list[tuple[int, float, list[list[int]]]] = []

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams,
                 length: LengthControl) -> list[Completion]:
        out = super().generate(prompt_ids, n, sampling, length)
        self.calls.append((n, sampling.temperature, [c.token_ids for c in out]))
        return out


def _shared_samples(tiny_spec, tiny_model, tokenizer, strategies: tuple[str, ...], *, seed: int = 0):
    """Token ids of the n = 4 samples per problem the selection strategies share, after `strategies` ran."""
    task = make_task(tiny_spec)
    backend = RecordingBackend(TorchEngine(tiny_model, tokenizer, seed=seed), seed=seed)
    opts = EvalOptions(strategies=strategies, ks=(1, 4), samples=4, temperature=1.0, seed=seed, show_progress=False)
    ctx = Context(spec=tiny_spec, task=task, verifier=make_verifier(tiny_spec, task), tokenizer=tokenizer,
                  policy=tiny_model, backend=backend, checkpoint=Path("unused"), opts=opts, progress=Progress(False))
    evaluate_checkpoint(ctx, task.problems("eval")[:4])
    shared = [ids for n, temperature, ids in backend.calls if n == 4 and temperature > 0]
    assert len(shared) == 1 and len(shared[0]) == 16
    return shared[0]


def test_shared_samples_do_not_depend_on_earlier_phases(spec_threads, tiny_model, tokenizer):
    tiny_spec = spec_threads
    alone = _shared_samples(tiny_spec, tiny_model, tokenizer, ("sample",))
    after_greedy = _shared_samples(tiny_spec, tiny_model, tokenizer, ("greedy", "sample", "majority"))
    assert after_greedy == alone
    # the seed still matters: another eval seed draws other completions
    assert _shared_samples(tiny_spec, tiny_model, tokenizer, ("sample",), seed=1) != alone


def test_stream_seeds_repeat_and_differ_by_name_and_seed():
    assert stream_seed(0, "samples") == stream_seed(0, "samples")
    assert len({stream_seed(0, "samples"), stream_seed(0, "greedy"), stream_seed(1, "samples")}) == 3
    assert 0 <= stream_seed(7, "budget forcing 8") < 2 ** 63
