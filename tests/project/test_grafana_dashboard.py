"""docs/grafana/equeue-dashboard.json is importable as it is and uses only
metrics the broker and the name server export.

Grafana itself is not installable here, so this checks what an import needs
(Grafana's export format: one ``DS_PROMETHEUS`` input that every panel and
query uses, unique panel ids, a layout that fits the 24-column grid) and
that every ``expr`` names exported series (the ``METRICS`` lists). The
cluster test (tests/cluster/test_prometheus.py) runs every ``expr`` against
a real Prometheus scraping a real cluster.
"""

from __future__ import annotations

import json
import re
from typing import Any

from equeue_broker.namesrv.metrics import METRICS as NAMESRV_METRICS
from equeue_broker.server.metrics import METRICS
from tests.support.observability import (
    DASHBOARD_FILE,
    dashboard_panels,
    exposed_names,
    promql_metric_names,
)

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
ROWS = [
    "Overview", "Throughput", "Consumer groups", "Replication", "Storage", "RPCs", "Budgets",
    "Transactions and delayed messages", "Name servers",
]  # fmt: skip
VARIABLES = ["cluster", "broker", "topic", "group"]
PROMETHEUS_OWN = {"up", "ALERTS"}
GRID_COLUMNS = 24


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
    return loaded


def queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel."""
    return [
        (p["title"], t["expr"])
        for p in dashboard_panels(dashboard())
        for t in p.get("targets", [])
    ]  # fmt: skip


def test_export_format() -> None:
    d = dashboard()
    [source] = d["__inputs"]
    assert (source["name"], source["type"], source["pluginId"]) == (
        "DS_PROMETHEUS", "datasource", "prometheus"
    )  # fmt: skip
    required = {(r["type"], r["id"]) for r in d["__requires"]}
    used = {("panel", p["type"]) for p in dashboard_panels(d) if p["type"] != "row"}
    assert used <= required, "every panel plugin is listed in __requires"
    assert ("datasource", "prometheus") in required
    assert (d["uid"], d["schemaVersion"], d["refresh"]) == ("equeue-overview", 39, "30s")
    assert d["time"] == {"from": "now-1h", "to": "now"}
    assert d["id"] is None  # an import makes its own


def test_rows_in_order() -> None:
    assert [p["title"] for p in dashboard()["panels"] if p["type"] == "row"] == ROWS


def test_panel_ids_are_unique() -> None:
    ids = [p["id"] for p in dashboard_panels(dashboard())]
    assert len(ids) == len(set(ids))


def test_every_panel_and_query_uses_the_datasource_input() -> None:
    for panel in dashboard_panels(dashboard()):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]


def test_layout_fits_the_grid_without_overlaps() -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard_panels(dashboard()):
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= GRID_COLUMNS, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]


def test_variables() -> None:
    variables = dashboard()["templating"]["list"]
    assert [v["name"] for v in variables] == VARIABLES
    known = exposed_names((*METRICS, *NAMESRV_METRICS))
    for v in variables:
        shape = (v["type"], v["datasource"], v["includeAll"], v["multi"], v["allValue"])
        assert shape == ("query", DATASOURCE, True, True, ".*"), v["name"]
        metric = re.fullmatch(r"label_values\((\w+)(\{[^}]*\})?, (\w+)\)", v["query"]["query"])
        assert metric and metric[1] in known and metric[3] == v["name"], v["query"]


def test_exprs_use_exported_metrics_only() -> None:
    known = exposed_names((*METRICS, *NAMESRV_METRICS)) | PROMETHEUS_OWN
    for title, expr in queries():
        names = promql_metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        assert sorted(names - known) == [], f"{title} uses metrics nobody exports: {expr}"


def test_variables_are_used_as_regex_matchers() -> None:
    """With "All" selected a variable is ``.*``: only ``=~`` matches everything."""
    defined = {f"${name}" for name in VARIABLES} | {"$__rate_interval"}
    for title, expr in queries():
        for used in re.findall(r"\$\w+", expr):
            assert used in defined, f"{title}: unknown variable {used}"
        for used in re.findall(r'(!?[=~]+)"\$(?!__)', expr):
            assert used == "=~", f"{title}: a variable must be matched with =~: {expr}"
