"""The pure-Python reference of the Avro decoder (``equeue_proto/_avro.c``).

``validate_datum`` walks the writer schema over a datum making the C decoder's
structural checks (same reasons, same byte positions); ``fastavro.schemaless_reader``
then decodes and resolves the value and ``to_arrow_value`` shapes it for ``pa.array``
in Spark's type (``avro_columns.arrow_type``). Used when the C extension is not built,
with ``EQUEUE_PURE_PYTHON=1``, and for constructs the program compiler does not take.
A union of two branches of the same Python type (e.g. [int, long, string]) can only be
told apart by the C decoder: here the first such branch is taken.
"""

from __future__ import annotations

import io
import json
from decimal import Decimal
from functools import lru_cache
from typing import Any

import pyarrow as pa

from equeue_spark.client.avro_columns import (
    KEPT_LOGICAL,
    Node,
    arrow_type,
    parse_schema,
    reader_record,
    union_shape,
)


class BadDatum(ValueError):
    """A datum that does not decode; the message names the byte position."""


class _Reader:
    """Walks a writer schema over one datum with the C decoder's checks."""

    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def fail(self, what: str, at: int) -> BadDatum:
        return BadDatum(f"{what} at byte {at} of {len(self.buf)}")

    def long(self) -> int:
        start, shift, v = self.pos, 0, 0
        while self.pos < len(self.buf):
            b = self.buf[self.pos]
            self.pos += 1
            v |= (b & 0x7F) << shift
            if not b & 0x80:
                v &= (1 << 64) - 1
                return (v >> 1) ^ -(v & 1)
            shift += 7
            if shift > 63:
                raise self.fail("varint longer than 10 bytes", start)
        raise self.fail("unexpected end of data", start)

    def take(self, n: int, at: int) -> bytes:
        if n < 0:
            raise self.fail("negative length", at)
        if len(self.buf) - self.pos < n:
            raise self.fail("unexpected end of data", at)
        self.pos += n
        return self.buf[self.pos - n : self.pos]

    def walk(self, n: Node) -> None:
        at, k = self.pos, n.kind
        if k in ("int", "long", "enum"):
            v = self.long()
            if k == "int" and not -(2**31) <= v < 2**31:
                raise self.fail("int out of range", at)
            if k == "enum" and not 0 <= v < len(n.symbols):
                raise self.fail("enum index out of range", at)
        elif k == "boolean":
            if self.take(1, at)[0] > 1:
                raise self.fail("bad boolean", at)
        elif k in ("float", "double", "fixed"):
            self.take({"float": 4, "double": 8}.get(k, n.size), at)
        elif k in ("bytes", "string"):
            data = self.take(self.long(), at)
            if k == "string":
                self.utf8(data, at)
        elif k == "record":
            for f in n.fields:
                self.walk(f.type)
        elif k == "union":
            i = self.long()
            if not 0 <= i < len(n.branches):
                raise self.fail("union branch out of range", at)
            self.walk(n.branches[i])
        elif k in ("array", "map"):
            assert n.items is not None
            self.blocks(n.items, k == "map")

    def blocks(self, item: Node, is_map: bool) -> None:
        while True:
            at = self.pos
            count = self.long()
            if count == 0:
                return
            if count < 0:
                if count == -(2**63):
                    raise self.fail("bad block count", at)
                count = -count
                self.long()  # the block's size in bytes
            for _ in range(count):
                if is_map:
                    kat = self.pos
                    self.utf8(self.take(self.long(), kat), kat)
                self.walk(item)

    def utf8(self, data: bytes, at: int) -> None:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail("invalid UTF-8", at) from None


def validate_datum(writer: Node, buf: bytes) -> None:
    """Raise ``BadDatum`` unless ``buf`` is exactly one well-formed ``writer`` value."""
    r = _Reader(buf)
    r.walk(writer)
    if r.pos != len(buf):
        raise BadDatum(f"{len(buf) - r.pos} bytes left over at byte {r.pos} of {len(buf)}")


