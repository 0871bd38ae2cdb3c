"""Idempotent produce across a broker's SIGKILL and restart (one broker, no replication).

A keyed producer sends batches to one broker (``--flush async``: a process
crash loses nothing the page cache holds) while the test SIGKILLs the broker
mid-stream and restarts it over the same data directory on the same port,
three times. The producer's retries ride over each restart (the connection
retries for about 10 s). A batch the broker appended before the kill but
never acknowledged is sent again with the same producer id, epoch and
sequences; the restarted broker, whose producer state is rebuilt from the
log at recovery, answers it with its original offsets. Then every queue is
read back: each acknowledged record exactly once, at its acknowledged queue
and offset, and nothing else.

Unary ``send_batch`` and the streaming ``send_batches`` (one call for the
whole run: a broken stream resends what it did not acknowledge, then carries
on on a new stream, up to ``STREAM_RESTARTS`` = 3 times per call). The
control: the same unary run with ``enable_idempotence=False`` is at-least-once
and may count duplicates (printed, not asserted: whether a kill lands between
an append and its reply is chance); ``test_the_tally_counts_planted_...``
shows the counting itself finds what it must.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from pathlib import Path

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, ClientConfig, Producer
from tests.support.acked import Place, Sending, Tally, read_topic, tally, value

pytestmark = pytest.mark.slow  # make test-fast skips it

TOPIC = "idem"
QUEUES = 4
BATCH = 500
BATCHES = 160
KILLS = 3
MARGIN = 10
"""Batches the producer may send beyond a kill's point (so it is mid-stream)."""
SEND_BUDGET_S = 90.0
"""The whole send, kills included (about 10 s alone on 2 cores)."""


def free_low_port() -> int:
    """A free port below Linux's ephemeral range (32768-60999): a client
    reconnecting to a port of that range while nothing listens on it can
    connect to itself (TCP simultaneous open)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20_000, 32_000)
        with contextlib.closing(socket.socket()) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in 20000-32000")


def patient(address: str) -> ClientConfig:
    """Retries that outlast a restart: 40 tries 0.05-0.5 s apart, about 10-20 s."""
    return ClientConfig(broker=address, timeout_s=10.0, retries=40, backoff_s=0.05,
                        max_backoff_s=0.5)  # fmt: skip


def run_with_kills(
    tmp_path: Path, *, idempotent: bool, unary: bool, keyed: bool = True
) -> tuple[Sending, Tally]:
    """The scenario: a broker, a producer sending ``BATCHES`` keyed batches,
    ``KILLS`` SIGKILLs and restarts mid-stream; (the sender, the log's tally)."""
    port = free_low_port()
    broker = BrokerProcess(tmp_path / "data", "--port", str(port), "--flush", "sync")
    broker.start()
    try:
        with Admin(broker.address) as admin:
            admin.create_topic(TOPIC, queues=QUEUES)
        with Producer(config=patient(broker.address), enable_idempotence=idempotent) as producer:
            # Streaming: one send_batches call for the whole run, so every kill
            # breaks it mid-stream (it restarts a broken stream up to 3 times).
            sending = Sending(producer, TOPIC, BATCHES, BATCH, unary=unary, per_stream=BATCHES,
                              group_of=lambda _broker_id: "", keyed=keyed)  # fmt: skip
            step = BATCHES // (KILLS + 1)
            sending.allow(step + MARGIN)  # mid-stream at every kill
            sending.start()
            rng = random.Random()
            for k in range(1, KILLS + 1):
                sending.allow(k * step + MARGIN)
                sending.wait_acked(k * step, SEND_BUDGET_S)
                # A random moment within the next batch or so, not the instant
                # an acknowledgement arrived (when no request is on its way).
                threading.Event().wait(rng.uniform(0.0, 0.06))
                broker.kill()
                assert broker.start() == f"127.0.0.1:{port}"
            sending.allow(BATCHES)
            sending.join(SEND_BUDGET_S)
            if idempotent:
                assert producer.producer_identity()[0] > 0
        log = read_topic(TOPIC, {"": (broker.address, QUEUES)})
    finally:
        broker.kill()
    result = tally(sending.acked, log, sending.in_doubt)
    print(f"idempotence {'on' if idempotent else 'off'}, {'unary' if unary else 'stream'}, "
          f"{KILLS} kills: {result.summary()}; errors: {sending.errors}")  # fmt: skip
    return sending, result


@pytest.mark.timeout(240)  # above SEND_BUDGET_S and the broker's starts (60 s each at most)
@pytest.mark.parametrize(
    ("unary", "keyed"), [(True, True), (False, True), (True, False)],
    ids=["send_batch", "send_batches", "send_batch-keyless"],
)  # fmt: skip
def test_every_acknowledged_record_once_across_restarts(
    tmp_path: Path, unary: bool, keyed: bool
) -> None:
    """Keyless batches too: the producer picks their queue and keeps it (one
    broker: it waits for the broker to come back, with the connection's backoff)."""
    sending, result = run_with_kills(tmp_path, idempotent=True, unary=unary, keyed=keyed)
    assert result.problems() == []  # whatever else happened: no acknowledged record twice
    assert sending.errors == [], "every batch rides over the restarts"
    assert len(sending.acked) == BATCHES * BATCH


@pytest.mark.timeout(240)
def test_control_without_idempotence_is_at_least_once(tmp_path: Path) -> None:
    """The same unary run, at-least-once: duplicates are allowed (printed), losses not."""
    sending, result = run_with_kills(tmp_path, idempotent=False, unary=True)
    assert sending.errors == []
    assert (result.lost, result.moved, result.unknown) == ([], [], 0)


def test_the_tally_counts_planted_duplicates_losses_and_moves() -> None:
    acked = {i: Place("g", 0, i) for i in range(5)}
    log = [(Place("g", 0, i), value(i)) for i in range(5)]
    assert tally(acked, log).problems() == []
    planted = [
        *log[:3],                       # id 3 lost; id 4 moved below
        (Place("g", 0, 3), value(2)),   # a second copy of id 2
        (Place("g", 1, 0), value(4)),   # id 4, at another queue only
        (Place("g", 1, 1), value(9)),   # in doubt, present twice
        (Place("g", 1, 2), value(9)),
        (Place("g", 1, 3), value(77)),  # never sent
        (Place("g", 1, 4), b"short"),   # no id at all
    ]  # fmt: skip
    result = tally(acked, planted, in_doubt={9})
    assert result.lost == [3]
    assert result.duplicated == {2: 1} and result.duplicates == 1
    assert result.moved == [4]
    assert (result.in_doubt_present, result.in_doubt_duplicated, result.unknown) == (1, 1, 2)
    assert result.records == 9
    assert len(result.problems()) == 5
