"""`generation.engine` is honoured by one factory: the torch engine here; `vllm` where the vllm package is
absent (this environment) is one line naming the field and the environment that provides it, exit 2,
before any work — for `scalerl run`, `scalerl serve generator` and `scalerl eval`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from scalerl.cli import main
from scalerl.config import SpecError, spec_from_dict
from scalerl.generator.factory import VLLM_MISSING, make_engine
from scalerl.generator.torch_engine import TorchEngine
from scalerl.model.factory import load_model_and_tokenizer, save_model_and_tokenizer

SPEC = ("name: t\ntask:\n  kind: addition\n  digits: 2\ngeneration:\n  engine: vllm\n  thinking_budget_tokens: 48\n"
        "  answer_budget_tokens: 8\n  interruption:\n    window_tokens: [40, 48]\n")


def _one_line_exit_2(code: int, capsys: pytest.CaptureFixture[str]) -> None:
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("scalerl") and err.endswith(f" error: {VLLM_MISSING}\n") and err.count("\n") == 1
    assert "make install-vllm" in err


def test_this_environment_has_no_vllm() -> None:
    assert importlib.util.find_spec("vllm") is None  # the premise of the tests below


def test_run_with_vllm_exits_2_before_writing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    _one_line_exit_2(main(["run", str(spec), "--out", str(tmp_path / "out")]), capsys)
    assert not (tmp_path / "out").exists()


def test_serve_generator_with_vllm_exits_2_before_connecting(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    # Port 9 (discard) has no broker: had the role started, it would wait for one instead of returning.
    code = main(["serve", "generator", "--job", str(spec), "--bus", "kafka://127.0.0.1:9",
                 "--store", str(tmp_path / "store"), "--grpc-port", "-1", "--http-port", "0"])
    _one_line_exit_2(code, capsys)
    assert not (tmp_path / "store").exists()


def test_eval_with_vllm_exits_2_before_loading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    model, tok = load_model_and_tokenizer(spec_from_dict({"name": "t"}).model, 0)
    save_model_and_tokenizer(model, tok, tmp_path / "ckpt")
    capsys.readouterr()  # the save's progress bar
    before = sorted(p.name for p in tmp_path.rglob("*"))
    _one_line_exit_2(main(["eval", str(tmp_path / "ckpt"), "--spec", str(spec)]), capsys)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_factory_builds_the_spec_engine(tmp_path: Path) -> None:
    spec = spec_from_dict({"name": "t", "seed": 4})
    model, tok = load_model_and_tokenizer(spec.model, 0)
    engine = make_engine(spec, model, tok, seed=9, workdir=tmp_path)
    assert isinstance(engine, TorchEngine) and engine.model is model and engine.fp32_head
    vllm = spec.model_copy(update={"generation": spec.generation.model_copy(update={"engine": "vllm"})})
    with pytest.raises(SpecError, match=r"generation\.engine"):
        make_engine(vllm, model, tok, seed=9, workdir=tmp_path)
    assert not any(tmp_path.iterdir())  # nothing saved for an engine that cannot start
