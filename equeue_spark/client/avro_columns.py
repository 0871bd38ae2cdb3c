"""Avro values to Arrow columns: the schema model, the program compiler and the reference.

``compile_program(writer, reader)`` resolves a writer schema against a reader schema
(Avro's rules: writer-only fields skipped, reader-only fields from their defaults,
promotions int->long/float/double, long->float/double, float->double, string<->bytes,
enum symbols by name, unions by branch) into a flat program of int32 words that the C
interpreter ``equeue_proto._avro.decode`` runs over a whole batch of values, writing
Arrow-layout buffers per output column ("slot"). The Arrow type is Spark's
(``SchemaConverters``): see ``arrow_type``.

``avro_reference.decode_reference`` is the pure-Python reference (fastavro per
value); a test holds the two equal.

Strictness (both paths): a datum must be exactly one value (no bytes left over), a
varint at most 10 bytes, an ``int`` within 32 bits, a boolean 0 or 1, strings valid
UTF-8, timestamps and dates within years 1-9999 (Python's and Spark's range), a
decimal within its precision.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pyarrow as pa

PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
NO_DEFAULT: Any = object()
MAX_DECIMAL_PRECISION = 38
_TS_MILLIS = ("timestamp-millis", "local-timestamp-millis")
_TS_MICROS = ("timestamp-micros", "local-timestamp-micros")
KEPT_LOGICAL = ("date", "decimal", *_TS_MILLIS, *_TS_MICROS)
"""Logical types Spark converts; others (uuid, time-*) read as their underlying type."""


class Unsupported(ValueError):
    """A schema construct Spark cannot read (recursive records, a bare null, ...)."""


@dataclass(eq=False)
class Field:
    name: str
    type: Node
    default: Any = NO_DEFAULT
    aliases: tuple[str, ...] = ()


@dataclass(eq=False)
class Node:
    """One parsed Avro schema (named types shared by reference)."""

    kind: str
    logical: str = ""
    name: str = ""
    """Full name of a record, enum or fixed."""
    aliases: tuple[str, ...] = ()
    fields: list[Field] = field(default_factory=list)
    symbols: list[str] = field(default_factory=list)
    enum_default: str | None = None
    size: int = 0
    items: Node | None = None
    """Array items or map values."""
    branches: list[Node] = field(default_factory=list)
    precision: int = 0
    scale: int = 0

    @property
    def short(self) -> str:
        return self.name.rsplit(".", 1)[-1]


class _Parser:
    def __init__(self) -> None:
        self.names: dict[str, Node] = {}
        self.open: set[str] = set()

    def node(self, js: Any, ns: str) -> Node:
        if isinstance(js, list):
            return Node("union", branches=[self.node(b, ns) for b in js])
        if isinstance(js, str):
            return Node(js) if js in PRIMITIVES else self._named(js, ns)
        if not isinstance(js, dict) or "type" not in js:
            raise ValueError(f"not an Avro schema: {json.dumps(js)[:80]}")
        kind = js["type"]
        if kind in ("record", "error", "enum", "fixed"):
            return self._define(js, ns)
        if kind == "array":
            return Node("array", items=self.node(js["items"], ns))
        if kind == "map":
            return Node("map", items=self.node(js["values"], ns))
        base = self.node(kind, ns)
        return _logical(base, js) if base.kind in PRIMITIVES else base

    def _named(self, name: str, ns: str) -> Node:
        full = name if "." in name or not ns else f"{ns}.{name}"
        for candidate in (full, name):
            if candidate in self.open:
                raise Unsupported(
                    f"recursive Avro type {candidate}: Spark cannot read recursive records"
                )
            if candidate in self.names:
                return self.names[candidate]
        raise ValueError(f"unknown Avro type {name!r}")

    def _define(self, js: dict[str, Any], ns: str) -> Node:
        name = str(js["name"])
        ns = str(js.get("namespace", ns) or "") if "." not in name else name.rsplit(".", 1)[0]
        full = name if "." in name or not ns else f"{ns}.{name}"
        aliases = tuple(str(a) for a in js.get("aliases", ()))
        if js["type"] == "enum":
            node = Node("enum", name=full, aliases=aliases, symbols=list(js["symbols"]))
            node.enum_default = js.get("default")
        elif js["type"] == "fixed":
            node = _logical(Node("fixed", name=full, aliases=aliases, size=int(js["size"])), js)
        else:
            node = Node("record", name=full, aliases=aliases)
            self.open.add(full)
            for f in js["fields"]:
                node.fields.append(
                    Field(
                        str(f["name"]),
                        self.node(f["type"], ns),
                        f.get("default", NO_DEFAULT),
                        tuple(str(a) for a in f.get("aliases", ())),
                    )
                )
            self.open.discard(full)
        self.names[full] = node
        return node


def _logical(node: Node, js: dict[str, Any]) -> Node:
    logical = js.get("logicalType", "")
    ok = {
        "date": ("int",),
        "decimal": ("bytes", "fixed"),
        "uuid": ("string",),
        **{t: ("long",) for t in (*_TS_MILLIS, *_TS_MICROS)},
    }
    if logical not in ok or node.kind not in ok[logical]:
        return node  # unknown or misplaced logical types are ignored (Avro spec)
    node.logical = logical
    if logical == "decimal":
        node.precision, node.scale = int(js.get("precision", 0)), int(js.get("scale", 0))
        if node.precision > MAX_DECIMAL_PRECISION:
            raise Unsupported(f"decimal precision {node.precision} > 38: Spark cannot read it")
        if node.precision <= 0 or not 0 <= node.scale <= node.precision:
            node.logical = ""
    return node


@lru_cache(maxsize=256)
def parse_schema(text: str) -> Node:
    """The schema tree of Avro schema JSON text (``ValueError`` if invalid)."""
    return _Parser().node(json.loads(text), "")


# ---- Spark's types (SchemaConverters) ---------------------------------------


def union_shape(node: Node) -> tuple[str, list[Node]]:
    """How Spark reads a union: "nullable" ([T]), "long"/"double" or "struct" (members)."""
    members = [b for b in node.branches if b.kind != "null"]
    if not members:
        raise Unsupported("a union of only null: Spark cannot read it")
    if len(members) == 1:
        return "nullable", members
    kinds = {m.kind for m in members}
    if len(members) == 2 and kinds == {"int", "long"}:
        return "long", members
    if len(members) == 2 and kinds == {"float", "double"}:
        return "double", members
    return "struct", members


def arrow_type(node: Node) -> pa.DataType:
    """The Arrow type pyspark makes of Spark's type for ``node`` (all nullable)."""
    k, lg = node.kind, node.logical
    if lg == "date":
        return pa.date32()
    if lg in _TS_MILLIS + _TS_MICROS:
        return pa.timestamp("us", tz=None if lg.startswith("local") else "UTC")
    if lg == "decimal":
        return pa.decimal128(node.precision, node.scale)
    simple = {
        "boolean": pa.bool_(),
        "int": pa.int32(),
        "long": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "string": pa.string(),
        "enum": pa.string(),
        "bytes": pa.binary(),
        "fixed": pa.binary(),
    }
    if k in simple:
        return simple[k]
    if k == "record":
        return pa.struct([pa.field(f.name, arrow_type(f.type)) for f in node.fields])
    if k == "array":
        assert node.items is not None
        return pa.list_(pa.field("element", arrow_type(node.items)))
    if k == "map":
        assert node.items is not None
        return pa.map_(
            pa.field("key", pa.string(), False), pa.field("value", arrow_type(node.items))
        )
    if k == "union":
        shape, members = union_shape(node)
        if shape == "nullable":
            return arrow_type(members[0])
        if shape in ("long", "double"):
            return pa.int64() if shape == "long" else pa.float64()
        return pa.struct([pa.field(f"member{i}", arrow_type(m)) for i, m in enumerate(members)])
    raise Unsupported(f"Avro type {k} has no Spark type")


