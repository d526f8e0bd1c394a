"""The documentation site (mkdocs.yml, docs/): its references are generated from the code and must be current,
every JobSpec field is documented, the RLJob reference lists every field of the CRD's schema, the site builds
with --strict (a broken link, a missing page or an unknown anchor fails), and the README's quick commands
work as pasted."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel, Field

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
QUICK = "<!-- quick -->"  # the line before a fenced block of commands cheap enough for the suite to run


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts/gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_jobspec_field_has_a_description() -> None:
    from scalerl.config import JobSpec

    assert _gen_docs().undocumented_fields(JobSpec) == [], "give each field a description= (unit, range, source)"


def test_an_undocumented_field_is_found() -> None:
    class Inner(BaseModel):
        documented: int = Field(1, description="a documented leaf")
        bare: int = 2

    class Outer(BaseModel):
        inner: Inner = Field(default_factory=Inner)  # a section without description or docstring

    assert _gen_docs().undocumented_fields(Outer) == ["inner", "inner.bare"]


def test_generated_references_are_current(tmp_path: Path) -> None:
    written = _gen_docs().write_all(tmp_path)
    stale = [p.name for p in written if p.read_text() != (REPO / "docs/reference" / p.name).read_text()]
    assert not stale, f"docs/reference/{', '.join(stale)} differ from the code: run `make docs` and commit them"


def test_rljob_reference_lists_every_field_of_the_crd_schema() -> None:
    gen = _gen_docs()
    page = (REPO / "docs/reference/rljob.md").read_text()
    paths = gen.crd_field_paths()
    assert len(paths) > 100 and "spec.bus.bootstrap" in paths and "status.phase" in paths
    missing = [p for p in paths if f"| `{p}` |" not in page]
    assert not missing, f"docs/reference/rljob.md lacks {missing[:10]} (of {len(missing)}): run `make docs`"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = BIN / "mkdocs"
    if not mkdocs.exists():
        pytest.fail(f"mkdocs is not installed in {BIN} (make install-dev installs it)")
    proc = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert proc.returncode == 0, "\n".join(warnings) or proc.stderr[-3000:]
    assert (tmp_path / "site/reference/jobspec/index.html").exists()


def quick_commands(markdown: str) -> list[str]:
    """The commands of every fenced block that follows a `<!-- quick -->` line (comments and blank lines
    dropped, backslash continuations joined)."""
    commands = []
    for block in re.findall(rf"^{re.escape(QUICK)}\n```[a-z]*\n(.*?)^```", markdown, flags=re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split(" #", 1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def test_quick_commands_are_found() -> None:
    text = f"x\n{QUICK}\n```bash\nscalerl --help    # note\n# a comment\nscalerl fit \\\n  --help\n```\n" \
           "```bash\nmake run\n```\n"
    assert quick_commands(text) == ["scalerl --help", "scalerl fit    --help"]


def test_the_readme_quick_commands_work_as_pasted() -> None:
    commands = quick_commands((REPO / "README.md").read_text())
    assert len(commands) >= 3, f"the README marks too few commands {QUICK}: {commands}"
    # as pasted into a fresh shell: the project environment is not on PATH (make test puts it there)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != BIN.resolve()]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(path)
    for command in commands:
        proc = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=300,
                              check=False, env=env)
        assert proc.returncode == 0, f"{command!r} exited {proc.returncode}: {proc.stderr[-2000:]}"
