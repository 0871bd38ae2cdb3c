"""Transaction check-back against real broker and producer processes.

A producer process (tests/support/txn_producer.py) stages a transaction with a
producer group and is SIGKILLed before it commits; the broker, started with
short check settings, asks a live producer of the group (another process with
a checker) what became of it, and commits, rolls back or asks again. Every
wait polls a readiness signal (ListTransactions, reads, stats) with a deadline.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import grpc
import pytest

from equeue_broker.server.txn_checks import STREAM_QUEUE, CheckStreams, TransactionChecker
from equeue_broker.storage import FlushMode, MessageBatch, Store
from equeue_broker.storage.config import TransactionConfig
from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.cli import main as cli_main
from equeue_spark.client import Admin, ClientConfig, Producer, read_range
from equeue_spark.client.connection import Connection
from tests.conftest import MakeConfig
from tests.support.waits import wait_for

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "orders"
GROUP = "orders-svc"
CHECK_FLAGS = (
    "--txn-check-after", "1s", "--txn-check-interval", "2s", "--txn-check-max", "3",
    "--flush", "sync",
)  # fmt: skip
WAIT_S = 30.0
"""Bound on one wait: checks come within seconds; this is for a loaded machine."""


class ProducerProcess:
    """tests/support/txn_producer.py in a child process; its output lines queued."""

    def __init__(self, target: str, *args: str, token: str = "") -> None:
        env = {**os.environ, "EQUEUE_TOKEN": token} if token else None
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.txn_producer", target, GROUP, *args],
            cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def expect(self, wanted: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while wanted not in self.seen:
            left = deadline - time.monotonic()
            try:
                self.seen.append(self.lines.get(timeout=max(0.01, left)))
            except queue.Empty:
                code = self.process.poll()
                raise AssertionError(f"no {wanted!r} from the producer (exit {code})") from None

    def checks(self) -> list[str]:
        """The CHECK lines printed so far."""
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return [line for line in self.seen if line.startswith("CHECK ")]

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)
        self.reader.join(timeout=30)  # the pipe ends with the process
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture
def producers() -> Iterator[Callable[..., ProducerProcess]]:
    started: list[ProducerProcess] = []

    def start(target: str, *args: str, token: str = "") -> ProducerProcess:
        started.append(ProducerProcess(target, *args, token=token))
        return started[-1]

    yield start
    for p in started:
        if p.process.stdout is not None and not p.process.stdout.closed:
            p.kill()


def _broker(broker_factory: Callable[..., BrokerProcess], *flags: str) -> BrokerProcess:
    broker = broker_factory(*CHECK_FLAGS, *flags)
    with Admin(broker.address) as admin:
        admin.create_topic(TOPIC, 2)
    return broker


def _open(address: str) -> list[pb.TransactionInfo]:
    with Admin(address) as admin:
        return list(admin.list_transactions().transactions)


def _stats(address: str) -> pb.BrokerStats:
    with Admin(address) as admin:
        return admin.stats()


def _values(address: str) -> list[bytes]:
    config = ClientConfig(broker=address)
    return sorted(
        m.value for q in (0, 1) for batch in read_range(TOPIC, q, 0, config=config) for m in batch
    )


def _stage_and_kill(address: str, producers: Callable[..., ProducerProcess], txn: str) -> None:
    """Producer A stages ``txn`` (10 messages) and is SIGKILLed: it never commits."""
    a = producers(address, "--stage", txn, "--topic", TOPIC)
    a.expect("STAGED")
    a.kill()


def _checker(address: str, producers: Callable[..., ProducerProcess], mode: str) -> ProducerProcess:
    """Producer B of the same group, answering with ``mode``, its stream open."""
    b = producers(address, "--checker", mode)
    b.expect("READY")
    wait_for("B's check stream", lambda: _stats(address).check_streams >= 1, WAIT_S)
    return b


EXPECTED = sorted(f"m{i}".encode() for i in range(10))


@pytest.mark.timeout(120)
def test_a_checker_answering_commit_makes_the_transaction_visible(
    broker_factory: Callable[..., BrokerProcess], producers: Callable[..., ProducerProcess]
) -> None:
    broker = _broker(broker_factory)
    b = _checker(broker.address, producers, "commit")
    _stage_and_kill(broker.address, producers, "T1")
    assert wait_for("the commit", lambda: _values(broker.address) == EXPECTED, WAIT_S)
    assert _open(broker.address) == []
    stats = _stats(broker.address)
    assert stats.transaction_checks_sent >= 1 and stats.transaction_checks_answered >= 1
    assert "txn-check" in stats.features
    assert b.checks() and b.checks()[0].startswith("CHECK T1 ")


@pytest.mark.timeout(120)
def test_a_checker_answering_rollback_discards_the_transaction(
    broker_factory: Callable[..., BrokerProcess], producers: Callable[..., ProducerProcess]
) -> None:
    broker = _broker(broker_factory)
    _checker(broker.address, producers, "rollback")
    _stage_and_kill(broker.address, producers, "T2")
    wait_for("the rollback", lambda: _open(broker.address) == [], WAIT_S)
    assert _values(broker.address) == []
    with Producer(broker.address) as producer:  # aborted records never took an offset
        [result] = producer.send_batch(TOPIC, [b"later"], queue_ids=[0])
    assert result.offset == 0


@pytest.mark.timeout(120)
def test_without_a_producer_the_transaction_is_rolled_back_after_the_last_check(
    broker_factory: Callable[..., BrokerProcess], producers: Callable[..., ProducerProcess]
) -> None:
    broker = _broker(broker_factory)
    _stage_and_kill(broker.address, producers, "T3")
    seen: set[int] = set()

    def rolled_back() -> bool:
        listing = _open(broker.address)
        seen.update(t.checks for t in listing)
        return not listing

    wait_for("the rollback after 3 checks", rolled_back, WAIT_S)
    assert {1, 2, 3} <= seen  # each check is 2 s after the last: every count is seen
    assert _values(broker.address) == []
    assert "rolling back transaction T3 of producer group orders-svc" in broker.log_since_start()


@pytest.mark.timeout(120)
def test_with_keep_an_exhausted_transaction_stays_open(
    broker_factory: Callable[..., BrokerProcess], producers: Callable[..., ProducerProcess]
) -> None:
    broker = _broker(broker_factory, "--txn-check-exhausted", "keep")
    _stage_and_kill(broker.address, producers, "T4")

    def exhausted() -> pb.TransactionInfo | None:
        listing = _open(broker.address)
        return listing[0] if listing and listing[0].checks == 3 else None

    info = wait_for("the third check", exhausted, WAIT_S)
    assert info.next_check_ms == 0 and info.group == GROUP
    # Nothing to wait for: the rollback would come an interval (2 s) after the
    # last check, at a tick (1 s); past both, it is still open.
    time.sleep(4)
    [info] = _open(broker.address)
    assert info.checks == 3
    sent = _stats(broker.address).transaction_checks_sent
    assert sent == 0  # nobody was connected: every check went to no one


@pytest.mark.timeout(180)
def test_a_broker_killed_between_checks_continues_the_count(
    broker_factory: Callable[..., BrokerProcess], producers: Callable[..., ProducerProcess]
) -> None:
    # A longer interval and more checks allowed: under load the checker started
    # after the restart may connect after the third check or later; with the
    # default 3 checks it would then be rolled back rather than committed.
    broker = _broker(broker_factory, "--txn-check-interval", "5s", "--txn-check-max", "10")
    _stage_and_kill(broker.address, producers, "T5")
    wait_for("two checks", lambda: [t.checks for t in _open(broker.address)] == [2], WAIT_S)
    broker.kill()
    broker.start()
    [info] = _open(broker.address)
    assert info.checks >= 2  # the count was not restarted
    _checker(broker.address, producers, "commit")
    assert wait_for("the commit", lambda: _values(broker.address) == EXPECTED, WAIT_S)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["unknown-then-commit", "raise-then-commit"])
def test_unknown_answers_and_raising_checkers_are_asked_again(
    broker_factory: Callable[..., BrokerProcess],
    producers: Callable[..., ProducerProcess],
    mode: str,
) -> None:
    broker = _broker(broker_factory)
    b = _checker(broker.address, producers, mode)
    _stage_and_kill(broker.address, producers, "T6")
    assert wait_for("the commit", lambda: _values(broker.address) == EXPECTED, WAIT_S)
    assert [line.split()[2] for line in b.checks()] == ["1", "2", "3"]
    assert _stats(broker.address).check_streams == 1  # B stayed connected


def _stream(
    address: str, *requests: pb.CheckStreamRequest, hold: threading.Event | None = None
) -> Any:
    """A raw TransactionChecks call sending ``requests`` (then waiting for ``hold``)."""

    def send() -> Iterator[pb.CheckStreamRequest]:
        yield from requests
        if hold is not None:
            hold.wait(WAIT_S)

    conn = Connection(ClientConfig(broker=address))
    return conn.broker.TransactionChecks(send(), timeout=WAIT_S)


def _code(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        for _ in call:
            pass
    code: grpc.StatusCode = caught.value.code()
    return code


HELLO = pb.CheckStreamRequest(hello=pb.CheckHello(group=GROUP, client_id="test"))


@pytest.mark.timeout(120)
def test_bad_hellos_and_the_stream_limit(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory("--max-check-streams", "1")
    address = broker.address
    answer = pb.CheckStreamRequest(answer=pb.CheckAnswer(transaction_id="t", check=1))
    empty = pb.CheckStreamRequest(hello=pb.CheckHello(group=""))
    bad = pb.CheckStreamRequest(hello=pb.CheckHello(group="no spaces"))
    for requests in ((answer,), (empty,), (bad,), (HELLO, HELLO)):
        assert _code(_stream(address, *requests)) == grpc.StatusCode.INVALID_ARGUMENT
    hold = threading.Event()
    first = _stream(address, HELLO, hold=hold)
    try:
        wait_for("the first stream", lambda: _stats(address).check_streams == 1, WAIT_S)
        assert _code(_stream(address, HELLO)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        hold.set()
        first.cancel()
    wait_for("the stream closed", lambda: _stats(address).check_streams == 0, WAIT_S)
    # An answer for a transaction that is not open is moot, not an error: the
    # stream goes on to the next request (a bad one, which ends it).
    bad_answer = pb.CheckStreamRequest(answer=pb.CheckAnswer(transaction_id="bad id", check=1))
    assert _code(_stream(address, HELLO, answer, bad_answer)) == grpc.StatusCode.INVALID_ARGUMENT
    assert _stats(address).transaction_checks_answered == 0  # only applied answers count


@pytest.mark.timeout(120)
def test_long_or_unprintable_client_ids_and_answer_ids_are_refused_unlogged(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory()
    long_id = "x" * 1000
    refused = [
        (pb.CheckStreamRequest(hello=pb.CheckHello(group=GROUP, client_id=long_id)),),
        (pb.CheckStreamRequest(hello=pb.CheckHello(group=GROUP, client_id="a\nforged line")),),
        (pb.CheckStreamRequest(hello=pb.CheckHello(group=GROUP, client_id="")),),
        (HELLO, pb.CheckStreamRequest(answer=pb.CheckAnswer(transaction_id=long_id, check=1))),
        (HELLO, pb.CheckStreamRequest(answer=pb.CheckAnswer(transaction_id="a\nb", check=1))),
    ]
    for requests in refused:
        assert _code(_stream(broker.address, *requests)) == grpc.StatusCode.INVALID_ARGUMENT
    log = broker.log_since_start()
    assert "x" * 200 not in log
    assert not any(line.startswith("forged line") for line in log.splitlines())
    assert _stats(broker.address).check_streams == 0


class RawStream:
    """A TransactionChecks call fed request by request; its checks collected."""

    def __init__(self, address: str, group: str) -> None:
        self.out: queue.Queue[pb.CheckStreamRequest | None] = queue.Queue()
        self.checks: queue.Queue[pb.TransactionCheck] = queue.Queue()
        self.code: grpc.StatusCode | None = None
        self.conn = Connection(ClientConfig(broker=address))
        self.send(hello=pb.CheckHello(group=group, client_id="raw"))
        self.call: Any = self.conn.broker.TransactionChecks(self._requests(), timeout=4 * WAIT_S)
        self.ended = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _requests(self) -> Iterator[pb.CheckStreamRequest]:
        while (request := self.out.get()) is not None:
            yield request

    def _read(self) -> None:
        try:
            for check in self.call:
                self.checks.put(check)
        except grpc.RpcError as exc:
            self.code = exc.code()
        self.ended.set()

    def send(self, **kind: Any) -> None:
        self.out.put(pb.CheckStreamRequest(**kind))

    def answer(self, txn_id: str, resolution: pb.TransactionResolution) -> None:
        self.send(answer=pb.CheckAnswer(transaction_id=txn_id, check=1, resolution=resolution))

    def barrier(self) -> None:
        """Send a bad answer and wait for the stream to end on it: every answer
        before it has been handled."""
        self.answer("bad id", pb.TRANSACTION_RESOLUTION_UNKNOWN)
        assert self.ended.wait(WAIT_S)
        assert self.code == grpc.StatusCode.INVALID_ARGUMENT

    def close(self) -> None:
        self.out.put(None)
        self.call.cancel()
        self.conn.close()


COMMIT = pb.TRANSACTION_RESOLUTION_COMMIT
ROLLBACK = pb.TRANSACTION_RESOLUTION_ROLLBACK


@pytest.mark.timeout(120)
def test_answers_apply_only_to_transactions_of_the_streams_group(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = _broker(broker_factory, "--txn-check-interval", "60s")
    address = broker.address
    with (
        Producer(address, group="other") as other,
        Producer(address) as plain,  # no group: a Spark sink's transactions
    ):
        txns = {"T-other": other.transaction("T-other"), "T-plain": plain.transaction("T-plain")}
        for txn in txns.values():
            txn.send_batch(TOPIC, [b"x"], queue_ids=[0])

        def checked() -> bool:  # group "other" has no stream: checked with "none"
            return any(t.transaction_id == "T-other" and t.checks >= 1 for t in _open(address))

        wait_for("T-other checked", checked, WAIT_S)
        stream = RawStream(address, GROUP)
        try:
            for txn_id in txns:
                stream.answer(txn_id, COMMIT)
            stream.answer("T-other", ROLLBACK)
            stream.barrier()
        finally:
            stream.close()
        assert sorted(t.transaction_id for t in _open(address)) == sorted(txns)
        assert _stats(address).transaction_checks_answered == 0
        for txn in txns.values():
            assert not txn.commit().already_committed
    assert _values(address) == [b"x"] * 2


@pytest.mark.timeout(120)
def test_a_commit_or_abort_after_a_checks_answer_is_not_an_error(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = _broker(broker_factory, "--txn-check-interval", "60s")
    address = broker.address
    stream = RawStream(address, GROUP)
    try:
        wait_for("the stream", lambda: _stats(address).check_streams == 1, WAIT_S)
        with Producer(address, group=GROUP) as producer:
            committed = producer.transaction("T-commit")
            committed.send_batch(TOPIC, [b"c"], queue_ids=[0])
            rolled_back = producer.transaction("T-rollback")
            rolled_back.send_batch(TOPIC, [b"r"], queue_ids=[0])
            asked = {stream.checks.get(timeout=WAIT_S).transaction_id for _ in range(2)}
            assert asked == {"T-commit", "T-rollback"}
            stream.answer("T-commit", COMMIT)
            stream.answer("T-rollback", ROLLBACK)
            wait_for("both answers", lambda: not _open(address), WAIT_S)
            assert _stats(address).transaction_checks_answered == 2
            outcome = committed.commit()  # the check committed it first: success
            assert outcome.already_committed and outcome.queues == []
            rolled_back.abort()  # idempotent: rolled back already
    finally:
        stream.close()
    assert _values(address) == [b"c"]


@pytest.mark.timeout(180)
def test_a_replica_applies_no_answer(broker_factory: Callable[..., BrokerProcess]) -> None:
    flags = ("--txn-check-after", "1s", "--txn-check-interval", "60s", "--flush", "sync")
    master = _broker(broker_factory, *flags)
    replica = broker_factory(*flags, "--role", "replica", "--master", master.address)
    with Producer(master.address, group=GROUP) as producer:
        txn = producer.transaction("T1")
        txn.send_batch(TOPIC, [b"x1", b"x2"], queue_ids=[0, 0])

        def checked_on_replica() -> bool:  # checked on the master (no stream: "none")
            return [(t.transaction_id, t.checks >= 1) for t in _open(replica.address)] == [
                ("T1", True)
            ]

        wait_for("T1 checked, on the replica", checked_on_replica, WAIT_S)
        stream = RawStream(replica.address, GROUP)
        try:
            stream.answer("T1", COMMIT)
            stream.barrier()
        finally:
            stream.close()
        assert _stats(replica.address).transaction_checks_answered == 0
        assert [t.transaction_id for t in _open(replica.address)] == ["T1"]
        txn.abort()  # the master's decision, which the replica follows
    wait_for("the replica follows", lambda: not _open(replica.address), WAIT_S)
    assert "TRUNCAT" not in replica.log_since_start().upper()


@pytest.mark.timeout(120)
def test_cancelled_streams_leave_no_pending_task(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory()
    for _ in range(5):
        hold = threading.Event()
        call = _stream(broker.address, HELLO, hold=hold)
        wait_for("the stream", lambda: _stats(broker.address).check_streams == 1, WAIT_S)
        call.cancel()
        hold.set()
        wait_for("its end", lambda: _stats(broker.address).check_streams == 0, WAIT_S)
    broker.stop()  # a pending task is reported when it is destroyed, at the latest here
    assert "Task was destroyed" not in broker.log_since_start()


@pytest.mark.timeout(120)
def test_cli_transactions_list_shows_group_age_and_checks(
    broker_factory: Callable[..., BrokerProcess], producers: Callable[..., ProducerProcess]
) -> None:
    broker = _broker(broker_factory, "--txn-check-interval", "60s")  # one check, then still
    _stage_and_kill(broker.address, producers, "T7")
    wait_for("a check", lambda: [t.checks for t in _open(broker.address)] == [1], WAIT_S)

    def run(*args: str) -> str:
        out = io.StringIO()
        with redirect_stdout(out):
            assert cli_main(["--broker", broker.address, "transactions", "list", *args]) == 0
        return out.getvalue()

    lines = run().splitlines()
    assert lines[0].split() == [
        "ID", "GROUP", "AGE", "CHECKS", "NEXT", "CHECK", "MESSAGES", "BYTES", "QUEUES", "STATE",
    ]  # fmt: skip
    row = lines[1].split()
    assert row[:2] == ["T7", GROUP] and row[2].endswith("s") and row[3] == "1"
    assert row[4] == "in" and row[5].endswith("s")  # NEXT CHECK: "in 59s"
    [raw] = json.loads(run("--json"))["transactions"]
    assert raw["group"] == GROUP and int(raw["checks"]) >= 1 and int(raw["next_check_ms"]) > 0


TOKENS = """
[[tokens]]
name = "ops"
secret = "ops-secret-0123456789ab"
roles = ["admin"]

