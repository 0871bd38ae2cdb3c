from _typeshed import ReadableBuffer

def decode(
    program: ReadableBuffer,
    data: ReadableBuffer,
    offsets: ReadableBuffer,
    offset_width: int,
    start: int,
    count: int,
    validity: ReadableBuffer | None,
) -> tuple[
    list[tuple[int, int, bytes | None, bytes | None, bytes | None]],
    list[tuple[int, int, int, int, int, int]],
]:
    """Run an ``avro_columns`` program over values ``start..start+count`` of a binary array.

    Returns per slot (length, null count, validity, offsets, data) and the bad rows as
    (row, error code, byte position, value length, pool offset, pool length).
    """
