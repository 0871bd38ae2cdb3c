"""Filter expressions' trees: what they mean over a record, and the program C runs.

``selector.py`` parses an expression (RocketMQ's SQL92 subset) into the tree
defined here; ``evaluate`` is the reference meaning of a tree over a record
(SQL's three-valued logic and the conversions selector.py describes), and
``compile_program`` its postfix form for the C evaluator
(``_codec.select_frames``, run by ``selection.py``), which a property test
holds equal to ``evaluate``. Imports only the ``keys`` header's definition.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from equeue_proto.message_keys import KEYS_HEADER, MAX_EXTRA_KEYS, split_keys

# Truth values (SQL three-valued logic).
FALSE, TRUE, UNKNOWN = 0, 1, 2

# Operand kinds.
TAG, KEY, KEYS, TIMESTAMP, STORE_TIMESTAMP, HEADER = 1, 2, 3, 4, 5, 6

# Comparison types.
T_STR, T_BYTES, T_NUM, T_BOOL = 1, 2, 3, 4

# Comparison operators.
EQ, NE, LT, LE, GT, GE = 1, 2, 3, 4, 5, 6

_NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\Z")
_INT64 = (-(1 << 63), (1 << 63) - 1)


# -- the tree --------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    kind: int
    name: str = ""  # a header's name


@dataclass(frozen=True)
class Literal:
    raw: bytes | None  # the operand's bytes; None for NULL
    type: int  # the literal's own type (T_*), T_STR for NULL
    text: str  # as written back (normalized)


Operand = Field | Literal


@dataclass(frozen=True)
class Compare:
    op: int
    type: int
    left: Operand
    right: Operand


@dataclass(frozen=True)
class In:
    operand: Operand
    type: int
    items: tuple[Literal, ...]
    negated: bool


@dataclass(frozen=True)
class IsNull:
    operand: Operand
    negated: bool


@dataclass(frozen=True)
class Const:
    value: bool


@dataclass(frozen=True)
class Not:
    child: Node


@dataclass(frozen=True)
class And:
    children: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    children: tuple[Node, ...]


Node = Compare | In | IsNull | Const | Not | And | Or


class Record(Protocol):
    """What an expression reads of a record (``selection.FrameRecord`` is one)."""

    def tag(self) -> bytes | None: ...
    def key(self) -> bytes | None: ...
    def header(self, name: str) -> bytes | None: ...
    def producer_ms(self) -> int: ...
    def store_ms(self) -> int: ...


# -- the reference evaluator -----------------------------------------------------------


Value = bytes | int | float | None


def convert(raw: bytes | None, type_: int) -> Value:
    """An operand's bytes as a comparison of ``type_`` sees them (None = NULL)."""
    if raw is None:
        return None
    if type_ == T_BYTES:
        return raw
    if type_ == T_STR:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return raw
    if type_ == T_BOOL:
        lowered = raw.lower()
        return 1 if lowered == b"true" else 0 if lowered == b"false" else None
    return to_number(raw)


def to_number(raw: bytes) -> int | float | None:
    """A decimal number: an int64 when written as an integer in range, else a float."""
    if len(raw) > 400 or not _NUMBER.match(raw):
        return None
    if b"." not in raw and b"e" not in raw and b"E" not in raw and len(raw) <= 20:
        value = int(raw)
        if _INT64[0] <= value <= _INT64[1]:
            return value
    return float(raw)


def _operand_raw(operand: Operand, record: Record) -> bytes | None:
    if isinstance(operand, Literal):
        return operand.raw
    kind = operand.kind
    if kind == TAG:
        return record.tag()
    if kind == KEY:
        return record.key()
    if kind == TIMESTAMP:
        return str(record.producer_ms()).encode()
    if kind == STORE_TIMESTAMP:
        return str(record.store_ms()).encode()
    return record.header(operand.name)


def record_keys(record: Record) -> list[bytes]:
    """The key and the extra keys of a record (``keys``: the first
    ``MAX_EXTRA_KEYS`` of its ``keys`` header, as the key index takes them)."""
    keys = []
    key = record.key()
    if key is not None:
        keys.append(key)
    extra = record.header(KEYS_HEADER)
    if extra is not None:
        keys.extend(split_keys(extra))
    return keys


