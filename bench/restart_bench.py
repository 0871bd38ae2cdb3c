"""Broker restart over many messages and many queues (issue 31, item 5).

Run ``python bench/restart_bench.py`` (about 5 minutes at the default
10,000,000 messages; ``--quick``: a smoke run of seconds). Every broker is a
real ``python -m equeue_broker --flush async --log-level INFO`` process on
127.0.0.1 over a temporary directory under /tmp, removed at the end; the
client is this one Python process. Tables go to stdout (markdown), progress
to stderr.

Shapes, each filled once with ``--messages`` 100 B messages through pipelined
``ProduceStream`` requests (the fill is not timed for the table):

* ``one topic``: 1 topic of 8 queues, batches of 1,000 messages;
* ``12,800 queues``: 100 topics of 128 queues (the broker's limits are 1,000
  topics and 256 queues per topic), the messages spread evenly, one batch per
  queue.

Then, shape by shape (each one's data is removed before the next is
filled: gigabytes), ``--repeat`` rounds, each restarting every broker once
(the empty ones too) after a clean stop (SIGTERM) and, but the empty ones,
once after ``kill -9`` while a producer is writing (a ProduceStream cycling
over every queue of the shape, killed after ``KILL_AFTER_S`` of writing). A
restart is timed from spawning the process to the broker answering: gRPC
health ``SERVING``, then one message produced to a queue of the shape and
pulled back (the first successful produce and pull). Also reported: spawn
to the ready line, and the store's open as the broker logs it ("store
opened in X s").

Baseline, in the same rounds: a broker over an empty data directory restarted
the same way (the floor: interpreter, imports, gRPC start-up). Each shape's
restart is reported as a ratio to it. With ``--baseline-python PATH`` (the
interpreter of another checkout's virtualenv, e.g. the code before a change),
every broker is doubled: one more of each runs that interpreter's
``equeue_broker`` over a copy of the same filled data directory (and its own
empty floor), restarted in the same rounds, so that before and after are
measured under the same load (copies are made with ``cp --sparse=always``).
Target (issue 31): < 2 s for 10 M messages in both shapes after ``kill -9``
while producing. The issue's figures
before this work: 4.20 s in one topic, 9.8 s clean / 10.1 s after kill -9
over 12,800 queues (idle machine).

Bytecode: every broker keeps its compiled modules between starts (in the
run's temporary directory, ``PYTHONPYCACHEPREFIX``), as an installed broker
does, even when ``PYTHONDONTWRITEBYTECODE`` is set; ``--source-only``
measures brokers that compile every module at every start instead.

Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench._broker_measure import values_for
from bench._measure import progress
from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, ClientConfig, Producer
from equeue_spark.client.batches import BatchColumns
from equeue_spark.client.connection import Connection

RPC_TIMEOUT_S = 120.0
START_TIMEOUT_S = 600.0
"""A restart over gigabytes of log on a loaded machine may be slow: bounded, generously."""
ANSWER_TIMEOUT_S = 120.0
KILL_AFTER_S = 1.0
"""Seconds a producer writes before the broker is killed (--quick: less)."""
TARGET_S = 2.0
BATCH = 1_000


@dataclass(frozen=True)
class Shape:
    name: str
    topics: int
    queues: int
    """Queues per topic."""

    @property
    def total_queues(self) -> int:
        return self.topics * self.queues

    def topic(self, i: int) -> str:
        return f"{self.name.replace(' ', '-').replace(',', '')}-{i}"


SHAPES = (Shape("one topic", 1, 8), Shape("12,800 queues", 100, 128))
QUICK_SHAPES = (Shape("one topic", 1, 8), Shape("12,800 queues", 4, 32))
"""--quick: the second shape scaled down to 128 queues (a smoke run)."""


@dataclass
class Timing:
    answered: float
    """Spawn to health SERVING and one message produced and pulled back."""
    ready: float
    """Spawn to the ready line."""
    store_open: float
    """The store's open as the broker logged it."""


@dataclass
class Subject:
    label: str
    shape: Shape | None
    broker: BrokerProcess
    messages: int = 0
    timings: dict[str, list[Timing]] = field(default_factory=dict)