[[tokens]]
name = "etl"
secret = "etl-secret-0123456789ab"
roles = ["produce", "consume"]

[[tokens]]
name = "other"
secret = "other-secret-0123456789"
roles = ["produce", "consume"]
"""
ETL = "etl-secret-0123456789ab"


@pytest.mark.timeout(120)
def test_a_token_is_asked_only_about_its_own_transactions_by_the_ids_it_knows(
    broker_factory: Callable[..., BrokerProcess],
    producers: Callable[..., ProducerProcess],
    tmp_path: Path,
) -> None:
    """With auth, a non-admin token's transaction ids are ``<name>@<id>`` on the
    broker (auth.py): its checker is asked about "T8", not "etl@T8", and
    another token's producers of the same group are never asked about it."""
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS)
    path.chmod(0o600)
    # A longer interval: the etl checker, started after the first check,
    # connects before the second.
    broker = broker_factory(*CHECK_FLAGS, "--txn-check-interval", "10s", "--tokens-file", str(path))
    ops = ClientConfig(broker=broker.address, token="ops-secret-0123456789ab")
    with Admin(config=ops) as admin:
        admin.create_topic(TOPIC, 2)

    def stats() -> pb.BrokerStats:
        with Admin(config=ops) as admin:
            return admin.stats()

    other = producers(broker.address, "--checker", "commit", token="other-secret-0123456789")
    other.expect("READY")
    wait_for("the other token's stream", lambda: stats().check_streams == 1, WAIT_S)
    a = producers(
        broker.address, "--stage", "T8", "--topic", TOPIC, token="etl-secret-0123456789ab"
    )
    a.expect("STAGED")
    a.kill()
    with Admin(config=ops) as admin:
        wait_for("a check", lambda: admin.list_transactions().transactions[0].checks >= 1, WAIT_S)
    etl = producers(broker.address, "--checker", "commit", token=ETL)
    etl.expect("READY")

    def committed() -> bool:
        with Admin(config=ops) as admin:
            return not admin.list_transactions().transactions

    wait_for("the commit", committed, WAIT_S)
    assert [line.split()[1] for line in etl.checks()] == ["T8"]
    assert other.checks() == []


