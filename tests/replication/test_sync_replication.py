"""Sync replication with real broker processes on 127.0.0.1 (docs/replication.md,
"Sync replication"): an acknowledged produce, transaction commit and offset
commit are on the in-sync replica at the ack; a SIGSTOPped replica leaves the
in-sync set and writes go on (min 1), or are refused naming the group (min 2);
the high watermark hides from consumers what the replica has not confirmed;
after SIGCONT it catches up and rejoins; nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from equeue_broker.replication.errors import NotEnoughReplicas
from equeue_broker.replication.insync import InSyncSet
from equeue_broker.replication.replica_log import ReplicaLog
from equeue_broker.server.budgets import ByteBudget
from equeue_broker.server.config import BrokerConfig, parse_args
from equeue_broker.storage import MessageBatch, StorageConfig, Store
from equeue_broker.storage.config import FlushMode
from equeue_broker.storage.errors import CorruptionError, InvalidArgument, LimitExceeded
from equeue_broker.storage.log.positioned import check_frames_at, records_end
from equeue_broker.testing import BrokerProcess
from equeue_proto.protocol import NOT_ENOUGH_REPLICAS
from equeue_proto.record import decode_record, read_meta
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.cli import main
from tests.support.raw_client import RawClient, error_kind
from tests.support.waits import wait_for

TOPIC = "t"
LAG_MS = 1000


class Client(RawClient):
    process: BrokerProcess | None = None
    """The broker process, when the test needs to stop it itself."""

    def values(self) -> list[bytes]:
        """Every readable value of the topic's one queue, in order."""
        out: list[bytes] = []
        for _ in range(1000):  # bounded: each pull returns at least one record or ends
            reply = self.broker.Pull(
                pb.PullRequest(topic=TOPIC, queue_id=0, offset=len(out), max_messages=10_000),
                timeout=10,
            )
            if reply.count == 0:
                return out
            pos = 0
            while pos < len(reply.records):
                out.append(decode_record(reply.records, pos).value)
                pos += read_meta(reply.records, pos).frame_size
        raise AssertionError("the queue never ended")

    def committed(self, group: str) -> dict[int, int]:
        got = self.broker.FetchOffsets(pb.FetchOffsetsRequest(group=group, topic=TOPIC), timeout=10)
        return {o.queue_id: o.offset for o in got.offsets}


@contextmanager
def group(
    tmp_path: Path, *master_flags: str, replicas: int = 1
) -> Iterator[tuple[Client, list[Client], list[BrokerProcess]]]:
    """A master (sync replication, 1 s lag limit, ``master_flags``) and its
    replicas (in the master's flush mode), all of them in sync."""
    flush = master_flags[master_flags.index("--flush") :][:2] if "--flush" in master_flags else ()
    common = ("--broker-name", "g", "--replica-lag-max-ms", str(LAG_MS), *flush)
    master = BrokerProcess(tmp_path / "master", *common, "--replication", "sync", *master_flags)
    address = master.start()
    processes = [
        BrokerProcess(tmp_path / f"replica{i}", *common, "--role", "replica", "--master", address)
        for i in range(replicas)
    ]
    clients: list[Client] = []
    m = Client(address)
    m.process = master
    try:
        for process in processes:
            clients.append(Client(process.start()))
        m.admin.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1), timeout=10)
        members = 1 + replicas
        wait_for("the replicas to join the in-sync set", lambda: in_sync(m) == members, 30)
        yield m, clients, processes
    finally:
        for process in processes:
            with_signal(process, signal.SIGCONT)
            process.kill()
        for client in [m, *clients]:
            client.close()
        master.kill()


def in_sync(master: Client) -> int:
    return len(master.stats().in_sync)


def with_signal(broker: BrokerProcess, sig: signal.Signals) -> None:
    if broker.alive():
        os.kill(broker.pid, sig)


def replicas_have_all(master: Client, replicas: list[Client]) -> bool:
    """Right after an ack (this test's writes are sequential): every replica's
    log reaches the master's log end, i.e. the acknowledged write's end."""
    end = master.stats().log_end_position
    return all(r.stats().log_end_position >= end for r in replicas)