class OtherBroker(BrokerProcess):
    """A broker run by another interpreter (``--baseline-python``)."""

    def __init__(
        self, python: str, data_dir: Path, *flags: str, log_path: Path, env: dict[str, str]
    ) -> None:
        super().__init__(data_dir, *flags, log_path=log_path, env=env)
        self.python = python

    def command(self) -> list[str]:
        return [self.python, *super().command()[1:]]


BYTECODE = {"on": True}
"""Whether brokers keep their compiled bytecode between starts (``--source-only``: no)."""


def bytecode_env(root: Path) -> dict[str, str]:
    """Environment for a broker that keeps its compiled modules, as an installed
    one does (pip writes ``.pyc`` files at install): its first start compiles
    them into ``root/pycache`` (``PYTHONPYCACHEPREFIX``), every later start
    reads them. Without it, an editable checkout under
    ``PYTHONDONTWRITEBYTECODE=1`` compiles every module of the broker again
    at every start (0.4-0.8 s here), which no installed broker does."""
    if not BYTECODE["on"]:
        return {}
    return {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(root / "pycache")}


def start_broker(root: Path, name: str, python: str | None = None) -> BrokerProcess:
    data = root / name / "data"
    data.mkdir(parents=True, exist_ok=True)
    flags = ("--flush", "async", "--log-level", "INFO")
    log_path = root / name / "broker.log"
    env = bytecode_env(root)
    broker = (
        BrokerProcess(data, *flags, log_path=log_path, env=env)
        if python is None
        else OtherBroker(python, data, *flags, log_path=log_path, env=env)
    )
    broker.start(START_TIMEOUT_S)
    return broker


def copy_of(root: Path, subject: Subject, python: str) -> Subject:
    """The same shape and data, served by ``python``'s broker (stopped to copy)."""
    name = f"{subject.label} baseline".replace(",", "").replace(" ", "-")
    subject.broker.stop()
    (root / name).mkdir()
    # cp keeps the index files sparse (a copytree would write their holes out).
    subprocess.run(
        ["cp", "-a", "--sparse=always", str(subject.broker.data_dir), str(root / name / "data")],
        check=True, timeout=START_TIMEOUT_S,
    )  # fmt: skip
    subject.broker.start(START_TIMEOUT_S)
    copy = Subject(f"{subject.label} (baseline)", subject.shape, start_broker(root, name, python))
    copy.messages = subject.messages
    return copy


def config_for(broker: BrokerProcess) -> ClientConfig:
    return ClientConfig(broker=broker.address, timeout_s=RPC_TIMEOUT_S)


def loadavg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


# -- filling -------------------------------------------------------------------------------


def requests_for(shape: Shape, count: int) -> Iterator[pb.ProduceRequest]:
    """``count`` 100 B messages spread evenly over the shape's queues, batches
    of at most ``BATCH`` to one queue each."""
    values = values_for(100)
    queues = shape.total_queues
    per_queue = count // queues
    for start in range(0, per_queue, BATCH):
        n = min(BATCH, per_queue - start)
        for t in range(shape.topics):
            for q in range(shape.queues):
                yield BatchColumns(values[:n], queue_ids=[q] * n).request(shape.topic(t))


def fill(subject: Subject, count: int) -> int:
    shape = subject.shape
    assert shape is not None
    config = config_for(subject.broker)
    started = time.monotonic()
    done = 0
    with Admin(config=config) as admin:
        for t in range(shape.topics):
            admin.create_topic(shape.topic(t), queues=shape.queues)
    with Producer(config=config, enable_idempotence=False) as producer:
        for results in producer.send_requests(requests_for(shape, count)):
            done += len(results)
            if done % 1_000_000 < len(results):
                progress(
                    f"{subject.label}: {done:,} of {count:,} written "
                    f"({time.monotonic() - started:.0f} s, load {loadavg()})"
                )
    return done


# -- restarting ----------------------------------------------------------------------------


