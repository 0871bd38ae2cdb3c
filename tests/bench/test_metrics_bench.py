"""bench/metrics_bench.py runs (``--quick``): every arm, the table it prints.
A smoke test of the script, not a measurement (performance claims are the
benchmark's, in docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "metrics_bench.py"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_quick_run_prints_every_arm() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True, text=True, timeout=200, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
        for line in done.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| arm")
    }
    assert list(rows) == ["off", "on", "on-1s", "on-idle"]
    assert rows["off"][1] == "1.000x"
    for arm in ("on", "on-1s", "on-idle"):
        series = rows[arm][-1]
        assert series != "-" and int(series.replace(",", "")) > 50, rows[arm]
    assert rows["off"][-1] == "-"  # no port, nothing to count
    assert int(rows["on-1s"][6]) >= 1  # scraped while it ran
    assert "load average at start" in done.stdout
