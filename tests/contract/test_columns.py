"""decode_columns: the C and pure-Python column decoders against each other
(byte-identical buffers, identical errors) and against ``decode_records``, the
per-record decoder, field by field; and the buffers as a pyarrow RecordBatch."""

from __future__ import annotations

import itertools
import os
import struct
import sys
from array import array
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from equeue_broker.storage import MessageLimits
from equeue_proto.record import (
    FIXED_BODY_SIZE,
    FLAG_HAS_KEY,
    HEADER,
    RECORD_VERSION,
    encode_headers,
)
from equeue_spark.client import columns
from equeue_spark.client.columns import RecordColumns, decode_columns, decode_columns_py
from equeue_spark.client.errors import DataLossError, LimitError
from equeue_spark.client.records import Message, _decode_py, decode_records
from tests.support.records import encode_rows

LIMITS = MessageLimits()
Row = tuple[bytes, bytes | None, str, list[tuple[str, bytes]], int]
"""value, key, tag, headers, producer timestamp (ms)."""
Batch = tuple[str, int, list[Row]]
"""topic, queue id, rows."""
MS_MAX = (2**63 - 1) // 1000


def encode(batches: list[Batch], position: int = 0, first_offset: int = 100) -> bytes:
    """The records of ``batches`` as a pull reply holds them, from the real encoder."""
    out = bytearray()
    for topic, queue_id, rows in batches:
        records, _ = encode_rows(
            rows, topic=topic, queue_id=queue_id, position=position + len(out),
            first_offset=first_offset,
        )  # fmt: skip
        out += records
    return bytes(out)


def decode_both(records: Any, broker_id: str = "b1", want_headers: bool = True) -> RecordColumns:
    """Decode with both implementations; they must agree byte for byte."""
    py = decode_columns_py(records, broker_id, want_headers)
    assert len(py) == len(RecordColumns._fields) == 22
    if columns.DECODER == "c":
        c = decode_columns(records, broker_id, want_headers)
        assert type(c) is RecordColumns
        for name, a, b in zip(RecordColumns._fields, c, py, strict=True):
            assert type(a) is type(b), name
            assert a == b, name
    return py


def error_of(records: bytes, broker_id: str = "b1", want_headers: bool = True) -> Exception:
    """The error both implementations raise for ``records``: same class, same message."""
    errors = []
    decoders = [decode_columns_py] + ([decode_columns] if columns.DECODER == "c" else [])
    for decode in decoders:
        with pytest.raises((DataLossError, LimitError)) as info:
            decode(records, broker_id, want_headers)
        errors.append(info.value)
    assert len({(type(e), str(e)) for e in errors}) == 1, errors
    return errors[0]


def ints(buf: bytes, code: str) -> list[int]:
    values = array(code)
    values.frombytes(buf)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


def blobs(offsets: bytes, data: bytes, count: int) -> list[bytes]:
    ends = ints(offsets, "i")
    assert len(ends) == count + 1 and ends[0] == 0 and ends[-1] == len(data)
    assert all(a <= b for a, b in itertools.pairwise(ends))
    return [data[a:b] for a, b in itertools.pairwise(ends)]


