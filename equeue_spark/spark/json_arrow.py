"""JSON values decoded into an Arrow struct column, batch-wise.

The fast path hands the whole batch to pyarrow's JSON reader (C++): the
values joined with ``\\n``, parsed with the explicit reader type. It is taken
only when it cannot mis-split or mis-read the batch: no value holds a newline
(the reader splits rows at them), every value starts with ``{`` and ends with
``}`` (pyarrow 26 crashes on a batch whose only row is ``null``), the type has
no map (the reader builds no maps) and the result has exactly one row per
value (``{..}{..}`` in one value makes two). The count cannot catch values
that are each invalid JSON yet add up to as many objects as values
(``{"a":"}`` + ``{","b":1}`` + ``{}{}``): rows written by a validating
producer are never such. Anything else, and any
``ArrowInvalid``, sends the batch row by row (``json.loads`` and a checked
conversion), which also finds the bad rows and says what is wrong with each.

Values are matched to the type by field name: fields the type lacks are
ignored, missing ones are null (JSON evolves without resolution). A string
field takes any JSON value, non-strings as their JSON text (as Spark's JSON
reader does). Dates are parsed as strings and cast (pyarrow's JSON reader
builds no ``date32``). Pyspark-free.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

Bad = list[tuple[int, str]]
"""Rows that do not decode: (row index, reason), in row order."""

INT64 = (-(2**63), 2**63 - 1)
BLOCK = 64 * 1024
"""Block size of the fast path's reader (it grows to hold the longest value)."""


def decode_json(values: pa.Array, kind: pa.StructType) -> tuple[pa.StructArray, Bad]:
    """``values`` (binary) decoded into ``kind``: the struct array (bad and
    null rows null) and the bad rows."""
    if len(values) == 0:
        return pa.array([], type=kind), []
    if values.type != pa.binary():
        values = values.cast(pa.binary())
    if _fast_path_allowed(values, kind):
        try:
            decoded = _fast(values, kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            decoded = None
        if decoded is not None:
            return decoded, []
    return decode_rows(values, kind)


def _value_bytes(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The values' bytes (one uint8 view, no copy) and their offsets into it."""
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)
    offsets = offsets[values.offset : values.offset + len(values) + 1]
    data_buf = values.buffers()[2]
    if data_buf is None:
        return np.zeros(0, dtype=np.uint8), offsets - offsets[0]
    return np.frombuffer(data_buf, dtype=np.uint8)[offsets[0] : offsets[-1]], offsets - offsets[0]


def _fast_path_allowed(values: pa.Array, kind: pa.DataType) -> bool:
    if values.null_count or _has_map(kind):
        return False
    data, offsets = _value_bytes(values)
    starts, ends = offsets[:-1], offsets[1:]
    if np.any(ends <= starts):  # an empty value
        return False
    if np.any(data == 0x0A) or np.any(data == 0x0D):
        return False
    return bool(np.all(data[starts] == ord("{")) and np.all(data[ends - 1] == ord("}")))


def _has_map(kind: pa.DataType) -> bool:
    if pa.types.is_map(kind):
        return True
    if pa.types.is_struct(kind):
        return any(_has_map(f.type) for f in kind)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_map(kind.value_type)
    return False


def _parse_type(kind: pa.DataType) -> pa.DataType:
    """``kind`` with dates as strings (cast after parsing)."""
    if pa.types.is_date32(kind):
        return pa.string()
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_parse_type(f.type)) for f in kind])
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_parse_type(kind.value_type)))
    return kind


def _fast(values: pa.Array, kind: pa.StructType) -> pa.StructArray | None:
    # One row per line (a vectorized insert of the newlines, one copy) lets
    # the reader parse in blocks of BLOCK bytes: cache-sized blocks parse
    # about 3x faster than the whole batch as one block.
    data, offsets = _value_bytes(values)
    lined = np.insert(data, offsets[1:-1], 0x0A)
    longest = int(np.max(np.diff(offsets)))
    parse = _parse_type(kind)
    table = pj.read_json(
        pa.BufferReader(pa.py_buffer(lined)),
        read_options=pj.ReadOptions(use_threads=False, block_size=max(BLOCK, 2 * longest + 2)),
        parse_options=pj.ParseOptions(
            explicit_schema=pa.schema(list(parse)), unexpected_field_behavior="ignore"
        ),
    )
    if table.num_rows != len(values):
        return None
    arrays = [c.combine_chunks() if c.num_chunks != 1 else c.chunk(0) for c in table.columns]
    struct = pa.StructArray.from_arrays(arrays, fields=list(parse))
    return struct.cast(kind) if parse != kind else struct


