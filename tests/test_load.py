"""Load, bounded: 100 long-polling consumers and 8 producers for 15 s on loopback.

``bench/load_broker.py`` does the work (``make load`` runs it for 10 minutes).
Asserted: no errors, nothing lost or duplicated, the broker's peak RSS under a
generous bound, and long-poll latency sane (a missed wake-up would cost the
full 5 s wait). The figures are printed (``pytest -s``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import load_broker
from bench.load_broker import LoadConfig

pytestmark = pytest.mark.slow  # make test-fast skips it (see pyproject.toml)

MiB = 1 << 20
RSS_BOUND = 512 * MiB


def test_100_long_polling_consumers_and_8_producers(tmp_path: Path) -> None:
    config = LoadConfig(seconds=15.0, consumers=100, producers=8, rate=300.0)
    result = load_broker.run(config, tmp_path)
    print(load_broker.report(result))
    assert result.producer_errors == [] and result.consumer_errors == []
    assert result.achieved_rate >= 0.8 * config.rate, "the broker did not keep up"
    assert result.lost == 0 and result.duplicates == 0
    assert result.received == result.produced
    assert 0 < result.rss_peak < RSS_BOUND, f"peak RSS {result.rss_peak / MiB:.0f} MiB"
    assert result.send_to_receive_ms["p99"] < 1_000, result.send_to_receive_ms
