"""docs/prometheus/ against Prometheus' own checker and the code.

- ``promtool check rules`` / ``check config`` accept the shipped files and
  ``promtool test rules`` passes equeue-alerts.test.yml (each alert fires
  after its ``for`` on made-up series, and a look-alike series does not).
- Every metric an alert uses is one the broker or the name server exports
  (their ``METRICS`` lists), or Prometheus' own ``up``.
- The thresholds and hold times that the console's alarms have by default
  are the same here (EQueue's 100,000 unconsumed messages, ``--alarm-for``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from equeue_broker.namesrv.metrics import METRICS as NAMESRV_METRICS
from equeue_broker.server.metrics import METRICS
from equeue_spark.console.alarms import rules as alarm_rules
from tests.support.observability import (
    RULES_FILE,
    RULES_TEST_FILE,
    SCRAPE_CONFIG,
    exposed_names,
    promql_metric_names,
    rule_exprs,
)

PROMTOOL = "/usr/bin/promtool"
PROMETHEUS_OWN = {"up"}
ALERTS = (
    "EqueueGroupLag", "EqueueGroupLagSeconds", "EqueueUnconsumed", "EqueueDeadLetters",
    "EqueueReplicaOutOfSync", "EqueueDiskFree", "EqueueDown", "EqueueNoMaster",
    "EqueueTransactionOld", "EqueueDelayedOverdue",
)  # fmt: skip


def promtool(*args: str) -> str:
    found = shutil.which("promtool") or (PROMTOOL if Path(PROMTOOL).exists() else None)
    if found is None:
        pytest.fail(f"{PROMTOOL} is missing: run `make observability-tools` (Debian's prometheus)")
    done = subprocess.run(
        [found, *args], capture_output=True, text=True, timeout=60, cwd=RULES_FILE.parent,
        check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def test_promtool_checks_the_rules() -> None:
    assert f"SUCCESS: {len(ALERTS)} rules found" in promtool("check", "rules", RULES_FILE.name)


def test_promtool_checks_the_scrape_config() -> None:
    output = promtool("check", "config", SCRAPE_CONFIG.name)
    assert "is valid prometheus config file syntax" in output
    assert RULES_FILE.name in output  # the config loads the rules next to it


def test_promtool_unit_tests_pass() -> None:
    assert "SUCCESS" in promtool("test", "rules", RULES_TEST_FILE.name)


def test_every_alert_is_unit_tested() -> None:
    tested = set(re.findall(r"alertname:\s*(\S+)", RULES_TEST_FILE.read_text()))
    assert tuple(rule_exprs()) == ALERTS
    assert sorted(set(ALERTS) - tested) == []


def test_rules_use_exported_metrics_only() -> None:
    known = exposed_names((*METRICS, *NAMESRV_METRICS)) | PROMETHEUS_OWN
    for alert, expr in rule_exprs().items():
        names = promql_metric_names(expr)
        assert names, f"{alert}: no metric in {expr!r}"
        assert sorted(names - known) == [], f"{alert} uses metrics nobody exports: {expr}"


def test_every_alert_has_severity_type_summary_and_description() -> None:
    blocks = re.split(r"^\s*- alert:", RULES_FILE.read_text(), flags=re.MULTILINE)[1:]
    assert len(blocks) == len(ALERTS)
    for block in blocks:
        name = block.split()[0]
        for key in ("severity:", "type:", "summary:", "description:"):
            assert key in block, f"{name} has no {key}"
        severity = re.search(r"severity:\s*(\S+)", block)
        assert severity and severity[1] in ("warning", "critical"), name
        rule_type = re.search(r"\btype:\s*(\S+)", block)
        assert rule_type and rule_type[1] in alarm_rules.RULE_TYPES, name


def test_thresholds_match_the_console_alarm_defaults() -> None:
    exprs = rule_exprs()
    assert exprs["EqueueUnconsumed"].endswith(f"> {alarm_rules.DEFAULT_TOTAL}")
    # The flags' default hold is the rules' own (a flag given, or the rule
    # file's [defaults], overrides it).
    hold = f"{alarm_rules.Rule.__dataclass_fields__['for_s'].default:g}s"
    blocks = RULES_FILE.read_text().split("- alert: ")
    for block in blocks:
        if block.startswith(("EqueueGroupLag\n", "EqueueUnconsumed\n")):
            assert f"for: {hold}\n" in block, block.splitlines()[0]


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (group, topic) (x_total{a=~"$b"}) > 1e4', {"x_total"}),
        ("histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m])))", {"h_bucket"}),
        ("a - b offset 5m > 0 or c unless on (x) d", {"a", "b", "c", "d"}),
        ('count(ALERTS{alertname=~"Eq.*"}) or vector(0)', {"ALERTS"}),
        ("time() - m > 60", {"m"}),
    ],
)
def test_metric_names_of_promql(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names
