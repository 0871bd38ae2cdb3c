"""The connector on a Spark standalone cluster: master and worker started with
pyspark's ``bin/spark-class``, executors in their own JVM and Python processes,
and the driver in a separate Python process (tests/support/cluster_job.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from equeue_broker.testing import BrokerProcess, LocalCluster
from equeue_spark.client import Admin

pytestmark = pytest.mark.slow  # make test-fast skips it (see pyproject.toml)

pyspark = pytest.importorskip("pyspark")

SPARK_HOME = Path(pyspark.__file__).parent
MASTER_READY = re.compile(r"Starting Spark master at (spark://\S+)")
WORKER_READY = re.compile(r"Successfully registered with master")


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
        "SPARK_LOG_DIR": str(tmp_path / "logs"),
        "PYSPARK_PYTHON": sys.executable,
    }


def _start(
    args: list[str], env: dict[str, str], ready: re.Pattern[str], log: Path, timeout_s: float = 90
) -> tuple[subprocess.Popen[bytes], re.Match[str]]:
    """Start a Spark daemon in the foreground, logging to ``log`` (a pipe could
    fill up and stall it), and wait (bounded) for its ready line there."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        match = ready.search(log.read_text(errors="replace"))
        if match:
            return process, match
        time.sleep(0.2)
    process.kill()
    process.wait(30)
    tail = log.read_text(errors="replace")[-3000:]
    raise AssertionError(f"{args[0]} not ready in {timeout_s}s:\n{tail}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One master and one worker for the module (starting them takes two JVM
    starts); the driver application (``jobs``) runs on them."""
    tmp_path = tmp_path_factory.mktemp("spark-standalone")
    env = _env(tmp_path)
    master, found = _start(
        ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
         "--webui-port", "0"],
        env, MASTER_READY, tmp_path / "master.log",
    )  # fmt: skip
    url = found.group(1)
    processes = [master]
    try:
        worker, _ = _start(
            ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--port", "0",
             "--webui-port", "0", "--cores", "2", "--memory", "2g"],
            env, WORKER_READY, tmp_path / "worker.log",
        )  # fmt: skip
        processes.append(worker)
        yield url
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(30)


JOB_S = 600
"""The driver job's budget; the master's and worker's starts have 90 s each (fixture)."""


@dataclass
class Jobs:
    """One driver application's results, per equeue target, and the targets themselves."""

    broker: BrokerProcess
    equeue: LocalCluster
    single: dict[str, Any]
    """The job against one broker (option ``broker``)."""
    clustered: dict[str, Any]
    """The job against two name servers and three brokers (option ``namesrv``)."""


@pytest.fixture(scope="module")
def jobs(cluster: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    """The job run once against a single broker, then against an equeue cluster,
    by one driver application on the standalone cluster (a driver JVM and an
    executor start less than a driver per test); each test checks its part."""
    tmp_path = tmp_path_factory.mktemp("cluster-jobs")
    broker = BrokerProcess(tmp_path / "broker")
    equeue = LocalCluster(tmp_path / "equeue", broker_flags=("--register-interval-ms", "300"))
    try:
        broker.start()
        equeue.start(2, ("a", "b", "c"))
        with Admin(namesrv=equeue.namesrv) as admin:
            admin.create_topic("cl", queues=2)
            deadline = time.monotonic() + 30
            while len(admin.route("cl").queues()) < 6 and time.monotonic() < deadline:
                time.sleep(0.05)
        targets = [broker.address, f"namesrv={equeue.namesrv}"]
        args = [a for n, t in enumerate(targets) for a in (t, str(tmp_path / f"ck{n}"))]
        job = subprocess.run(
            [sys.executable, "-m", "tests.support.cluster_job", cluster, *args],
            capture_output=True, text=True, timeout=JOB_S, env=_env(tmp_path),
            cwd=Path(__file__).parents[2], check=False,
        )  # fmt: skip
        assert job.returncode == 0, job.stderr[-5000:]
        results = [json.loads(line) for line in job.stdout.strip().splitlines()[-2:]]
        assert [r["target"] for r in results] == targets
        yield Jobs(broker, equeue, *results)
    finally:
        equeue.kill()
        broker.kill()


@pytest.mark.timeout(JOB_S + 2 * 90 + 180)
def test_standalone_cluster_write_read_stream(jobs: Jobs) -> None:
    result = jobs.single
    assert result["total"] == result["distinct_positions"] == result["distinct_values"] == 2000
    assert result["driver_pid"] not in result["task_pids"]  # tasks ran in executors
    assert result["finished"] and result["streamed"] == 2000 and result["batches"] >= 3
    with Admin(jobs.broker.address) as admin:
        assert admin.describe_group("cluster").total_lag == 0


@pytest.mark.timeout(JOB_S + 2 * 90 + 180)
def test_standalone_cluster_over_an_equeue_cluster(jobs: Jobs) -> None:
    """The same job over two name servers and three brokers (option namesrv)."""
    result = jobs.clustered
    assert result["total"] == result["distinct_positions"] == result["distinct_values"] == 2000
    assert result["brokers"] == ["a", "b", "c"]
    assert result["finished"] and result["streamed"] == 2000
    with Admin(namesrv=jobs.equeue.namesrv) as admin:
        group = admin.describe_group("cluster")
        assert {q.broker for q in group.queues} == {"a", "b", "c"}
        assert group.total_lag == 0