class Writer(threading.Thread):
    """A producer writing to every queue of a shape, in turn, until its broker dies."""

    def __init__(self, subject: Subject) -> None:
        super().__init__(name="restart-bench-writer", daemon=True)
        self.subject = subject
        self.written = 0
        self.stop = threading.Event()

    def requests(self) -> Iterator[pb.ProduceRequest]:
        shape = self.subject.shape
        assert shape is not None
        values = values_for(100)[:100]
        while not self.stop.is_set():
            for t in range(shape.topics):
                for q in range(shape.queues):
                    yield BatchColumns(values, queue_ids=[q] * len(values)).request(shape.topic(t))
                    if self.stop.is_set():
                        return

    def run(self) -> None:
        config = config_for(self.subject.broker)
        try:
            with Producer(config=config, enable_idempotence=False) as producer:
                for results in producer.send_requests(self.requests()):
                    self.written += len(results)
        except Exception:  # the broker was killed under it: what this writer is for
            return


def kill_while_writing(subject: Subject, seconds: float) -> int:
    """Start a writer, SIGKILL the broker once it has written for ``seconds``;
    messages acknowledged before the kill."""
    writer = Writer(subject)
    writer.start()
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while writer.written == 0 and writer.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)  # bounded: the first reply of a broker that is up
    if writer.written == 0:
        raise RuntimeError(f"{subject.label}: the writer got no reply before the kill")
    time.sleep(seconds)
    subject.broker.kill()
    writer.stop.set()
    writer.join(ANSWER_TIMEOUT_S)
    return writer.written


def first_answer(subject: Subject) -> None:
    """Health SERVING, then one message produced to a queue of the shape and
    pulled back (bounded retries: the broker is up, its reply may lag)."""
    broker = subject.broker
    topic, queue = ("probe", 0) if subject.shape is None else (subject.shape.topic(0), 0)
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    with Connection(config_for(broker)) as conn:
        health = health_pb2_grpc.HealthStub(conn.channel)
        while True:
            try:
                status = health.Check(health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_S).status
            except grpc.RpcError:
                status = None
            if status == health_pb2.HealthCheckResponse.SERVING:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{subject.label}: not SERVING after {ANSWER_TIMEOUT_S:.0f} s")
            time.sleep(0.005)
        value = b"probe-%d" % time.monotonic_ns()
        request = BatchColumns([value], queue_ids=[queue]).request(topic)
        reply: pb.ProduceReply = conn.broker.Produce(request, timeout=RPC_TIMEOUT_S)
        offset = reply.offsets[0]
        pulled: pb.PullReply = conn.broker.Pull(
            pb.PullRequest(topic=topic, queue_id=queue, offset=offset, max_messages=1),
            timeout=RPC_TIMEOUT_S,
        )
        if pulled.count != 1 or value not in pulled.records:
            raise RuntimeError(f"{subject.label}: the probe at offset {offset} did not come back")


def restart(subject: Subject, kind: str, kill_after_s: float) -> Timing:
    broker = subject.broker
    if kind == "kill -9":
        subject.messages += kill_while_writing(subject, kill_after_s)
    else:
        broker.stop()
    started = time.monotonic()
    broker.start(START_TIMEOUT_S)
    ready = time.monotonic() - started
    first_answer(subject)
    answered = time.monotonic() - started
    timing = Timing(answered, ready, store_open_s(broker.log_since_start()))
    subject.timings.setdefault(kind, []).append(timing)
    progress(
        f"{subject.label}: restart after {kind}: answered {answered:.2f} s (ready line "
        f"{ready:.2f} s, store opened in {timing.store_open:.2f} s), load {loadavg()}"
    )
    return timing


def store_open_s(log: str) -> float:
    """Seconds of "store opened in X s" in a broker's INFO log (nan if absent)."""
    found = re.search(r"store opened in ([0-9.]+) s", log)
    return float(found.group(1)) if found else float("nan")


# -- report --------------------------------------------------------------------------------

