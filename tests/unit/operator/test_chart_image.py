"""The chart hands its image to the operator as the RLJobs' default (no helm needed here; the rendered
Deployment is checked with the real helm client in tests/k8s/test_helm.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from scalerl_operator.api.spec import parse_spec
from scalerl_operator.render.images import IMAGE_ENV, PULL_POLICY_ENV, PULL_SECRETS_ENV

CHART = Path(__file__).resolve().parents[3] / "helm" / "scalerl"


def test_the_operator_deployment_sets_the_variables_the_operator_reads() -> None:
    template = (CHART / "templates" / "operator.yaml").read_text()
    for name, value in ((IMAGE_ENV, '{{ include "scalerl.image" . | quote }}'),
                        (PULL_POLICY_ENV, "{{ .Values.image.pullPolicy | quote }}"),
                        (PULL_SECRETS_ENV, '{{ include "scalerl.pullSecretNames" . | quote }}')):
        assert f"- name: {name}\n              value: {value}\n" in template, name


def test_values_say_the_image_must_be_built_pushed_and_set() -> None:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    assert values["image"]["repository"].startswith("registry.invalid/")  # reserved TLD: never pullable
    assert "docker build -t REGISTRY/scalerl" in text and "docker push" in text and "MUST be set" in text


def test_an_rljob_without_image_leaves_it_to_the_operator() -> None:
    spec = parse_spec({"bus": {"bootstrap": "k:9092"}, "store": {"uri": "s3://bucket/x"}})
    assert (spec.image, spec.image_pull_policy) == ("", "")


def test_the_operator_runs_under_tini() -> None:
    # PID 1 ignores SIGTERM without a handler: tini is PID 1 and forwards it to the operator's process group
    template = (CHART / "templates" / "operator.yaml").read_text()
    assert "          command: [tini, -g, --, python, -m, scalerl_operator]\n" in template
