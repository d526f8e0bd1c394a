"""The chart's Grafana dashboards (helm/scalerl/files/dashboards/*.json) are valid dashboard JSON with
the panels the issue names, on a Prometheus datasource variable, and every series they query is one
that the roles export (scalerl.telemetry.metrics.RoleMetrics), so no panel stays empty because of a
misspelt name or an add-on that is not installed (no kube-state-metrics). That every panel has data on a
real run, scraped by a real Prometheus, is tests/integration/test_observability.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric

from scalerl.telemetry.metrics import ROLES, RoleMetrics

REPO = Path(__file__).resolve().parents[3]
DASHBOARDS = REPO / "helm" / "scalerl" / "files" / "dashboards"
GRID_COLUMNS = 24
# The panels the issue asks for, by dashboard file.
REQUIRED_PANELS = {
    "scalerl-training.json": {"Pass rate with fitted curve and forecast band", "Staleness vs bound", "Step time",
                              "Tokens/s per role", "Forecast of the budget's end"},
    "scalerl-scaling.json": {"Replicas per role", "Lag per topic", "Tokens/s per role"},
}


def _load_all() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict[str, Any]]:
    return _load_all()


def exported_series() -> set[str]:
    """Every sample name the four roles' /metrics can expose (counters add _total, histograms
    _bucket/_sum/_count)."""
    names: set[str] = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    for role in ROLES:
        family: Metric
        for family in RoleMetrics(role).registry.collect():
            names.update(family.name + s for s in suffixes[family.type])
    return names


def series_in(expr: str) -> set[str]:
    """Metric names of a PromQL expression: identifiers followed by `{`, `[`, `)` or whitespace that are
    not functions, keywords or label names."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_labels = re.sub(r"\{[^}]*\}", "{}", without_strings)
    tokens = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", without_labels))
    keywords = {"by", "without", "on", "ignoring", "group_left", "group_right", "le", "and", "or", "unless",
                "rljob", "topic", "deployment", "namespace", "bool", "offset"}
    return {t for t in tokens if t not in keywords and ("_" in t) and not re.fullmatch(r"\d+[smhd]", t)}


def balanced(expr: str) -> bool:
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for ch in re.sub(r'"[^"]*"', '""', expr):
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack


def test_helpers_on_hand_written_expressions() -> None:
    expr = 'histogram_quantile(0.9, sum by (rljob, le) (rate(scalerl_learner_step_seconds_bucket{rljob=~"a"}[5m])))'
    assert series_in(expr) == {"scalerl_learner_step_seconds_bucket"}
    assert series_in('a_b{x="y"} / (1 + (c_d / e_f) ^ g_h)') == {"a_b", "c_d", "e_f", "g_h"}
    assert balanced(expr) and not balanced("sum(rate(x[5m])") and not balanced('x{a="}"]')
    assert {"scalerl_generator_tokens_total", "scalerl_verifier_queue_lag_messages",
            "scalerl_learner_step_seconds_bucket", "scalerl_curriculum_ready"} <= exported_series()


def test_there_are_the_two_dashboards(dashboards: dict[str, dict[str, Any]]) -> None:
    assert set(dashboards) == set(REQUIRED_PANELS)
    uids = [d["uid"] for d in dashboards.values()]
    assert len(set(uids)) == len(uids) and all(len(u) <= 40 for u in uids)  # Grafana's uid limit


@pytest.mark.parametrize("name", sorted(REQUIRED_PANELS))
def test_dashboard_is_valid_grafana_json(dashboards: dict[str, dict[str, Any]], name: str) -> None:
    board = dashboards[name]
    for key in ("uid", "title", "panels", "templating", "time", "schemaVersion"):
        assert key in board, f"{name}: no {key}"
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for var in ("namespace", "rljob"):
        assert variables[var]["type"] == "query" and variables[var]["allValue"] == ".*"
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids), f"{name}: duplicate panel ids"
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        where = f"{name} panel {panel['title']!r}"
        assert panel["type"] in {"timeseries", "stat"}, where
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        grid = panel["gridPos"]
        assert grid["w"] >= 1 and grid["h"] >= 1 and grid["x"] >= 0 and grid["x"] + grid["w"] <= GRID_COLUMNS, where
        mine = {(grid["x"] + dx, grid["y"] + dy) for dx in range(grid["w"]) for dy in range(grid["h"])}
        assert not mine & cells, f"{where} overlaps another panel"
        cells |= mine
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs), where
        for t in panel["targets"]:
            assert t["datasource"] == panel["datasource"] and t["expr"].strip(), where
            assert balanced(t["expr"]), f"{where}: unbalanced brackets in {t['expr']}"


def test_named_panels_are_there(dashboards: dict[str, dict[str, Any]]) -> None:
    for name, titles in REQUIRED_PANELS.items():
        have = {p["title"] for p in dashboards[name]["panels"]}
        assert titles <= have, f"{name}: missing panels {sorted(titles - have)}"
    training = {p["title"]: p for p in dashboards["scalerl-training.json"]["panels"]}
    # the forecast band is drawn between its two edges
    fit = training["Pass rate with fitted curve and forecast band"]
    legends = [t["legendFormat"] for t in fit["targets"]]
    assert any("fitted R(C)" in legend for legend in legends)
    band = [o for o in fit["fieldConfig"]["overrides"]
            if any(p["id"] == "custom.fillBelowTo" for p in o["properties"])]
    assert band and any("curve at A low" in legend for legend in legends)
    # staleness is drawn against the bound k
    assert any("bound" in t["legendFormat"] for t in training["Staleness vs bound"]["targets"])
    # replicas and tokens/s cover every role that has them
    scaling = {p["title"]: p for p in dashboards["scalerl-scaling.json"]["panels"]}
    replica_exprs = " ".join(t["expr"] for t in scaling["Replicas per role"]["targets"])
    assert all(f"scalerl_{role}_ready" in replica_exprs for role in ROLES)
    assert "by (rljob, topic)" in " ".join(t["expr"] for t in scaling["Lag per topic"]["targets"])


def test_every_scalerl_series_is_exported_by_the_roles(dashboards: dict[str, dict[str, Any]]) -> None:
    exported = exported_series()
    unknown: dict[str, set[str]] = {}
    for name, board in dashboards.items():
        for panel in board["panels"]:
            for t in panel["targets"]:
                for series in series_in(t["expr"]):
                    if series not in exported:
                        unknown.setdefault(f"{name}: {panel['title']}", set()).add(series)
        for var in board["templating"]["list"]:
            if var["type"] == "query":
                assert series_in(var["definition"]) <= exported, var["definition"]
    assert not unknown, f"series no role exports (scalerl.telemetry.metrics): {unknown}"