def assert_matches(cols: RecordColumns, messages: list[Message], want_headers: bool) -> None:
    """Every column of ``cols`` against the per-record decoder's messages."""
    n = len(messages)
    assert cols.count == n
    assert [t.decode() for t in blobs(cols.topic_offsets, cols.topics, n)] == [
        m.topic for m in messages
    ]
    assert ints(cols.queue_ids, "i") == [m.queue_id for m in messages]
    assert ints(cols.offsets, "q") == [m.offset for m in messages]
    assert ints(cols.timestamps_us, "q") == [m.timestamp_ms * 1000 for m in messages]
    stores = [m.store_timestamp_ms * 1000 for m in messages]
    assert ints(cols.store_timestamps_us, "q") == stores
    keys = blobs(cols.key_offsets, cols.keys, n)
    nulls = [i for i, m in enumerate(messages) if m.key is None]
    assert cols.key_nulls == len(nulls)
    if nulls:
        assert cols.key_validity is not None and len(cols.key_validity) == (n + 7) // 8
        bits = int.from_bytes(cols.key_validity, "little")
        assert bits >> n == 0, "padding bits must be clear"
        present = [bool(bits >> i & 1) for i in range(n)]
    else:
        assert cols.key_validity is None
        present = [True] * n
    assert [k if p else None for k, p in zip(keys, present, strict=True)] == [
        m.key for m in messages
    ]
    assert all(keys[i] == b"" for i in nulls), "a null key has an empty slot"
    assert blobs(cols.value_offsets, cols.values, n) == [m.value for m in messages]
    assert [t.decode() for t in blobs(cols.tag_offsets, cols.tags, n)] == [m.tag for m in messages]
    assert [i.decode() for i in blobs(cols.id_offsets, cols.ids, n)] == [
        m.message_id for m in messages
    ]
    if not want_headers:
        assert _header_columns(cols) == (b"", b"", b"", b"", b"")
        return
    per_record = ints(cols.header_list_offsets, "i")
    total = sum(len(m.headers) for m in messages)
    assert len(per_record) == n + 1 and per_record[0] == 0 and per_record[-1] == total
    header_keys = [k.decode() for k in blobs(cols.header_key_offsets, cols.header_keys, total)]
    header_values = blobs(cols.header_value_offsets, cols.header_values, total)
    pairs = list(zip(header_keys, header_values, strict=True))
    for m, (a, b) in zip(messages, itertools.pairwise(per_record), strict=True):
        assert tuple(pairs[a:b]) == m.headers


def _header_columns(cols: RecordColumns) -> tuple[bytes, ...]:
    return (
        cols.header_list_offsets, cols.header_key_offsets, cols.header_keys,
        cols.header_value_offsets, cols.header_values,
    )  # fmt: skip


def check(records: bytes, broker_id: str = "b1") -> RecordColumns:
    """Decode ``records`` every way; all must agree. Returns the columns."""
    messages = decode_records(records, broker_id)
    assert messages == _decode_py(records, broker_id)
    for want_headers in (True, False):
        cols = decode_both(records, broker_id, want_headers)
        assert_matches(cols, messages, want_headers)
    return decode_both(records, broker_id, True)


# -- examples ------------------------------------------------------------------


def test_decoder_in_use() -> None:
    """CI must exercise the C decoder; EQUEUE_PURE_PYTHON=1 runs the reference."""
    expected = "python" if os.environ.get("EQUEUE_PURE_PYTHON") else "c"
    assert expected == columns.DECODER


def test_empty_input() -> None:
    zero = bytes(4)
    cols = decode_both(b"")
    assert cols == RecordColumns(
        0, zero, b"", b"", b"", b"", zero, b"", None, 0, zero, b"", zero, b"", zero, b"",
        zero, zero, b"", zero, b"", b"",
    )  # fmt: skip
    assert _header_columns(decode_both(b"", want_headers=False)) == (b"",) * 5
    check(b"")


def test_no_key_versus_empty_key() -> None:
    rows: list[Row] = [
        (b"v0", None, "", [], 1),
        (b"v1", b"", "", [], 2),
        (b"v2", b"key", "", [], 3),
        (b"v3", None, "", [], 4),
    ] + [(b"v", b"k%d" % i, "", [], 5) for i in range(6)]  # 10 records: a second bitmap byte
    cols = check(encode([("t", 0, rows)]))
    assert cols.key_nulls == 2
    assert cols.key_validity == bytes([0b11110110, 0b00000011])
    assert ints(cols.key_offsets, "i")[:4] == [0, 0, 0, 3]
    assert cols.keys.startswith(b"key")


def test_every_key_present_gives_no_bitmap() -> None:
    cols = check(encode([("t", 0, [(b"a", b"", "", [], 0), (b"b", b"k", "", [], 0)])]))
    assert cols.key_validity is None and cols.key_nulls == 0


def test_no_key_anywhere() -> None:
    cols = check(encode([("t", 0, [(b"a", None, "", [], 0)] * 9)]))
    assert cols.key_nulls == 9 and cols.key_validity == bytes(2)
    assert cols.keys == b""


