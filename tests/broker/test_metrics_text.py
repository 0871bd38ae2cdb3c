"""metrics_text.exposition writes exactly what prometheus_client's
generate_latest writes for the broker's families (it replaces it for them)."""

from __future__ import annotations

import math

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from equeue_broker.server.metrics import METRICS, Families
from equeue_broker.server.metrics_hot import BUCKETS
from equeue_broker.server.metrics_text import exposition

VALUES = (0, 1, 7, 0.5, 1e-05, 123456789.0, 1e21, -3.25, math.inf, -math.inf, math.nan, 2**53)
LABELS = ("orders", "", 'say "hi"', "back\\slash", "two\nlines", "%RETRY%g", "ünï", "a,b=c}")


class Fixed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


def every_family() -> list[Metric]:
    """Every family of METRICS with samples of awkward values and labels."""
    out = Families("broker-1")
    for n, spec in enumerate(METRICS):
        rest = len(spec.labels) - 1
        for i in range(3):
            labels = [LABELS[(n + i + j) % len(LABELS)] for j in range(rest)]
            if spec.type == "histogram":
                counts = [(n + i + j) % 4 for j in range(len(BUCKETS) + 1)]
                out.histogram(spec.name, [(tuple(labels), counts, 0.125 * i)], BUCKETS)
            else:
                out.add(spec.name, VALUES[(n + i) % len(VALUES)], *labels)
    return list(out.all())


def test_the_same_bytes_as_generate_latest() -> None:
    families = every_family()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed(families))
    expected = generate_latest(registry).decode()
    assert exposition(families) == expected
    assert 'say \\"hi\\"' in expected and "two\\nlines" in expected  # escaping was exercised
    assert "+Inf" in expected and "NaN" in expected and "e+21" in expected