def spark_ddl(node: Node) -> str:
    """The Spark DDL type of ``node`` (the type ``arrow_type`` is pyspark's Arrow form of)."""
    t = arrow_type(node)
    return _ddl(t)


def _ddl(t: pa.DataType) -> str:
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"`{f.name}`:{_ddl(f.type)}" for f in t) + ">"
    if pa.types.is_map(t):
        return f"map<string,{_ddl(t.item_type)}>"
    if pa.types.is_list(t):
        return f"array<{_ddl(t.value_type)}>"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    names = {
        pa.bool_(): "boolean",
        pa.int32(): "int",
        pa.int64(): "bigint",
        pa.float32(): "float",
        pa.float64(): "double",
        pa.string(): "string",
        pa.binary(): "binary",
        pa.date32(): "date",
    }
    return names[t]


def reader_record(text: str) -> Node:
    node = parse_schema(text)
    if node.kind != "record":
        raise Unsupported(f"the reader schema must be an Avro record, not {node.kind}")
    arrow_type(node)  # refuses what Spark cannot read
    return node


# ---- the program ------------------------------------------------------------
# Words (int32, little-endian); "slot" is an output column (-1: read and discard).
OP_NULL, OP_BOOL, OP_INT, OP_LONG, OP_FLOAT, OP_DOUBLE, OP_BYTES, OP_FIXED = 1, 2, 3, 4, 5, 6, 7, 8
OP_DEC_BYTES, OP_DEC_FIXED, OP_ENUM, OP_RECORD, OP_ARRAY, OP_MAP = 9, 10, 11, 12, 13, 14
OP_WUNION, OP_RUNION, OP_DEFAULT, OP_BAD = 15, 16, 17, 18
# Layouts: NULL s | BOOL s | INT s to | LONG s to | FLOAT s to | DOUBLE s | BYTES s utf8 |
# FIXED s size | DEC_BYTES s prec | DEC_FIXED s size prec | ENUM s n (off len)*n |
# RECORD s n end op*n | ARRAY s end op | MAP s end op | WUNION n end pc*n op*n |
# RUNION s k end op | DEFAULT off len end op | BAD off len   (off/len: into the pool)
TO_I32, TO_I64, TO_F32, TO_F64, TO_DATE, TO_TS_MILLIS, TO_TS_MICROS = 0, 1, 2, 3, 4, 5, 6
SLOT_BOOL, SLOT_FIXED, SLOT_VAR, SLOT_STRUCT, SLOT_LIST, SLOT_MAP = 0, 1, 2, 3, 4, 5