def _compare(op: int, a: Value, b: Value) -> int:
    if a is None or b is None:
        return UNKNOWN
    if isinstance(a, bytes) or isinstance(b, bytes):
        assert isinstance(a, bytes) and isinstance(b, bytes)
        x: object = a
        y: object = b
    elif isinstance(a, int) and isinstance(b, int):
        x, y = a, b
    else:
        x, y = float(a), float(b)
    result = {
        EQ: x == y, NE: x != y, LT: x < y, LE: x <= y, GT: x > y, GE: x >= y,  # type: ignore[operator]
    }[op]  # fmt: skip
    return TRUE if result else FALSE


def _keys_match(record: Record, type_: int, wanted: Sequence[Value]) -> int:
    """TRUE if any of the record's keys equals one of ``wanted``; UNKNOWN if it has none
    (of this type)."""
    values = [v for v in (convert(k, type_) for k in record_keys(record)) if v is not None]
    if not values:
        return UNKNOWN
    for v in values:
        for w in wanted:
            if w is not None and _compare(EQ, v, w) == TRUE:
                return TRUE
    return FALSE


def _negate(value: int) -> int:
    return UNKNOWN if value == UNKNOWN else 1 - value


def _eval_compare(node: Compare, record: Record) -> int:
    left, right = node.left, node.right
    for keys_side, other in ((left, right), (right, left)):
        if isinstance(keys_side, Field) and keys_side.kind == KEYS:
            wanted = convert(_operand_raw(other, record), node.type)
            if wanted is None:
                return UNKNOWN
            found = _keys_match(record, node.type, [wanted])
            return found if node.op == EQ else _negate(found)
    a = convert(_operand_raw(left, record), node.type)
    b = convert(_operand_raw(right, record), node.type)
    return _compare(node.op, a, b)


def _eval_in(node: In, record: Record) -> int:
    wanted = [convert(item.raw, node.type) for item in node.items]
    operand = node.operand
    if isinstance(operand, Field) and operand.kind == KEYS:
        found = _keys_match(record, node.type, wanted)
    else:
        value = convert(_operand_raw(operand, record), node.type)
        if value is None:
            return UNKNOWN
        found = FALSE
        for w in wanted:
            if w is not None and _compare(EQ, value, w) == TRUE:
                found = TRUE
                break
    return _negate(found) if node.negated else found


def evaluate(node: Node, record: Record) -> int:
    """TRUE, FALSE or UNKNOWN: ``node`` over ``record`` (SQL three-valued logic)."""
    if isinstance(node, Compare):
        return _eval_compare(node, record)
    if isinstance(node, In):
        return _eval_in(node, record)
    if isinstance(node, IsNull):
        operand = node.operand
        if isinstance(operand, Field) and operand.kind == KEYS:
            missing = not record_keys(record)
        else:
            missing = _operand_raw(operand, record) is None
        return TRUE if missing != node.negated else FALSE
    if isinstance(node, Const):
        return TRUE if node.value else FALSE
    if isinstance(node, Not):
        return _negate(evaluate(node.child, record))
    if isinstance(node, And):
        result = TRUE
        for child in node.children:
            value = evaluate(child, record)
            if value == FALSE:
                return FALSE
            if value == UNKNOWN:
                result = UNKNOWN
        return result
    result = FALSE
    for child in node.children:
        value = evaluate(child, record)
        if value == TRUE:
            return TRUE
        if value == UNKNOWN:
            result = UNKNOWN
    return result


# -- the compiled program (what the C evaluator runs) ----------------------------------
#
# Little-endian, postfix; each instruction pushes or combines tri-state values:
#   OP_CONST  u8 value                      push TRUE/FALSE
#   OP_CMP    u8 op | u8 type | operand a | operand b
#   OP_IN     u8 type | u8 flags | operand x | u16 count | [count x u32 offset] | count x literal
#             flags: IN_NEGATED | IN_SORTED (the items ascending, distinct, of one
#             kind, none NULL, after a table of each one's offset from the first:
#             C binary-searches them, so a long list costs a record log2(count))
#   OP_ISNULL u8 negated | operand x
#   OP_NOT
#   OP_AND    u16 n   (pops n)              OP_OR u16 n
#   OP_END
# operand := u8 0 (NULL) | u8 1 literal | u8 2 u8 field kind | u16 name length | name
# literal (converted to the comparison's type at compile time):
#   u8 0 (NULL after conversion) | u8 1 u32 length | bytes (string/bytes)
#   | u8 2 i64 (int) | u8 3 f64 (float) | u8 4 u8 (boolean)