KINDS = ("clean stop", "kill -9")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(subjects: list[Subject], repeat: int) -> str:
    floors = {
        "baseline" in s.label: median([t.answered for t in s.timings["clean stop"]])
        for s in subjects
        if s.shape is None
    }
    lines = [
        "| broker | messages | queues | restart after clean stop s | restart after kill -9 "
        "while producing s | x empty broker (clean / kill -9) | ready line s (clean / kill -9) "
        "| store open s (clean / kill -9) | target < 2 s after kill -9 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in subjects:
        base = floors["baseline" in s.label]
        cells, ratios, ready, opened = [], [], [], []
        for kind in KINDS:
            runs = s.timings.get(kind, [])
            if not runs:
                cells.append("-")
                continue
            answered = [t.answered for t in runs]
            cells.append(f"{median(answered):.2f} ({max(answered):.2f})")
            ratios.append(f"{median(answered) / base:.2f}x")
            ready.append(f"{median([t.ready for t in runs]):.2f}")
            opened.append(f"{median([t.store_open for t in runs]):.2f}")
        kill = s.timings.get("kill -9")
        met = "-" if not kill else ("met" if median([t.answered for t in kill]) < TARGET_S
                                     else "**not met**")  # fmt: skip
        queues = 0 if s.shape is None else s.shape.total_queues
        lines.append(
            f"| {s.label} | {s.messages:,} | {queues:,} | {cells[0]} | {cells[1]} | "
            f"{' / '.join(ratios)} | {' / '.join(ready)} | {' / '.join(opened)} | {met} |"
        )
    return "\n".join(lines) + (
        f"\n\nMedian (max) of {repeat} restarts each, seconds from spawning the broker to "
        "health SERVING and one message produced and pulled back; ratios to the empty "
        "broker's restart after a clean stop (a baseline broker's: to the baseline's empty "
        "broker), measured in the same rounds."
    )


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=Path(__file__).resolve().parent, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.stdout.strip() or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of seconds")
    parser.add_argument("--repeat", type=int, default=1, help="restarts of each kind per broker")
    parser.add_argument("--messages", type=int, default=10_000_000, help="messages per shape")
    parser.add_argument(
        "--baseline-python",
        help="also restart every broker run by this interpreter (another checkout's venv)",
    )
    parser.add_argument(
        "--source-only",
        action="store_true",
        help="brokers compile their modules at every start (no bytecode kept between starts)",
    )
    args = parser.parse_args()
    BYTECODE["on"] = not args.source_only
    if args.repeat < 1 or args.messages < 1:
        parser.error("--repeat and --messages must be positive")
    messages = min(args.messages, 40_000) if args.quick else args.messages
    shapes = QUICK_SHAPES if args.quick else SHAPES
    kill_after = 0.2 if args.quick else KILL_AFTER_S
    began = time.monotonic()
    print(
        f"restart_bench: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, commit {commit()}, "
        f"load {loadavg()}, {messages:,} messages of 100 B per shape"
        + (" (--quick)" if args.quick else "")
        + (", modules compiled at every start" if args.source_only else ", bytecode kept")
    )
    root = Path(tempfile.mkdtemp(prefix="equeue-restart-bench-"))
    subjects: list[Subject] = []
    try:
        floors = [Subject("empty broker (floor)", None, start_broker(root, "empty"))]
        if args.baseline_python:
            floors.append(
                Subject(
                    "empty broker (floor, baseline)", None,
                    start_broker(root, "empty-baseline", args.baseline_python),
                )
            )  # fmt: skip
        subjects += floors
        for floor in floors:
            with Admin(config=config_for(floor.broker)) as admin:
                admin.create_topic("probe", queues=1)
        for shape in shapes:  # one at a time: 10 M messages take gigabytes of disk
            subject = Subject(shape.name, shape, start_broker(root, shape.name.replace(",", "")))
            group = [subject]
            subjects.append(subject)
            subject.messages = fill(subject, messages)
            if args.baseline_python:
                group.append(copy_of(root, subject, args.baseline_python))
                subjects.append(group[-1])
            for round_ in range(args.repeat):
                progress(f"{shape.name}: round {round_ + 1} of {args.repeat}, load {loadavg()}")
                for each in [*floors, *group]:
                    restart(each, "clean stop", kill_after)
                    if each.shape is not None:
                        restart(each, "kill -9", kill_after)
            for each in group:
                each.broker.stop()
                shutil.rmtree(each.broker.data_dir.parent, ignore_errors=True)
        print()
        print(table(subjects, args.repeat))
        print(f"\nload after: {loadavg()}; {time.monotonic() - began:.0f} s in all")
    finally:
        for subject in subjects:
            if subject.broker.alive():
                subject.broker.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
