"""Wire-shape benchmark: how the gRPC contract should carry a batch of messages.

Run ``python bench/wire_shape_bench.py`` (about 30 s; ``--quick`` for a smoke
run of a few seconds). Compiles ``bench/wire_shape.proto`` with grpc_tools into
a temp dir (nothing generated is kept) and compares, for 1,000 messages of
100 B and 1 KiB random values, each with a 16-byte key, without and with a
short tag per message (producer timestamps always present):

* A, "repeated Message": one sub-message per message.
* B, "columnar": values (and keys) concatenated into one ``bytes`` field plus
  packed lengths; tags as ``repeated string``; timestamps packed. B' is B with
  the tags as a UTF-8 blob + lengths.
* C, "raw records" (pull replies only): one ``bytes`` field holding the log's
  record frames (equeue_proto/record.py) as stored.

Produce (client -> broker): the client builds the request from Python lists
(values, keys, tags, timestamps) and serializes it; the broker parses it and
turns it into the ``MessageBatch`` columns the store appends.

Pull (broker -> client): the broker reads 1,000 stored records of one queue
from a log buffer, builds the reply and serializes it; the client parses it
and extracts either ``(key, value, offset)`` per message or the values as one
column (B, C: the blob plus offsets into it, no per-message bytes objects; A
cannot avoid them). How the broker reads the log:

* A, B, B': ``decode_record`` per frame (CRC checked, a ``StoredMessage``
  each), which is what ``Store.read`` does today.
* A*, B*: one ``HEADER.unpack_from`` and a few slices per frame, straight into
  columns (a possible cheaper store read API; no CRC check).
* C: one slice per frame, located by its index entry, joined; no decoding.

C's client decodes frames with one ``struct.unpack_from`` per header (plus,
in a second variant, the CRC32C of each frame checked; in a third, every frame
through ``decode_record``).

Every step is timed separately inside each iteration (fresh objects each
time); a row reports the median over runs of each step's mean, in
microseconds per message, the broker's and the client's sums, and the
serialized size in bytes per message. "vs A" divides a row's total by shape
A's for the same data (and, for pulls, the same client form). Each pipeline's
output is checked against the input once before it is timed. glibc's malloc
is told to keep freed memory (see ``pin_malloc``; ``--default-malloc`` to
leave it alone) so the ~1 MB buffers of a 1 KiB batch do not page-fault anew
at random.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import importlib.util
import itertools
import os
import platform
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from crc32c import crc32c

from equeue_broker.storage import MessageBatch, MessageLimits, StoredMessage
from equeue_broker.storage.index.queue_index import ENTRY, ENTRY_SIZE
from equeue_broker.storage.log.record import encode_records, prepare_batch
from equeue_proto.accel import IMPLEMENTATION as ENCODER
from equeue_proto.record import HEADER, TRAILER, decode_record

COUNT = 1_000
SIZES = (100, 1024)
KEY_SIZE = 16
TAGS = ("created", "paid", "shipped", "cancelled")
TOPIC = "orders"
QUEUE_ID = 3
FIRST_OFFSET = 5_000_000
LOG_POSITION = 1 << 32
"""Global log position of the first stored frame (realistic 8-byte varints)."""
BASE_MS = 1_700_000_000_000
PROTO = Path(__file__).with_name("wire_shape.proto")

_LENGTHS = struct.Struct("<I36xHBxIII")
"""From a frame header: body_length and the topic/tag/key/headers/value lengths."""
_TUPLE_FIELDS = struct.Struct("<IxB2xQ24xHBxIII")
"""body_length, flags, queue_offset and the five lengths."""
_U32 = struct.Struct("<I")
assert _LENGTHS.size == _TUPLE_FIELDS.size == HEADER.size

Message = Any
"""A generated protobuf message (the module is compiled at run time)."""
Step = Callable[[Any], Any]


# -- protos --------------------------------------------------------------------


def compile_protos(out_dir: str) -> ModuleType:
    """Compile wire_shape.proto into ``out_dir`` and import the generated module."""
    protoc: Any = importlib.import_module("grpc_tools.protoc")
    args = ["protoc", f"-I{PROTO.parent}", f"--python_out={out_dir}", str(PROTO)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    path = Path(out_dir) / "wire_shape_pb2.py"
    spec = importlib.util.spec_from_file_location("wire_shape_pb2", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def protobuf_backend() -> tuple[str, str]:
    """(backend, version) of the protobuf runtime in use."""
    api: Any = importlib.import_module("google.protobuf.internal.api_implementation")
    version: str = importlib.import_module("google.protobuf").__version__
    return str(api.Type()), version


# -- allocator -------------------------------------------------------------------

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def pin_malloc() -> bool:
    """Keep glibc from returning big freed buffers to the OS (True if it applied).

    By default glibc serves ~1 MB buffers (a 1 KiB batch) with mmap or trims
    them from the heap on free, so each new one page-faults afresh; whether it
    does depends on the allocator's history, which made the 1 KiB steps jump
    between two levels from one pipeline to the next. Pinned, every step costs
    its CPU work (copies included) and nothing else.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, 256 << 20) and mallopt(M_TRIM_THRESHOLD, 1 << 30))


