"""Round-trip tests for every on-disk structure, each against its one encoder."""

from __future__ import annotations

import functools
import itertools
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equeue_broker.storage import CorruptionError, MessageBatch, MessageLimits
from equeue_broker.storage.index.index_repair import entry_for
from equeue_broker.storage.index.queue_index import (
    ENTRY,
    ENTRY_SIZE,
    RUNS_DAMAGED,
    RUNS_DONE,
    RUNS_EMPTY,
    RUNS_LIMIT,
    entry_damaged,
    index_runs_py,
    index_segments_py,
    pack_entry,
)
from equeue_broker.storage.log import record
from equeue_broker.storage.log.chunk import (
    CHUNK_TYPE_INDEX,
    CHUNK_TYPE_LOG,
    FOOTER_SIZE,
    HEADER_SIZE,
    ChunkFooter,
    ChunkHeader,
)
from equeue_broker.storage.log.record import prepare_batch
from equeue_broker.storage.meta.atomic_file import decode_document, load_json, save_json
from equeue_proto import accel
from equeue_proto.record import (
    FLAG_BATCH_END,
    FLAG_HAS_KEY,
    FLAG_TXN,
    RecordError,
    check_frame,
    check_frames_py,
    decode_headers,
    decode_record,
    encode_headers,
    read_meta,
)
from tests.support.records import batch_of, encode_prepared, encode_rows

LIMITS = MessageLimits()


def test_chunk_header_round_trip() -> None:
    header = ChunkHeader(CHUNK_TYPE_INDEX, 42, 32_000, 1_700_000_000_000, 32)
    data = header.encode()
    assert len(data) == HEADER_SIZE
    assert ChunkHeader.decode(data) == header


def test_chunk_header_checksum_detects_flip() -> None:
    data = bytearray(ChunkHeader(CHUNK_TYPE_LOG, 1, 4096, 5).encode())
    data[20] ^= 1
    with pytest.raises(CorruptionError, match="checksum"):
        ChunkHeader.decode(bytes(data), "x.chunk")


def test_chunk_footer_round_trip() -> None:
    footer = ChunkFooter(123_456, 1_700_000_000_123)
    data = footer.encode()
    assert len(data) == FOOTER_SIZE
    assert ChunkFooter.decode(data) == footer
    with pytest.raises(CorruptionError, match="magic"):
        ChunkFooter.decode(bytes(FOOTER_SIZE), "x.chunk", 99)


def test_index_entry_round_trip() -> None:
    entry = (2**40 + 1, 1234, 0xDEADBEEF, 1_700_000_000_000)
    data = ENTRY.pack(*entry)
    assert len(data) == ENTRY_SIZE == 32
    assert ENTRY.unpack(data) == entry
    checked = pack_entry(*entry)
    assert ENTRY.unpack(checked) == entry and checked[28:] == b"\x01\x00\x00\x00"
    assert not entry_damaged(checked) and not entry_damaged(data)  # older entries: accepted
    for byte in range(ENTRY_SIZE):  # any flipped byte of a checked entry is caught
        flipped = bytearray(checked)
        flipped[byte] ^= 0xFF
        assert entry_damaged(flipped), byte
    assert entry_damaged(data[:24] + b"\x00\x00\x00\x00\x02\x00\x00\x00")  # unknown format


@given(st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=50)), max_size=10))
def test_headers_round_trip(headers: list[tuple[str, bytes]]) -> None:
    assert decode_headers(encode_headers(headers)) == tuple(headers)


messages = st.lists(
    st.tuples(
        st.binary(max_size=300),
        st.one_of(st.none(), st.binary(max_size=40)),
        st.text(max_size=10),
        st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=16)), max_size=3),
        st.integers(min_value=0, max_value=2**62),
    ),
    min_size=1,
    max_size=20,
)


@given(messages, st.integers(min_value=0, max_value=2**40))
def test_records_round_trip(
    rows: list[tuple[bytes, bytes | None, str, list[tuple[str, bytes]], int]], position: int
) -> None:
    out, entries = encode_rows(rows, queue_id=7, position=position, first_offset=100)
    assert len(out) == prepare_batch(batch_of(rows), b"topic-1", LIMITS).total_bytes
    pos = 0
    for i, (value, key, tag, headers, produced) in enumerate(rows):
        size = check_frame(out, pos, len(out))
        assert isinstance(size, int)
        message = decode_record(out, pos)
        assert (message.value, message.key, message.tag) == (value, key, tag)
        assert message.headers == tuple(headers)
        assert (message.topic, message.queue_id, message.queue_offset) == ("topic-1", 7, 100 + i)
        assert (message.position, message.producer_timestamp_ms) == (position + pos, produced)
        assert message.store_timestamp_ms == 555
        meta = read_meta(out, pos)
        assert bool(meta.flags & FLAG_BATCH_END) == (i == len(rows) - 1)
        assert bool(meta.flags & FLAG_HAS_KEY) == (key is not None)
        entry = ENTRY.unpack_from(entries, i * ENTRY_SIZE)
        assert entry[0] - 1 == position + pos and entry[1] == size and entry[3] == 555
        assert bytes(entries[i * ENTRY_SIZE : (i + 1) * ENTRY_SIZE]) == pack_entry(*entry)
        assert (entry[2] == 0) == (tag == "")
        pos += size