def test_headers_zero_one_several_and_empty_values() -> None:
    rows: list[Row] = [
        (b"none", None, "", [], 0),
        (b"one", None, "", [("k", b"v")], 0),
        (b"several", None, "", [("a", b""), ("", b"x"), ("ключ", b"\x00\xff"), ("a", b"dup")], 0),
        (b"empty value", None, "", [("e", b"")], 0),
        (b"none again", None, "", [], 0),
    ]
    cols = check(encode([("t", 0, rows)]))
    assert ints(cols.header_list_offsets, "i") == [0, 0, 1, 5, 6, 6]
    assert cols.header_keys == "kaключae".encode()
    assert cols.header_values == b"vx\x00\xffdup"


def test_empty_values_tags_and_unicode() -> None:
    batches: list[Batch] = [
        ("заказы", 1, [(b"", None, "", [], 0), (b"", b"", "тег", [], -1)]),
        ("注文.log", 65535, [(b"x", b"k", "🎉", [("😀", b"")], 1_700_000_000_000)]),
        ("plain", 0, [(b"", None, "tag", [], MS_MAX), (b"y", None, "", [], -MS_MAX)]),
    ]
    cols = check(encode(batches, position=12345), broker_id="брокер-1")
    assert cols.topics == "заказызаказы注文.logplainplain".encode()
    assert cols.tags == "тег🎉tag".encode()
    assert ints(cols.queue_ids, "i") == [1, 1, 65535, 0, 0]
    assert cols.values == b"xy"


def test_message_ids_match_format_message_id() -> None:
    records = encode([("t", 0, [(b"v", None, "", [], 0)] * 3)], position=2**63 - 2**12)
    cols = check(records, broker_id="broker-7")
    ids = blobs(cols.id_offsets, cols.ids, 3)
    assert ids[0] == b"broker-7-7ffffffffffff000"
    assert [m.message_id.encode() for m in decode_records(records, "broker-7")] == ids


def test_many_records() -> None:
    rows: list[Row] = [
        (
            bytes([i % 256]) * (i % 300),
            None if i % 7 == 0 else str(i).encode(),
            f"tag{i % 5}" if i % 3 else "",
            [("h", str(i).encode())] * (i % 3),
            1_700_000_000_000 + i,
        )
        for i in range(5000)
    ]
    batches: list[Batch] = [("orders", q, rows[q * 1000 : (q + 1) * 1000]) for q in range(5)]
    cols = check(encode(batches))
    assert cols.count == 5000
    assert cols.key_nulls == len(range(0, 5000, 7))


def test_accepts_any_contiguous_buffer() -> None:
    records = encode([("t", 2, [(b"v", b"k", "x", [("h", b"1")], 5)] * 3)])
    expected = decode_both(records)
    assert decode_both(bytearray(records)) == expected
    assert decode_both(memoryview(records)) == expected
    padded = b"junk" + records + b"junk"
    assert decode_both(memoryview(padded)[4:-4]) == expected