# -- data ------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    value_size: int
    tagged: bool
    values: list[bytes]
    keys: list[bytes | None]
    tags: list[str] | None
    timestamps_ms: list[int]
    log: bytes
    """The stored frames of these messages, as the log holds them."""
    entries: list[tuple[int, int]]
    """(position in ``log``, frame size) per message, from the index entries."""

    @property
    def label(self) -> str:
        return f"{self.value_size} B" if self.value_size < 1024 else f"{self.value_size >> 10} KiB"


def make_dataset(value_size: int, tagged: bool) -> Dataset:
    values = [os.urandom(value_size) for _ in range(COUNT)]
    keys: list[bytes | None] = [os.urandom(KEY_SIZE) for _ in range(COUNT)]
    tags = [TAGS[i % len(TAGS)] for i in range(COUNT)] if tagged else None
    stamps = [BASE_MS + i // 10 for i in range(COUNT)]
    batch = MessageBatch(values=values, keys=keys, tags=tags, timestamps_ms=stamps)
    prepared = prepare_batch(batch, TOPIC.encode(), MessageLimits())
    log = bytearray(prepared.total_bytes)
    index = bytearray(COUNT * ENTRY_SIZE)
    written = encode_records(
        log, position=LOG_POSITION, topic=TOPIC.encode(), queue_id=QUEUE_ID,
        first_offset=FIRST_OFFSET, store_ms=BASE_MS + 50, prepared=prepared,
        start=0, stop=COUNT, index_out=index,
    )  # fmt: skip
    assert written == len(log)
    entries: list[tuple[int, int]] = []
    for i in range(COUNT):
        position_plus_one, size, _tag_hash, _store_ms = ENTRY.unpack_from(index, i * ENTRY_SIZE)
        entries.append((position_plus_one - 1 - LOG_POSITION, size))
    return Dataset(value_size, tagged, values, keys, tags, stamps, bytes(log), entries)


# -- produce: A ----------------------------------------------------------------


def produce_build_a(pb: ModuleType, ds: Dataset) -> Message:
    request = pb.ProduceA(topic=TOPIC, queue_id=QUEUE_ID)
    add = request.messages.add
    if ds.tags is None:
        for key, value, stamp in zip(ds.keys, ds.values, ds.timestamps_ms, strict=True):
            add(key=key, value=value, timestamp_ms=stamp)
    else:
        for key, value, tag, stamp in zip(ds.keys, ds.values, ds.tags, ds.timestamps_ms,
                                          strict=True):  # fmt: skip
            add(key=key, value=value, tag=tag, timestamp_ms=stamp)
    return request


def produce_extract_a(request: Message) -> MessageBatch:
    rows = [
        (m.value, m.key if m.HasField("key") else None, m.tag, m.timestamp_ms)
        for m in request.messages
    ]
    values, keys, tags, stamps = zip(*rows, strict=True)
    return MessageBatch(
        values=values, keys=keys, tags=tags if any(tags) else None, timestamps_ms=stamps
    )


# -- produce: B ----------------------------------------------------------------


def _key_columns(keys: Sequence[bytes | None]) -> tuple[bytes, list[int]]:
    if None in keys:
        return (
            b"".join([k for k in keys if k is not None]),
            [-1 if k is None else len(k) for k in keys],
        )
    present: Sequence[bytes] = keys  # type: ignore[assignment]  # no None in keys
    return b"".join(present), list(map(len, present))


def produce_build_b(pb: ModuleType, ds: Dataset, tag_blob: bool) -> Message:
    keys, key_lengths = _key_columns(ds.keys)
    request = pb.ProduceB(
        topic=TOPIC, queue_id=QUEUE_ID,
        values=b"".join(ds.values), value_lengths=list(map(len, ds.values)),
        keys=keys, key_lengths=key_lengths, timestamps_ms=ds.timestamps_ms,
    )  # fmt: skip
    if ds.tags is not None:
        if tag_blob:
            encoded = [t.encode() for t in ds.tags]
            request.tag_blob = b"".join(encoded)
            request.tag_lengths.extend(map(len, encoded))
        else:
            request.tags.extend(ds.tags)
    return request


def split_blob(blob: bytes, lengths: Sequence[int]) -> list[bytes]:
    """One bytes object per length; ValueError if the lengths do not cover ``blob``."""
    out = []
    pos = 0
    for n in lengths:
        out.append(blob[pos : pos + n])
        pos += n
    if pos != len(blob):
        raise ValueError(f"lengths cover {pos} bytes of a {len(blob)}-byte blob")
    return out


def split_keys(blob: bytes, lengths: Sequence[int]) -> list[bytes | None]:
    out: list[bytes | None] = []
    pos = 0
    for n in lengths:
        if n < 0:
            out.append(None)
        else:
            out.append(blob[pos : pos + n])
            pos += n
    if pos != len(blob):
        raise ValueError(f"key lengths cover {pos} bytes of a {len(blob)}-byte blob")
    return out


def split_tags(blob: bytes, lengths: Sequence[int]) -> list[str]:
    return [t.decode() for t in split_blob(blob, lengths)]


def _tag_column(message: Message, count: int) -> list[str] | None:
    if message.tag_lengths:
        return split_tags(message.tag_blob, message.tag_lengths)
    tags = list(message.tags)
    if tags and len(tags) != count:
        raise ValueError(f"{len(tags)} tags for {count} messages")
    return tags or None


def produce_extract_b(request: Message) -> MessageBatch:
    lengths = request.value_lengths
    count = len(lengths)
    if len(request.key_lengths) != count or len(request.timestamps_ms) != count:
        raise ValueError("columns of different lengths")
    return MessageBatch(
        values=split_blob(request.values, lengths),
        keys=split_keys(request.keys, request.key_lengths),
        tags=_tag_column(request, count),
        timestamps_ms=list(request.timestamps_ms),
    )


# -- pull: reading the log -------------------------------------------------------


def read_stored(ds: Dataset) -> list[StoredMessage]:
    """What ``Store.read`` does per message today: decode_record (CRC checked)."""
    log = ds.log
    return [decode_record(log, pos) for pos, _size in ds.entries]


def read_frames(ds: Dataset) -> bytes:
    """The frames of the read, one slice per index entry, joined (no decoding)."""
    view = memoryview(ds.log)
    try:
        return b"".join([view[pos : pos + size] for pos, size in ds.entries])
    finally:
        view.release()


@dataclass(frozen=True, slots=True)
class Columns:
    """A read as columns taken straight from the frames (a possible store API)."""

    offsets: list[int]
    keys: list[bytes | None]
    key_lengths: list[int]
    """-1 for no key."""
    values: list[bytes]
    value_lengths: list[int]
    tags: list[bytes]
    """UTF-8 tags (empty: untagged)."""
    producer_ms: list[int]
    store_ms: list[int]


def read_columns(ds: Dataset) -> Columns:
    """One HEADER.unpack_from and a few bytes slices per frame; no CRC check, no
    StoredMessage. (memoryview slices instead of bytes: slower at both sizes.)"""
    buf = ds.log
    unpack = HEADER.unpack_from
    fixed = HEADER.size
    cols = Columns([], [], [], [], [], [], [], [])
    for pos, _size in ds.entries:
        (
            _body, _version, flags, _queue, offset, _position, producer_ms, store_ms,
            topic_len, tag_len, key_len, headers_len, value_len,
        ) = unpack(buf, pos)  # fmt: skip
        p = pos + fixed + topic_len
        cols.tags.append(buf[p : p + tag_len])
        p += tag_len
        if flags & 1:
            cols.keys.append(buf[p : p + key_len])
            cols.key_lengths.append(key_len)
        else:
            cols.keys.append(None)
            cols.key_lengths.append(-1)
        p += key_len + headers_len
        cols.values.append(buf[p : p + value_len])
        cols.value_lengths.append(value_len)
        cols.offsets.append(offset)
        cols.producer_ms.append(producer_ms)
        cols.store_ms.append(store_ms)
    return cols


# -- pull: A -------------------------------------------------------------------


def pull_build_a(pb: ModuleType, messages: list[StoredMessage]) -> Message:
    reply = pb.PullReplyA(next_offset=messages[-1].queue_offset + 1)
    add = reply.messages.add
    for m in messages:
        add(
            queue_offset=m.queue_offset, key=m.key, value=m.value, tag=m.tag,
            timestamp_ms=m.producer_timestamp_ms, store_timestamp_ms=m.store_timestamp_ms,
        )  # fmt: skip
    return reply


def pull_build_a_columns(pb: ModuleType, cols: Columns) -> Message:
    reply = pb.PullReplyA(next_offset=cols.offsets[-1] + 1)
    add = reply.messages.add
    for offset, key, value, tag, producer_ms, store_ms in zip(
        cols.offsets, cols.keys, cols.values, cols.tags, cols.producer_ms, cols.store_ms,
        strict=True,
    ):  # fmt: skip
        add(
            queue_offset=offset, key=key, value=value, tag=tag.decode(),
            timestamp_ms=producer_ms, store_timestamp_ms=store_ms,
        )  # fmt: skip
    return reply


def pull_tuples_a(reply: Message) -> list[tuple[bytes | None, bytes, int]]:
    return [(m.key if m.HasField("key") else None, m.value, m.queue_offset) for m in reply.messages]


def pull_column_a(reply: Message) -> list[bytes]:
    return [m.value for m in reply.messages]


# -- pull: B -------------------------------------------------------------------


def pull_build_b(pb: ModuleType, messages: list[StoredMessage], tag_blob: bool) -> Message:
    values = [m.value for m in messages]
    keys, key_lengths = _key_columns([m.key for m in messages])
    reply = pb.PullReplyB(
        next_offset=messages[-1].queue_offset + 1,
        queue_offsets=[m.queue_offset for m in messages],
        values=b"".join(values), value_lengths=list(map(len, values)),
        keys=keys, key_lengths=key_lengths,
        timestamps_ms=[m.producer_timestamp_ms for m in messages],
        store_timestamps_ms=[m.store_timestamp_ms for m in messages],
    )  # fmt: skip
    tags = [m.tag for m in messages]
    if any(tags):
        if tag_blob:
            encoded = [t.encode() for t in tags]
            reply.tag_blob = b"".join(encoded)
            reply.tag_lengths.extend(map(len, encoded))
        else:
            reply.tags.extend(tags)
    return reply


def pull_build_b_columns(pb: ModuleType, cols: Columns) -> Message:
    reply = pb.PullReplyB(
        next_offset=cols.offsets[-1] + 1, queue_offsets=cols.offsets,
        values=b"".join(cols.values), value_lengths=cols.value_lengths,
        keys=b"".join([k for k in cols.keys if k is not None]), key_lengths=cols.key_lengths,
        timestamps_ms=cols.producer_ms, store_timestamps_ms=cols.store_ms,
    )  # fmt: skip
    if any(cols.tags):
        reply.tags.extend([t.decode() for t in cols.tags])
    return reply


def pull_tuples_b(reply: Message) -> list[tuple[bytes | None, bytes, int]]:
    offsets = reply.queue_offsets
    values = split_blob(reply.values, reply.value_lengths)
    keys = split_keys(reply.keys, reply.key_lengths)
    if not len(offsets) == len(values) == len(keys):
        raise ValueError("columns of different lengths")
    return list(zip(keys, values, offsets, strict=True))


def pull_column_b(reply: Message) -> tuple[bytes, list[int]]:
    """The values blob and the end offset of each value in it."""
    blob: bytes = reply.values
    ends = list(itertools.accumulate(reply.value_lengths))
    if (ends[-1] if ends else 0) != len(blob):
        raise ValueError("value lengths do not cover the values blob")
    return blob, ends


# -- pull: C -------------------------------------------------------------------


def pull_build_c(pb: ModuleType, frames: bytes, next_offset: int) -> Message:
    return pb.PullReplyC(next_offset=next_offset, records=frames)


def pull_tuples_c_decode(reply: Message) -> list[tuple[bytes | None, bytes, int]]:
    """Every frame through ``decode_record`` (CRC verified, a StoredMessage each)."""
    blob: bytes = reply.records
    body_length = _U32.unpack_from
    out = []
    pos = 0
    end = len(blob)
    while pos < end:
        m = decode_record(blob, pos)
        out.append((m.key, m.value, m.queue_offset))
        pos += body_length(blob, pos)[0] + 12
    return out


def pull_tuples_c_struct(reply: Message) -> list[tuple[bytes | None, bytes, int]]:
    """One struct.unpack_from per frame header and two slices; no CRC check."""
    blob: bytes = reply.records
    unpack = _TUPLE_FIELDS.unpack_from
    fixed = HEADER.size
    out: list[tuple[bytes | None, bytes, int]] = []
    pos = 0
    end = len(blob)
    while pos < end:
        body, flags, offset, topic_len, tag_len, key_len, headers_len, value_len = unpack(blob, pos)
        key_at = pos + fixed + topic_len + tag_len
        value_at = key_at + key_len + headers_len
        key = blob[key_at : key_at + key_len] if flags & 1 else None
        out.append((key, blob[value_at : value_at + value_len], offset))
        pos += body + 12
    return out


def pull_tuples_c_crc(reply: Message) -> list[tuple[bytes | None, bytes, int]]:
    """As pull_tuples_c_struct, plus each frame's CRC32C and length suffix checked."""
    blob: bytes = reply.records
    view = memoryview(blob)
    unpack = _TUPLE_FIELDS.unpack_from
    trailer = TRAILER.unpack_from
    fixed = HEADER.size
    out: list[tuple[bytes | None, bytes, int]] = []
    pos = 0
    end = len(blob)
    while pos < end:
        body, flags, offset, topic_len, tag_len, key_len, headers_len, value_len = unpack(blob, pos)
        if trailer(blob, pos + 4 + body) != (crc32c(view[pos + 4 : pos + 4 + body]), body):
            raise ValueError(f"corrupt record at byte {pos} of the reply")
        key_at = pos + fixed + topic_len + tag_len
        value_at = key_at + key_len + headers_len
        key = blob[key_at : key_at + key_len] if flags & 1 else None
        out.append((key, blob[value_at : value_at + value_len], offset))
        pos += body + 12
    view.release()
    return out


def pull_column_c(reply: Message) -> tuple[bytes, list[int], list[int]]:
    """The records blob, and the start and length of each value in it."""
    blob: bytes = reply.records
    unpack = _LENGTHS.unpack_from
    fixed = HEADER.size
    starts: list[int] = []
    lengths: list[int] = []
    pos = 0
    end = len(blob)
    while pos < end:
        body, topic_len, tag_len, key_len, headers_len, value_len = unpack(blob, pos)
        starts.append(pos + fixed + topic_len + tag_len + key_len + headers_len)
        lengths.append(value_len)
        pos += body + 12
    return blob, starts, lengths


# -- checks --------------------------------------------------------------------


def check_batch(batch: MessageBatch, ds: Dataset) -> None:
    assert list(batch.values) == ds.values
    assert list(batch.keys or ()) == ds.keys
    assert (list(batch.tags) if batch.tags is not None else None) == ds.tags
    assert list(batch.timestamps_ms or ()) == ds.timestamps_ms
    prepare_batch(batch, TOPIC.encode(), MessageLimits())  # the store accepts it


def check_tuples(rows: list[tuple[bytes | None, bytes, int]], ds: Dataset) -> None:
    offsets = range(FIRST_OFFSET, FIRST_OFFSET + COUNT)
    assert rows == list(zip(ds.keys, ds.values, offsets, strict=True))


def column_values(column: Any) -> list[bytes]:
    if isinstance(column, list):
        return column
    if len(column) == 2:
        blob, ends = column
        return [blob[s:e] for s, e in zip([0, *ends], ends, strict=False)]
    blob, starts, lengths = column
    return [blob[s : s + n] for s, n in zip(starts, lengths, strict=True)]


# -- timing --------------------------------------------------------------------


@dataclass(frozen=True)
class Pipeline:
    """Linear ``steps`` (each gets the previous output), then ``branches``, each
    applied to the last output and timed on its own."""

    shape: str
    steps: list[tuple[str, Step]]
    branches: list[tuple[str, Step]]
    wire_size: Callable[[], int]


@dataclass(frozen=True)
class Timing:
    us_per_message: dict[str, float]
    wire_bytes: int


def run_once(pipeline: Pipeline, totals: dict[str, float]) -> None:
    clock = time.perf_counter
    x: Any = None
    for name, step in pipeline.steps:
        t0 = clock()
        x = step(x)
        totals[name] += clock() - t0
    for name, branch in pipeline.branches:
        t0 = clock()
        branch(x)
        totals[name] += clock() - t0


def measure(pipeline: Pipeline, runs: int, run_seconds: float, max_iterations: int) -> Timing:
    names = [n for n, _ in pipeline.steps] + [n for n, _ in pipeline.branches]
    scratch = dict.fromkeys(names, 0.0)
    run_once(pipeline, scratch)  # warm up
    t0 = time.perf_counter()
    run_once(pipeline, scratch)
    one = time.perf_counter() - t0
    iterations = max(3, min(max_iterations, round(run_seconds / max(one, 1e-9))))
    samples: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(runs):
        totals = dict.fromkeys(names, 0.0)
        gc.collect()
        for _ in range(iterations):
            run_once(pipeline, totals)
        for name in names:
            samples[name].append(totals[name] / iterations / COUNT * 1e6)
    return Timing({n: statistics.median(s) for n, s in samples.items()}, pipeline.wire_size())


# -- pipelines -----------------------------------------------------------------


def produce_pipelines(pb: ModuleType, ds: Dataset) -> list[Pipeline]:
    shapes: list[tuple[str, Callable[[], Message], Any, Step]] = [
        ("A", lambda: produce_build_a(pb, ds), pb.ProduceA, produce_extract_a),
        ("B", lambda: produce_build_b(pb, ds, False), pb.ProduceB, produce_extract_b),
    ]
    if ds.tagged:
        shapes.append(("B'", lambda: produce_build_b(pb, ds, True), pb.ProduceB, produce_extract_b))
    out = []
    for shape, build, cls, extract in shapes:
        check_batch(extract(cls.FromString(build().SerializeToString())), ds)
        out.append(
            Pipeline(
                shape,
                [
                    ("build", lambda _, b=build: b()),  # type: ignore[misc]
                    ("serialize", lambda m: m.SerializeToString()),
                    ("parse", lambda data, c=cls: c.FromString(data)),  # type: ignore[misc]
                    ("to batch", extract),
                ],
                [],
                lambda b=build: len(b().SerializeToString()),  # type: ignore[misc]
            )
        )
    return out


def pull_pipelines(pb: ModuleType, ds: Dataset) -> list[Pipeline]:
    next_offset = FIRST_OFFSET + COUNT
    a_client: list[tuple[str, Step]] = [("tuples", pull_tuples_a), ("column", pull_column_a)]
    b_client: list[tuple[str, Step]] = [("tuples", pull_tuples_b), ("column", pull_column_b)]
    shapes: list[tuple[str, Step, Step, Any, list[tuple[str, Step]]]] = [
        ("A", lambda _: read_stored(ds), lambda ms: pull_build_a(pb, ms),
         pb.PullReplyA, a_client),
        ("A*", lambda _: read_columns(ds), lambda c: pull_build_a_columns(pb, c),
         pb.PullReplyA, a_client),
        ("B", lambda _: read_stored(ds), lambda ms: pull_build_b(pb, ms, False),
         pb.PullReplyB, b_client),
        ("B*", lambda _: read_columns(ds), lambda c: pull_build_b_columns(pb, c),
         pb.PullReplyB, b_client),
    ]  # fmt: skip
    if ds.tagged:
        shapes.append(
            ("B'", lambda _: read_stored(ds), lambda ms: pull_build_b(pb, ms, True),
             pb.PullReplyB, b_client)
        )  # fmt: skip
    shapes.append(
        ("C", lambda _: read_frames(ds), lambda f: pull_build_c(pb, f, next_offset),
         pb.PullReplyC, [("tuples", pull_tuples_c_struct), ("tuples + crc", pull_tuples_c_crc),
                         ("tuples via decode_record", pull_tuples_c_decode),
                         ("column", pull_column_c)])
    )  # fmt: skip
    out = []
    for shape, read, build, cls, branches in shapes:
        reply = cls.FromString(build(read(None)).SerializeToString())
        for name, branch in branches:
            if name.startswith("tuples"):
                check_tuples(branch(reply), ds)
            else:
                assert column_values(branch(reply)) == ds.values
        out.append(
            Pipeline(
                shape,
                [
                    ("read", read),
                    ("build", build),
                    ("serialize", lambda m: m.SerializeToString()),
                    ("parse", lambda data, c=cls: c.FromString(data)),  # type: ignore[misc]
                ],
                branches,
                lambda r=read, b=build: len(b(r(None)).SerializeToString()),  # type: ignore[misc]
            )
        )
    return out


# -- report --------------------------------------------------------------------


def fmt(us: float) -> str:
    return f"{us:.3f}" if us < 1 else f"{us:.2f}"


def produce_table(results: list[tuple[Dataset, Pipeline, Timing]]) -> list[str]:
    lines = [
        "| shape | value | tags | client build | client serialize | **client Σ** "
        "| broker parse | broker -> MessageBatch | **broker Σ** | **total** | vs A "
        "| wire B/msg |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    base: dict[tuple[int, bool], float] = {}
    for ds, pipeline, timing in results:
        t = timing.us_per_message
        client = t["build"] + t["serialize"]
        broker = t["parse"] + t["to batch"]
        total = client + broker
        base.setdefault((ds.value_size, ds.tagged), total)
        ratio = total / base[(ds.value_size, ds.tagged)]
        lines.append(
            f"| {pipeline.shape} | {ds.label} | {'yes' if ds.tagged else 'no'} "
            f"| {fmt(t['build'])} | {fmt(t['serialize'])} | **{fmt(client)}** "
            f"| {fmt(t['parse'])} | {fmt(t['to batch'])} | **{fmt(broker)}** "
            f"| **{fmt(total)}** | {ratio:.2f} "
            f"| {timing.wire_bytes / COUNT:.1f} |"
        )
    return lines


def pull_table(results: list[tuple[Dataset, Pipeline, Timing]]) -> list[str]:
    lines = [
        "| shape | client gets | value | tags | broker read log | broker build "
        "| broker serialize | **broker Σ** | client parse | client extract | **client Σ** "
        "| **total** | vs A | wire B/msg |",
        "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    base: dict[tuple[int, bool, str], float] = {}
    for ds, pipeline, timing in results:
        t = timing.us_per_message
        broker = t["read"] + t["build"] + t["serialize"]
        for name, _ in pipeline.branches:
            client = t["parse"] + t[name]
            total = broker + client
            kind = "column" if name == "column" else "tuples"
            base.setdefault((ds.value_size, ds.tagged, kind), total)
            ratio = total / base[(ds.value_size, ds.tagged, kind)]
            gets = {
                "tuples": "(key, value, offset)",
                "tuples + crc": "(key, value, offset), CRC checked",
                "tuples via decode_record": "(key, value, offset) via decode_record",
                "column": "values column",
            }[name]
            lines.append(
                f"| {pipeline.shape} | {gets} | {ds.label} | {'yes' if ds.tagged else 'no'} "
                f"| {fmt(t['read'])} | {fmt(t['build'])} | {fmt(t['serialize'])} "
                f"| **{fmt(broker)}** | {fmt(t['parse'])} | {fmt(t[name])} | **{fmt(client)}** "
                f"| **{fmt(total)}** | {ratio:.2f} "
                f"| {timing.wire_bytes / COUNT:.1f} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="few short runs: a smoke run")
    parser.add_argument(
        "--default-malloc", action="store_true", help="leave glibc's mmap/trim thresholds alone"
    )
    args = parser.parse_args(argv)
    pinned = False if args.default_malloc else pin_malloc()
    runs, run_seconds, max_iterations = (3, 0.01, 20) if args.quick else (7, 0.12, 200)
    backend, version = protobuf_backend()
    started = time.perf_counter()
    print(
        f"protobuf {version}, backend {backend}; Python {platform.python_version()}; "
        f"record encoder {ENCODER}; {COUNT} messages per batch, {KEY_SIZE}-byte keys; "
        f"median of {runs} runs of up to {max_iterations} iterations; "
        f"malloc {'pinned (no mmap/trim)' if pinned else 'default'}",
        flush=True,
    )
    if backend == "python":
        print("WARNING: pure-Python protobuf backend; figures are not representative")
    produced: list[tuple[Dataset, Pipeline, Timing]] = []
    pulled: list[tuple[Dataset, Pipeline, Timing]] = []
    with tempfile.TemporaryDirectory(prefix="wire_shape_") as tmp:
        pb = compile_protos(tmp)
        for tagged in (False, True):
            for size in SIZES:
                ds = make_dataset(size, tagged)
                for pipeline in produce_pipelines(pb, ds):
                    produced.append((ds, pipeline, measure(pipeline, runs, run_seconds,
                                                           max_iterations)))  # fmt: skip
                for pipeline in pull_pipelines(pb, ds):
                    pulled.append((ds, pipeline, measure(pipeline, runs, run_seconds,
                                                         max_iterations)))  # fmt: skip
                print(f"  measured {ds.label}, tags {'yes' if tagged else 'no'}", flush=True)
    print("\n## Produce request (client -> broker), µs per message\n")
    print("\n".join(produce_table(produced)))
    print("\n## Pull reply (broker -> client), µs per message\n")
    print("\n".join(pull_table(pulled)))
    print(f"\n({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