OP_END, OP_CONST, OP_CMP, OP_IN, OP_ISNULL, OP_NOT, OP_AND, OP_OR = range(8)


IN_NEGATED, IN_SORTED = 1, 2
SORT_IN_FROM = 8
"""IN lists of this many items or more are compiled sorted (IN_SORTED)."""


def _in_code(node: In) -> tuple[bytes, int, bytes]:
    """An IN list's flags, count and items: sorted when long and of one kind."""
    flags = IN_NEGATED if node.negated else 0
    # Items NULL after conversion never match: left out.
    values = [v for v in (convert(item.raw, node.type) for item in node.items) if v is not None]
    if len(values) < SORT_IN_FROM or len({type(v) for v in values}) != 1:
        # Short, or ints mixed with floats (C compares those as doubles: no
        # order both sides agree on), so scanned.
        items = b"".join(_value_code(v, node.type) for v in values)
        return bytes([flags]), len(values), items
    codes = [_value_code(v, node.type) for v in sorted(set(values))]
    offsets, at = bytearray(), 0
    for code in codes:
        offsets += struct.pack("<I", at)
        at += len(code)
    return bytes([flags | IN_SORTED]), len(codes), bytes(offsets) + b"".join(codes)


def _literal_code(raw: bytes | None, type_: int) -> bytes:
    return _value_code(convert(raw, type_), type_)


def _value_code(value: Value, type_: int) -> bytes:
    if value is None:
        return b"\x00"
    if isinstance(value, bytes):
        return b"\x01" + struct.pack("<I", len(value)) + value
    if type_ == T_BOOL:
        return b"\x04" + bytes([int(value)])
    if isinstance(value, int):
        return b"\x02" + struct.pack("<q", value)
    return b"\x03" + struct.pack("<d", value)


def _operand_code(operand: Operand, type_: int) -> bytes:
    if isinstance(operand, Literal):
        return b"\x01" + _literal_code(operand.raw, type_) if operand.raw is not None else b"\x00"
    name = operand.name.encode()
    return b"\x02" + bytes([operand.kind]) + struct.pack("<H", len(name)) + name


def _emit(node: Node, out: bytearray) -> None:
    if isinstance(node, Compare):
        out += bytes([OP_CMP, node.op, node.type])
        out += _operand_code(node.left, node.type) + _operand_code(node.right, node.type)
    elif isinstance(node, In):
        flags, count, items = _in_code(node)
        out += bytes([OP_IN, node.type]) + flags
        out += _operand_code(node.operand, node.type) + struct.pack("<H", count) + items
    elif isinstance(node, IsNull):
        out += bytes([OP_ISNULL, int(node.negated)]) + _operand_code(node.operand, T_BYTES)
    elif isinstance(node, Const):
        out += bytes([OP_CONST, int(node.value)])
    elif isinstance(node, Not):
        _emit(node.child, out)
        out.append(OP_NOT)
    else:
        for child in node.children:
            _emit(child, out)
        out += bytes([OP_AND if isinstance(node, And) else OP_OR])
        out += struct.pack("<H", len(node.children))


def cost(node: Node) -> int:
    """About how many value comparisons ``node`` makes over one record at most
    (``keys`` stands for a record's key and extra keys; an IN list is
    binary-searched once long): what bounds a filtered read's scan."""
    if isinstance(node, Compare | In | IsNull):
        operands = (node.left, node.right) if isinstance(node, Compare) else (node.operand,)
        values = 1 + MAX_EXTRA_KEYS if any(_is_keys(o) for o in operands) else 1
        if isinstance(node, In):
            n = len(node.items)
            return values * (n if n < SORT_IN_FROM else n.bit_length() + 1)
        return values
    if isinstance(node, Const):
        return 1
    if isinstance(node, Not):
        return 1 + cost(node.child)
    return 1 + sum(cost(child) for child in node.children)


def _is_keys(operand: Operand) -> bool:
    return isinstance(operand, Field) and operand.kind == KEYS


def compile_program(root: Node) -> bytes:
    """The postfix program of ``root`` (format above)."""
    out = bytearray()
    _emit(root, out)
    out.append(OP_END)
    return bytes(out)