def test_pieces_decode_as_their_concatenation() -> None:
    """A list of buffers (several replies' records) decodes like the joined
    bytes, and errors name positions in the concatenation."""
    rows: list[Row] = [(bytes([i]) * i, str(i).encode(), "t", [], i) for i in range(30)]
    parts = [encode([("t", q, rows[q * 10 : (q + 1) * 10])]) for q in range(3)]
    joined = b"".join(parts)
    expected = decode_both(joined)
    views = [memoryview(p) for p in parts]
    assert decode_columns(views, "b1", True) == expected
    assert decode_columns([], "b1", True) == decode_both(b"")
    damaged = bytearray(parts[2])
    damaged[len(damaged) // 2] ^= 0x10
    pieces_error = error_of_pieces([parts[0], parts[1], bytes(damaged)])
    assert str(pieces_error) == str(error_of(parts[0] + parts[1] + bytes(damaged)))
    at = int(str(pieces_error).split("record at byte ")[1].split(":")[0])
    assert len(parts[0]) + len(parts[1]) < at < len(joined)


def error_of_pieces(pieces: list[bytes]) -> Exception:
    with pytest.raises(DataLossError) as info:
        decode_columns(pieces, "b1", True)
    return info.value


# -- errors --------------------------------------------------------------------


def test_every_flipped_byte_is_detected() -> None:
    """Flip each byte in turn: both decoders raise the same DataLossError naming a
    byte position (a frame's start)."""
    rows: list[Row] = [(b"hello", b"k", "tag", [("h", b"v")], 1), (b"x", None, "", [], 2)]
    records = encode([("t", 0, rows)])
    first = struct.unpack_from("<I", records)[0] + 12
    for i in range(len(records)):
        damaged = bytearray(records)
        damaged[i] ^= 0x10
        error = error_of(bytes(damaged))
        assert isinstance(error, DataLossError)
        at = 0 if i < first else first
        assert str(error).startswith(f"received a damaged record: record at byte {at}: "), error


def test_truncated_and_padded_input() -> None:
    records = encode([("t", 0, [(b"hello", None, "", [], 1)] * 2)])
    frame = len(records) // 2
    assert "bad length" in str(error_of(records[:-1]))
    message = str(error_of(records[: frame + 10]))
    assert message.endswith(f"record at byte {frame}: frame header runs past the end of the data")
    message = str(error_of(records + bytes(HEADER.size)))
    assert message.endswith(f"record at byte {len(records)}: zero length (end of written data)")
    damaged = bytearray(records)
    damaged[-1] ^= 1  # the second frame's length suffix
    assert "length suffix" in str(error_of(bytes(damaged)))


def raw_frame(
    *,
    topic: bytes = b"t",
    tag: bytes = b"",
    key: bytes | None = None,
    headers: bytes = b"",
    value: bytes = b"v",
    version: int = RECORD_VERSION,
    producer_ms: int = 1,
    extra: bytes = b"",
    store_ms: int = 0,
) -> bytes:
    """A frame with a valid checksum but any contents (the encoder refuses bad ones)."""
    key_bytes = key or b""
    payload = topic + tag + key_bytes + headers + value + extra
    body = FIXED_BODY_SIZE + len(payload)
    flags = FLAG_HAS_KEY if key is not None else 0
    head = HEADER.pack(
        body, version, flags, 0, 0, 0, producer_ms, store_ms,
        len(topic), len(tag), len(key_bytes), len(headers), len(value),
    )  # fmt: skip
    return head + payload + struct.pack("<II", crc32c(head[4:] + payload), body)


def test_raw_frame_is_a_valid_record() -> None:
    headers = encode_headers([("a", b"b")])
    frame = raw_frame(topic=b"t", tag=b"g", key=b"k", headers=headers, value=b"v", producer_ms=5)
    (m,) = decode_records(frame, "b1")
    assert (m.topic, m.tag, m.key, m.value, m.headers, m.timestamp_ms) == (
        "t", "g", b"k", b"v", (("a", b"b"),), 5,
    )  # fmt: skip
    check(frame)
    check(raw_frame(headers=b"\x00\x00"))  # an explicit zero count is well-formed


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"version": 2}, "unsupported record version 2"),
        ({"extra": b"x"}, "field lengths do not add up to the body length"),
        ({"topic": b"\xff"}, "topic is not valid UTF-8"),
        ({"tag": b"\xc0\xaf"}, "tag is not valid UTF-8"),  # overlong "/"
        ({"tag": b"\xed\xa0\x80"}, "tag is not valid UTF-8"),  # surrogate
        ({"tag": b"\xf4\x90\x80\x80"}, "tag is not valid UTF-8"),  # above U+10FFFF
        ({"tag": b"abc\xe2\x82"}, "tag is not valid UTF-8"),  # truncated sequence
        ({"headers": b"\x01"}, "malformed headers section"),
        ({"headers": encode_headers([("k", b"v")]) + b"\x00"}, "malformed headers section"),
        ({"headers": encode_headers([("k", b"v")])[:-1]}, "malformed headers section"),
        ({"headers": b"\x02\x00" + encode_headers([("k", b"v")])[2:]}, "malformed headers"),
        ({"headers": b"\x01\x00\x05\x00abc"}, "malformed headers section"),
        ({"headers": b"\x01\x00\x01\x00\xff\x00\x00\x00\x00"}, "header key is not valid UTF-8"),
        ({"headers": b"\x01\x00\x01\x00k\x09\x00\x00\x00value"}, "malformed headers section"),
    ],
)
def test_damaged_contents_under_a_valid_checksum(kwargs: dict[str, Any], reason: str) -> None:
    good = raw_frame()
    check(good)
    error = error_of(good + raw_frame(**kwargs))
    assert isinstance(error, DataLossError)
    assert str(error).startswith(f"received a damaged record: record at byte {len(good)}: ")
    assert reason in str(error)


