"""Damaged bytes at rest (issue 15): bit rot in metadata files and in a sealed
log chunk's header, and ``equeue-broker verify``, which lists the damage.

leveldb style: one test per corruption case. Each builds a data directory,
flips bytes in one place, reopens it (a store, or a real broker where the
behaviour is the broker's) and asserts exactly what is still served, what is
refused and how.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from equeue_broker.storage import FlushMode, RetentionConfig, StorageConfig
from equeue_broker.storage.errors import CorruptionError
from equeue_broker.storage.meta.atomic_file import decode_document
from equeue_broker.storage.meta.offsets import OffsetsLost
from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_checks import details_of, status_of
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from tests.conftest import MakeConfig
from tests.support.faults import flip_byte, index_files, log_chunks, read_document, write_at
from tests.support.sent import TOPIC, OpenStore, append, assert_queue_holds, shape

RPC_S = 15.0
VERIFY_S = 60.0


def commit_5_then_500(open_store: OpenStore, make_config: MakeConfig) -> StorageConfig:
    """A closed store whose offsets.json says group g is at 500 on queue 0, and
    offsets.json.bak (the previous save) at 5."""
    store = open_store(make_config(flush_mode=FlushMode.SYNC))  # every commit persists
    store.create_topic(TOPIC, 1)
    append(store, 0, "a", 600, size=20)
    store.commit_offset("g", TOPIC, 0, 5)
    store.commit_offset("g", TOPIC, 0, 500)
    store.close()
    return store.config


def flip_500_to_700(path: Path) -> None:
    """One flipped bit ('5' is 0x35, '7' is 0x37): the file is still valid JSON."""
    data = path.read_bytes()
    at = data.index(b":500")
    write_at(path, at + 1, b"7")
    assert json.loads(path.read_bytes())  # still parses


# -- metadata files ------------------------------------------------------------------


def test_offsets_flipped_digit_uses_backup(open_store: OpenStore, make_config: MakeConfig) -> None:
    """Before checksums, the group silently resumed at 700, skipping 200 messages."""
    config = commit_5_then_500(open_store, make_config)
    flip_500_to_700(config.data_dir / "offsets.json")
    store = open_store(config)
    assert store.committed_offsets("g") == {TOPIC: {0: 5}}
    # Both copies hold the good document again, checksummed.
    for name in ("offsets.json", "offsets.json.bak"):
        assert read_document(config.data_dir / name)["groups"] == {"g": {TOPIC: {"0": 5}}}


def test_offsets_file_without_checksum_loads_once_and_gains_one(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """A file of the previous format (a bare document) still loads, and both
    copies carry a checksum from then on (before: the file stayed unchecked)."""
    config = commit_5_then_500(open_store, make_config)
    legacy = json.dumps({"groups": {"g": {TOPIC: {"0": 42}}}}).encode()
    (config.data_dir / "offsets.json").write_bytes(legacy)
    (config.data_dir / "offsets.json.bak").unlink()
    store = open_store(config)
    assert store.committed_offsets("g") == {TOPIC: {0: 42}}
    for name in ("offsets.json", "offsets.json.bak"):
        document, checked = decode_document((config.data_dir / name).read_bytes())
        assert checked
        assert document["groups"] == {"g": {TOPIC: {"0": 42}}}


def test_offsets_both_copies_damaged_refuse_groups_until_reset(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """Before: the store refused to open ("no readable copy of metadata file").
    Now it opens, serves every message, and refuses only the groups' offsets
    until an operator resets each group; the refusal outlives a restart."""
    config = commit_5_then_500(open_store, make_config)
    data = config.data_dir
    flip_500_to_700(data / "offsets.json")
    write_at(data / "offsets.json.bak", 3, b"X")  # inside the checksum's key
    store = open_store(config)
    assert len(store.read(TOPIC, 0, 0, max_messages=1000).messages) == 600
    with pytest.raises(OffsetsLost, match="equeue groups reset"):
        store.committed_offsets("g")
    with pytest.raises(OffsetsLost):
        store.commit_offset("g", TOPIC, 0, 1)
    assert store.damage().offsets_lost is not None
    assert "offsets.json" in store.damage().metadata()[0]
    assert (data / "offsets.json.damaged").exists() and (data / "offsets.json.bak.damaged").exists()

    store.commit_offsets("g", [(TOPIC, 0, 10)], reset=True)  # what `equeue groups reset` does
    assert store.committed_offsets("g") == {TOPIC: {0: 10}}
    store.close()
    store = open_store(config)
    assert store.committed_offsets("g") == {TOPIC: {0: 10}}
    with pytest.raises(OffsetsLost):
        store.committed_offsets("other")  # never reset: the broker cannot tell it was new
    store.delete_group("other")  # deleting counts as a reset
    assert store.committed_offsets("other") == {}


def test_offsets_reset_of_a_lost_group_is_saved_at_once(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """Async mode saves offsets on an interval; a reset must not wait for it: a
    killed broker would refuse the group again after the operator reset it."""
    config = commit_5_then_500(open_store, make_config)
    for name in ("offsets.json", "offsets.json.bak"):
        write_at(config.data_dir / name, 3, b"X")
    config = make_config(flush_mode=FlushMode.ASYNC)
    store = open_store(config)
    store.commit_offsets("g", [(TOPIC, 0, 10)], reset=True)
    store.abandon()  # killed: nothing more is saved
    store = open_store(config)
    assert store.committed_offsets("g") == {TOPIC: {0: 10}}


def test_topics_flipped_incarnation_digit_uses_backup(open_store: OpenStore) -> None:
    """Before: a topic's incarnation silently changed (a Spark checkpoint would
    take the topic for a new one)."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    sent = append(store, 0, "a", 3)
    store.create_topic("other", 1)  # a second save: the backup holds TOPIC too
    incarnation = store.topic_admin.describe(TOPIC).incarnation
    store.close()
    path = store.config.data_dir / "topics.json"
    data = path.read_bytes()
    at = data.index(b'"incarnation":%d' % incarnation) + len(b'"incarnation":%d' % incarnation)
    write_at(path, at - 1, bytes([data[at - 1] ^ 1]))  # one bit of the last digit
    store = open_store(store.config)
    assert store.topic_admin.describe(TOPIC).incarnation == incarnation
    assert_queue_holds(store, 0, sent)