def test_frame_checks_name_each_failure() -> None:
    out, _ = encode_rows([(b"hello", None, "", [], 0)], topic="t")
    assert check_frame(out, 0, len(out)) == len(out)
    assert check_frame(bytes(len(out)), 0, len(out)) == "zero length (end of written data)"
    assert check_frame(out, 0, len(out) - 1) == f"bad length {len(out) - 12}"
    flipped = bytearray(out)
    flipped[-14] ^= 0x40  # a value byte
    assert check_frame(flipped, 0, len(out)) == "checksum mismatch"
    suffix = bytearray(out)
    suffix[-1] ^= 1
    assert "does not match prefix" in str(check_frame(suffix, 0, len(out)))
    with pytest.raises(RecordError, match="at byte 0: checksum mismatch"):
        decode_record(flipped, 0)


def test_atomic_json_round_trip_and_backup(tmp_path: Path) -> None:
    path = tmp_path / "meta.json"
    assert load_json(path) is None
    save_json(path, {"v": 1})
    save_json(path, {"v": 2})
    assert load_json(path) == {"v": 2}
    assert decode_document((tmp_path / "meta.json.bak").read_bytes()) == ({"v": 1}, True)
    path.write_bytes(b"{not json")
    assert load_json(path) == {"v": 1}
    path.unlink()
    assert load_json(path) == {"v": 1}


@given(messages, st.integers(min_value=0, max_value=2**40), st.data())
def test_c_encoder_matches_python_reference(
    rows: list[tuple[bytes, bytes | None, str, list[tuple[str, bytes]], int]],
    position: int,
    data: st.DataObject,
) -> None:
    if accel.IMPLEMENTATION != "c":
        pytest.skip("C accelerator not built (EQUEUE_PURE_PYTHON set)")
    start = data.draw(st.integers(min_value=0, max_value=len(rows) - 1))
    batch = MessageBatch(
        values=[r[0] for r in rows],
        keys=[r[1] for r in rows],
        tags=[r[2] for r in rows] if data.draw(st.booleans()) else None,
        headers=[r[3] for r in rows] if data.draw(st.booleans()) else None,
        timestamps_ms=[r[4] for r in rows] if data.draw(st.booleans()) else None,
    )
    prepared = prepare_batch(batch, b"topic", LIMITS)
    outputs = [
        encode_prepared(
            prepared,
            topic=b"topic",
            queue_id=3,
            position=position,
            first_offset=9,
            store_ms=77,
            start=start,
            encoder=encode,
        )
        for encode in (record.encode_records, record.encode_records_py)
    ]
    assert outputs[0] == outputs[1]


def test_c_accelerator_is_built() -> None:
    """CI must exercise the C encoder; EQUEUE_PURE_PYTHON=1 runs the reference."""
    expected = "python" if os.environ.get("EQUEUE_PURE_PYTHON") else "c"
    assert expected == accel.IMPLEMENTATION


@given(messages, st.integers(min_value=0, max_value=2**40))
def test_c_frame_decoder_matches_python_reference(
    rows: list[tuple[bytes, bytes | None, str, list[tuple[str, bytes]], int]], position: int
) -> None:
    if accel.IMPLEMENTATION != "c":
        pytest.skip("C accelerator not built (EQUEUE_PURE_PYTHON set)")
    from equeue_proto._codec import decode_frames

    batch = MessageBatch(
        values=[r[0] for r in rows],
        keys=[r[1] for r in rows],
        tags=[r[2] for r in rows],
        headers=[r[3] for r in rows],
        timestamps_ms=[r[4] for r in rows],
    )
    prepared = prepare_batch(batch, b"topic", LIMITS)
    out = bytearray(prepared.total_bytes)
    record.encode_records_py(
        out, position=position, topic=b"topic", queue_id=5, first_offset=3, store_ms=9,
        prepared=prepared, start=0, stop=len(rows), index_out=bytearray(len(rows) * ENTRY_SIZE),
    )  # fmt: skip
    frames = decode_frames(bytes(out), Row, "b1")
    pos = 0
    for frame in frames:
        m = decode_record(out, pos)
        assert type(frame) is Row
        assert frame == (
            m.topic, m.queue_id, m.queue_offset, m.key, m.value, m.tag, m.headers,
            m.producer_timestamp_ms, m.store_timestamp_ms, m.position, "b1",
        )  # fmt: skip
        pos += int(check_frame(out, pos, len(out)))
    assert len(frames) == len(rows)
    out[len(out) // 2] ^= 0x10
    with pytest.raises(ValueError, match=r"byte \d+"):
        decode_frames(bytes(out), Row, "b1")


class Row(tuple[object, ...]):
    """A tuple subclass for decode_frames to build (the client passes its Message)."""

    __slots__ = ()


index_entries = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=3 * 4096),  # position + 1 (0: an empty entry)
        st.integers(min_value=1, max_value=700),  # record size
    ),
    max_size=40,
)


