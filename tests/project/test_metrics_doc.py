"""docs/metrics.md's metric tables equal the code's METRICS lists."""

from __future__ import annotations

import re
from pathlib import Path

from equeue_broker.namesrv.metrics import METRICS as NAMESRV_METRICS
from equeue_broker.server.metrics import METRICS

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(equeue_[a-z_]+)` \| (counter|gauge|histogram) \| ([a-z_, ]+) \| (.+) \|$")


def test_metric_tables_equal_the_metrics_lists() -> None:
    documented = {}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            assert match[1] not in documented, f"{match[1]} is documented twice"
            labels = tuple(label.strip() for label in match[3].split(","))
            documented[match[1]] = (match[2], labels, match[4])
    in_code = {s.name: (s.type, s.labels, s.help) for s in (*METRICS, *NAMESRV_METRICS)}
    assert sorted(set(in_code) - set(documented)) == [], "undocumented metrics"
    assert sorted(set(documented) - set(in_code)) == [], "documented metrics the code lacks"
    for name, (kind, labels, _help) in in_code.items():
        assert documented[name][:2] == (kind, labels), name