@pytest.mark.timeout(120)
def test_sync_acks_wait_for_in_sync_replicas_and_a_stopped_one_leaves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two replicas: `r` is stopped later; `w` keeps running, a witness of the
    # high watermark on a replica.
    with group(tmp_path, replicas=2) as (m, (r, w), (replica, _)):
        stats = m.stats()
        assert stats.replication == "sync" and stats.min_insync_replicas == 1
        assert [x.in_sync for x in stats.replicas] == [True, True]
        assert sorted(stats.in_sync[1:]) == sorted(x.replica_id for x in stats.replicas)
        assert main(["--broker", m.address, "stats"]) == 0
        said = capsys.readouterr().out
        assert f"sync, min 1 in sync; in sync: {', '.join(stats.in_sync)}" in said, said
        assert said.count("behind, connected") == 2 and said.count(", in sync (id ") == 2
        acked: list[bytes] = []

        # (a) A produce is on the replicas when it is acknowledged.
        for i in range(5):
            values = [b"a-%d-%d" % (i, j) for j in range(20)]
            m.produce(TOPIC, values)
            assert replicas_have_all(m, [r, w]), "acknowledged but not on the replicas"
            acked += values
        wait_for("the replica to serve them (below the HW)", lambda: r.values() == acked, 10)

        # (e) A transaction commit: its records are on the replicas at the ack.
        m.produce(TOPIC, [b"txn-1", b"txn-2"], txn="x1")
        m.broker.CommitTransactions(
            pb.CommitTransactionsRequest(
                transactions=[pb.TransactionRef(transaction_id="x1", expected_messages=2)]
            ),
            timeout=30,
        )
        assert replicas_have_all(m, [r, w]), "commit acknowledged but not on the replicas"
        acked += [b"txn-1", b"txn-2"]
        wait_for("the replica to serve the transaction", lambda: r.values() == acked, 10)

        # (d) An offset commit has been applied on the replicas at the ack.
        for offset in (3, 7, 12):
            m.broker.CommitOffsets(
                pb.CommitOffsetsRequest(
                    group="billing",
                    offsets=[pb.QueueOffset(topic=TOPIC, queue_id=0, offset=offset)],
                ),
                timeout=30,
            )
            assert r.committed("billing") == w.committed("billing") == {0: offset}

        # (c) `r` stopped but still in sync: a record the master wrote, and `w`
        # has, stays invisible to consumers on the master and on `w` (the HW).
        wait_for("the witness to serve everything", lambda: w.values() == acked, 10)
        written_before = m.stats().log_end_position
        with_signal(replica, signal.SIGSTOP)
        outcome: list[object] = []

        def produce_in_background() -> None:
            started = time.monotonic()
            try:
                outcome.append(m.produce(TOPIC, [b"held"]))
            except grpc.RpcError as exc:
                outcome.append(exc)
            outcome.append(time.monotonic() - started)

        producer = threading.Thread(target=produce_in_background)
        producer.start()
        wait_for(
            "the write in the witness's log",
            lambda: w.stats().log_end_position > written_before,
            10,
        )
        unseen = {"master": m.values() == acked, "witness": w.values() == acked}
        still_in_sync = in_sync(m) == 3 and producer.is_alive()
        assert all(unseen.values()) and still_in_sync, (
            f"a record not on the stopped in-sync replica was readable "
            f"(unseen {unseen}, replica still in sync {still_in_sync})"
        )

        # (b) min 1: `r` leaves the set within the lag limit, the write is
        # acknowledged and becomes visible, and later writes go on.
        producer.join(timeout=30)
        assert not producer.is_alive()
        assert isinstance(outcome[0], pb.ProduceReply), outcome
        print(f"first write with the replica stopped waited {outcome[1]:.2f} s")
        acked.append(b"held")
        assert m.values() == acked
        stats = m.stats()
        assert len(stats.in_sync) == 2
        assert sorted(x.in_sync for x in stats.replicas) == [False, True]
        for i in range(3):
            values = [b"b-%d" % i]
            m.produce(TOPIC, values)
            acked += values
        assert m.values() == acked
        wait_for("the witness to serve them", lambda: w.values() == acked, 10)

        # SIGCONT: it catches up, rejoins, and acks wait for it again.
        with_signal(replica, signal.SIGCONT)
        wait_for("the replica to rejoin the in-sync set", lambda: in_sync(m) == 3, 30)
        m.produce(TOPIC, [b"c-0"])
        acked.append(b"c-0")
        assert replicas_have_all(m, [r, w])

        # Nothing acknowledged is lost, on any side.
        assert m.values() == acked
        wait_for(
            "every replica to serve everything",
            lambda: r.values() == acked and w.values() == acked,
            10,
        )


