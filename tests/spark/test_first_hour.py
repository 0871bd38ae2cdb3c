"""Issue 26's first hour with the connector: installing, the workers' interpreter,
a new group's starting point, a missing topic, and a dead broker's failure."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import pyspark
from pyspark.errors import PySparkException
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import SparkSession

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, Producer
from equeue_spark.client.errors import BrokerUnavailable, DeadlineExceeded, NotFoundError
from equeue_spark.spark.options import ReadOptions
from equeue_spark.spark.planning import Planner

ROOT = Path(__file__).resolve().parents[2]
SparkError = (PySparkException, CapturedException)


def read_options(**raw: str) -> ReadOptions:
    streaming = raw.pop("streaming", "") == "true"
    return ReadOptions.parse({k.lower(): v for k, v in raw.items()}, streaming=streaming)


@pytest.fixture
def dead_address() -> str:
    """An address nothing listens on (a port just bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def silent_address() -> Iterator[str]:
    """An address that accepts connections and never answers (a hung broker)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"127.0.0.1:{s.getsockname()[1]}"


# -- 1. installing ------------------------------------------------------------------


def test_readme_installs_from_a_clone_and_names_the_shipped_files() -> None:
    readme = (ROOT / "README.md").read_text()
    install = readme[readme.index("## Install") : readme.index("## Spark")]
    assert "not published on PyPI" in install
    assert "pip install '.[spark]'" in install
    assert "share/equeue/" in install and "equeue-broker.service" in install
    spark_md = (ROOT / "docs/spark.md").read_text()
    assert "pip install '.[spark]'" in spark_md


@pytest.mark.timeout(240)
def test_the_wheel_ships_the_sample_config_and_the_unit(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path), str(ROOT)],
        check=True, timeout=220,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("equeue_mq-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {
            Path(n).name: archive.read(n)
            for n in archive.namelist()
            if re.fullmatch(r"equeue_mq-[^/]+\.data/data/share/equeue/[^/]+", n)
        }
    for name in ("equeue-broker.toml", "equeue-broker.service"):
        assert shipped.get(name) == (ROOT / "docs" / name).read_bytes(), name


# -- 2. the workers' interpreter ----------------------------------------------------


def test_a_worker_python_without_the_connector_gets_a_source_naming_pyspark_python(
    tmp_path: Path,
) -> None:
    """What Spark's lookup worker does (lookup_data_sources.py: import every
    pyspark_* module, pickle its DefaultSource), in a bare venv that sees this
    clone (cwd) and pyspark (Spark's worker PYTHONPATH) but not pyarrow or grpc."""
    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    check = (
        "import pickle, pyspark_equeue\n"
        "from pyspark import cloudpickle\n"
        "cls = pickle.loads(cloudpickle.dumps(pyspark_equeue.DefaultSource))\n"
        "print(cls.name())\n"
        "try:\n"
        "    cls({})\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [str(bare / "bin" / "python"), "-c", check],
        check=False,
        cwd=ROOT,
        env={"PYTHONPATH": ":".join(str(z) for z in sorted(lib.glob("*.zip"))),
             "PYSPARK_PYTHON": str(bare / "bin" / "python")},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    name, why = done.stdout.splitlines()
    assert name == "equeue"
    assert f"Spark's Python workers run {bare / 'bin' / 'python'} (PYSPARK_PYTHON=" in why
    assert "cannot import the connector (No module named" in why
    assert "set PYSPARK_PYTHON to the python that equeue-mq[spark] is installed in" in why


def test_spark_md_explains_data_source_not_found() -> None:
    text = (ROOT / "docs/spark.md").read_text()
    paragraph = text[text.index("`[DATA_SOURCE_NOT_FOUND]") :].split("\n\n")[0]
    assert "PYSPARK_PYTHON" in paragraph


# -- 3. a new group starts where it committed, else at groupFallback ----------------


def test_group_without_starting_offsets_starts_at_the_group() -> None:
    assert read_options(topic="t", group="g", streaming="true").starting == "group"
    assert read_options(topic="t", group="g").starting == "group"
    assert read_options(topic="t", streaming="true").starting == "latest"
    assert read_options(topic="t", group="g", startingOffsets="latest").starting == "latest"
    timed = read_options(topic="t", group="g", startingTimestamp="5", streaming="true")
    assert timed.starting_timestamp_ms == 5
    assert read_options(topic="t", group="g").group_fallback == "earliest"


@pytest.mark.timeout(240)
def test_readme_spark_example_reads_what_it_wrote(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Spark") : readme.index("## Python client")]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    code = code.replace("127.0.0.1:5000", broker.address)
    code = code.replace("/tmp/ck/orders-upper", str(tmp_path / "ck"))
    namespace = {"spark": spark}
    try:
        exec(compile(code, "README.md", "exec"), namespace)
    finally:
        query = namespace.get("query")
        if query is not None:
            query.stop()
    upper = spark.read.format("equeue").option("broker", broker.address)
    values = {r.value for r in upper.option("topic", "orders-upper").load().collect()}
    assert values == {b"ORDER %d" % i for i in range(1000)}
    with Admin(broker.address) as admin:
        assert admin.describe_group("billing").total_lag == 0


# -- 4. a batch read of a missing topic fails naming it -----------------------------


def test_batch_read_of_a_missing_topic_names_it(broker: BrokerProcess) -> None:
    with Producer(broker.address) as producer:
        producer.send_batch("present", [b"x"])
    planner = Planner(read_options(broker=broker.address, topic="present,absent"))
    try:
        with pytest.raises(NotFoundError, match=f"topic 'absent' does not exist on broker "
                                                f"{re.escape(broker.address)}"):  # fmt: skip
            planner.resolve("earliest", None, end=False)
        streaming = Planner(read_options(broker=broker.address, topic="absent", streaming="true"))
        assert streaming.listing().queues == {}  # a stream waits for it
        streaming.close()
        pattern = Planner(read_options(broker=broker.address, topicPattern="abs.*"))
        assert pattern.listing().queues == {}  # a pattern may match none
        pattern.close()
    finally:
        planner.close()


def test_spark_batch_read_of_a_missing_topic_fails(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    df = spark.read.format("equeue").option("broker", broker.address).option("topic", "nope")
    with pytest.raises(SparkError, match="topic 'nope' does not exist on broker"):
        df.load().collect()


# -- 9. a dead broker: timeoutMs bounds the failure, and its message is one line -----


def test_timeout_bounds_a_refused_connection_with_its_retries(dead_address: str) -> None:
    planner = Planner(read_options(broker=dead_address, topic="t", timeoutMs="400"))
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable):
        planner.listing()
    planner.close()
    # Before: six attempts with 0.05-0.15, 0.1-0.3, ... 0.8-2.4 s of backoff between.
    assert time.monotonic() - started < 1.5


def test_timeout_bounds_a_broker_that_never_answers(silent_address: str) -> None:
    planner = Planner(read_options(broker=silent_address, topic="t", timeoutMs="500"))
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        planner.listing()
    planner.close()
    # Before: six attempts of 0.5 s each, plus the backoff: over 4.5 s.
    assert time.monotonic() - started < 3.0


def test_spark_read_of_a_dead_broker_fails_with_one_line(
    spark: SparkSession, dead_address: str
) -> None:
    df = (
        spark.read.format("equeue")
        .option("broker", dead_address)
        .option("topic", "t")
        .option("timeoutMs", 500)
    )
    with pytest.raises(SparkError) as failed:
        df.load().collect()
    text = str(failed.value)
    lines = text.strip().splitlines()
    assert len(lines) <= 8, text  # Spark's line, a frame or two, the message
    assert any(
        line.startswith(
            f"equeue_spark.spark.errors.BrokerUnreachable: broker {dead_address} did not "
            "answer within timeoutMs=500"
        )
        for line in lines
    ), text