@pytest.mark.parametrize(
    "raw",
    [b"\xe0\x80\x80", b"\xf0\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\x80", b"a\xc2", b"\xfe"],
)
def test_invalid_utf8_is_rejected_like_python(raw: bytes) -> None:
    cases: list[dict[str, Any]] = [{"topic": raw}, {"tag": raw}]
    for kwargs in cases:
        assert "not valid UTF-8" in str(error_of(raw_frame(**kwargs)))


def test_producer_timestamp_beyond_int64_microseconds() -> None:
    check(raw_frame(producer_ms=MS_MAX) + raw_frame(producer_ms=-MS_MAX))
    for ms in (MS_MAX + 1, -MS_MAX - 1, 2**63 - 1, -(2**63)):
        error = error_of(raw_frame() + raw_frame(producer_ms=ms))
        assert isinstance(error, LimitError)
        assert f"record at byte {len(raw_frame())}: producer timestamp {ms} ms" in str(error)


def test_store_timestamp_beyond_int64_microseconds() -> None:
    """The store time column (``storeTimestamp``) is range-checked like the producer's."""
    check(raw_frame(store_ms=MS_MAX) + raw_frame(store_ms=-MS_MAX))
    for ms in (MS_MAX + 1, -(2**63)):
        error = error_of(raw_frame() + raw_frame(store_ms=ms))
        assert isinstance(error, LimitError)
        assert f"record at byte {len(raw_frame())}: store timestamp {ms} ms" in str(error)


def test_too_large_for_32_bit_offsets() -> None:
    """2048 message ids of over 1 MiB each exceed int32 offsets: refused before
    anything is allocated."""
    records = raw_frame() * 2048
    error = error_of(records, broker_id="b" * 2**20)
    assert isinstance(error, LimitError)
    assert "records too large for 32-bit offsets: ids total 2147518464 bytes" in str(error)
    assert decode_both(records[: 1024 * len(raw_frame())], "b" * 2**20).count == 1024


# -- properties ----------------------------------------------------------------

rows_strategy = st.lists(
    st.tuples(
        st.binary(max_size=200),
        st.one_of(st.none(), st.binary(max_size=30)),
        st.text(max_size=10),
        st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=16)), max_size=4),
        st.integers(min_value=-MS_MAX, max_value=MS_MAX),
    ),
    min_size=1,
    max_size=12,
)
batches_strategy = st.lists(
    st.tuples(st.text(min_size=1, max_size=12), st.integers(0, 65535), rows_strategy),
    max_size=4,
)


@given(
    batches_strategy,
    st.integers(min_value=0, max_value=2**62),
    st.integers(min_value=0, max_value=2**40),
    st.text(max_size=10),
)
def test_columns_match_decode_records(
    batches: list[Batch], position: int, first_offset: int, broker_id: str
) -> None:
    check(encode(batches, position, first_offset), broker_id)


@given(st.binary(max_size=12), st.binary(max_size=12), st.binary(max_size=8))
def test_utf8_validation_agrees_with_python(topic: bytes, tag: bytes, header_key: bytes) -> None:
    """Random bytes as topic, tag and header key: the C decoder accepts exactly
    what Python's UTF-8 decoder accepts."""
    headers = struct.pack("<HH", 1, len(header_key)) + header_key + struct.pack("<I", 0)
    records = raw_frame(topic=topic, tag=tag, headers=headers)
    try:
        for raw in (topic, tag, header_key):
            raw.decode()
    except UnicodeDecodeError:
        assert "not valid UTF-8" in str(error_of(records))
    else:
        check(records)


# -- pyarrow -------------------------------------------------------------------


