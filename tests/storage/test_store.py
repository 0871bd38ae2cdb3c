"""Behaviour of the Store API on real files: appends, reads, admin, offsets, retention."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from equeue_broker.storage import (
    AlreadyExists,
    FlushMode,
    InvalidArgument,
    InvalidName,
    LimitExceeded,
    MessageBatch,
    MessageLimits,
    NotFound,
    PreconditionFailed,
    ReadStatus,
    RetentionConfig,
    StorageConfig,
    Store,
    StoreClosed,
    StoredMessage,
)
from equeue_broker.storage.meta.atomic_file import decode_document
from equeue_proto.record import check_frame, decode_record
from tests.conftest import MakeConfig

OpenStore = Callable[..., Store]
FAR_FUTURE_MS = int(time.time() * 1000) + 10**12


def values(n: int, size: int = 100, tag: str = "v") -> list[bytes]:
    return [f"{tag}{i}:".encode().ljust(size, b".") for i in range(n)]


def read_all(store: Store, topic: str, queue_id: int, start: int = 0) -> list[bytes]:
    out: list[bytes] = []
    offset = start
    for _ in range(10_000):
        result = store.read(topic, queue_id, offset, max_messages=500)
        out += [m.value for m in result.messages]
        if result.next_offset == result.end:
            return out
        offset = result.next_offset
    raise AssertionError("read loop did not reach the end")


def test_appends_get_consecutive_offsets_across_chunks(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("orders", 2)
    written: list[bytes] = []
    for round_ in range(30):
        batch = values(50, 300, tag=f"r{round_}-")
        result = store.append("orders", 1, MessageBatch(batch))
        assert (result.first_offset, result.count) == (len(written), 50)
        written += batch
    assert store.stats()["log_chunks"] > 5  # 450 KB over 64 KiB chunks
    assert read_all(store, "orders", 1) == written
    assert store.queue_info("orders", 0).end == 0


def test_read_bounds_by_count_and_bytes_but_returns_at_least_one(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    store.append("t", 0, MessageBatch(values(20, 1000)))
    by_count = store.read("t", 0, 3, max_messages=4)
    assert [m.queue_offset for m in by_count.messages] == [3, 4, 5, 6]
    assert by_count.next_offset == 7
    by_bytes = store.read("t", 0, 0, max_bytes=2500)
    assert len(by_bytes.messages) == 2 and by_bytes.next_offset == 2
    tiny = store.read("t", 0, 5, max_bytes=1)
    assert len(tiny.messages) == 1 and tiny.next_offset == 6
    at_end = store.read("t", 0, 20)
    assert (at_end.status, at_end.messages, at_end.next_offset) == (ReadStatus.OK, [], 20)


def test_tag_filter_skips_records_and_always_advances(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    tags = ["red", "blue", "", "red", "green"] * 10
    store.append("t", 0, MessageBatch(values(50), tags=tags))
    red = store.read("t", 0, 0, max_messages=100, tags=["red"])
    assert [m.queue_offset for m in red.messages] == [i for i, t in enumerate(tags) if t == "red"]
    assert {m.tag for m in red.messages} == {"red"}
    assert red.next_offset == 50
    either = store.read("t", 0, 0, max_messages=3, tags=["blue", "green"])
    assert [m.queue_offset for m in either.messages] == [1, 4, 6]
    assert either.next_offset == 7
    none = store.read("t", 0, 0, tags=["purple"])
    assert none.messages == [] and none.next_offset == 50  # a filtering consumer never stalls
    with pytest.raises(InvalidArgument, match="at least one tag"):
        store.read("t", 0, 0, tags=[])


def test_out_of_range_offsets_get_typed_answers(make_config: MakeConfig) -> None:
    config = make_config(retention=RetentionConfig(max_chunks=1, max_age_ms=None))
    store = Store(config, background=False)
    try:
        store.create_topic("t", 1)
        for _ in range(20):
            store.append("t", 0, MessageBatch(values(40, 500)))
        store.apply_retention()
        info = store.queue_info("t", 0)
        assert 0 < info.earliest < info.end == 800
        low = store.read("t", 0, 0)
        assert (low.status, low.next_offset, low.messages) == (
            ReadStatus.OFFSET_TOO_SMALL,
            info.earliest,
            [],
        )
        high = store.read("t", 0, 801)
        assert (high.status, high.next_offset) == (ReadStatus.OFFSET_TOO_BIG, 800)
        first = store.read("t", 0, info.earliest, max_messages=1).messages[0]
        assert first.queue_offset == info.earliest
    finally:
        store.close()


def test_batch_larger_than_a_chunk_is_split_and_readable(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    batch = values(400, 1000)  # ~420 KB into 64 KiB chunks
    result = store.append("t", 0, MessageBatch(batch))
    assert result.count == 400
    positions = result.positions()
    assert positions == sorted(positions) and len({p // (64 * 1024) for p in positions}) > 5
    assert read_all(store, "t", 0) == batch
    assert store.reads.read_at_position(positions[123]).value == batch[123]


@pytest.mark.parametrize(
    ("batch", "error", "match"),
    [
        (MessageBatch([]), InvalidArgument, "at least one message"),
        (MessageBatch([b"x" * 17_000]), LimitExceeded, "max_message_bytes=16384"),
        (MessageBatch([b"x"], keys=[b"k" * 1025]), LimitExceeded, "max_key_bytes=1024"),
        (MessageBatch([b"x"], tags=["t" * 256]), LimitExceeded, "max_tag_bytes=255"),
        (MessageBatch([b"x", b"y"], keys=[b"k"]), InvalidArgument, "keys has 1 items"),
        (MessageBatch(["text"]), InvalidArgument, "value 0 must be bytes-like, got str"),  # type: ignore[list-item]
        (MessageBatch([b"x"] * 100_001), LimitExceeded, "max_batch_messages"),
        (MessageBatch([b"x"], headers=[[("h", "s")]]), InvalidArgument, "header 'h'"),  # type: ignore[list-item]
    ],
)
def test_bad_batches_are_rejected_before_writing(
    open_store: OpenStore, batch: MessageBatch, error: type[Exception], match: str
) -> None:
    store = open_store()
    store.create_topic("t", 1)
    before = store.stats()["log_write_position"]
    with pytest.raises(error, match=match):
        store.append("t", 0, batch)
    assert store.stats()["log_write_position"] == before
    assert store.queue_info("t", 0).end == 0


def test_message_size_limit_is_checked_per_message(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    # Largest value and largest key are in different messages: each fits alone.
    batch = MessageBatch([b"v" * 15_000, b"v"], keys=[b"", b"k" * 1000])
    assert store.append("t", 0, batch).count == 2


@pytest.mark.parametrize(
    "name", ["../escape", "a/b", "", ".hidden", "x" * 129, "a b", "caf\u00e9", "..", "-x"]
)
def test_topic_names_cannot_escape_the_data_dir(
    open_store: OpenStore, tmp_path: Path, name: str
) -> None:
    store = open_store()
    with pytest.raises(InvalidName):
        store.create_topic(name)
    with pytest.raises(InvalidName):
        store.append(name, 0, MessageBatch([b"x"]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    index_root = tmp_path / "data" / "index"
    assert not index_root.exists() or list(index_root.iterdir()) == []


def test_topic_admin_and_metadata_persist(make_config: MakeConfig) -> None:
    config = make_config()
    store = Store(config, background=False)
    store.create_topic("a", 2)
    with pytest.raises(AlreadyExists, match="'a'"):
        store.create_topic("a")
    with pytest.raises(LimitExceeded, match="queue count 0"):
        store.create_topic("b", 0)
    with pytest.raises(NotFound, match="topic 'nope'"):
        store.append("nope", 0, MessageBatch([b"x"]))
    with pytest.raises(NotFound, match="no queue 5"):
        store.append("a", 5, MessageBatch([b"x"]))
    assert [q.queue_id for q in store.topic_admin.add_queues("a", 2).queues] == [0, 1, 2, 3]
    store.topic_admin.set_queue_visibility("a", 3, producer=False)
    with pytest.raises(PreconditionFailed, match="hidden from producers"):
        store.append("a", 3, MessageBatch([b"x"]))
    store.close()
    store = Store(config, background=False)
    try:
        meta = store.topic_admin.describe("a")
        assert [(q.queue_id, q.producer_visible, q.consumer_visible) for q in meta.queues] == [
            (0, True, True),
            (1, True, True),
            (2, True, True),
            (3, False, True),
        ]
    finally:
        store.close()


def test_delete_queue_requires_hidden_and_consumed(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 2)
    store.append("t", 1, MessageBatch(values(5)))
    store.commit_offset("g", "t", 1, 2)
    with pytest.raises(PreconditionFailed, match="hidden"):
        store.topic_admin.delete_queue("t", 1)
    store.topic_admin.set_queue_visibility("t", 1, producer=False, consumer=False)
    with pytest.raises(PreconditionFailed, match="3 unconsumed"):
        store.topic_admin.delete_queue("t", 1)
    store.commit_offset("g", "t", 1, 5)
    store.topic_admin.delete_queue("t", 1)
    assert [q.queue_id for q in store.topic_admin.describe("t").queues] == [0]
    assert store.committed_offsets("g") == {"t": {}}


def test_deleted_topic_records_never_come_back(make_config: MakeConfig) -> None:
    config = make_config(flush_mode=FlushMode.ASYNC)
    store = Store(config, background=False)
    store.create_topic("t", 1)
    store.append("t", 0, MessageBatch(values(10, tag="old")))
    store.topic_admin.delete_topic("t")
    store.create_topic("t", 1)
    store.append("t", 0, MessageBatch(values(3, tag="new")))
    store.close()
    store = Store(config, background=False)
    try:
        assert read_all(store, "t", 0) == values(3, tag="new")
        assert store.recovery.index_entries_rebuilt == 0
    finally:
        store.close()


def test_topic_incarnation_survives_restart_and_changes_on_recreate(
    make_config: MakeConfig,
) -> None:
    config = make_config()
    store = Store(config, background=False)
    first = store.create_topic("t", 1).incarnation
    assert 0 < first < 2**63
    assert store.topic_admin.add_queues("t", 1).incarnation == first  # later changes keep it
    store.close()
    store = Store(config, background=False)
    assert store.topic_admin.describe("t").incarnation == first
    store.topic_admin.delete_topic("t")
    second = store.create_topic("t", 1).incarnation
    assert second != first
    store.close()
    store = Store(config, background=False)
    try:
        assert store.topic_admin.describe("t").incarnation == second
    finally:
        store.close()


def test_topics_saved_without_incarnations_get_one_at_load_for_good(
    make_config: MakeConfig,
) -> None:
    """A data directory from a broker without incarnations: each topic is given
    one at open, saved at once, so the next open finds the same."""
    config = make_config()
    store = Store(config, background=False)
    store.create_topic("old", 2)
    store.close()
    topics_file = config.data_dir / "topics.json"
    document, _ = decode_document(topics_file.read_bytes())
    del document["topics"]["old"]["incarnation"]
    topics_file.write_text(json.dumps(document))  # a file of the format before checksums
    (config.data_dir / "topics.json.bak").unlink(missing_ok=True)

    store = Store(config, background=False)
    assigned = store.topic_admin.describe("old").incarnation
    store.close()
    assert assigned > 0
    assert decode_document(topics_file.read_bytes()) == (
        {"topics": {"old": {**document["topics"]["old"], "incarnation": assigned}}},
        True,
    )
    store = Store(config, background=False)
    try:
        assert store.topic_admin.describe("old").incarnation == assigned
        assert [q.queue_id for q in store.topic_admin.describe("old").queues] == [0, 1]
    finally:
        store.close()


def test_committed_offsets_persist_and_are_validated(make_config: MakeConfig) -> None:
    config = make_config()
    store = Store(config, background=False)
    store.create_topic("t", 2)
    store.append("t", 0, MessageBatch(values(10)))
    store.commit_offset("g1", "t", 0, 7)
    store.commit_offset("g2", "t", 0, 10)
    with pytest.raises(InvalidArgument, match="offset 11 for t/0 outside"):
        store.commit_offset("g1", "t", 0, 11)
    with pytest.raises(InvalidArgument, match="offset -1"):
        store.commit_offset("g1", "t", 0, -1)
    with pytest.raises(InvalidName, match="group name"):
        store.commit_offset("bad group", "t", 0, 1)
    store.close()
    store = Store(config, background=False)
    try:
        assert store.committed_offsets("g1") == {"t": {0: 7}}
        assert store.groups() == ["g1", "g2"]
        store.delete_group("g2")
        with pytest.raises(NotFound, match="'g2'"):
            store.delete_group("g2")
        assert store.groups() == ["g1"]
    finally:
        store.close()


def test_retention_by_count_deletes_old_chunks_and_their_index(make_config: MakeConfig) -> None:
    config = make_config(retention=RetentionConfig(max_chunks=2, max_age_ms=None))
    store = Store(config, background=False)
    try:
        store.create_topic("t", 1)
        for _ in range(30):
            store.append("t", 0, MessageBatch(values(20, 1000)))
        index_dir = config.data_dir / "index" / "t" / "0"
        before = len(list(index_dir.glob("*.idx")))
        report = store.apply_retention()
        assert report.log_chunks_deleted > 0
        assert store.stats()["log_chunks"] == 3  # two sealed + the active one
        assert report.index_chunks_deleted > 0
        assert len(list(index_dir.glob("*.idx"))) == before - report.index_chunks_deleted
        earliest = store.queue_info("t", 0).earliest
        tail = read_all(store, "t", 0, earliest)
        assert tail == (values(20, 1000) * 30)[earliest:]
    finally:
        store.close()


def test_retention_by_age_only_deletes_old_sealed_chunks(make_config: MakeConfig) -> None:
    config = make_config(retention=RetentionConfig(max_chunks=None, max_age_ms=60_000))
    store = Store(config, background=False)
    try:
        store.create_topic("t", 1)
        for _ in range(10):
            store.append("t", 0, MessageBatch(values(20, 1000)))
        chunks = store.stats()["log_chunks"]
        assert store.apply_retention().log_chunks_deleted == 0  # all sealed just now
        report = store.apply_retention(now_ms=FAR_FUTURE_MS)
        assert report.log_chunks_deleted == chunks - 1  # never the active chunk
        assert store.queue_info("t", 0).earliest > 0
    finally:
        store.close()


def test_retention_keeps_chunks_a_group_still_needs(make_config: MakeConfig) -> None:
    config = make_config(
        retention=RetentionConfig(max_chunks=0, max_age_ms=None, keep_unconsumed=True)
    )
    store = Store(config, background=False)
    try:
        store.create_topic("t", 1)
        for _ in range(10):
            store.append("t", 0, MessageBatch(values(20, 1000)))
        store.commit_offset("slow", "t", 0, 50)
        store.apply_retention()
        assert store.queue_info("t", 0).earliest <= 50
        assert (
            store.read("t", 0, 50, max_messages=1).messages[0].value == (values(20, 1000) * 10)[50]
        )
        store.commit_offset("slow", "t", 0, 200)
        store.apply_retention()
        assert store.stats()["log_chunks"] == 1
    finally:
        store.close()


def test_offset_for_timestamp_uses_store_time(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    store.append("t", 0, MessageBatch(values(5)))
    first = store.read("t", 0, 0).messages[0].store_timestamp_ms
    assert store.reads.offset_for_timestamp("t", 0, 0) == 0
    assert store.reads.offset_for_timestamp("t", 0, first + 10**9) == 5
    assert store.reads.offset_for_timestamp("t", 0, first) == 0


def test_offset_for_bytes_follows_record_sizes(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    store.append("t", 0, MessageBatch([b"x" * n for n in (10, 200, 30, 40)]))
    sizes = [len(store.reads.record_at(store.reads.position_of("t", 0, i))) for i in range(4)]
    assert store.reads.offset_for_bytes("t", 0, 0, 4, sizes[0]) == (1, sizes[0])
    # A budget smaller than one record still moves one record.
    assert store.reads.offset_for_bytes("t", 0, 1, 4, 1) == (2, sizes[1])
    assert store.reads.offset_for_bytes("t", 0, 0, 4, sum(sizes[:3]) + 5) == (3, sum(sizes[:3]))
    assert store.reads.offset_for_bytes("t", 0, 0, 99, 10**9) == (4, sum(sizes))
    assert store.reads.offset_for_bytes("t", 0, 4, 4, 10) == (4, 0)
    assert store.reads.offset_for_bytes("t", 0, 2, 1, 10**9) == (2, 0)
    with pytest.raises(InvalidArgument, match="start offset 5"):
        store.reads.offset_for_bytes("t", 0, 5, 9, 10)
    with pytest.raises(InvalidArgument, match="max_bytes"):
        store.reads.offset_for_bytes("t", 0, 0, 9, 0)


def test_offset_for_bytes_spans_index_chunks(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    store = open_store(make_config(index_entries_per_chunk=16))
    store.create_topic("t", 1)
    store.append("t", 0, MessageBatch(values(100)))
    size = len(store.reads.record_at(store.reads.position_of("t", 0, 0)))
    assert store.reads.offset_for_bytes("t", 0, 3, 100, size * 40) == (43, size * 40)
    assert store.reads.offset_for_bytes("t", 0, 3, 100, size * 40 + size - 1) == (43, size * 40)


def test_message_by_position(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 2)
    result = store.append("t", 1, MessageBatch(values(5), keys=[b"k"] * 5))
    message = store.reads.read_at_position(result.positions()[3])
    assert (message.topic, message.queue_id, message.queue_offset, message.key) == ("t", 1, 3, b"k")
    with pytest.raises(NotFound, match="position 999999999"):
        store.reads.read_at_position(999_999_999)


def test_open_scans_only_the_last_chunk(make_config: MakeConfig) -> None:
    config = make_config()
    store = Store(config, background=False)
    store.create_topic("t", 1)
    for _ in range(40):
        store.append("t", 0, MessageBatch(values(20, 1000)))
    chunks = store.stats()["log_chunks"]
    store.close()
    store = Store(config, background=False)
    try:
        assert chunks > 10
        # 800 records in all, none scanned on open: the checkpoint of a clean
        # close vouches for every one (the tail scan starts there).
        assert store.recovery.tail_records_scanned == 0
        assert store.recovery.index_entries_rebuilt == 0
    finally:
        store.close()


def test_closed_store_refuses_operations(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    store.close()
    with pytest.raises(StoreClosed):
        store.append("t", 0, MessageBatch([b"x"]))
    with pytest.raises(StoreClosed):
        store.read("t", 0, 0)


def test_bad_read_arguments_name_the_value(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    with pytest.raises(InvalidArgument, match="got -3"):
        store.read("t", 0, -3)
    with pytest.raises(InvalidArgument, match="max_messages 0"):
        store.read("t", 0, 0, max_messages=0)
    with pytest.raises(InvalidArgument, match="max_bytes 999999999999"):
        store.read("t", 0, 0, max_bytes=999_999_999_999)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"chunk_capacity_bytes": 100}, "chunk_capacity_bytes"),
        ({"flush_mode": "sometimes"}, "flush_mode must be 'sync' or 'async'"),
        ({"flush_interval_ms": 0}, "flush_interval_ms"),
        ({"max_queues_per_topic": 5000}, "max_queues_per_topic"),
        ({"limits": MessageLimits(max_message_bytes=1 << 20)}, "records never span chunks"),
    ],
)
def test_config_errors_name_the_field(
    tmp_path: Path, overrides: dict[str, object], match: str
) -> None:
    settings: dict[str, object] = {"data_dir": tmp_path, "chunk_capacity_bytes": 64 * 1024}
    settings["limits"] = MessageLimits(max_message_bytes=1024)
    settings.update(overrides)
    with pytest.raises(InvalidArgument, match=match):
        StorageConfig(**settings)  # type: ignore[arg-type]


def decode_all(records: bytes) -> list[StoredMessage]:
    out = []
    pos = 0
    while pos < len(records):
        size = check_frame(records, pos, len(records))
        assert isinstance(size, int), size
        out.append(decode_record(records, pos))
        pos += size
    return out


@pytest.mark.parametrize("tags", [None, ["b"], ["a", "c"]])
def test_read_records_equals_read(open_store: OpenStore, tags: list[str] | None) -> None:
    store = open_store()
    store.create_topic("t", 2)
    for round_ in range(40):  # interleaved queues: runs break between appends
        for queue_id in (0, 1):
            n = 7 + round_ % 5
            store.append(
                "t", queue_id, MessageBatch(values(n, 300, f"q{queue_id}r{round_}-"),
                                            tags=["a", "b", "c"] * (n // 3) + ["a"] * (n % 3)),
            )  # fmt: skip
    for offset, max_messages, max_bytes in [(0, 1000, 1 << 20), (13, 50, 4000), (200, 3, 1)]:
        raw = store.reads.read_records("t", 1, offset, max_messages=max_messages,
                                 max_bytes=max_bytes, tags=tags)  # fmt: skip
        decoded = store.read("t", 1, offset, max_messages=max_messages,
                             max_bytes=max_bytes, tags=tags)  # fmt: skip
        assert raw.count == len(decoded.messages) > 0
        assert decode_all(raw.records) == decoded.messages
        assert (raw.next_offset, raw.end) == (decoded.next_offset, decoded.end)
    low = store.reads.read_records("t", 0, 10**6)
    assert (low.status, low.next_offset, low.records) == (ReadStatus.OFFSET_TOO_BIG, low.end, b"")
