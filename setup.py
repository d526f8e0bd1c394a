"""Build hook only; the project's metadata lives in pyproject.toml.

A non-editable build (wheel) copies protos/ into the package (`scalerl/rpc/protos/`) and generates
the protobuf/gRPC stubs (`scalerl/rpc/gen/`) into the build folder, so an installed scalerl has both
and never needs to write into site-packages. An editable install reads protos/ in the checkout and
generates the stubs there (`make install`, or on first import of `scalerl.rpc`).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _codegen():  # type: ignore[no-untyped-def]
    """scalerl/rpc/codegen.py loaded by path (importing the package would run its import-time check)."""
    spec = importlib.util.spec_from_file_location("_scalerl_codegen", ROOT / "services/scalerl/rpc/codegen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        rpc = Path(self.build_lib) / "scalerl" / "rpc"
        protos = rpc / "protos"
        shutil.rmtree(protos, ignore_errors=True)
        shutil.copytree(ROOT / "protos", protos, ignore=shutil.ignore_patterns("*~", ".*"))
        shutil.rmtree(rpc / "gen", ignore_errors=True)
        _codegen().generate(rpc / "gen", protos)


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildPyWithProtos})