@given(
    index_entries,
    st.integers(min_value=1, max_value=50),
    st.integers(min_value=1, max_value=5000),
    st.integers(min_value=0, max_value=3),
    st.booleans(),
    st.integers(min_value=-1, max_value=45),
)
def test_c_index_runs_matches_python_reference(  # noqa: PLR0917 (hypothesis draws)
    rows: list[tuple[int, int]], max_messages: int, max_bytes: int, count: int, contiguous: bool,
    damaged: int,
) -> None:  # fmt: skip
    """The pull planner: same runs, counts and stop reason in C and Python,
    over scattered or back-to-back records crossing 4,096-byte chunks, with
    checked entries (one flipped byte in entry ``damaged``, if any)."""
    if accel.IMPLEMENTATION != "c":
        pytest.skip("C accelerator not built (EQUEUE_PURE_PYTHON set)")
    from equeue_proto._codec import index_runs

    if contiguous:  # records back to back from the first position, like one append
        start = rows[0][0] if rows else 1
        packed = []
        for _, size in rows:
            packed.append((start, size))
            start += size
        rows = packed
    entries = bytearray(b"".join(pack_entry(p, s, 0, 0) for p, s in rows))
    if 0 <= damaged < len(rows):
        entries[damaged * ENTRY_SIZE + damaged % ENTRY_SIZE] ^= 0xFF
    args = (bytes(entries), 4096, max_messages, max_bytes, count, count * 10)
    assert index_runs(*args) == index_runs_py(*args)


def test_index_runs_splits_at_gaps_chunk_starts_and_limits() -> None:
    sizes = [(1, 100), (101, 100), (301, 50), (4097, 10), (4107, 10)]  # position + 1
    entries = b"".join(ENTRY.pack(p, s, 0, 0) for p, s in sizes)
    runs, taken, count, total, stop = index_runs_py(entries, 4096, 100, 10**6, 0, 0)
    # a gap after 200, and a new chunk at 4096 even though 4096 follows nothing
    assert runs == [(0, 200, 0), (300, 350, 2), (4096, 4116, 3)]
    assert (taken, count, total, stop) == (5, 5, 270, RUNS_DONE)
    assert index_runs_py(entries, 4096, 2, 10**6, 0, 0)[1:] == (2, 2, 200, RUNS_LIMIT)
    # the byte limit stops before the record that would pass it, but a read's
    # first record is always taken
    assert index_runs_py(entries, 4096, 100, 150, 0, 0)[1:] == (1, 1, 100, RUNS_LIMIT)
    assert index_runs_py(entries, 4096, 100, 50, 0, 0)[1:] == (1, 1, 100, RUNS_LIMIT)
    hole = entries[:ENTRY_SIZE] + bytes(ENTRY_SIZE) + entries[ENTRY_SIZE:]
    assert index_runs_py(hole, 4096, 100, 10**6, 0, 0)[1:] == (1, 1, 100, RUNS_EMPTY)
    bad = bytearray(b"".join(pack_entry(p, s, 0, 0) for p, s in sizes))
    bad[2 * ENTRY_SIZE + 12] ^= 0x01  # entry 2's tag hash
    runs, *rest = index_runs_py(bad, 4096, 100, 10**6, 0, 0)
    assert (runs, rest) == ([(0, 200, 0)], [2, 2, 200, RUNS_DAMAGED])


