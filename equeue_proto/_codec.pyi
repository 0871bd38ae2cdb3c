from collections.abc import Sequence
from typing import TypeVar

from _typeshed import ReadableBuffer, WriteableBuffer

_T = TypeVar("_T", bound=tuple[object, ...])

HARDWARE_CRC: int
LAYOUT: dict[str, int]
"""The layout constants of the record and index-entry formats (asserted by accel.py)."""

def encode_records(
    out: WriteableBuffer,
    position: int,
    topic: bytes,
    queue_id: int,
    first_offset: int,
    store_ms: int,
    values: Sequence[bytes],
    keys: Sequence[bytes | None] | None,
    tags: Sequence[bytes] | None,
    headers: Sequence[bytes] | None,
    timestamps_ms: Sequence[int] | None,
    start: int,
    stop: int,
    index_out: WriteableBuffer,
    extra_flags: int = 0,
    offset_step: int = 1,
) -> int: ...
def patch_committed(
    src: ReadableBuffer, entries: ReadableBuffer, first_offset: int
) -> bytearray | None: ...
def restamp_entries(entries: WriteableBuffer, store_ms: int) -> None: ...
def crc32c(data: ReadableBuffer) -> int: ...
def murmur2(data: ReadableBuffer) -> int: ...
def index_segments(
    buffer: ReadableBuffer, start: int, end: int, position: int
) -> list[tuple[int, int, bytes, int, int, bytes]]: ...
def index_runs(
    entries: ReadableBuffer,
    capacity: int,
    max_messages: int,
    max_bytes: int,
    count: int,
    total: int,
) -> tuple[list[tuple[int, int, int]], int, int, int, int]: ...
def measure_batch(
    values: Sequence[bytes],
    keys: Sequence[bytes | None] | None,
    tags: Sequence[bytes] | None,
    headers: Sequence[bytes] | None,
    fixed: int,
) -> tuple[int, int, int, int]: ...
def decode_frames(records: ReadableBuffer, cls: type[_T], broker_id: str) -> list[_T]: ...
def decode_columns(
    records: ReadableBuffer | list[ReadableBuffer], broker_id: str, want_headers: bool
) -> tuple[
    int,  # count
    bytes,  # topic_offsets
    bytes,  # topics
    bytes,  # queue_ids
    bytes,  # offsets
    bytes,  # timestamps_us
    bytes,  # key_offsets
    bytes,  # keys
    bytes | None,  # key_validity
    int,  # key_nulls
    bytes,  # value_offsets
    bytes,  # values
    bytes,  # tag_offsets
    bytes,  # tags
    bytes,  # id_offsets
    bytes,  # ids
    bytes,  # header_list_offsets
    bytes,  # header_key_offsets
    bytes,  # header_keys
    bytes,  # header_value_offsets
    bytes,  # header_values
]: ...
def split_blob(blob: ReadableBuffer, lengths: Sequence[int]) -> list[bytes]: ...
def varints(values: ReadableBuffer, count: int, stride: int, add: int, step: int) -> bytes: ...
def select_frames(
    program: ReadableBuffer, buffer: ReadableBuffer, max_frames: int
) -> tuple[list[tuple[int, int, int, int]], int]: ...
