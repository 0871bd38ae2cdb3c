"""Model-based test of the Store: random appends, reads, commits, restarts,
machine crashes and retention against a plain in-memory model.

The store runs in sync flush mode, where every acknowledged append is durable
before it returns. So whatever the sequence of operations, including simulated
machine crashes that drop every unsynced byte:

- each queue's end equals the number of messages the model acknowledged
  (nothing acknowledged is lost, nothing unacknowledged appears);
- each message at or after the queue's earliest offset reads back identical, at
  its offset and at its log position;
- the earliest offset is exactly the first offset whose record lies at or after
  the log's start position (the model knows every record's position from the
  ``AppendResult``), and it never decreases;
- committed offsets survive restarts and crashes unchanged.

Small chunks (4 KiB log chunks, the minimum; 16-entry index chunks) make a few
appends cross chunk boundaries, so rolling, sealing, split batches, index chunk
creation and deletion, and retention happen in most runs; ``fill_chunk`` lands
appends exactly on and around a chunk's end. Reads are checked against a
reference implementation of the documented read semantics (``max_messages``,
``max_bytes`` with at least one message, tag filters, ``max_filter_scan``).
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from equeue_broker.storage import (
    FlushMode,
    InvalidArgument,
    MessageBatch,
    MessageLimits,
    NotFound,
    ReadStatus,
    RetentionConfig,
    StorageConfig,
    Store,
    StoredMessage,
)
from equeue_proto.record import FRAME_OVERHEAD, encode_headers
from tests.support.faults import simulate_machine_crash

KiB = 1024
QUEUES: tuple[tuple[str, int], ...] = (("orders", 0), ("orders", 1), ("audit.log", 0))
GROUPS = ("billing", "search")
TAGS = ("", "red", "green", "tag-blue")
MAX_FILTER_SCAN = 12
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
"""A RAM-backed file system where there is one: recovery is tested with simulated
crashes, never real ones, so real fsyncs only slow the test (and its shrinking) down."""
FAR_FUTURE_MS = int(time.time() * 1000) + 10**12


def synthetic(size: int, seed: int) -> bytes:
    """Random-looking bytes of ``size`` without making Hypothesis draw each byte."""
    return random.Random(seed).randbytes(size)


payloads = st.one_of(
    st.binary(max_size=24),
    st.builds(synthetic, st.integers(0, 1400), st.integers(0, 2**32 - 1)),
)
keys = st.one_of(st.none(), st.binary(max_size=40))
header_lists = st.lists(
    st.tuples(st.sampled_from(["trace", "retry", "h"]), st.binary(max_size=16)), max_size=2
).map(tuple)
bulk_sizes = st.lists(
    st.tuples(st.integers(100, 1400), st.integers(0, 2**32 - 1)), min_size=1, max_size=20
)


@dataclasses.dataclass(frozen=True)
class Acked:
    """One acknowledged message as the model remembers it."""

    key: bytes | None
    value: bytes
    tag: str
    headers: tuple[tuple[str, bytes], ...]
    producer_ms: int | None
    position: int

    def frame_size(self, topic: str) -> int:
        headers = len(encode_headers(self.headers)) if self.headers else 0
        key = len(self.key) if self.key is not None else 0
        return (
            FRAME_OVERHEAD
            + len(topic.encode())
            + len(self.tag.encode())
            + key
            + headers
            + len(self.value)
        )


@st.composite
def batches(
    draw: st.DrawFn,
) -> list[tuple[bytes | None, bytes, str, tuple[tuple[str, bytes], ...]]]:
    count = draw(st.integers(1, 20))
    return [
        (
            draw(keys),
            draw(payloads),
            draw(st.sampled_from(TAGS)),
            draw(header_lists),
        )
        for _ in range(count)
    ]


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="equeue-stateful-", dir=SCRATCH))
        self.store: Store | None = None
        self.config: StorageConfig | None = None
        self.acked: dict[tuple[str, int], list[Acked]] = {q: [] for q in QUEUES}
        self.earliest: dict[tuple[str, int], int] = dict.fromkeys(QUEUES, 0)
        self.committed: dict[str, dict[str, dict[int, int]]] = {}

    # -- set-up and tear-down ---------------------------------------------------------

    @initialize(
        max_chunks=st.sampled_from([0, 1, 2, None]),
        max_age_ms=st.sampled_from([None, None, 60_000]),
        keep_unconsumed=st.booleans(),
        prefill=st.lists(st.tuples(st.sampled_from(QUEUES), bulk_sizes), max_size=6),
    )
    def open_store(
        self,
        max_chunks: int | None,
        max_age_ms: int | None,
        keep_unconsumed: bool,
        prefill: list[tuple[tuple[str, int], list[tuple[int, int]]]],
    ) -> None:
        """Open a store with random retention rules, and give it a few chunks of data."""
        self.config = StorageConfig(
            data_dir=self.root / "data",
            chunk_capacity_bytes=4 * KiB,
            index_entries_per_chunk=16,
            flush_mode=FlushMode.SYNC,
            max_mapped_chunks=2,
            max_filter_scan=MAX_FILTER_SCAN,
            limits=MessageLimits(max_message_bytes=2 * KiB, max_key_bytes=64, max_tag_bytes=16),
            retention=RetentionConfig(
                max_chunks=max_chunks, max_age_ms=max_age_ms, keep_unconsumed=keep_unconsumed
            ),
        )
        self.store = Store(self.config, background=False)
        self.store.create_topic("orders", 2)
        self.store.create_topic("audit.log", 1)
        for queue, sizes in prefill:
            self.append_bulk(queue, sizes)

    def teardown(self) -> None:
        try:
            if self.store is not None:
                self.store.close()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    @property
    def s(self) -> Store:
        assert self.store is not None
        return self.store

    @property
    def cfg(self) -> StorageConfig:
        assert self.config is not None
        return self.config

    def end(self, queue: tuple[str, int]) -> int:
        return len(self.acked[queue])

    # -- rules ------------------------------------------------------------------------

    @rule(
        queue=st.sampled_from(QUEUES),
        messages=batches(),
        columns=st.frozensets(st.sampled_from(["keys", "tags", "headers", "timestamps"])),
    )
    def append(
        self,
        queue: tuple[str, int],
        messages: list[tuple[bytes | None, bytes, str, tuple[tuple[str, bytes], ...]]],
        columns: frozenset[str],
    ) -> None:
        """A batch with a random subset of the optional columns."""
        stamps = [1_000_000 + 7 * i for i in range(len(messages))]
        batch = MessageBatch(
            values=[m[1] for m in messages],
            keys=[m[0] for m in messages] if "keys" in columns else None,
            tags=[m[2] for m in messages] if "tags" in columns else None,
            headers=[m[3] for m in messages] if "headers" in columns else None,
            timestamps_ms=stamps if "timestamps" in columns else None,
        )
        expected = [
            Acked(
                key=key if "keys" in columns else None,
                value=value,
                tag=tag if "tags" in columns else "",
                headers=headers if "headers" in columns else (),
                producer_ms=stamps[i] if "timestamps" in columns else None,
                position=-1,
            )
            for i, (key, value, tag, headers) in enumerate(messages)
        ]
        self.do_append(queue, batch, expected)

    @rule(
        queue=st.sampled_from(QUEUES),
        sizes=bulk_sizes,
    )
    def append_bulk(self, queue: tuple[str, int], sizes: list[tuple[int, int]]) -> None:
        """Values only, large enough to fill chunks quickly (and split across them)."""
        values = [synthetic(size, seed) for size, seed in sizes]
        expected = [Acked(None, value, "", (), None, -1) for value in values]
        self.do_append(queue, MessageBatch(values), expected)

    @rule(
        queue=st.sampled_from(QUEUES),
        slack=st.sampled_from([0, 1, 8, 127, 128, 129, 256]),
        seed=st.integers(0, 2**32 - 1),
    )
    def fill_chunk(self, queue: tuple[str, int], slack: int, seed: int) -> None:
        """One batch that leaves exactly ``slack`` bytes free in the active log chunk
        (chunk boundaries are where off-by-one errors live)."""
        capacity = self.cfg.chunk_capacity_bytes
        room = capacity - self.s.stats()["log_write_position"] % capacity
        fixed = FRAME_OVERHEAD + len(queue[0].encode())
        largest = self.cfg.limits.max_message_bytes
        target = room - slack
        if target < fixed:
            return
        frames: list[int] = []
        while target > largest:
            piece = min(largest, target - fixed)  # leave room for at least one more frame
            frames.append(piece)
            target -= piece
        frames.append(target)
        values = [synthetic(frame - fixed, seed + i) for i, frame in enumerate(frames)]
        expected = [Acked(None, value, "", (), None, -1) for value in values]
        self.do_append(queue, MessageBatch(values), expected)
        used = self.s.stats()["log_write_position"] % capacity
        assert (capacity - used) % capacity == slack, "the batch should leave exactly slack"

    def do_append(self, queue: tuple[str, int], batch: MessageBatch, expected: list[Acked]) -> None:
        topic, queue_id = queue
        result = self.s.append(topic, queue_id, batch)
        assert (result.topic, result.queue_id) == queue
        assert result.first_offset == self.end(queue)
        assert result.count == len(expected)
        positions = result.positions()
        assert len(positions) == len(expected)
        assert positions == sorted(set(positions)), "positions must be distinct and increasing"
        previous = self.acked[queue][-1].position if self.acked[queue] else -1
        assert positions[0] > previous
        self.acked[queue] += [
            dataclasses.replace(m, position=p) for m, p in zip(expected, positions, strict=True)
        ]
        assert self.s.queue_info(topic, queue_id).end == self.end(queue)

    @rule(
        queue=st.sampled_from(QUEUES),
        data=st.data(),
        max_messages=st.integers(1, 25),
        max_bytes=st.one_of(st.integers(1, 200), st.integers(1, 12_000)),
        tag_filter=st.one_of(
            st.none(), st.frozensets(st.sampled_from(TAGS), min_size=1, max_size=2)
        ),
    )
    def read(
        self,
        *,
        queue: tuple[str, int],
        data: st.DataObject,
        max_messages: int,
        max_bytes: int,
        tag_filter: frozenset[str] | None,
    ) -> None:
        topic, queue_id = queue
        end = self.end(queue)
        earliest = self.earliest[queue]
        offset = data.draw(
            st.one_of(
                st.integers(0, end + 3),
                st.integers(max(earliest - 2, 0), min(earliest + 2, end)),
                st.integers(max(end - 2, 0), end + 1),
            ),
            label="offset",
        )
        result = self.s.read(
            topic, queue_id, offset, max_messages=max_messages, max_bytes=max_bytes, tags=tag_filter
        )
        assert (result.earliest, result.end) == (earliest, end)
        if offset < earliest:
            assert result.status is ReadStatus.OFFSET_TOO_SMALL
            assert result.messages == []
            assert result.next_offset == earliest
            return
        if offset > end:
            assert result.status is ReadStatus.OFFSET_TOO_BIG
            assert result.messages == []
            assert result.next_offset == end
            return
        assert result.status is ReadStatus.OK
        expected, next_offset = self.reference_read(
            queue, offset, max_messages=max_messages, max_bytes=max_bytes, tags=tag_filter
        )
        assert [m.queue_offset for m in result.messages] == expected
        for message in result.messages:
            self.check_message(queue, message)
        assert result.next_offset == next_offset
        if offset < end:
            assert result.next_offset > offset, "a read before the end must make progress"

    def reference_read(
        self,
        queue: tuple[str, int],
        offset: int,
        *,
        max_messages: int,
        max_bytes: int,
        tags: frozenset[str] | None,
    ) -> tuple[list[int], int]:
        """The offsets a read should return, and its next offset, per the Store docs.

        At least one message if any matches (even if larger than ``max_bytes``);
        with a tag filter at most ``max_filter_scan`` index entries are inspected.
        """
        acked = self.acked[queue]
        stop = len(acked)
        if tags is not None:
            stop = min(stop, offset + self.cfg.max_filter_scan)
        out: list[int] = []
        total = 0
        cursor = offset
        while cursor < stop:
            message = acked[cursor]
            if tags is not None and message.tag not in tags:
                cursor += 1
                continue
            size = message.frame_size(queue[0])
            if out and total + size > max_bytes:
                break
            out.append(cursor)
            total += size
            cursor += 1
            if len(out) >= max_messages:
                break
        return out, cursor

    @rule(queue=st.sampled_from(QUEUES), data=st.data())
    def read_at_position(self, queue: tuple[str, int], data: st.DataObject) -> None:
        acked = self.acked[queue]
        if not acked:
            return
        offset = data.draw(st.integers(0, len(acked) - 1), label="offset")
        position = acked[offset].position
        if offset >= self.earliest[queue]:
            message = self.s.reads.read_at_position(position)
            assert message.queue_offset == offset
            self.check_message(queue, message)
        else:
            try:
                self.s.reads.read_at_position(position)
            except NotFound:
                pass
            else:
                raise AssertionError(f"read_at_position({position}) found a deleted record")

    @rule(group=st.sampled_from(GROUPS), queue=st.sampled_from(QUEUES), data=st.data())
    def commit(self, group: str, queue: tuple[str, int], data: st.DataObject) -> None:
        topic, queue_id = queue
        end = self.end(queue)
        offset = data.draw(st.integers(0, end + 2), label="next_offset")
        if offset > end:
            try:
                self.s.commit_offset(group, topic, queue_id, offset)
            except InvalidArgument:
                return
            raise AssertionError(f"commit of {offset} past the end {end} was accepted")
        self.s.commit_offset(group, topic, queue_id, offset)
        self.committed.setdefault(group, {}).setdefault(topic, {})[queue_id] = offset

    @rule()
    def flush(self) -> None:
        self.s.flush()

    @rule()
    def close_and_reopen(self) -> None:
        self.s.close()
        self.store = None
        self.store = Store(self.cfg, background=False)
        self.check_committed()

    @rule(drop_unsynced_index=st.booleans())
    def crash_and_reopen(self, drop_unsynced_index: bool) -> None:
        simulate_machine_crash(self.s, drop_unsynced_index=drop_unsynced_index)
        self.store = None
        self.store = Store(self.cfg, background=False)
        self.check_committed()

    @rule(far_future=st.booleans())
    def apply_retention(self, far_future: bool) -> None:
        rules = self.cfg.retention
        before = dict(self.earliest)
        report = self.s.apply_retention(FAR_FUTURE_MS if far_future else None)
        event(f"retention deleted {min(report.log_chunks_deleted, 3)}+ log chunks")
        stats = self.s.stats()
        sealed = stats["log_chunks"] - 1
        if not rules.keep_unconsumed:
            if rules.max_chunks is not None:
                assert sealed <= rules.max_chunks
            if rules.max_age_ms is not None and far_future:
                assert sealed == 0
        for queue in QUEUES:
            info = self.s.queue_info(*queue)
            assert before[queue] <= info.earliest <= info.end == self.end(queue)
            if rules.keep_unconsumed:
                low = self.min_committed(queue)
                if low is not None and max(low, before[queue]) < self.end(queue):
                    # the first unconsumed message of every committing group is kept
                    assert info.earliest <= max(low, before[queue])
            self.earliest[queue] = info.earliest

    # -- checks -----------------------------------------------------------------------

    def min_committed(self, queue: tuple[str, int]) -> int | None:
        topic, queue_id = queue
        values = [
            topics[topic][queue_id]
            for topics in self.committed.values()
            if queue_id in topics.get(topic, {})
        ]
        return min(values) if values else None

    def check_message(self, queue: tuple[str, int], message: StoredMessage) -> None:
        expected = self.acked[queue][message.queue_offset]
        assert (message.topic, message.queue_id) == queue
        assert message.position == expected.position
        assert message.value == expected.value
        assert message.key == expected.key
        assert message.tag == expected.tag
        assert message.headers == expected.headers
        if expected.producer_ms is None:
            assert message.producer_timestamp_ms == message.store_timestamp_ms
        else:
            assert message.producer_timestamp_ms == expected.producer_ms

    def check_committed(self) -> None:
        for group in GROUPS:
            assert self.s.committed_offsets(group) == self.committed.get(group, {})

    @invariant()
    def queues_match_model(self) -> None:
        if self.store is None:
            return
        log_start = self.s.stats()["log_start_position"]
        for queue in QUEUES:
            topic, queue_id = queue
            acked = self.acked[queue]
            info = self.s.queue_info(topic, queue_id)
            assert info.end == len(acked), f"{queue}: end {info.end}, acknowledged {len(acked)}"
            expected_earliest = next(
                (i for i, m in enumerate(acked) if m.position >= log_start), len(acked)
            )
            assert info.earliest == expected_earliest, (
                f"{queue}: earliest {info.earliest}, first retained offset {expected_earliest}"
            )
            assert info.earliest >= self.earliest[queue], "earliest went backwards"
            self.earliest[queue] = info.earliest
            offset = info.earliest
            while offset < info.end:
                result = self.s.read(topic, queue_id, offset, max_messages=1000, max_bytes=1 << 20)
                assert result.status is ReadStatus.OK
                assert result.messages, f"{queue}: empty read at {offset} < end {info.end}"
                for i, message in enumerate(result.messages):
                    assert message.queue_offset == offset + i
                    self.check_message(queue, message)
                offset += len(result.messages)
                assert result.next_offset == offset
        self.check_committed()


StoreMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestStoreMachine = StoreMachine.TestCase


def test_chunk_sealed_with_exactly_footer_room_left_reopens() -> None:
    """The machine's first find, as a fixed sequence: a chunk whose data ends
    exactly one footer short of its capacity is sealed, then the store reopens."""
    state = StoreMachine()
    try:
        state.open_store(max_chunks=None, max_age_ms=None, keep_unconsumed=False, prefill=[])
        state.fill_chunk(("orders", 0), slack=128, seed=0)
        state.append_bulk(("orders", 0), [(200, 1)])  # does not fit: seals the chunk
        state.close_and_reopen()
        state.queues_match_model()
    finally:
        state.teardown()
