"""Shared fixtures: a tiny model + tokenizer and small specs, so unit tests need no downloads."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# tests/vllm_cpu run in the vLLM environment (`make install-vllm`, a separate pytest process: make test);
# the main environment has no vLLM and does not collect them.
if importlib.util.find_spec("vllm") is None:
    collect_ignore = ["vllm_cpu"]

# `infra` (the running Kafka + MinIO) and `unique`: tests/integration and tests/vllm_cpu both use them
pytest_plugins = ["infra_servers"]


@pytest.fixture(scope="session")
def tokenizer():
    from scalerl.model.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture
def tiny_spec():
    from scalerl.config import spec_from_dict

    return spec_from_dict({
        "name": "unit", "seed": 0,
        "model": {"tiny": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 2,
                           "max_positions": 128}},
        "task": {"kind": "addition", "digits": 2, "train_size": 200, "eval_size": 8},
        "sft": {"steps": 0},
        "generation": {"group_size": 4, "thinking_budget_tokens": 24, "answer_budget_tokens": 6,
                       "interruption": {"window_tokens": [16, 24]}, "prompts_per_batch": 4},
        "optim": {"lr": 1e-3, "warmup_steps": 0},
        "train": {"prompts_per_step": 4, "steps": 4, "checkpoint_every": 2},
        "eval": {"every_steps": 2, "samples_per_prompt": 2},
        "runtime": {"threads": 1},
    })


@pytest.fixture(scope="session")
def addition_run_spec():
    """Factory of the small addition job the end-to-end runs share: `warm_start.addition_spec`."""
    from warm_start import addition_spec

    return addition_spec


@pytest.fixture(scope="session")
def mixed_start(tmp_path_factory, addition_run_spec) -> str:
    """One mixed-reward warm start (`warm_start.mixed_reward_warm_start`) of the addition run, shared by the
    session's runs: its SFT reads only the model, task, SFT settings and seed, the same in every
    `addition_run_spec` (the steps, k and checkpoints given here do not enter it)."""
    from warm_start import mixed_reward_warm_start

    spec = addition_run_spec("sft", None, steps=1, off_policy={"mode": "pipeline", "k": 1}, checkpoint_every=1,
                             eval_every=1)
    return mixed_reward_warm_start(spec, tmp_path_factory.mktemp("mixed-start"))


@pytest.fixture
def tiny_model(tiny_spec, tokenizer):
    from scalerl.model.factory import build_tiny_model

    torch.manual_seed(0)
    return build_tiny_model(tiny_spec.model, tokenizer, seed=0).eval()


# Servers that scripts/test_suite.sh's background up.sh brings up last (Kafka and MinIO come first).
_LATE_SERVER_FIXTURES = frozenset({"k8s", "k8s_env", "cluster_env", "kueue_env", "node_env", "observability"})


# The session fixtures that start or wait for servers (tests/infra_session.running_servers): a test that
# uses one is marked `infra`, or `make test` runs it in the stream that has no servers, where it passes only
# when the other stream's servers happen to be up by then (cert-manager's tests in CI of 2026-12-07).
SERVER_FIXTURES = frozenset({"infra", "k8s_env", "cluster_env", "kueue_env", "certmanager_env", "observability",
                             "grpcurl", "node_env"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuses a test that uses servers without the `infra` marker. Under `make test` (SCALERL_INFRA_UP_PID
    set: the servers still come up in the background), the files whose tests need only Kafka and MinIO run
    first, so they run while the other servers build; the order within a file, and of files of the same
    kind, is kept."""
    unmarked = [item.nodeid for item in items if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("infra") is None]
    if unmarked:
        raise pytest.UsageError("these tests use servers (" + ", ".join(sorted(SERVER_FIXTURES)) + ") but are "
                                "not marked `infra`: " + "; ".join(unmarked[:10]))
    if not os.environ.get("SCALERL_INFRA_UP_PID"):
        return
    late: set[str] = set()
    for item in items:
        if _LATE_SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            late.add(str(item.fspath))
    items.sort(key=lambda item: str(item.fspath) in late)