def to_record_batch(pa: Any, cols: RecordColumns) -> Any:
    """The RecordBatch a Spark reader builds from the buffers, without copying."""
    n = cols.count
    buf = pa.py_buffer

    def variable(kind: Any, offsets: bytes, data: bytes, length: int = n) -> Any:
        return pa.Array.from_buffers(kind, length, [None, buf(offsets), buf(data)])

    def fixed(kind: Any, data: bytes) -> Any:
        return pa.Array.from_buffers(kind, n, [None, buf(data)])

    validity = buf(cols.key_validity) if cols.key_validity is not None else None
    keys = pa.Array.from_buffers(
        pa.binary(), n, [validity, buf(cols.key_offsets), buf(cols.keys)],
        null_count=cols.key_nulls,
    )  # fmt: skip
    m = len(cols.header_key_offsets) // 4 - 1
    pairs = pa.StructArray.from_arrays(
        [
            variable(pa.string(), cols.header_key_offsets, cols.header_keys, m),
            variable(pa.binary(), cols.header_value_offsets, cols.header_values, m),
        ],
        names=["key", "value"],
    )
    headers = pa.Array.from_buffers(
        pa.list_(pairs.type), n, [None, buf(cols.header_list_offsets)], children=[pairs]
    )
    return pa.RecordBatch.from_arrays(
        [
            variable(pa.string(), cols.topic_offsets, cols.topics),
            fixed(pa.int32(), cols.queue_ids),
            fixed(pa.int64(), cols.offsets),
            fixed(pa.timestamp("us"), cols.timestamps_us),
            keys,
            variable(pa.binary(), cols.value_offsets, cols.values),
            variable(pa.string(), cols.tag_offsets, cols.tags),
            variable(pa.string(), cols.id_offsets, cols.ids),
            headers,
        ],
        names=["topic", "queue_id", "offset", "timestamp", "key", "value", "tag", "id", "headers"],
    )


def expected_rows(messages: list[Message]) -> list[dict[str, Any]]:
    return [
        {
            "topic": m.topic,
            "queue_id": m.queue_id,
            "offset": m.offset,
            "timestamp": m.timestamp_ms * 1000,
            "key": m.key,
            "value": m.value,
            "tag": m.tag,
            "id": m.message_id,
            "headers": [{"key": k, "value": v} for k, v in m.headers],
        }
        for m in messages
    ]


def arrow_rows(pa: Any, batch: Any) -> list[dict[str, Any]]:
    """``batch.to_pylist()`` with the timestamps as int64 microseconds."""
    as_int = batch.set_column(3, "timestamp", batch.column(3).cast(pa.int64()))
    rows: list[dict[str, Any]] = as_int.to_pylist()
    return rows


def test_pyarrow_record_batch_round_trip() -> None:
    pa = pytest.importorskip("pyarrow")
    rows: list[Row] = [
        (f"v{i}".encode(), None if i % 3 == 0 else b"k" * (i % 4), "τ" * (i % 2),
         [(f"h{j}", b"x" * j) for j in range(i % 4)], 1_700_000_000_000 + i)
        for i in range(21)
    ]  # fmt: skip
    records = encode([("orders", 0, rows[:10]), ("заказы", 1, rows[10:])], position=77)
    for decode in (decode_columns, decode_columns_py):
        batch = to_record_batch(pa, decode(records, "b1", True))
        batch.validate(full=True)
        assert batch.num_rows == 21
        assert batch.column("key").null_count == 7
        assert batch.schema.field("timestamp").type == pa.timestamp("us")
        assert arrow_rows(pa, batch) == expected_rows(decode_records(records, "b1"))
    empty = to_record_batch(pa, decode_columns(b"", "b1", True))
    empty.validate(full=True)
    assert empty.num_rows == 0


@given(batches_strategy)
def test_pyarrow_property(batches: list[Batch]) -> None:
    pa = pytest.importorskip("pyarrow")
    records = encode(batches)
    batch = to_record_batch(pa, decode_columns(records, "b1", True))
    batch.validate(full=True)
    assert arrow_rows(pa, batch) == expected_rows(decode_records(records, "b1"))


@pytest.mark.skipif(columns.DECODER != "c", reason="the C decoder's property")
def test_decoded_messages_are_left_out_of_the_garbage_collector() -> None:
    """A decoded message can be in no reference cycle (str, int, bytes, None and
    tuples of them, in a NamedTuple without a __dict__), so the C decoder
    untracks it: a pull of 1,000 would otherwise set off collections costing
    as much as the decode (issue 31). The messages stay whole and equal."""
    import gc

    records = encode([("t", 0, [(b"v%d" % i, b"k", "tag", [("h", b"x")], 5) for i in range(50)])])
    messages = decode_records(records, "b1")
    assert not any(gc.is_tracked(m) for m in messages)
    assert messages == _decode_py(records, "b1")
    assert messages[7].value == b"v7" and messages[7].headers == (("h", b"x"),)