def test_retention_deletes_a_quarantined_chunk_and_its_report(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """A quarantined chunk is deleted by retention like any sealed chunk, and
    leaves the damage report with it."""
    config = make_config(retention=RetentionConfig(max_chunks=2, max_age_ms=None))
    store = open_store(config)
    store.create_topic(TOPIC, 1)
    append(store, 0, "a", 1500, size=100)  # 64 KiB chunks: three sealed
    store.close()
    flip_byte(log_chunks(config.data_dir)[0], 20)
    store = open_store(config)
    assert [c.number for c in store.damage().quarantined_chunks] == [0]
    assert store.stats()["quarantined_chunks"] == 1
    assert store.apply_retention().log_chunks_deleted >= 1
    assert store.damage().quarantined_chunks == []
    assert store.stats()["quarantined_chunks"] == 0


# -- the active chunk's header --------------------------------------------------------


def test_active_chunk_header_flip_is_rebuilt_and_every_record_served(
    open_store: OpenStore,
) -> None:
    """Before: "cannot start: chunk header checksum mismatch" for the last
    (unsealed) chunk, so nothing at all was served. Its header holds nothing
    the log cannot say again (its number is in the file name, its capacity is
    the log's): it is rebuilt, the tail scan checks every record in the chunk,
    and the damaged header is kept for an operator."""
    store = open_store()
    store.create_topic(TOPIC, 2)
    sent = append(store, 0, "a", 300, size=500) + append(store, 1, "b", 10)
    store.close()
    chunks = log_chunks(store.config.data_dir)
    assert len(chunks) > 1  # sealed chunks and an active one holding records
    active = chunks[-1]
    flip_byte(active, 20)  # inside the capacity field, under the header checksum

    store = open_store(store.config)
    assert_queue_holds(store, 0, [s for s in sent if s.queue_id == 0])
    assert_queue_holds(store, 1, [s for s in sent if s.queue_id == 1])
    assert store.damage().quarantined_chunks == []
    assert active.with_name(active.name + ".header.damaged").exists()
    more = append(store, 0, "c", 3)
    assert more[0].offset == 300
    store.close()


def test_a_queue_whose_last_record_is_in_a_quarantined_chunk_still_opens(
    open_store: OpenStore,
) -> None:
    """Recovery checks each queue's last index entry against the log; when
    that record is in a quarantined (sealed) chunk the check used to raise
    and the store did not open. Now the entry is kept: reads of it answer
    DATA_LOSS, every other record is served."""
    store = open_store()
    store.create_topic(TOPIC, 2)
    early = append(store, 1, "b", 5)
    sent = append(store, 0, "a", 300, size=500)
    store.close()
    first = log_chunks(store.config.data_dir)[0]
    flip_byte(first, 20)

    store = open_store(store.config)
    [quarantined] = store.damage().quarantined_chunks
    assert quarantined.path == first and early[-1].position < quarantined.end_position
    with pytest.raises(CorruptionError, match="quarantined"):
        store.read(TOPIC, 1, 0, max_messages=1)
    later = [s for s in sent if s.position >= quarantined.end_position]
    result = store.read(TOPIC, 0, later[0].offset, max_messages=len(later))
    assert [shape(m) for m in result.messages] == [s.shape() for s in later]
    assert append(store, 1, "c", 1)[0].offset == len(early)
    store.close()


# -- sealed chunk header: real brokers ----------------------------------------------

CHUNK = 64 * 1024
VALUE = 1000


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(
        tmp_path / "data", "--chunk-size", str(CHUNK), "--max-message-bytes", str(CHUNK // 4),
        "--log-level", "WARNING",
        log_path=tmp_path / "broker.log",
    )  # fmt: skip
    yield process
    process.kill()


def stubs(broker: BrokerProcess) -> tuple[grpc.Channel, pb_grpc.BrokerStub, pb_grpc.AdminStub]:
    channel = grpc.insecure_channel(broker.address)
    return channel, pb_grpc.BrokerStub(channel), pb_grpc.AdminStub(channel)


def produce_rounds(stub: pb_grpc.BrokerStub, rounds: int) -> dict[tuple[int, int], int]:
    """{(queue, offset): log position} of ``rounds`` x 2 queues x 10 messages."""
    positions: dict[tuple[int, int], int] = {}
    for r in range(rounds):
        for q in (0, 1):
            values = [f"{r}:{q}:{i}:".encode().ljust(VALUE, b"v") for i in range(10)]
            columns = pb.MessageColumns(
                count=len(values), values=b"".join(values), value_lengths=[VALUE] * 10
            )
            reply = stub.Produce(
                pb.ProduceRequest(topic=TOPIC, messages=columns, queue_ids=[q] * 10),
                timeout=RPC_S,
            )
            keys = zip(reply.queue_ids, reply.offsets, strict=True)
            positions.update(zip(keys, reply.positions, strict=True))
    return positions


def run_verify(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "equeue_broker", "verify", "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=VERIFY_S, check=False,
    )  # fmt: skip


def test_sealed_chunk_header_flip_quarantines_the_chunk(broker: BrokerProcess) -> None:
    """Before: "cannot start: chunk header checksum mismatch", and every record
    of every other chunk was unreachable."""
    broker.start()
    channel, stub, admin = stubs(broker)
    admin.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=2), timeout=RPC_S)
    positions = produce_rounds(stub, 12)  # 240 KB: chunks 0-3 sealed, 4 active
    channel.close()
    assert broker.stop() == 0
    chunks = log_chunks(broker.data_dir)
    assert len(chunks) >= 4
    damaged = chunks[1]
    flip_byte(damaged, 20)  # inside the capacity field, under the header checksum

    broker.start()
    channel, stub, admin = stubs(broker)
    inside = sorted(o for (q, o), p in positions.items() if q == 0 and p // CHUNK == 1)
    assert inside
    try:
        for (q, offset), position in sorted(positions.items()):
            request = pb.PullRequest(topic=TOPIC, queue_id=q, offset=offset, max_messages=1)
            if position // CHUNK != 1:
                reply = stub.Pull(request, timeout=RPC_S)
                assert reply.count == 1, (q, offset)
                continue
            with pytest.raises(grpc.RpcError) as caught:
                stub.Pull(request, timeout=RPC_S)
            assert status_of(caught.value) is grpc.StatusCode.DATA_LOSS
            assert f"{TOPIC}/{q} offset {offset}" in details_of(caught.value)
            assert damaged.name in details_of(caught.value)
        address = pb.QueueOffset(topic=TOPIC, queue_id=0, offset=inside[0])
        with pytest.raises(grpc.RpcError) as caught:
            admin.GetMessage(pb.GetMessageRequest(address=address), timeout=RPC_S)
        assert status_of(caught.value) is grpc.StatusCode.DATA_LOSS
        assert damaged.name in details_of(caught.value)
        stats = admin.GetStats(pb.GetStatsRequest(), timeout=RPC_S)
        assert [c.file for c in stats.quarantined_chunks] == [str(damaged)]
        assert "header checksum mismatch" in stats.quarantined_chunks[0].reason
        assert stats.quarantined_chunks[0].start_position == CHUNK
    finally:
        channel.close()
    cli = subprocess.run(
        [sys.executable, "-m", "equeue_spark.cli", "--broker", broker.address, "stats"],
        capture_output=True, text=True, timeout=VERIFY_S, check=False,
    )  # fmt: skip
    assert f"QUARANTINED chunk {damaged}: chunk header checksum mismatch" in cli.stdout
    assert "QUARANTINED log chunk" in broker.log_since_start()
    assert broker.stop() == 0

    result = run_verify(broker.data_dir)
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        f"{damaged}: byte 0: damaged chunk: chunk header checksum mismatch"
    ]


