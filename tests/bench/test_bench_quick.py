"""Every script in bench/ runs: its ``--quick`` smoke run, start to end, prints its tables.

Benchmarks are run by hand, seldom, so one broken by a change elsewhere went
unnoticed for a round (issue 31: ``bench/spark_bench.py`` built 8 columns for a
9-column read schema). Each script here runs as a subprocess, as a user runs it
(``python bench/<script>.py --quick``, from the repository's root, with this
interpreter), and the test asserts only that it exited 0 and printed the header
rows of its tables: the figures of a smoke run on a shared machine mean nothing,
and performance claims belong to the benchmarks' full runs (docs/benchmarks.md).

A script added to bench/ without a case here fails ``test_every_script_has_a_case``
(fast tier); the runs themselves are in the slow tier.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from equeue_broker.testing_zk import java_available, zookeeper_installed
from tests.support.spark_home import shadow_spark_home

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
KILL_GRACE_S = 10.0


@dataclass(frozen=True)
class Case:
    script: str
    expect: tuple[str, ...]
    """Header rows (or parts of them) the run prints on stdout, one per table."""
    budget_s: float
    """The subprocess's bound; far above a quick run on an idle machine (seconds to
    about a minute), because a loaded 2-core machine stretches Spark's start-up most."""
    args: tuple[str, ...] = ("--quick",)
    spark: bool = False
    zookeeper: bool = False
    expect_stderr: tuple[str, ...] = ()
    elsewhere: str = ""
    """The test file that runs this script's quick run with checks of its own."""

    @property
    def id(self) -> str:
        extra = [a.lstrip("-") for a in self.args if a != "--quick"]
        return "-".join([self.script.removesuffix(".py"), *extra])


CASES = (
    Case("avro_decode_bench.py", ("rec/s wall", "reference v1 -> v2"), 120),
    Case("broker_ab.py", ("| workload | flush | A (baseline) | B (this checkout) | B / A |",), 180),
    Case(
        "broker_bench.py",
        ("| system | workload | size | flush | msgs/s", "| system | flush | method |"),
        240,
    ),
    Case(
        "broker_bench.py",
        ("| size | path | keys | control records per batch",),
        180,
        args=("--quick", "--scenario", "idempotence"),
    ),
    Case(
        "broker_bench.py",
        ("| variant | rounds |",),
        180,
        args=("--quick", "--scenario", "latency", "--repeat", "1"),
    ),
    Case(
        "cluster_bench.py",
        (
            "| brokers | pinned | produce routed msg/s",
            "### Catch-up of an empty replica",
            "### Produce with sync replication",
            "### Failover: 3 brokers",
        ),
        480,
        spark=True,
        zookeeper=True,
    ),
    Case(
        "delay_bench.py",
        (
            "| size | plain msgs/s | delayed msgs/s",
            "| broker | fill s (ProduceStream)",
            "| measured as | p50 ms",
            "| workload | msgs/s | against plain consume |",
        ),
        300,
    ),
    Case("filter_bench.py", ("### evaluator: C", "### evaluator: python", "| selectivity |"), 180),
    Case("key_index_bench.py", ("| path | no key index msgs/s", "| run | queries | p50 ms"), 180),
    Case(
        "metrics_bench.py",
        ("| arm | produce msg/s | x off |",),
        240,
        elsewhere="tests/bench/test_metrics_bench.py",
    ),
    Case("replication_bench.py", ("msgs/s  ratio  per round",), 180),
    Case("restart_bench.py", ("| broker | messages | queues | restart after clean stop s",), 180),
    Case(
        "schema_bench.py", ("| format | value size | plain msgs/s", "`set_schema` of version"), 180
    ),
    Case(
        "spark_bench.py",
        (
            "| scenario | size | rows | equeue rows/s",
            "streaming read over PullStream",
            "valueFormat=avro vs binary",
            "## Diagnostics",
            "## CPU seconds by component",
        ),
        600,
        spark=True,
    ),
    # The ceiling's batches against the read schema, without Spark: what broke in issue 31.
    Case(
        "spark_bench.py",
        (),
        60,
        args=("--check", "--sizes", "100,1024"),
        expect_stderr=("columns = the read schema",),
    ),
    Case("spark_pushdown_bench.py", ("x full  target", "nothing (queue < 0)"), 420, spark=True),
    Case("storage_bench.py", ("## Results", "| scenario | msg size | writers | msgs/s"), 180),
    Case("timer_pending.py", ("| store | append msg/s",), 180),
    Case("txn_check_bench.py", ("checks/s", "one producer connected"), 120),
    Case("verify_bench.py", ("codec:", "first read", "no check"), 120),
    Case("wire_shape_bench.py", ("## Produce request", "## Pull reply", "| shape |"), 180),
)


