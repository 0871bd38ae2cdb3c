"""Avro values of an Arrow batch decoded into an Arrow struct column, column-wise.

``decode_avro`` runs the program ``client.avro_columns`` compiles for a (writer, reader)
pair in C (``equeue_proto._avro``, no Python object per record, the GIL released) and
wraps the buffers it returns with ``Array.from_buffers`` into the reader's Arrow type,
the one Spark expects (``avro_arrow_type``). ``EQUEUE_PURE_PYTHON=1``, a build without
the extension, or a schema construct the compiler does not take (logged once) use the
pure-Python reference (fastavro per value): the same result, ~50x slower.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

import pyarrow as pa

from equeue_spark.client import avro_columns as ac
from equeue_spark.client.avro_reference import decode_reference

log = logging.getLogger(__name__)

_REASONS = {
    1: "unexpected end of data",
    2: "varint longer than 10 bytes",
    3: "int out of range",
    4: "negative length",
    5: "invalid UTF-8",
    6: "bad boolean",
    7: "union branch out of range",
    8: "enum index out of range",
    10: "timestamp or date outside years 1-9999",
    11: "decimal exceeds its precision",
    13: "bad block count",
    16: "enum symbol not in the reader's schema, which has no default",
    17: "the reader's default does not decode",
}
_E_LEFT_OVER, _E_BAD = 9, 12
_logged: set[tuple[str, str]] = set()


def _load() -> Any:
    if os.environ.get("EQUEUE_PURE_PYTHON"):
        return None
    try:
        return importlib.import_module("equeue_proto._avro")
    except ImportError:  # built without a C compiler
        return None


_AVRO: Any = _load()
IMPLEMENTATION = "python" if _AVRO is None else "c"


def avro_arrow_type(reader: str) -> pa.StructType:
    """The Arrow type of the struct Spark reads ``reader`` (a record schema) as."""
    return ac.arrow_type(ac.reader_record(reader))


def avro_spark_ddl(reader: str) -> str:
    """The Spark DDL type (``struct<...>``) of ``reader``."""
    return ac.spark_ddl(ac.reader_record(reader))


def decode_avro(
    values: pa.Array, writer: str, reader: str, arrow_type: pa.StructType
) -> tuple[pa.StructArray, list[tuple[int, str]]]:
    """``values`` (binary) decoded as ``writer`` datums read with ``reader``.

    Returns the struct column (a null row for a null value or a bad datum) and the bad
    rows as (row index, reason naming the byte position), in row order.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        raise TypeError(f"Avro values must be binary, not {values.type}")
    expected = avro_arrow_type(reader)
    if arrow_type != expected:
        raise ValueError(f"arrow_type {arrow_type} is not the reader's type {expected}")
    program = None
    if _AVRO is not None:
        try:
            program = ac.compile_program(writer, reader)
        except ac.Unsupported as e:
            if (writer, reader) not in _logged:
                _logged.add((writer, reader))
                log.warning("Avro decoding in Python (slow): %s", e)
    if program is None:
        return decode_reference(values.to_pylist(), writer, reader)
    return _decode_c(program, values)


def _decode_c(
    program: ac.Program, values: pa.Array
) -> tuple[pa.StructArray, list[tuple[int, str]]]:
    validity, offsets, data = values.buffers()[:3]
    width = 8 if pa.types.is_large_binary(values.type) else 4
    slots, bad = _AVRO.decode(
        program.words, data or b"", offsets, width, values.offset, len(values), validity
    )
    column = _build(program, slots, 0)
    return column, [(entry[0], _reason(program, entry[1:])) for entry in bad]


def _reason(program: ac.Program, entry: tuple[int, int, int, int, int]) -> str:
    code, pos, length, off, n = entry
    if code == _E_BAD:
        what = program.pool(off, n)
    elif code == _E_LEFT_OVER:
        what = f"{length - pos} bytes left over"
    else:
        what = _REASONS.get(code, f"error {code}")
    return f"{what} at byte {pos} of {length}"


def _build(program: ac.Program, out: list[tuple[int, int, Any, Any, Any]], i: int) -> pa.Array:
    slot = program.slots[i]
    length, nulls, valid, offs, data = out[i]
    vbuf = pa.py_buffer(valid) if valid is not None else None
    t = slot.type
    if slot.kind in (ac.SLOT_BOOL, ac.SLOT_FIXED):
        return pa.Array.from_buffers(t, length, [vbuf, pa.py_buffer(data)], nulls)
    if slot.kind == ac.SLOT_VAR:
        return pa.Array.from_buffers(
            t, length, [vbuf, pa.py_buffer(offs), pa.py_buffer(data)], nulls
        )
    kids = [_build(program, out, c) for c in slot.children]
    if slot.kind == ac.SLOT_STRUCT:
        return pa.Array.from_buffers(t, length, [vbuf], nulls, children=kids)
    if slot.kind == ac.SLOT_MAP:
        entries_type = pa.struct([t.key_field, t.item_field])
        kids = [pa.Array.from_buffers(entries_type, len(kids[0]), [None], 0, children=kids)]
    return pa.Array.from_buffers(t, length, [vbuf, pa.py_buffer(offs)], nulls, children=kids)
