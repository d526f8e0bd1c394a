"""The Helm chart's copy of the RLJob CRD (helm/scalerl/files/rljob-crd.yaml) is exactly what
`python -m scalerl_operator.api.crd` prints today, and the chart's template takes it from there.

A change to the operator's pydantic models without `make crd` (scripts/gen_crd.sh) fails here, so a
chart never ships a schema older than the operator that reads it.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import yaml

from scalerl_operator.api.crd import crd, crd_yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "scalerl"
CHART_CRD = CHART / "files" / "rljob-crd.yaml"


def test_chart_crd_file_is_the_generated_crd() -> None:
    committed = CHART_CRD.read_text()
    generated = crd_yaml()
    if committed != generated:
        diff = "".join(list(difflib.unified_diff(committed.splitlines(True), generated.splitlines(True),
                                                 str(CHART_CRD), "python -m scalerl_operator.api.crd", n=1))[:40])
        raise AssertionError(f"{CHART_CRD.relative_to(REPO)} is stale: run `make crd`\n{diff}")
    # the same object, not only the same text: the YAML parses back to crd()
    assert yaml.safe_load(committed) == crd()


def test_gen_crd_check_mode_agrees() -> None:
    # scripts/gen_crd.sh --check compares a fresh generation with the committed copy (exit 0 = current)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gen_crd.sh"), "--check"], cwd=REPO,
                          env={**os.environ, "PY": sys.executable},
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "helm/scalerl/files/rljob-crd.yaml: current"


def test_crd_template_reads_the_generated_file_behind_the_install_flag() -> None:
    template = (CHART / "templates" / "crd.yaml").read_text()
    assert '.Files.Get "files/rljob-crd.yaml"' in template
    assert "if .Values.crds.install" in template
    assert '"helm.sh/resource-policy" "keep"' in template
    assert not (CHART / "crds").exists(), "crds/ is never upgraded by Helm: the CRD lives in templates/"