# -- the row path --------------------------------------------------------------------


class _Mismatch(ValueError):
    pass


def decode_rows(values: pa.Array, kind: pa.StructType) -> tuple[pa.StructArray, Bad]:
    """The row-by-row decode: every row checked, bad ones reported."""
    rows: list[Any] = []
    bad: Bad = []
    for i, value in enumerate(values):
        raw = value.as_py()
        if raw is None:
            rows.append(None)
            continue
        try:
            rows.append(decode_one(raw, kind))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            rows.append(None)
            bad.append((i, _reason(exc)))
    return pa.array(rows, type=kind), bad


def decode_one(raw: bytes, kind: pa.StructType) -> dict[str, Any] | None:
    """One value as the Python row of ``kind``; ``ValueError`` says why not."""
    if not raw:
        raise _Mismatch("empty value")
    doc = json.loads(raw)
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise _Mismatch(f"expected a JSON object, got {_kind_of(doc)}")
    return _struct(doc, kind, "")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON: {exc.msg} at byte {exc.pos}"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 at byte {exc.start}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc)


def _kind_of(doc: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    for t, name in names.items():
        if isinstance(doc, t):
            return name
    return "null" if doc is None else "a number"


def _struct(doc: dict[str, Any], kind: pa.StructType, path: str) -> dict[str, Any]:
    return {f.name: _convert(doc.get(f.name), f.type, f"{path}/{f.name}") for f in kind}


def _convert(doc: Any, kind: pa.DataType, path: str) -> Any:
    if doc is None:
        return None
    if pa.types.is_string(kind):
        return _text(doc, path) if isinstance(doc, str) else json.dumps(doc, separators=(",", ":"))
    if pa.types.is_struct(kind):
        _expect(isinstance(doc, dict), doc, "an object", path)
        return _struct(doc, kind, path)
    if pa.types.is_list(kind):
        _expect(isinstance(doc, list), doc, "an array", path)
        return [_convert(x, kind.value_type, f"{path}/{i}") for i, x in enumerate(doc)]
    if pa.types.is_map(kind):
        _expect(isinstance(doc, dict), doc, "an object", path)
        return [
            (_text(k, path), _convert(v, kind.item_type, f"{path}/{k}")) for k, v in doc.items()
        ]
    if pa.types.is_boolean(kind):
        _expect(isinstance(doc, bool), doc, "a boolean", path)
        return doc
    if pa.types.is_integer(kind):
        whole = isinstance(doc, int) or (isinstance(doc, float) and doc.is_integer())
        _expect(whole and not isinstance(doc, bool), doc, "an integer", path)
        if not INT64[0] <= doc <= INT64[1]:
            raise _Mismatch(f"{path or '/'}: {doc} is out of the long range")
        return int(doc)
    if pa.types.is_floating(kind):
        _expect(isinstance(doc, int | float) and not isinstance(doc, bool), doc, "a number", path)
        return float(doc)
    if pa.types.is_timestamp(kind):
        _expect(isinstance(doc, str), doc, "a date-time string", path)
        return _timestamp(doc, path)
    if pa.types.is_date32(kind):
        _expect(isinstance(doc, str), doc, "a date string", path)
        try:
            return dt.date.fromisoformat(doc)
        except ValueError:
            raise _Mismatch(f"{path}: {doc!r} is not a date (YYYY-MM-DD)") from None
    raise _Mismatch(f"{path}: no JSON decoding into {kind}")


def _text(doc: str, path: str) -> str:
    """``doc`` if it is Unicode text: JSON's ``\\ud800`` escapes decode to lone
    surrogates, which no UTF-8 column holds (pyarrow would fail the whole batch)."""
    if not doc.isascii():
        try:
            doc.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _Mismatch(
                f"{path or '/'}: a string with a lone surrogate \\u{ord(doc[exc.start]):04x}"
            ) from None
    return doc


def _timestamp(doc: str, path: str) -> dt.datetime:
    try:
        stamp = dt.datetime.fromisoformat(doc)
    except ValueError:
        raise _Mismatch(f"{path}: {doc!r} is not an ISO-8601 date-time") from None
    if stamp.tzinfo is None:  # as pyarrow's reader: no offset means UTC
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp


def _expect(ok: bool, doc: Any, what: str, path: str) -> None:
    if not ok:
        raise _Mismatch(f"{path or '/'}: expected {what}, got {_kind_of(doc)}")
