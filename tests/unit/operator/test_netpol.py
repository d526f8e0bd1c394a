"""The NetworkPolicy of an RLJob's roles (scalerl_operator.render.netpol): ingress only from the job's own
Pods and, to the side port only, from the scrapers; valid against the Kubernetes 1.34 schema (strict); the
operator's settings refused with the variable named when malformed."""

from __future__ import annotations

import kubernetes_validate
import pytest
from test_render import JOB, NS, OPERATOR_IMAGES, make_spec

from scalerl_operator.render.children import desired_replicas, render
from scalerl_operator.render.netpol import DEFAULT_SCRAPE_FROM, NetworkDefaults, network_defaults, network_policy


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_only_the_jobs_pods_and_the_scrapers_get_in() -> None:
    spec = make_spec()
    policy = network_policy(JOB, NS, spec, NetworkDefaults())
    kubernetes_validate.validate(policy, "1.34", strict=True)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    own, scrape = policy["spec"]["ingress"]
    assert "ports" not in own and scrape["ports"] == [{"port": 9091, "protocol": "TCP"}]  # metricsPort of make_spec
    assert scrape["from"] == list(DEFAULT_SCRAPE_FROM)
    # the policy selects every role Pod of this job, and its own-Pods rule admits exactly them
    objs = render(JOB, NS, spec, desired_replicas(spec, live={}, remembered={}), OPERATOR_IMAGES)
    pods = [o["spec"]["template"]["metadata"]["labels"] for o in objs if o["kind"] in ("Deployment", "StatefulSet")]
    assert len(pods) == 4
    assert all(_matches(policy["spec"]["podSelector"], p) for p in pods)
    (peer,) = own["from"]
    assert set(peer) == {"podSelector"}  # this namespace only: no namespaceSelector
    assert all(_matches(peer["podSelector"], p) for p in pods)
    other_job = render("other", NS, spec, desired_replicas(spec, live={}, remembered={}), OPERATOR_IMAGES)
    assert not any(_matches(peer["podSelector"], o["spec"]["template"]["metadata"]["labels"])
                   for o in other_job if o["kind"] in ("Deployment", "StatefulSet"))
    assert len(network_policy(JOB, NS, spec, NetworkDefaults(scrape_from=()))["spec"]["ingress"]) == 1


@pytest.mark.parametrize("env, message", [
    ({"SCALERL_NETWORK_POLICIES": "yes"}, "SCALERL_NETWORK_POLICIES: must be true or false (got 'yes')"),
    ({"SCALERL_SCRAPE_FROM": "[{"}, "SCALERL_SCRAPE_FROM: not JSON"),
    ({"SCALERL_SCRAPE_FROM": '{"podSelector": {}}'}, "SCALERL_SCRAPE_FROM: expected a list of NetworkPolicyPeer"),
    ({"SCALERL_SCRAPE_FROM": '[{"pods": {}}]'}, "SCALERL_SCRAPE_FROM: expected a list of NetworkPolicyPeer"),
    ({"SCALERL_SCRAPE_FROM": "[{}]"}, "SCALERL_SCRAPE_FROM: expected a list of NetworkPolicyPeer"),
])
def test_malformed_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as err:
        network_defaults(env)
    assert str(err.value).startswith(message)


def test_settings() -> None:
    assert network_defaults({}) == NetworkDefaults(True, DEFAULT_SCRAPE_FROM)
    peers = '[{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]'
    got = network_defaults({"SCALERL_NETWORK_POLICIES": "false", "SCALERL_SCRAPE_FROM": peers})
    assert not got.enabled and got.scrape_from == ({"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}},)