def test_offsets_lost_broker_answers_failed_precondition_until_reset(
    broker: BrokerProcess,
) -> None:
    """With both copies of offsets.json damaged, a real broker starts (before: it
    exited, "cannot start"), serves messages, answers FAILED_PRECONDITION to the
    group's fetch and commit until `equeue groups reset`, and says so in stats."""
    broker.flags += ["--flush", "sync"]  # every commit saves offsets.json
    broker.start()
    channel, stub, admin = stubs(broker)
    admin.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=2), timeout=RPC_S)
    produce_rounds(stub, 1)
    for offset in (5, 7):  # two saves: offsets.json and offsets.json.bak
        stub.CommitOffsets(
            pb.CommitOffsetsRequest(
                group="g", offsets=[pb.QueueOffset(topic=TOPIC, queue_id=0, offset=offset)]
            ),
            timeout=RPC_S,
        )
    channel.close()
    assert broker.stop() == 0
    for name in ("offsets.json", "offsets.json.bak"):
        write_at(broker.data_dir / name, 3, b"X")

    broker.start()
    channel, stub, admin = stubs(broker)
    try:
        reply = stub.Pull(pb.PullRequest(topic=TOPIC, queue_id=0, offset=0), timeout=RPC_S)
        assert reply.count == 10
        commit = pb.CommitOffsetsRequest(
            group="g", offsets=[pb.QueueOffset(topic=TOPIC, queue_id=0, offset=1)]
        )
        refusals = []
        with pytest.raises(grpc.RpcError) as fetch:
            stub.FetchOffsets(pb.FetchOffsetsRequest(group="g"), timeout=RPC_S)
        refusals.append(fetch.value)
        with pytest.raises(grpc.RpcError) as commit_refused:
            stub.CommitOffsets(commit, timeout=RPC_S)
        refusals.append(commit_refused.value)
        for refusal in refusals:
            assert status_of(refusal) is grpc.StatusCode.FAILED_PRECONDITION
            assert "equeue groups reset" in details_of(refusal)
        stats = admin.GetStats(pb.GetStatsRequest(), timeout=RPC_S)
        assert len(stats.damaged_metadata) == 1 and "offsets.json" in stats.damaged_metadata[0]
        cli = subprocess.run(
            [sys.executable, "-m", "equeue_spark.cli", "--broker", broker.address, "groups",
             "reset", "g", "--topic", TOPIC, "--to-earliest"],
            capture_output=True, text=True, timeout=VERIFY_S, check=False,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        stub.CommitOffsets(commit, timeout=RPC_S)
        fetched = stub.FetchOffsets(pb.FetchOffsetsRequest(group="g"), timeout=RPC_S)
        assert [(o.queue_id, o.offset) for o in fetched.offsets] == [(0, 1), (1, 0)]
    finally:
        channel.close()
    assert "CONSUMER OFFSETS LOST" in broker.log_since_start()


def test_broker_id_file_damaged_draws_a_new_id(broker: BrokerProcess) -> None:
    """broker.json (one copy: it is saved once) damaged: the broker starts with a
    new id and says why (before: "cannot start: no readable copy")."""
    broker.start()
    channel, _stub, admin = stubs(broker)
    first = admin.GetStats(pb.GetStatsRequest(), timeout=RPC_S).broker_id
    channel.close()
    assert broker.stop() == 0
    write_at(broker.data_dir / "broker.json", 3, b"X")
    broker.start()
    channel, _stub, admin = stubs(broker)
    try:
        second = admin.GetStats(pb.GetStatsRequest(), timeout=RPC_S).broker_id
    finally:
        channel.close()
    assert second and second != first
    assert "BROKER ID LOST" in broker.log_since_start()


# -- equeue-broker verify ------------------------------------------------------------


def closed_store_with_sealed_chunks(open_store: OpenStore) -> StorageConfig:
    store = open_store()
    store.create_topic(TOPIC, 1)
    append(store, 0, "a", 1500, size=100)  # 64 KiB chunks: three sealed
    store.close()
    assert len(log_chunks(store.config.data_dir)) >= 3
    return store.config


def test_verify_clean_data_dir_exits_0(open_store: OpenStore) -> None:
    config = closed_store_with_sealed_chunks(open_store)
    result = run_verify(config.data_dir)
    assert (result.returncode, result.stdout) == (0, ""), result.stderr


def test_verify_lists_damaged_record_in_sealed_chunk(open_store: OpenStore) -> None:
    config = closed_store_with_sealed_chunks(open_store)
    chunk = log_chunks(config.data_dir)[0]
    flip_byte(chunk, 128 + 200 * 3 + 60)  # somewhere inside the fourth record or so
    result = run_verify(config.data_dir)
    assert result.returncode == 1
    [line] = result.stdout.splitlines()
    assert line.startswith(f"{chunk}: byte ")
    assert "damaged record: checksum mismatch" in line


def test_verify_lists_every_damaged_record_of_a_chunk(open_store: OpenStore) -> None:
    """Two records damaged in their bodies: both are listed (their length
    prefixes still lead to the next record), and nothing else."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    sent = append(store, 0, "a", 1500, size=100)
    store.close()
    chunk = log_chunks(store.config.data_dir)[0]
    starts = [s.position for s in sent if s.position < 64 * 1024][:50]
    for at in (starts[3], starts[40]):
        flip_byte(chunk, 128 + at + 60)  # inside the record's body
    result = run_verify(store.config.data_dir)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{chunk}: byte {128 + at}: damaged record: checksum mismatch"
        for at in (starts[3], starts[40])
    ]


def test_verify_damaged_length_says_what_went_unchecked(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic(TOPIC, 1)
    sent = append(store, 0, "a", 1500, size=100)
    store.close()
    chunk = log_chunks(store.config.data_dir)[0]
    data_end = chunk.stat().st_size - 128
    write_at(chunk, 128 + sent[5].position + 1, b"\x7f")  # the length prefix's second byte
    result = run_verify(store.config.data_dir)
    assert result.returncode == 1
    [line] = result.stdout.splitlines()
    at = 128 + sent[5].position
    assert line.startswith(f"{chunk}: byte {at}: damaged record: ")
    assert line.endswith(f"({data_end - at} bytes from here unchecked)")


def test_verify_lists_damaged_index_chunk_header(open_store: OpenStore) -> None:
    config = closed_store_with_sealed_chunks(open_store)
    [first, *_] = index_files(config.data_dir, TOPIC, 0)
    flip_byte(first, 30)
    result = run_verify(config.data_dir)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{first}: byte 0: damaged chunk: chunk header checksum mismatch"
    ]


def test_verify_lists_damaged_metadata_copy(open_store: OpenStore) -> None:
    config = closed_store_with_sealed_chunks(open_store)
    path = config.data_dir / "checkpoint.json"
    data = path.read_bytes()
    assert data.endswith(b"}}")
    write_at(path, len(data) - 3, bytes([data[-3] ^ 1]))  # one bit of the position's last digit
    result = run_verify(config.data_dir)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{path}: byte -1: damaged metadata file: checksum mismatch"
    ]


def test_verify_refuses_a_data_dir_in_use(open_store: OpenStore) -> None:
    config = closed_store_with_sealed_chunks(open_store)
    open_store(config)
    result = run_verify(config.data_dir)
    assert result.returncode == 2
    assert "in use" in result.stderr
