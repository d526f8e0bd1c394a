"""Build-time generation of the Python stubs of protos/scalerl/v1/*.proto (never committed).

`python -m scalerl.rpc.codegen` (run by `make install` and `make protos`) compiles the protos with
grpcio-tools into the gitignored package `scalerl.rpc.gen` (`gen/scalerl/v1/messages_pb2.py`,
`services_pb2.py`, `services_pb2_grpc.py` and `.pyi` stubs) and writes `gen/PROTOS_SHA256`, the
digest of the .proto files it compiled. Importing `scalerl.rpc` calls `ensure_generated()`, which
regenerates when the stubs are missing or the stamp differs from the protos on disk, so a fresh
clone, an editable install and CI all work without a manual step.

Where the protos are found (first match):
1. `scalerl/rpc/protos/` inside the installed package: a non-editable install (wheel) gets a copy
   of protos/ there, and its stubs generated, at build time (setup.py's `build_py`);
2. `<repo>/protos/` next to `services/` (editable install, a checkout).

Choices:
1. protoc writes `from scalerl.v1 import messages_pb2`, which would resolve to the top-level
   `scalerl` package; the imports are rewritten to `scalerl.rpc.gen.scalerl.v1`.
2. Generation is atomic and safe with concurrent processes (several roles starting at once): under
   an exclusive file lock the stubs are written to a temporary folder beside `gen/`, then swapped
   in with two renames; the stamp is re-checked after the lock is taken.
3. This module imports only the standard library (setup.py loads it by path at build time) and runs
   protoc as `python -m grpc_tools.protoc` in a subprocess, so protoc's errors come back as text.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PROTO_PACKAGE = "scalerl/v1"
GEN_PACKAGE = "scalerl.rpc.gen"
STAMP_NAME = "PROTOS_SHA256"
# Bumped when the generation itself changes (flags, import rewriting), so old stubs are regenerated.
CODEGEN_VERSION = "1"

_RPC_DIR = Path(__file__).resolve().parent
_IMPORT_RE = re.compile(r"^(\s*)from scalerl\.v1 import ", re.MULTILINE)


class CodegenError(RuntimeError):
    """The protos cannot be found or compiled, or the stubs cannot be written."""


def default_gen_dir() -> Path:
    """The folder of the `scalerl.rpc.gen` package."""
    return _RPC_DIR / "gen"


def default_proto_root() -> Path:
    """The include root holding scalerl/v1/*.proto (see the module docstring for the search order)."""
    packaged = _RPC_DIR / "protos"
    repo = _RPC_DIR.parents[2] / "protos"
    for root in (packaged, repo):
        if (root / PROTO_PACKAGE).is_dir():
            return root
    raise CodegenError(f"no {PROTO_PACKAGE}/*.proto found in {packaged} (installed package) or {repo} "
                       "(checkout); reinstall scalerl or run from a checkout with protos/")


def proto_files(root: Path) -> list[Path]:
    files = sorted((root / PROTO_PACKAGE).glob("*.proto"))
    if not files:
        raise CodegenError(f"{root / PROTO_PACKAGE}: no .proto files")
    return files


def _grpc_version() -> str:
    """The installed grpcio's version ("none" without it): generated stubs refuse to load under a grpcio
    older than the grpcio-tools that wrote them (their GRPC_GENERATED_VERSION check)."""
    try:
        return importlib.metadata.version("grpcio")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def protos_digest(root: Path) -> str:
    """sha256 over (relative path, contents) of every .proto, plus CODEGEN_VERSION and the installed grpcio's
    version: stubs a build wrote with another grpcio-tools (pip's isolated build environment takes the newest)
    are regenerated with this environment's, so they always load (a real node's Pods crashed on that)."""
    h = hashlib.sha256(f"scalerl-codegen-{CODEGEN_VERSION}\0grpcio-{_grpc_version()}\0".encode())
    for f in proto_files(root):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def stamp_of(gen_dir: Path) -> str | None:
    try:
        return (gen_dir / STAMP_NAME).read_text().strip()
    except OSError:
        return None


def is_current(gen_dir: Path, root: Path) -> bool:
    """True when `gen_dir` holds stubs generated from exactly the protos under `root`."""
    return stamp_of(gen_dir) == protos_digest(root) and (gen_dir / "scalerl" / "v1" / "services_pb2_grpc.py").is_file()


def _protoc(root: Path, out: Path, extra: list[str]) -> None:
    files = [f.relative_to(root).as_posix() for f in proto_files(root)]
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", *extra, *files]
    try:
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CodegenError(f"cannot run protoc ({' '.join(cmd[:3])}): {exc}") from exc
    if proc.returncode != 0:
        hint = " (install grpcio-tools: pip install 'scalerl[distributed]')" if "No module named" in proc.stderr else ""
        raise CodegenError(f"protoc failed with exit code {proc.returncode}{hint}: {proc.stderr.strip()[-2000:]}")


def generate(out_dir: Path, root: Path | None = None) -> list[Path]:
    """Compile every proto under `root` into the package folder `out_dir` (created; existing stubs in
    it are overwritten) and write the stamp. Returns the files written."""
    root = (root or default_proto_root()).resolve()
    out_dir = out_dir.resolve()  # protoc runs in `root`
    digest = protos_digest(root)
    out_dir.mkdir(parents=True, exist_ok=True)
    _protoc(root, out_dir, [f"--python_out={out_dir}", f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}"])
    written: list[Path] = []
    pkg = out_dir / "scalerl" / "v1"
    for f in sorted(pkg.glob("*.py*")):
        text = f.read_text()
        fixed = _IMPORT_RE.sub(rf"\1from {GEN_PACKAGE}.scalerl.v1 import ", text)
        if fixed != text:
            f.write_text(fixed)
        written.append(f)
    for d in (out_dir, out_dir / "scalerl", pkg):
        init = d / "__init__.py"
        init.write_text('"""Generated by scalerl.rpc.codegen from protos/ (do not edit)."""\n')
        written.append(init)
    (out_dir / STAMP_NAME).write_text(digest + "\n")
    written.append(out_dir / STAMP_NAME)
    return written


def differences(gen_dir: Path, root: Path) -> list[str]:
    """Files of `gen_dir` that differ from a fresh generation out of `root` (missing, extra or changed,
    stamp included), as paths relative to `gen_dir`; empty when they agree byte for byte."""
    with tempfile.TemporaryDirectory(prefix="scalerl-codegen-check-") as tmp:
        fresh = Path(tmp) / "gen"
        generate(fresh, root)
        want = {f.relative_to(fresh).as_posix(): f.read_bytes() for f in fresh.rglob("*") if f.is_file()}
    have = {f.relative_to(gen_dir).as_posix(): f.read_bytes() for f in gen_dir.rglob("*")
            if f.is_file() and "__pycache__" not in f.parts} if gen_dir.is_dir() else {}
    return sorted(k for k in want.keys() | have.keys() if want.get(k) != have.get(k))


def descriptor_set(root: Path, out_file: Path) -> bytes:
    """The serialized FileDescriptorSet protoc builds from the protos (for consistency checks)."""
    _protoc(root.resolve(), out_file.parent, [f"--descriptor_set_out={out_file.resolve()}"])
    return out_file.read_bytes()


@contextmanager
def _exclusive_lock(gen_dir: Path) -> Iterator[None]:
    key = hashlib.sha256(str(gen_dir).encode()).hexdigest()[:16]
    lock_path = Path(tempfile.gettempdir()) / f"scalerl-codegen-{key}.lock"
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_generated(gen_dir: Path | None = None, root: Path | None = None, *, force: bool = False) -> bool:
    """Regenerate `gen_dir` if its stamp is missing or stale (or `force`); True if it regenerated."""
    gen_dir = (gen_dir or default_gen_dir()).resolve()
    if root is None:
        try:
            root = default_proto_root()
        except CodegenError:
            if stamp_of(gen_dir) is not None:  # an install that ships the stubs but not the protos
                return False
            raise
    root = root.resolve()
    if not force and is_current(gen_dir, root):
        return False
    if not os.access(gen_dir.parent, os.W_OK):
        raise CodegenError(f"the protobuf stubs in {gen_dir} are missing or stale and {gen_dir.parent} is "
                           "not writable: run `python -m scalerl.rpc.codegen` as the installation's owner")
    with _exclusive_lock(gen_dir):
        if not force and is_current(gen_dir, root):
            return False  # another process generated them while we waited
        tmp = Path(tempfile.mkdtemp(prefix=".gen-", dir=gen_dir.parent))
        old = gen_dir.parent / f".gen-old-{os.getpid()}"
        try:
            generate(tmp, root)
            if gen_dir.exists():
                try:
                    gen_dir.rename(old)
                except OSError as exc:  # a folder of a lower overlay layer (an image build) cannot be renamed
                    if exc.errno != errno.EXDEV:
                        raise
                    shutil.rmtree(gen_dir)
            tmp.rename(gen_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalerl.rpc.codegen",
                                     description="Generate the protobuf/gRPC stubs of scalerl.")
    parser.add_argument("--force", action="store_true", help="regenerate even when the stamp is current")
    parser.add_argument("--check", action="store_true",
                        help="only check: regenerate into a temporary folder and exit 1 if any file differs")
    args = parser.parse_args(argv)
    try:
        gen_dir, root = default_gen_dir(), default_proto_root()
        if args.check:
            diff = differences(gen_dir, root)
            print(f"{gen_dir}: " + (f"{len(diff)} file(s) differ from the protos in {root}: {', '.join(diff)}"
                                    if diff else f"agrees with the protos in {root}"))
            return 1 if diff else 0
        did = ensure_generated(gen_dir, root, force=args.force)
    except CodegenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{gen_dir}: {'generated' if did else 'already current'} from {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