def test_a_checker_that_is_not_a_master_writes_nothing(
    open_store: Callable[..., Store], make_config: MakeConfig
) -> None:
    """In process (a demotion during a tick cannot be timed from outside):
    with ``active`` off, neither an answer nor a tick, whose checks are due and
    exhausted, writes to the log."""
    txn_config = TransactionConfig(check_max=2)  # exhausted after the second check
    store = open_store(make_config(flush_mode=FlushMode.SYNC, transactions=txn_config))
    store.create_topic(TOPIC, 1)
    store.transactions.stage("T", TOPIC, [(0, MessageBatch([b"x"]))], group=GROUP)
    assert store.transactions.record_check("T", 1, "none")
    streams = CheckStreams(4)

    async def call(fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    checker = TransactionChecker(store, streams, "b", call)
    commit = pb.CheckAnswer(transaction_id="T", check=1, resolution=COMMIT)

    async def run() -> None:
        stream = streams.open(GROUP, "c", "")
        end = store.log_end
        await checker.answer(stream, commit)
        await checker.tick(int(time.time() * 1000) + 10**9)  # due: no check written
        assert store.log_end == end
        assert store.transactions.record_check("T", 2, "none")  # (as the master wrote)
        end = store.log_end
        await checker.tick(int(time.time() * 1000) + 10**10)  # exhausted: no rollback
        assert store.log_end == end and stream.queue.empty()
        assert [i.checks for i in store.transactions.list_open()] == [2]
        assert [i.txn_id for i in store.transactions.list_open()] == ["T"]
        checker.set_active(True)
        await checker.answer(stream, commit)
        assert not store.transactions.list_open() and checker.answered == 1

    asyncio.run(run())


def test_a_full_stream_is_skipped_for_one_with_room() -> None:
    async def run() -> None:
        streams = CheckStreams(4)
        stuck, healthy = streams.open(GROUP, "stuck", ""), streams.open(GROUP, "healthy", "")
        for i in range(STREAM_QUEUE):
            stuck.queue.put_nowait(pb.TransactionCheck(transaction_id=f"old{i}"))
        assert {streams.pick(GROUP, f"T{i}") for i in range(4)} == {healthy}
        for i in range(STREAM_QUEUE):
            healthy.queue.put_nowait(pb.TransactionCheck(transaction_id=f"new{i}"))
        assert streams.pick(GROUP, "T") is None  # every stream full: counted as "none"

    asyncio.run(run())