@given(st.lists(st.binary(min_size=1, max_size=200), min_size=1, max_size=8), st.integers())
def test_check_frames_finds_the_first_damaged_record(values: list[bytes], pick: int) -> None:
    """C and Python agree: -1 over intact frames, else the first bad frame's offset."""
    out, _ = encode_rows([(v, None, "t", [], 0) for v in values], topic="t")
    starts, pos = [], 0
    while pos < len(out):
        starts.append(pos)
        pos += check_frame(out, pos, len(out))  # type: ignore[operator]
    victim = pick % len(starts)
    damaged = bytearray(out)
    damaged[starts[victim] + 60] ^= 0x10
    impls = [check_frames_py]
    if accel.CODEC is not None:
        impls.append(accel.CODEC.check_frames)
    for check_frames in impls:
        assert check_frames(out, 0, len(out)) == -1
        assert check_frames(bytes(damaged), 0, len(out)) == starts[victim]
        assert check_frames(out, 0, len(out) - 1) == starts[-1]
        # With a position, each frame must also name its own (the replica's check).
        padded = b"zz" + out
        assert check_frames(padded, 2, len(padded), 0) == -1
        assert check_frames(padded, 2, len(padded), 1) == 2
        assert check_frames(padded, 2 + starts[-1], len(padded), starts[-1]) == -1


_PIECE = st.tuples(
    st.sampled_from(["t", "topic-2"]),  # topic
    st.integers(0, 2),  # queue id
    st.integers(0, 2),  # offset jump from the queue's last record
    st.booleans(),  # a transaction's staged records
    st.lists(
        st.tuples(st.binary(max_size=40), st.sampled_from(["", "a", "tag-b"])),
        min_size=1,
        max_size=4,
    ),
)


@settings(deadline=None)  # a shared 2-core machine: a slow example is not a failure
@given(st.lists(_PIECE, min_size=1, max_size=6), st.integers(0, 1 << 40))
def test_index_segments_derive_recoverys_entries(
    pieces: list[tuple[str, int, int, bool, list[tuple[bytes, str]]]], position: int
) -> None:
    """C and Python agree, and their entries are recovery's (``entry_for``, one
    record at a time) and the producing encoder's: runs split at a queue or an
    offset gap, a transaction's record left to the caller."""
    data, expected_entries = bytearray(), bytearray()
    nexts: dict[tuple[str, int], int] = {}
    for topic, queue_id, jump, staged, rows in pieces:
        first = nexts.get((topic, queue_id), 0) + jump
        prepared = prepare_batch(
            batch_of([(v, None, g, [], 7) for v, g in rows]), topic.encode(), LIMITS
        )
        encoder = functools.partial(record.encode_records, flags=FLAG_TXN if staged else 0)
        out, entries = encode_prepared(
            prepared, topic=topic.encode(), queue_id=queue_id, position=position + len(data),
            first_offset=first, store_ms=1000 + len(data), encoder=encoder,
        )  # fmt: skip
        data += out
        if not staged:
            nexts[(topic, queue_id)] = first + len(rows)
            expected_entries += entries
    derived, pos = [], 0
    while pos < len(data):
        meta = read_meta(data, pos)
        special = meta.flags & FLAG_TXN
        derived.append((pos, special, meta.topic, meta.queue_id, meta.queue_offset))
        if not special:
            assert entry_for(position + pos, meta) == expected_entries[:ENTRY_SIZE]
            expected_entries = expected_entries[ENTRY_SIZE:]
        pos += meta.frame_size
    impls = [index_segments_py]
    if accel.CODEC is not None:
        impls.append(accel.CODEC.index_segments)
    padded = b"xx" + bytes(data) + b"yy"
    for index_segments in impls:
        segments = index_segments(padded, 2, 2 + len(data), position)
        flat: list[tuple[int, int, bytes, int, int]] = []
        for at, count, topic_b, queue_id, first, entries in segments:
            assert len(entries) == count * ENTRY_SIZE
            if count == 0:
                flat.append(
                    (
                        at - 2,
                        FLAG_TXN,
                        derived[len(flat)][2],
                        derived[len(flat)][3],
                        derived[len(flat)][4],
                    )
                )
            for i in range(count):
                meta_pos = derived[len(flat)][0]
                assert entries[i * ENTRY_SIZE : (i + 1) * ENTRY_SIZE] == entry_for(
                    position + meta_pos, read_meta(data, meta_pos)
                )
                flat.append((meta_pos, 0, topic_b, queue_id, first + i))
        assert flat == derived
        # Maximal runs: neighbours in two segments differ in queue or offset.
        for (_, n, t, q, f, _e), (_, m, t2, q2, f2, _e2) in itertools.pairwise(segments):
            assert not (n and m and (t, q, f + n) == (t2, q2, f2))
        assert segments == impls[0](padded, 2, 2 + len(data), position)
    with pytest.raises(ValueError, match="overruns"):
        index_segments_py(data, 0, len(data) - 1, position)
    if accel.CODEC is not None:
        with pytest.raises(ValueError, match="overruns"):
            accel.CODEC.index_segments(data, 0, len(data) - 1, position)