def _fastavro_json(js: Any) -> Any:
    """``js`` without the logical types Spark reads as their underlying type (uuid, time-*)."""
    if isinstance(js, list):
        return [_fastavro_json(b) for b in js]
    if not isinstance(js, dict):
        return js
    out = {k: _fastavro_json(v) for k, v in js.items() if k != "fields"}
    if "fields" in js:
        out["fields"] = [{**f, "type": _fastavro_json(f["type"])} for f in js["fields"]]
    if out.get("logicalType") not in KEPT_LOGICAL:
        out.pop("logicalType", None)
    return out


@lru_cache(maxsize=64)
def _fastavro_schemas(writer: str, reader: str) -> tuple[Any, Any]:
    import fastavro

    w = fastavro.parse_schema(_fastavro_json(json.loads(writer)))
    r = fastavro.parse_schema(_fastavro_json(json.loads(reader)))
    return w, r


def _branch(members: list[Node], v: Any) -> tuple[int, Any]:
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
        for i, m in enumerate(members):
            if m.name and v[0] in (m.name, m.short):
                return i, v[1]
    for i, m in enumerate(members):
        if not m.name and _py_kind(m, v):
            return i, v
    raise ValueError(f"no union branch for {v!r}")


def _py_kind(m: Node, v: Any) -> bool:
    import datetime

    if m.logical == "date":
        return isinstance(v, datetime.date) and not isinstance(v, datetime.datetime)
    if m.logical:
        want = Decimal if m.logical == "decimal" else datetime.datetime
        return isinstance(v, want)
    k = m.kind
    if k in ("float", "double"):
        return isinstance(v, float)
    if k in ("int", "long"):
        return isinstance(v, int) and not isinstance(v, bool)
    types: dict[str, Any] = {"boolean": bool, "string": str, "bytes": bytes}
    types.update({"array": list, "map": dict})
    return isinstance(v, types[k])


def to_arrow_value(n: Node, v: Any) -> Any:
    """A fastavro value of reader type ``n`` as ``pa.array`` takes it for ``arrow_type(n)``."""
    if v is None:
        return None
    k = n.kind
    if k == "union":
        shape, members = union_shape(n)
        if shape == "nullable":
            return to_arrow_value(members[0], v)
        if shape != "struct":
            return float(v) if shape == "double" else v
        i, inner = _branch(members, v)
        return {
            f"member{j}": to_arrow_value(m, inner) if j == i else None
            for j, m in enumerate(members)
        }
    if k == "record":
        return {f.name: to_arrow_value(f.type, v.get(f.name)) for f in n.fields}
    if k == "array":
        assert n.items is not None
        return [to_arrow_value(n.items, x) for x in v]
    if k == "map":
        assert n.items is not None
        return [(key, to_arrow_value(n.items, x)) for key, x in v.items()]
    if n.logical == "decimal":
        t = v.as_tuple()
        digits = int("".join(map(str, t.digits)) or "0") * 10 ** (int(t.exponent) + n.scale)
        if digits >= 10**n.precision:
            raise ValueError(f"decimal {v} exceeds precision {n.precision}")
    return v


def decode_reference(
    values: list[bytes | None], writer: str, reader: str
) -> tuple[pa.StructArray, list[tuple[int, str]]]:
    """The pure-Python decode of ``values`` (None: a null row): fastavro per value."""
    import fastavro

    r = reader_record(reader)
    w = parse_schema(writer)
    fw, fr = _fastavro_schemas(writer, reader)
    out: list[Any] = []
    bad: list[tuple[int, str]] = []
    for row, buf in enumerate(values):
        if buf is None:
            out.append(None)
            continue
        try:
            validate_datum(w, buf)
            value = fastavro.schemaless_reader(
                io.BytesIO(buf),
                fw,
                fr,
                return_named_type=True,
                return_named_type_override=True,
            )
            out.append(to_arrow_value(r, value))
        except Exception as e:  # any failure of a datum makes it a bad row
            out.append(None)
            reason = str(e) if isinstance(e, BadDatum) else f"{type(e).__name__}: {e}"
            bad.append((row, reason))
    return pa.array(out, type=arrow_type(r)), bad