@pytest.mark.timeout(120)
def test_min_insync_2_refuses_writes_without_the_replica(tmp_path: Path) -> None:
    # Sync flush mode on both: durable means fsynced, on the master and the replica.
    with group(tmp_path, "--min-insync-replicas", "2", "--flush", "sync") as (m, [r], [replica]):
        acked = [b"before"]
        m.produce(TOPIC, acked)
        with_signal(replica, signal.SIGSTOP)
        # The first write waits for the replica, which leaves the set: the write
        # is in the master's log but not acknowledged.
        with pytest.raises(grpc.RpcError) as after:
            m.produce(TOPIC, [b"unacked"])
        assert after.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "group g" in (after.value.details() or "")
        assert "not acknowledged" in (after.value.details() or "").lower()
        # Later writes are refused before anything is written.
        end = m.stats().log_end_position
        for call in (
            lambda: m.produce(TOPIC, [b"refused"]),
            lambda: m.broker.CommitOffsets(
                pb.CommitOffsetsRequest(
                    group="billing", offsets=[pb.QueueOffset(topic=TOPIC, queue_id=0, offset=1)]
                ),
                timeout=30,
            ),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            details = refused.value.details() or ""
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, details
            assert "group g: 1 in-sync member" in details and "min_insync_replicas 2" in details
            assert "nothing was written" in details
            assert error_kind(refused.value) == NOT_ENOUGH_REPLICAS
        assert m.stats().log_end_position == end
        assert m.committed("billing") == {}

        # SIGCONT: it catches up and rejoins; writes are acknowledged again.
        with_signal(replica, signal.SIGCONT)
        wait_for("the replica to rejoin the in-sync set", lambda: in_sync(m) == 2, 30)
        m.produce(TOPIC, [b"after"])
        acked.append(b"after")
        # Every acknowledged write is on both (the unacknowledged one may be too).
        wait_for("the replica to serve what the master has", lambda: r.values() == m.values(), 10)
        assert [v for v in m.values() if v != b"unacked"] == acked


@pytest.mark.timeout(120)
def test_a_produce_stream_is_pipelined_and_acknowledged_only_with_the_replica(
    tmp_path: Path,
) -> None:
    """ProduceStream in sync mode writes batches while earlier ones wait for the
    replica (equeue_broker/replication/pipelined.py): replies still come in order, and none
    before the replica has the batch."""

    def stream(m: Client, tag: bytes, batches: int) -> Iterator[pb.ProduceReply]:
        requests = (
            pb.ProduceRequest(topic=TOPIC, messages=pb.MessageColumns(
                count=10, values=b"".join(b"%s-%03d-%d" % (tag, i, j) for j in range(10)),
                value_lengths=[len(b"%s-%03d-%d" % (tag, i, j)) for j in range(10)]))
            for i in range(batches)
        )  # fmt: skip
        yield from m.broker.ProduceStream(requests, timeout=60)

    with group(tmp_path, "--min-insync-replicas", "2") as (m, [r], [replica]):
        acked: list[bytes] = []
        for n, reply in enumerate(stream(m, b"s", 200)):
            assert list(reply.offsets) == list(range(10 * n, 10 * n + 10))  # in order
            if n % 50 == 0:  # ack n: the replica has every batch up to n
                have = r.stats().log_end_position
                assert have >= reply.positions[-1] + 1, (n, have, reply.positions[-1])
            acked += [b"s-%03d-%d" % (n, j) for j in range(10)]
        assert replicas_have_all(m, [r])
        wait_for("the replica to serve the stream", lambda: r.values() == acked, 10)

        # The replica stopped: the stream's batches are written, none is acknowledged.
        with_signal(replica, signal.SIGSTOP)
        got: list[pb.ProduceReply] = []
        with pytest.raises(grpc.RpcError) as failed:
            got.extend(stream(m, b"x", 5))
        assert got == []
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "not acknowledged" in (failed.value.details() or "").lower()
        assert [v for v in m.values() if not v.startswith(b"x-")] == acked


@pytest.mark.timeout(120)
def test_a_restarted_replica_keeps_hiding_what_the_high_watermark_held(tmp_path: Path) -> None:
    """What the replicated high watermark held back when a replica last saved its
    checkpoint stays unreadable on it after a restart, until its master's first
    reply: a record a failover could lose is not served in that window either."""
    with group(tmp_path, replicas=2) as (m, (_, w), (stopped, witness)):
        acked = [b"a-%d" % i for i in range(10)]
        m.produce(TOPIC, acked)
        wait_for("the witness to serve them", lambda: w.values() == acked, 10)
        before = w.stats().log_end_position
        with_signal(stopped, signal.SIGSTOP)  # in sync still: it holds the HW back
        producer = threading.Thread(target=lambda: _produce_quietly(m, [b"held"]))
        producer.start()
        checkpoint = witness.data_dir / "checkpoint.json"

        def held_and_saved() -> bool:
            # A checkpoint saved before the held record arrived may name an older
            # high watermark (one taken while the acked records still arrived, which
            # would hide some of them after the restart): wait for the one that
            # covers the held record and holds exactly the acked ones back.
            saved = json.loads(checkpoint.read_text()) if checkpoint.exists() else {}
            document = saved.get("document", {})  # atomic_file.py
            held = document.get("held_high_watermark")
            return bool(held == before and document.get("index_position", 0) > before)

        wait_for("the witness to save a held high watermark", held_and_saved, 30)
        assert w.values() == acked  # held back while running
        assert m.process is not None
        m.process.kill()
        witness.kill()
        w.close()
        witness.start()  # its master is gone: no reply will come
        restarted = Client(witness.address)
        try:
            assert restarted.stats().log_end_position > before  # it has the record...
            assert restarted.values() == acked  # ...and does not serve it
        finally:
            restarted.close()
        with_signal(stopped, signal.SIGCONT)
        producer.join(timeout=30)


def _produce_quietly(client: Client, values: list[bytes]) -> None:
    with contextlib.suppress(grpc.RpcError):
        client.produce(TOPIC, values)


def test_bad_replication_settings_are_config_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for flags, said in (
        (["--min-insync-replicas", "0"], "min_insync_replicas must be at least 1"),
        (["--replication", "quorum"], "invalid choice: 'quorum'"),
        (["--replica-lag-max-ms", "0"], "replica_lag_max_ms must be positive"),
        (["--min-insync-replicas", "2"], "min_insync_replicas 2 needs replication sync"),
    ):
        with pytest.raises(SystemExit) as exited:
            parse_args(flags)
        assert exited.value.code == 2
        assert said in capsys.readouterr().err, flags
    with pytest.raises(InvalidArgument, match="replication must be async or sync, got 'Sync'"):
        BrokerConfig(replication="Sync")
    config = parse_args(["--replication", "sync", "--min-insync-replicas", "2"])
    assert (config.replication, config.min_insync_replicas) == ("sync", 2)
    assert config.replica_lag_max_ms == 10_000


@pytest.mark.parametrize("flush", [FlushMode.ASYNC, FlushMode.SYNC])
def test_the_store_serves_only_below_its_hw_limit(
    open_store: Callable[..., Store], make_config: Callable[..., StorageConfig], flush: FlushMode
) -> None:
    """The storage side of the high watermark: a record is readable once it is
    durable and ends at or below the limit the server sets (None: no limit)."""
    store = open_store(make_config(flush_mode=flush))
    store.create_topic("t", 1)
    store.append("t", 0, MessageBatch([b"a"]))
    assert store.queue_info("t", 0).end == 1
    held_from = store.durable_end
    store.set_hw_limit(held_from)
    store.append("t", 0, MessageBatch([b"b", b"c"]))
    store.transactions.stage("x", "t", [(0, MessageBatch([b"d"]))])
    store.transactions.commit([("x", 1)])
    assert store.durable_end > held_from == store.high_watermark
    assert store.queue_info("t", 0).end == 1
    assert [m.value for m in store.read("t", 0, 0).messages] == [b"a"]
    store.set_hw_limit(store.durable_end - 1)  # short of the commit record's end
    assert store.queue_info("t", 0).end == 3
    store.set_hw_limit(None)
    assert store.high_watermark == store.durable_end
    assert [m.value for m in store.read("t", 0, 0).messages] == [b"a", b"b", b"c", b"d"]
    store.set_hw_limit(0)  # a limit that goes back hides nothing already readable
    assert store.queue_info("t", 0).end == 4


def test_a_replica_refuses_damaged_or_misplaced_bytes(
    open_store: Callable[..., Store], make_config: Callable[..., StorageConfig], tmp_path: Path
) -> None:
    """The replica's frame checks (one codec call, then each record's position)."""
    master = open_store()
    master.create_topic("t", 1)
    master.append("t", 0, MessageBatch([b"v%d" % i for i in range(50)]))
    piece = master.read_log(0, 1 << 20)
    replica = ReplicaLog(open_store(make_config(data_dir=tmp_path / "replica")))
    damaged = bytearray(piece.data)
    damaged[len(damaged) // 2] ^= 0xFF
    with pytest.raises(CorruptionError, match="is invalid"):
        replica.append(0, bytes(damaged))
    master.append("t", 0, MessageBatch([b"later"]))
    later = master.read_log(len(piece.data), 1 << 20)
    with pytest.raises(CorruptionError, match="names position"):
        check_frames_at(0, later.data)  # the bytes of one position presented as another's
    assert replica.append(0, piece.data) == len(piece.data)
    # Where a master cuts a reply: whole, checked records within the limit, at least one.
    first = read_meta(piece.data, 0).frame_size
    assert records_end(piece.data, 1) == first
    assert records_end(piece.data, 3 * first) == 3 * first
    assert records_end(piece.data, 1 << 20) == len(piece.data)
    with pytest.raises(CorruptionError, match="invalid record in the log"):
        records_end(bytes(damaged), 1 << 20)
    with pytest.raises(CorruptionError, match="invalid record in the log"):
        records_end(piece.data[:-1], 1 << 20)  # a frame that is not whole


def test_the_in_sync_set_in_process(
    open_store: Callable[..., Store], make_config: Callable[..., StorageConfig]
) -> None:
    """InSyncSet against a real store, replicas played by calls: joining, a wait
    settled by a confirmation (log and metadata), a silent member leaving after
    the lag limit (which settles the wait), a reconnect, the slot limit."""
    store = open_store(make_config())
    store.create_topic("t", 1)
    changes: list[list[str]] = []

    async def scenario() -> None:
        isr = InSyncSet(
            store, "m", "g", sync=True, min_insync=1, lag_max_s=0.3,
            slots=ByteBudget("max_replication_waits", 1, 0.05, "slots"),
        )  # fmt: skip
        isr.on_isr_change = changes.append
        isr.start()
        try:
            await run(isr)
        finally:
            isr.stop()

    async def nothing() -> None:  # an offset commit's write, as far as the set can tell
        pass

    def append() -> Callable[[], Awaitable[int]]:
        async def write() -> int:
            store.append("t", 0, MessageBatch([b"v"]))
            return store.durable_end

        return write

    async def run(isr: InSyncSet) -> None:
        isr.progress("r1", 1, store.durable_end, 0)
        assert isr.members == ["m", "r1"]
        # A write waits for r1's confirmation; readers see it only then.
        task = asyncio.ensure_future(isr.replicated(append()))
        done, _ = await asyncio.wait([task], timeout=0.05)
        assert not done and store.queue_info("t", 0).end == 0
        isr.progress("r1", 1, store.durable_end, 0)
        end = await asyncio.wait_for(task, 5)
        assert store.high_watermark == end and store.queue_info("t", 0).end == 1
        # An offset commit waits for the metadata version it made.
        commit = asyncio.ensure_future(isr.replicated(nothing, metadata=True))
        finished, _ = await asyncio.wait([commit], timeout=0.05)
        assert not finished
        isr.progress("r1", 1, store.durable_end, isr.metadata_version)
        await asyncio.wait_for(commit, 5)
        # The one slot taken: a second write is refused, unwritten.
        task = asyncio.ensure_future(isr.replicated(append()))
        await asyncio.sleep(0)
        with pytest.raises(LimitExceeded, match="max_replication_waits"):
            await isr.replicated(append())
        # r1 stays silent: it leaves after the lag limit and the write is acked.
        await asyncio.wait_for(task, 5)
        assert isr.members == ["m"] and store.queue_info("t", 0).end == 2
        # A reconnected stream speaks for r1; the old stream's end changes nothing.
        isr.progress("r1", 2, store.durable_end, isr.metadata_version)
        isr.disconnected("r1", 1)
        assert isr.members == ["m", "r1"]
        isr.disconnected("r1", 2)
        assert isr.members == ["m"]

    asyncio.run(scenario())
    assert changes == [["m", "r1"], ["m"], ["m", "r1"], ["m"]]


def test_too_few_in_sync_members_refuse_before_writing(
    open_store: Callable[..., Store], make_config: Callable[..., StorageConfig]
) -> None:
    store = open_store(make_config())
    isr = InSyncSet(
        store,
        "m",
        "g",
        sync=True,
        min_insync=2,
        lag_max_s=1,
        slots=ByteBudget("max_replication_waits", 1, 1, "slots"),
    )
    written: list[int] = []

    async def write() -> None:
        written.append(1)

    with pytest.raises(NotEnoughReplicas, match=r"group g: 1 in-sync member\(s\) \(m\)"):
        asyncio.run(isr.replicated(write))
    assert written == []