def test_every_script_has_a_case() -> None:
    """A runnable script in bench/ (helpers start with ``_``) without a case here
    would not be run by the suite, and could rot unseen."""
    scripts = {p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    covered = {case.script for case in CASES}
    assert scripts - covered == set(), "add a Case for these bench/ scripts"
    missing = {c.script for c in CASES if not (BENCH / c.script).exists()}
    assert missing == set(), "cases for scripts that are not in bench/"


@pytest.fixture(scope="module")
def spark_home(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The tests' linked ``SPARK_HOME`` (tests/support/spark_home.py): the scripts'
    Python workers then import pyspark with cached bytecode, in time under load."""
    return shadow_spark_home(tmp_path_factory.mktemp("bench-spark"))


def run_script(case: Case, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``case`` from the repository root in a session of its own, so that on
    timeout its brokers and JVMs go with it."""
    command = [sys.executable, str(BENCH / case.script), *case.args]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=case.budget_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate(timeout=KILL_GRACE_S)
        pytest.fail(
            f"{case.id} ran past {case.budget_s:g} s\n--- stdout\n{out[-3000:]}\n"
            f"--- stderr\n{err[-5000:]}"
        )
    return subprocess.CompletedProcess(command, process.returncode, out, err)


SECOND_FILE = frozenset({"spark_bench", "cluster_bench"})
"""Case ids run by test_bench_quick_spark.py: the two longest (a JVM each, ~2.5 min
together), in a file of their own so that the suite's two workers (``--dist
loadfile``) share this tier instead of one worker running all of it."""


def params(cases: tuple[Case, ...]) -> list[Any]:
    return [pytest.param(c, id=c.id, marks=pytest.mark.timeout(c.budget_s + 60)) for c in cases]


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", params(tuple(c for c in CASES if c.id not in SECOND_FILE and not c.elsewhere))
)
def test_quick_run_prints_its_tables(case: Case, spark_home: Path | None) -> None:
    run_case(case, spark_home)


def run_case(case: Case, spark_home: Path | None) -> None:
    if (case.spark or case.zookeeper) and not java_available():
        pytest.skip("java is not installed: Spark and ZooKeeper need a JRE (CI has Java 17)")
    if case.zookeeper and not zookeeper_installed():
        pytest.skip("ZooKeeper is not installed (make zookeeper)")
    env = dict(os.environ)
    if case.spark:
        env["PYSPARK_PYTHON"] = sys.executable  # the workers import equeue_spark and bench
        if spark_home is not None:
            env["SPARK_HOME"] = str(spark_home)
    began = time.monotonic()
    result = run_script(case, env)
    took = time.monotonic() - began
    print(f"{case.id}: {took:.1f} s")  # shown with -rP or -s: what the tier spends here
    report = (
        f"{case.id} exited {result.returncode} after {took:.0f} s\n"
        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-5000:]}"
    )
    assert result.returncode == 0, report
    missing = [row for row in case.expect if row not in result.stdout]
    missing += [row for row in case.expect_stderr if row not in result.stderr]
    assert missing == [], f"not printed: {missing}\n{report}"
