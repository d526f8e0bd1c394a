"""`scalerl --help`, `scalerl CMD --help` and `--version` answer without importing the heavy stack
(torch, transformers, numpy, scipy, pydantic): those load only when a command runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import scalerl
from scalerl.cli import build_parser

HEAVY = ("torch", "transformers", "numpy", "scipy", "pydantic", "kafka", "grpc", "matplotlib")
COMMANDS = ("run", "serve", "fetch-run", "dlq", "sft", "fit", "compare", "eval", "score")

_PROBE = """
import contextlib, io, json, sys
from scalerl.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
heavy = HEAVY_MODULES
loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
print(json.dumps({"code": code, "out": out.getvalue(), "loaded": loaded}))
""".replace("HEAVY_MODULES", repr(HEAVY))


def _probe(*argv: str) -> dict[str, object]:
    """Run the CLI in a fresh interpreter; report its exit code, stdout and which heavy modules it imported."""
    res = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout.splitlines()[-1]))


@pytest.mark.parametrize("argv", [("--help",), *((cmd, "--help") for cmd in COMMANDS)])
def test_help_imports_no_heavy_module(argv):
    got = _probe(*argv)
    assert got["code"] == 0
    assert got["loaded"] == [], f"scalerl {' '.join(argv)} imported {got['loaded']}"
    assert "usage: scalerl" in str(got["out"])


def test_version():
    got = _probe("--version")
    assert got["code"] == 0 and got["out"] == f"scalerl {scalerl.__version__}\n"


def test_top_level_help_lists_every_command_with_a_description():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    listed = {c.dest: (c.help or "") for c in sub._choices_actions}  # type: ignore[attr-defined]
    assert set(listed) == set(COMMANDS)
    assert all(len(text) > 10 for text in listed.values()), listed
    text = parser.format_help()
    for cmd in COMMANDS:
        assert f"    {cmd} " in text


def test_lazy_package_exports_resolve():
    """The lazily exported names are the real objects (and evaluation re-exports every metric)."""
    import scalerl.evaluation as evaluation
    import scalerl.scaling as scaling
    from scalerl.evaluation import metrics
    from scalerl.scaling import curves

    assert set(metrics.__all__) <= set(evaluation.__all__)
    assert evaluation.pass_at_k is metrics.pass_at_k
    assert scaling.sigmoid is curves.sigmoid and scaling.A_MARGIN == curves.A_MARGIN == 0.02
    for name in scaling.__all__:
        assert getattr(scaling, name) is not None
    with pytest.raises(AttributeError):
        _ = scaling.no_such_name