@dataclass
class Slot:
    kind: int
    width: int
    type: pa.DataType
    children: list[int]


@dataclass(frozen=True)
class Program:
    """A compiled (writer, reader) pair: ``words`` for the C interpreter."""

    words: bytes
    """Header (4 words: slots, child words, code words, pool bytes), slot table
    (kind, width, child count, first child index), child indexes, code, pool."""
    slots: tuple[Slot, ...]
    arrow_type: pa.StructType
    constants: bytes
    """The pool (enum symbols, encoded defaults, reasons), also at the end of ``words``."""

    def pool(self, offset: int, length: int) -> str:
        return self.constants[offset : offset + length].decode()


def _slots(t: pa.DataType, out: list[Slot]) -> int:
    index = len(out)
    if pa.types.is_boolean(t):
        out.append(Slot(SLOT_BOOL, 0, t, []))
    elif pa.types.is_struct(t) or pa.types.is_list(t) or pa.types.is_map(t):
        kind = SLOT_STRUCT if pa.types.is_struct(t) else SLOT_LIST
        out.append(Slot(SLOT_MAP if pa.types.is_map(t) else kind, 0, t, []))
        if pa.types.is_map(t):
            kids = [t.key_type, t.item_type]
        elif pa.types.is_list(t):
            kids = [t.value_type]
        else:
            kids = [f.type for f in t]
        out[index].children = [_slots(k, out) for k in kids]
    elif pa.types.is_string(t) or pa.types.is_binary(t):
        out.append(Slot(SLOT_VAR, 0, t, []))
    else:
        out.append(Slot(SLOT_FIXED, t.bit_width // 8, t, []))
    return index


class _Compiler:
    def __init__(self, slots: list[Slot]) -> None:
        self.slots = slots
        self.code: list[int] = []
        self.pool = bytearray()
        self.pooled: dict[bytes, int] = {}

    def const(self, data: bytes) -> tuple[int, int]:
        if data not in self.pooled:
            self.pooled[data] = len(self.pool)
            self.pool += data
        return self.pooled[data], len(data)

    def bad(self, reason: str) -> None:
        self.code += [OP_BAD, *self.const(reason.encode())]

    def kid(self, slot: int, i: int) -> int:
        return -1 if slot < 0 else self.slots[slot].children[i]

    def value(self, w: Node, r: Node, slot: int) -> None:
        """Code that reads one ``w`` value into ``slot`` as ``r``."""
        if w.kind == "union":
            self._writer_union(w, r, slot)
        elif r.kind == "union":
            self._reader_union(w, r, slot)
        elif w.kind in ("record", "enum", "fixed") and not _same_name(w, r):
            self.bad(f"the writer's {w.kind} {w.name} is not the reader's {r.kind} {r.name}")
        elif w.kind == "record" and r.kind == "record":
            self._record(w, r, slot)
        elif w.kind == "enum" and r.kind == "enum":
            self._enum(w, r, slot)
        elif w.kind == r.kind and w.kind in ("array", "map"):
            assert w.items is not None and r.items is not None
            start = self._open(OP_ARRAY if w.kind == "array" else OP_MAP, slot)
            self.value(w.items, r.items, self.kid(slot, 0 if w.kind == "array" else 1))
            self._close(start)
        else:
            self._primitive(w, r, slot)

    def skip(self, w: Node) -> None:
        self.value(w, w, -1)

    def _open(self, op: int, *args: int) -> int:
        self.code += [op, *args, 0]
        return len(self.code) - 1

    def _close(self, end_at: int) -> None:
        self.code[end_at] = len(self.code)

    def _writer_union(self, w: Node, r: Node, slot: int) -> None:
        n = len(w.branches)
        self.code += [OP_WUNION, n, 0, *([0] * n)]
        head = len(self.code) - n - 1  # the "end" word
        for i, b in enumerate(w.branches):
            self.code[head + 1 + i] = len(self.code)
            if slot < 0:
                self.skip(b)
            else:
                self.value(b, r, slot)
        self.code[head] = len(self.code)

    def _reader_union(self, w: Node, r: Node, slot: int) -> None:
        shape, members = union_shape(r)
        if w.kind == "null":
            if any(b.kind == "null" for b in r.branches):
                self.code += [OP_NULL, slot]
            else:
                self.bad("the writer's null has no branch in the reader's union")
            return
        k = _pick_branch(w, members)
        if k < 0:
            self.bad(f"the writer's {_describe(w)} has no branch in the reader's union")
        elif shape == "struct":
            start = self._open(OP_RUNION, slot, k)
            self.value(w, members[k], self.kid(slot, k))
            self._close(start)
        elif shape == "nullable":
            self.value(w, members[0], slot)
        else:  # [int, long] read as long, [float, double] as double
            self.value(w, Node(shape), slot)

    def _record(self, w: Node, r: Node, slot: int) -> None:
        by_name: dict[str, int] = {}
        for i, f in enumerate(r.fields):
            for name in (f.name, *f.aliases):
                by_name.setdefault(name, i)
        start = len(self.code)
        self.code += [OP_RECORD, slot, 0, 0]
        count, used = 0, set()
        for wf in w.fields:
            i = by_name.get(wf.name, -1)
            if i < 0 or i in used:
                self.skip(wf.type)
            else:
                used.add(i)
                self.value(wf.type, r.fields[i].type, self.kid(slot, i))
            count += 1
        for i, rf in enumerate(r.fields):
            if i in used:
                continue
            count += 1
            if rf.default is NO_DEFAULT:
                self.bad(f"the reader's field {rf.name} is not written and has no default")
                continue
            try:
                data = encode_value(rf.type, rf.default)
            except (ValueError, TypeError, KeyError, struct.error) as e:
                raise ValueError(f"bad default of field {rf.name}: {e}") from None
            end_at = self._open(OP_DEFAULT, *self.const(data))
            self.value(rf.type, rf.type, self.kid(slot, i))
            self._close(end_at)
        self.code[start + 2] = count
        self.code[start + 3] = len(self.code)

    def _enum(self, w: Node, r: Node, slot: int) -> None:
        self.code += [OP_ENUM, slot, len(w.symbols)]
        for sym in w.symbols:
            target = sym if sym in r.symbols else r.enum_default
            self.code += [*self.const(target.encode())] if target is not None else [0, -1]

    def _primitive(self, w: Node, r: Node, slot: int) -> None:
        wk, rk = w.kind, r.kind
        if (wk, rk) == ("null", "null"):
            raise Unsupported("a bare null field: Spark cannot read it")
        if wk == "boolean" and rk == "boolean":
            self.code += [OP_BOOL, slot]
        elif wk in ("int", "long") and rk in ("int", "long", "float", "double"):
            to = _number_target(r)
            if (wk, rk) == ("long", "int"):
                self.bad("the writer's long cannot be read as the reader's int")
                return
            self.code += [OP_INT if wk == "int" else OP_LONG, slot, to]
        elif wk == "float" and rk in ("float", "double"):
            self.code += [OP_FLOAT, slot, TO_F32 if rk == "float" else TO_F64]
        elif wk == "double" and rk == "double":
            self.code += [OP_DOUBLE, slot]
        elif wk in ("bytes", "string") and rk in ("bytes", "string"):
            if r.logical == "decimal" or w.logical == "decimal":
                self._decimal(w, r, slot)
            else:
                self.code += [OP_BYTES, slot, int("string" in (wk, rk))]
        elif wk == "fixed" and rk == "fixed" and w.size == r.size:
            if r.logical == "decimal" or w.logical == "decimal":
                self._decimal(w, r, slot)
            else:
                self.code += [OP_FIXED, slot, w.size]
        else:
            self.bad(f"the writer's {_describe(w)} cannot be read as the reader's {_describe(r)}")

    def _decimal(self, w: Node, r: Node, slot: int) -> None:
        if (w.logical, w.precision, w.scale) != (r.logical, r.precision, r.scale):
            raise Unsupported("decimal resolution between different decimal types")
        if w.kind == "fixed":
            self.code += [OP_DEC_FIXED, slot, w.size, r.precision]
        else:
            self.code += [OP_DEC_BYTES, slot, r.precision]


def _number_target(r: Node) -> int:
    if r.logical == "date":
        return TO_DATE
    if r.logical in _TS_MILLIS:
        return TO_TS_MILLIS
    if r.logical in _TS_MICROS:
        return TO_TS_MICROS
    return {"int": TO_I32, "long": TO_I64, "float": TO_F32, "double": TO_F64}[r.kind]


def _describe(n: Node) -> str:
    return f"{n.kind} {n.name}" if n.name else n.kind


def _same_name(w: Node, r: Node) -> bool:
    if w.kind != r.kind:
        return False
    names = {r.name, r.short, *r.aliases, *(a.rsplit(".", 1)[-1] for a in r.aliases)}
    return w.name in names or w.short in names


_PROMOTIONS = {
    "int": ("long", "float", "double"),
    "long": ("float", "double"),
    "float": ("double",),
    "string": ("bytes",),
    "bytes": ("string",),
}


def _pick_branch(w: Node, members: list[Node]) -> int:
    """The reader branch a writer value goes to: the same type first, then a promotion."""
    for i, m in enumerate(members):
        if m.kind == w.kind and (not w.name or _same_name(w, m)):
            return i
    for i, m in enumerate(members):
        if m.kind in _PROMOTIONS.get(w.kind, ()):
            return i
    return -1


def compile_program(writer: str, reader: str) -> Program:
    """The program decoding ``writer`` datums as ``reader`` (``Unsupported`` when it cannot)."""
    return _compile(writer, reader)


@lru_cache(maxsize=64)
def _compile(writer: str, reader: str) -> Program:
    r = reader_record(reader)
    w = parse_schema(writer)
    t = arrow_type(r)
    slots: list[Slot] = []
    _slots(t, slots)
    comp = _Compiler(slots)
    comp.value(w, r, 0)
    kids: list[int] = []
    table: list[int] = []
    for s in slots:
        table += [s.kind, s.width, len(s.children), len(kids)]
        kids += s.children
    header = [len(slots), len(kids), len(comp.code), len(comp.pool)]
    words = struct.pack(
        f"<{len(header) + len(table) + len(kids) + len(comp.code)}i",
        *header,
        *table,
        *kids,
        *comp.code,
    )
    return Program(words + bytes(comp.pool), tuple(slots), t, bytes(comp.pool))


# ---- encoding defaults ------------------------------------------------------


def _zigzag(v: int) -> bytes:
    u = (v << 1) ^ (v >> 63)
    out = bytearray()
    while u > 0x7F:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def _matches(n: Node, v: Any) -> bool:
    k = n.kind
    if k == "null":
        return v is None
    if k == "boolean":
        return isinstance(v, bool)
    if k in ("int", "long"):
        return isinstance(v, int) and not isinstance(v, bool)
    if k in ("float", "double"):
        return isinstance(v, int | float) and not isinstance(v, bool)
    if k in ("string", "bytes", "fixed", "enum"):
        return isinstance(v, str | bytes)
    return isinstance(v, list) if k == "array" else isinstance(v, dict)


def encode_value(n: Node, v: Any) -> bytes:
    """The Avro binary encoding of a JSON default value ``v`` of type ``n``."""
    k = n.kind
    if k == "union":
        for i, b in enumerate(n.branches):
            if _matches(b, v):
                return _zigzag(i) + encode_value(b, v)
        raise ValueError(f"{v!r} matches no branch of the union")
    if k == "null":
        return b""
    if k == "boolean":
        return b"\x01" if v else b"\x00"
    if k in ("int", "long"):
        return _zigzag(int(v))
    if k in ("float", "double"):
        return struct.pack("<f" if k == "float" else "<d", float(v))
    if k in ("bytes", "string", "fixed"):
        data = v.encode("latin-1" if k != "string" else "utf-8") if isinstance(v, str) else v
        return data if k == "fixed" else _zigzag(len(data)) + data
    if k == "enum":
        return _zigzag(n.symbols.index(v))
    if k == "record":
        parts = []
        for f in n.fields:
            fv = v.get(f.name, f.default)
            if fv is NO_DEFAULT:
                raise ValueError(f"field {f.name} missing")
            parts.append(encode_value(f.type, fv))
        return b"".join(parts)
    assert n.items is not None
    items = list(v.items()) if k == "map" else [(None, x) for x in v]
    if not items:
        return b"\x00"
    body = b"".join(
        (encode_value(Node("string"), key) if k == "map" else b"") + encode_value(n.items, x)
        for key, x in items
    )
    return _zigzag(len(items)) + body + b"\x00"
