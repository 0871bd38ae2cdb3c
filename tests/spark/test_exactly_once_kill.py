"""The kill test: a streaming copy stays exactly-once while its driver is SIGKILLed.

A query copies topic A to topic B (exactly-once sink, the default) while a
producer writes keyed messages into A (paced, until the last kill or 100,000).
The driver process group (the Python driver, its JVM and its Python workers) is
SIGKILLed at random moments and restarted from its checkpoint; in one cycle,
the broker (sync flush) is SIGKILLed and restarted as well. Finally an
AvailableNow run copies the rest, and B must hold every message of A exactly
once: equal multisets of (key, value).

How many kills: ``make test`` runs three cycles (the driver killed; the broker
and the driver; the driver again, against the restarted broker), ``make
kill-loop`` the long version (``EQUEUE_KILLS=6``: seven cycles, and
``EQUEUE_BETWEEN_COMMIT_TRIES=5`` for the two-broker test,
test_exactly_once_kill_two_brokers.py: a file of its own, so that ``--dist
loadfile`` runs the two side by side). The seed is printed; set
``EQUEUE_KILL_SEED`` to replay a run's kill moments.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, EqueueError, Producer
from tests.support.eo_kill import (
    FINAL_RUN_S,
    START_S,
    STOP_S,
    kill_group,
    start_driver,
    wait_started,
)
from tests.support.topics import topic_contents

pytestmark = pytest.mark.slow  # make test-fast skips it (see pyproject.toml)

MESSAGES = 100_000
"""At most: the producer stops after the last kill cycle, or here."""
BATCH = 1_000
"""Messages per paced batch: 2,500 a second, so micro-batches of about 1,250 rows are
in flight at each kill (2,000 and 200,000 before: the final copy and the comparison
of twice as many messages cost minutes on a loaded machine and proved nothing more)."""
QUEUES = 4
KILLS = int(os.environ.get("EQUEUE_KILLS", "2"))
"""Driver kills besides the broker's cycle (which kills the driver too); at least
one comes before the broker's kill and one after (``make kill-loop`` sets 6)."""
BROKER_KILL_CYCLE = max(1, KILLS // 2)
MAX_KILL_DELAY_S = 8.0
PRODUCE_S = 300.0
TIMEOUT_S = (KILLS + 1) * (START_S + MAX_KILL_DELAY_S + STOP_S) + PRODUCE_S + FINAL_RUN_S + STOP_S
"""The test's own pytest timeout: above the sum of its internal budgets, so a slow
machine fails one of those (with its message), never the global timeout."""


class Broker:
    """The current broker address, which changes when it is restarted."""

    def __init__(self, process: BrokerProcess) -> None:
        self.process = process
        self.changed = threading.Condition()

    @property
    def address(self) -> str:
        return self.process.address

    def replace(self, process: BrokerProcess) -> None:
        with self.changed:
            self.process = process
            self.changed.notify_all()

    def wait_for_change(self, old: str, timeout_s: float) -> str:
        with self.changed:
            self.changed.wait_for(lambda: self.address != old, timeout=timeout_s)
            return self.address


def produce_paced(
    broker: Broker, stop: threading.Event, produced: list[int], errors: list[BaseException]
) -> None:
    """Produce keyed messages into A, about one batch per 0.4 s, until ``stop`` is
    set (after the last kill) or MESSAGES were sent, riding out the broker
    restart (a retried batch may be duplicated in A: the check compares B with
    what A holds, not with what was sent). ``produced[0]``: messages acknowledged."""
    try:
        for start in range(0, MESSAGES, BATCH):
            if stop.is_set():
                break
            keys = [b"key-%d" % (i % 997) for i in range(start, start + BATCH)]
            values = [b"value-%d" % i for i in range(start, start + BATCH)]
            for _attempt in range(5):
                address = broker.address
                try:
                    with Producer(address) as producer:
                        producer.send_batch("A", values, keys=keys)
                    break
                except EqueueError:
                    broker.wait_for_change(address, timeout_s=60)
            else:
                raise AssertionError(f"batch at {start} not produced after 5 attempts")
            produced[0] = start + BATCH
            stop.wait(0.4)  # the pacing delay (cut short by the stop)
    except BaseException as exc:
        errors.append(exc)


@pytest.mark.timeout(TIMEOUT_S)
def test_copy_survives_driver_and_broker_kills_exactly_once(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    seed = int(os.environ.get("EQUEUE_KILL_SEED", random.randrange(1 << 30)))
    print(f"kill test seed {seed}")
    rng = random.Random(seed)
    data_dir, checkpoint, log = tmp_path / "broker", tmp_path / "ck", tmp_path / "driver.log"
    broker = Broker(broker_factory("--flush", "sync", data_dir=data_dir))
    with Admin(broker.address) as admin:
        admin.create_topic("A", queues=QUEUES)
        admin.create_topic("B", queues=QUEUES)

    stop, produced, errors = threading.Event(), [0], list[BaseException]()
    producer = threading.Thread(target=produce_paced, args=(broker, stop, produced, errors))
    producer.start()
    kill_moments = []
    for cycle in range(KILLS + 1):
        driver = start_driver(broker.address, checkpoint, log)
        try:
            wait_started(driver)
            delay = rng.uniform(0.5, MAX_KILL_DELAY_S)
            kill_moments.append(round(delay, 1))
            time.sleep(delay)  # the random moment itself, not a synchronisation
            if cycle == BROKER_KILL_CYCLE:
                broker.process.kill()
                broker.replace(broker_factory("--flush", "sync", data_dir=data_dir))
        finally:
            kill_group(driver)
    print(f"killed at {kill_moments} s after each start")
    stop.set()
    producer.join(timeout=PRODUCE_S)
    assert not producer.is_alive() and not errors, errors
    assert produced[0] > 0

    final = start_driver(broker.address, checkpoint, log, "--available-now")
    try:
        assert final.wait(timeout=FINAL_RUN_S) == 0, f"final AvailableNow run failed; see {log}"
    finally:
        kill_group(final)

    source = topic_contents(broker.address, "A", QUEUES)
    copied = topic_contents(broker.address, "B", QUEUES)
    sent = {(b"key-%d" % (i % 997), b"value-%d" % i) for i in range(produced[0])}
    assert sent <= set(source), "the producer's acknowledged messages are not all in A"
    missing, extra = source - copied, copied - source
    assert not missing and not extra, (
        f"B differs from A: {sum(missing.values())} missing, {sum(extra.values())} extra"
    )
    with Admin(broker.address) as admin:
        assert list(admin.list_transactions().transactions) == []
    logs = "".join(p.read_text() for p in tmp_path.glob("broker*.log"))
    print(
        f"A holds {sum(source.values())} messages, B {sum(copied.values())}; broker saw "
        f"{logs.count('was committed before')} replayed batches"
    )
