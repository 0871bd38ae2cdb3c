"""The two longest quick runs of bench/ (spark_bench, cluster_bench), in a file of
their own so that the suite's two workers share the benchmarks' smoke tier
(test_bench_quick.py says what is run and asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.test_bench_quick import CASES, SECOND_FILE, Case, params, run_case
from tests.support.spark_home import shadow_spark_home


@pytest.fixture(scope="module")
def spark_home(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    return shadow_spark_home(tmp_path_factory.mktemp("bench-spark"))


@pytest.mark.slow
@pytest.mark.parametrize("case", params(tuple(c for c in CASES if c.id in SECOND_FILE)))
def test_quick_run_prints_its_tables(case: Case, spark_home: Path | None) -> None:
    run_case(case, spark_home)
