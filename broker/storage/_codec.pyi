from collections.abc import Sequence

from _typeshed import ReadableBuffer, WriteableBuffer

HARDWARE_CRC: int

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
) -> int: ...
def crc32c(data: ReadableBuffer) -> int: ...
def measure_batch(
    values: Sequence[bytes],
    keys: Sequence[bytes | None] | None,
    tags: Sequence[bytes] | None,
    headers: Sequence[bytes] | None,
    fixed: int,
) -> tuple[int, int, int, int]: ...
def decode_frames(
    records: ReadableBuffer,
) -> list[tuple[str, int, int, int, bytes | None, bytes, str, bytes, int, int]]: ...
