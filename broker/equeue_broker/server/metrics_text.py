"""The text exposition (format 0.0.4) of the broker's own families, fast.

prometheus_client's ``generate_latest`` checks and escapes every label name
of every sample against the legacy character set (two regular expressions
and a ``StringIO`` a label): with a few thousand series that was about half
of a scrape's CPU (docs/benchmarks.md, "Metrics on against off"). Our
families are fixed (``METRICS``: legacy names, gauges, counters and
histograms, no timestamps, exemplars or ``_created`` samples), so their
names need no escaping; label values still do. The output is byte for byte
``generate_latest``'s for the same families (tests/broker/test_metrics_text.py),
so prometheus_client stays the reference; the process and platform
collectors still go through it.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

TYPES = ("counter", "gauge", "histogram")
"""The metric types this writer handles (the only ones ``METRICS`` has)."""


def _value(text: str) -> str:
    """A label value escaped as the text format wants (\\, newline, ")."""
    if "\\" in text or "\n" in text or '"' in text:
        return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return text


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def exposition(metrics: Iterable[Metric]) -> str:
    """The families as ``generate_latest`` would write them."""
    out: list[str] = []
    append = out.append
    for metric in metrics:
        kind = metric.type
        if kind not in TYPES:
            raise ValueError(f"metric {metric.name}: type {kind} is not one of {TYPES}")
        name = metric.name + "_total" if kind == "counter" else metric.name
        append(f"# HELP {name} {_help(metric.documentation)}\n# TYPE {name} {kind}\n")
        for sample in metric.samples:
            value = floatToGoString(sample.value)  # type: ignore[no-untyped-call]
            if sample.labels:
                labels = ",".join(f'{k}="{_value(v)}"' for k, v in sorted(sample.labels.items()))
                append(f"{sample.name}{{{labels}}} {value}\n")
            else:
                append(f"{sample.name} {value}\n")
    return "".join(out)
