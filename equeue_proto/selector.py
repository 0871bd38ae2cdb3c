"""Filter expressions: RocketMQ's SQL92 subset over tags, keys and headers.

The contract: client, CLI and Spark parse an expression here to refuse a bad
one early; the broker parses it here and evaluates it on every record a
filtered pull inspects (``equeue_proto.selection`` runs it over stored frames,
in C when built). This module imports only the ``keys`` header's definition (``message_keys``).

Grammar (keywords case-insensitive, whitespace insignificant)::

    expr     := or
    or       := and ("OR" and)*
    and      := not ("AND" not)*
    not      := "NOT" not | pred
    pred     := "(" expr ")" | TRUE | FALSE
              | operand ("=" | "<>" | "!=" | "<" | "<=" | ">" | ">=") operand
              | operand ["NOT"] "BETWEEN" operand "AND" operand
              | operand ["NOT"] "IN" "(" literal ("," literal)* ")"
              | operand "IS" ["NOT"] "NULL"
    operand  := ident | literal
    literal  := string | bytes | number | TRUE | FALSE | NULL
    bytes    := ("X" | "x") "'" (hex hex)* "'"
    ident    := [A-Za-z_][A-Za-z0-9_.-]* | '"' any but '"' ('""' escapes) '"'
    string   := "'" any but "'" ("''" escapes) "'"
    number   := ["-"] digits ["." digits] [("e"|"E") ["+"|"-"] digits]

Identifiers: ``tag`` (``TAGS``) the record's tag, NULL when untagged; ``key``
the record's key, NULL without one; ``keys`` (``KEYS``) the key and the extra
keys of the ``keys`` header (``message_keys.py``): ``=``/``IN`` are TRUE when
any of them matches (only ``=``, ``<>``, ``IN`` and ``IS NULL`` apply);
``timestamp`` and ``storeTimestamp`` the producer's and the broker's time in
ms; any other name (or any quoted one: ``"tag"``) a header, NULL when absent.

Semantics: every operand is bytes or NULL (a literal's bytes are its text:
a string's UTF-8, a number's digits, ``true``/``false``); a comparison's
type is its left literal's, else its right literal's, else (two
identifiers) string, and both sides are converted to it: string = valid UTF-8
(else NULL), compared in byte (= code point) order; bytes = as they are; number
= a decimal number (an int64 if written without ``.``/``e`` and in range, else
a float; anything else NULL); boolean = ``true``/``false`` in any case (else
NULL; only ``=`` and ``<>``). SQL's three-valued logic: a comparison with NULL
is UNKNOWN, ``NOT UNKNOWN`` is UNKNOWN, ``FALSE AND x`` is FALSE, ``TRUE OR
x`` is TRUE, and a record passes only if the whole expression is TRUE.
``x BETWEEN a AND b`` is ``x >= a AND x <= b``; ``x IN (...)`` is UNKNOWN when
x is NULL; an IN list holds literals of one type (no NULL).

Limits: 4096 bytes of text, 256 nodes, nesting depth 32, 1,000 IN items.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from equeue_proto.message_keys import KEYS_HEADER, split_keys

MAX_TEXT_BYTES = 4096
MAX_NODES = 256
MAX_DEPTH = 32
MAX_IN_ITEMS = 1000
ERROR_KIND = "bad-filter"
"""The broker's error kind (``protocol.ERROR_KIND_KEY`` trailer) for a bad expression."""

# Truth values (SQL three-valued logic).
FALSE, TRUE, UNKNOWN = 0, 1, 2

# Operand kinds.
TAG, KEY, KEYS, TIMESTAMP, STORE_TIMESTAMP, HEADER = 1, 2, 3, 4, 5, 6
_NAMED = {
    "tag": TAG, "TAGS": TAG, "key": KEY, "keys": KEYS, "KEYS": KEYS,
    "timestamp": TIMESTAMP, "storeTimestamp": STORE_TIMESTAMP,
}  # fmt: skip

# Comparison types.
T_STR, T_BYTES, T_NUM, T_BOOL = 1, 2, 3, 4
_TYPE_NAMES = {T_STR: "string", T_BYTES: "bytes", T_NUM: "number", T_BOOL: "boolean"}

# Comparison operators.
EQ, NE, LT, LE, GT, GE = 1, 2, 3, 4, 5, 6
_OPS = {"=": EQ, "<>": NE, "!=": NE, "<": LT, "<=": LE, ">": GT, ">=": GE}
_OP_TEXT = {EQ: "=", NE: "<>", LT: "<", LE: "<=", GT: ">", GE: ">="}

_KEYWORDS = frozenset({"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE"})
_NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\Z")
_INT64 = (-(1 << 63), (1 << 63) - 1)


class SelectorError(ValueError):
    """A filter expression that does not parse; ``position`` is the 0-based
    character index of the problem in the text."""

    def __init__(self, what: str, position: int, text: str) -> None:
        before = text[max(0, position - 20) : position]
        after = text[position : position + 20]
        lead = "..." if position > 20 else ""
        tail = "..." if position + 20 < len(text) else ""
        super().__init__(
            f"filter: {what} at position {position}: {lead}{before} ^ {after}{tail}".rstrip()
        )
        self.what = what
        self.position = position


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


@dataclass(frozen=True)
class Selector:
    """A parsed filter expression."""

    root: Node
    text: str
    """The normalized expression (parses back to the same tree)."""
    tag_prefilter: frozenset[bytes] | None
    """Tags a record must carry to pass (from top-level ``tag =``/``tag IN``
    conjuncts), so reads can skip by the index's tag hash; None: any."""
    key_prefilter: frozenset[bytes] | None
    """Likewise for ``key =``/``key IN`` (the key's bytes)."""
    program: bytes = field(repr=False, default=b"")
    """The compiled postfix form the C evaluator runs (``compile_program``)."""

    def matches(self, record: Record) -> bool:
        """True if the expression is TRUE for ``record`` (the reference evaluator)."""
        return evaluate(self.root, record) == TRUE


# -- tokens ----------------------------------------------------------------------------


# kinds: "ident", "qident", "string", "bytes", "number", "op", "kw", "end"
@dataclass(frozen=True)
class _Token:
    kind: str
    text: str  # ident/qident/string: the value; kw: upper-case; op: the operator
    position: int
    raw: bytes = b""  # bytes literals


_IDENT_START = re.compile(r"[A-Za-z_]")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_NUM_TOKEN = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_HEX = re.compile(r"[0-9A-Fa-f]*")


def _quoted(text: str, pos: int, quote: str, what: str) -> tuple[str, int]:
    """The body of a quoted token starting at ``pos`` (the quote), doubled quotes
    unescaped, and the index after it."""
    out = []
    i = pos + 1
    while True:
        j = text.find(quote, i)
        if j < 0:
            raise SelectorError(f"unterminated {what}", pos, text)
        out.append(text[i:j])
        if text.startswith(quote * 2, j):
            out.append(quote)
            i = j + 2
            continue
        return "".join(out), j + 1


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c == "'":
            value, end = _quoted(text, i, "'", "string")
            tokens.append(_Token("string", value, i))
            i = end
        elif c == '"':
            value, end = _quoted(text, i, '"', "quoted identifier")
            if not value:
                raise SelectorError("empty quoted identifier", i, text)
            tokens.append(_Token("qident", value, i))
            i = end
        elif c in "xX" and text.startswith("'", i + 1):
            body, end = _quoted(text, i + 1, "'", "bytes literal")
            bad = _HEX.match(body)
            if bad is None or bad.end() != len(body):
                at = i + 2 + (bad.end() if bad else 0)
                raise SelectorError("expected hex digits in X'..'", at, text)
            if len(body) % 2:
                raise SelectorError("odd number of hex digits in X'..'", i, text)
            tokens.append(_Token("bytes", body, i, bytes.fromhex(body)))
            i = end
        elif c.isdigit() or (c == "-" and i + 1 < n and text[i + 1].isdigit()):
            m = _NUM_TOKEN.match(text, i)
            assert m is not None
            end = m.end()
            if end < n and (text[end].isalnum() or text[end] in "_."):
                raise SelectorError(f"bad number {text[i : end + 1]!r}", i, text)
            tokens.append(_Token("number", m.group(), i))
            i = end
        elif _IDENT_START.match(c):
            m = _IDENT.match(text, i)
            assert m is not None
            word = m.group()
            if word.upper() in _KEYWORDS:
                tokens.append(_Token("kw", word.upper(), i))
            else:
                tokens.append(_Token("ident", word, i))
            i = m.end()
        elif text.startswith(("<>", "!=", "<=", ">="), i):
            tokens.append(_Token("op", text[i : i + 2], i))
            i += 2
        elif c in "=<>(),":
            tokens.append(_Token("op", c, i))
            i += 1
        else:
            raise SelectorError(f"unexpected character {c!r}", i, text)
    tokens.append(_Token("end", "", n))
    return tokens


def _describe(token: _Token) -> str:
    if token.kind == "end":
        return "the end"
    if token.kind == "string":
        return "a string"
    if token.kind == "bytes":
        return "a bytes literal"
    return repr(token.text)


# -- the parser ------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.at = 0
        self.nodes = 0
        self.depth = 0

    # helpers
    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.at + ahead, len(self.tokens) - 1)]

    def take(self) -> _Token:
        token = self.tokens[self.at]
        if token.kind != "end":
            self.at += 1
        return token

    def is_kw(self, word: str, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind == "kw" and token.text == word

    def is_op(self, op: str) -> bool:
        token = self.peek()
        return token.kind == "op" and token.text == op

    def fail(self, what: str, token: _Token | None = None) -> SelectorError:
        token = token or self.peek()
        return SelectorError(what, token.position, self.text)

    def count(self, token: _Token) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.fail(f"more than {MAX_NODES} nodes", token)

    def nest(self, token: _Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH}", token)

    # grammar
    def parse(self) -> Node:
        if self.peek().kind == "end":
            raise self.fail("empty expression")
        node = self.or_()
        token = self.peek()
        if token.kind != "end":
            raise self.fail(f"unexpected {_describe(token)}", token)
        return node

    def or_(self) -> Node:
        first = self.peek()
        children = [self.and_()]
        while self.is_kw("OR"):
            self.take()
            children.append(self.and_())
        if len(children) == 1:
            return children[0]
        self.count(first)
        return Or(tuple(_flatten(Or, children)))

    def and_(self) -> Node:
        first = self.peek()
        children = [self.not_()]
        while self.is_kw("AND"):
            self.take()
            children.append(self.not_())
        if len(children) == 1:
            return children[0]
        self.count(first)
        return And(tuple(_flatten(And, children)))

    def not_(self) -> Node:
        if self.is_kw("NOT"):
            token = self.take()
            self.nest(token)
            self.count(token)
            child = self.not_()
            self.depth -= 1
            return Not(child)
        return self.pred()

    def pred(self) -> Node:
        token = self.peek()
        if self.is_op("("):
            self.take()
            self.nest(token)
            node = self.or_()
            if not self.is_op(")"):
                raise self.fail(f"expected ')' to close the '(' at position {token.position}")
            self.take()
            self.depth -= 1
            return node
        if token.kind == "end":
            raise self.fail("expected a condition")
        left = self.operand("a condition")
        nxt = self.peek()
        if isinstance(left, Literal) and left.type == T_BOOL and not _starts_predicate_rest(nxt):
            self.count(token)
            return Const(left.text == "TRUE")
        return self.rest(left, token)

    def rest(self, left: Operand, start: _Token) -> Node:
        token = self.peek()
        self.count(start)
        if token.kind == "op" and token.text in _OPS:
            self.take()
            right = self.operand(f"a value after '{token.text}'")
            return self.compare(_OPS[token.text], left, right, token)
        negated = False
        if self.is_kw("NOT") and (self.is_kw("IN", 1) or self.is_kw("BETWEEN", 1)):
            self.take()
            negated = True
        if self.is_kw("BETWEEN"):
            return self.between(left, negated)
        if self.is_kw("IN"):
            return self.in_(left, negated)
        if self.is_kw("IS"):
            self.take()
            null_negated = False
            if self.is_kw("NOT"):
                self.take()
                null_negated = True
            if not self.is_kw("NULL"):
                raise self.fail("expected NULL after IS")
            self.take()
            return IsNull(left, null_negated)
        what = _describe(token)
        raise self.fail(f"expected an operator (=, <>, <, IN, BETWEEN, IS) but found {what}")

    def compare(self, op: int, left: Operand, right: Operand, token: _Token) -> Node:
        type_ = _type_of(left, right)
        for side in (left, right):
            if isinstance(side, Field) and side.kind == KEYS and op not in {EQ, NE}:
                raise self.fail(
                    f"keys compares only with =, <>, IN or IS NULL, not '{token.text}'", token
                )
        if isinstance(left, Field) and isinstance(right, Field) and KEYS in (left.kind, right.kind):
            raise self.fail("keys compares only with literals", token)
        if type_ == T_BOOL and op not in {EQ, NE}:
            raise self.fail(f"TRUE/FALSE compare only with = or <>, not '{token.text}'", token)
        return Compare(op, type_, left, right)

    def between(self, operand: Operand, negated: bool) -> Node:
        token = self.take()
        low = self.operand("a value after BETWEEN")
        if not self.is_kw("AND"):
            raise self.fail("expected AND in BETWEEN")
        self.take()
        high = self.operand("a value after BETWEEN .. AND")
        type_ = _type_of(operand, low, high)
        if isinstance(operand, Field) and operand.kind == KEYS:
            raise self.fail("keys compares only with =, <>, IN or IS NULL, not BETWEEN", token)
        if type_ == T_BOOL:
            raise self.fail("BETWEEN does not apply to TRUE/FALSE", token)
        self.count(token)  # the two comparisons it stands for
        self.count(token)
        node: Node = And((Compare(GE, type_, operand, low), Compare(LE, type_, operand, high)))
        return Not(node) if negated else node

    def in_(self, operand: Operand, negated: bool) -> Node:
        token = self.take()
        if not self.is_op("("):
            raise self.fail("expected '(' after IN")
        self.take()
        items: list[Literal] = []
        while True:
            item_token = self.peek()
            if len(items) >= MAX_IN_ITEMS:
                raise self.fail(f"more than {MAX_IN_ITEMS} items in IN", item_token)
            item = self.operand("a value in the IN list", literal_only=True)
            assert isinstance(item, Literal)
            if item.raw is None:
                raise self.fail("NULL is not allowed in an IN list", item_token)
            if items and item.type != items[0].type:
                raise self.fail(
                    f"IN list mixes {_TYPE_NAMES[items[0].type]} and "
                    f"{_TYPE_NAMES[item.type]} values",
                    item_token,
                )
            items.append(item)
            if self.is_op(","):
                self.take()
                continue
            if self.is_op(")"):
                self.take()
                break
            raise self.fail("expected ',' or ')' in the IN list")
        type_ = items[0].type
        if isinstance(operand, Literal) and operand.raw is not None:
            type_ = operand.type
        if type_ == T_BOOL:
            raise self.fail("IN does not apply to TRUE/FALSE", token)
        return In(operand, type_, tuple(items), negated)

    def operand(self, wanted: str, literal_only: bool = False) -> Operand:
        token = self.peek()
        kind = token.kind
        if kind in {"ident", "qident"} and not literal_only:
            self.take()
            if kind == "ident" and token.text in _NAMED:
                return Field(_NAMED[token.text])
            return Field(HEADER, token.text)
        if kind == "string":
            self.take()
            return Literal(token.text.encode(), T_STR, _quote(token.text, "'"))
        if kind == "bytes":
            self.take()
            return Literal(token.raw, T_BYTES, f"X'{token.raw.hex().upper()}'")
        if kind == "number":
            self.take()
            return Literal(token.text.encode(), T_NUM, token.text)
        if kind == "kw" and token.text in {"TRUE", "FALSE"}:
            self.take()
            return Literal(token.text.lower().encode(), T_BOOL, token.text)
        if kind == "kw" and token.text == "NULL":
            self.take()
            return Literal(None, T_STR, "NULL")
        raise self.fail(f"expected {wanted} but found {_describe(token)}")


def _starts_predicate_rest(token: _Token) -> bool:
    return (token.kind == "op" and token.text in _OPS) or (
        token.kind == "kw" and token.text in {"NOT", "BETWEEN", "IN", "IS"}
    )


def _flatten(cls: type[And] | type[Or], children: list[Node]) -> list[Node]:
    out: list[Node] = []
    for child in children:
        out.extend(child.children if isinstance(child, cls) else (child,))
    return out


def _type_of(*operands: Operand) -> int:
    for operand in operands:
        if isinstance(operand, Literal) and operand.raw is not None:
            return operand.type
    return T_STR


def _quote(value: str, quote: str) -> str:
    return quote + value.replace(quote, quote * 2) + quote


# -- entry point -----------------------------------------------------------------------


def parse(text: str) -> Selector:
    """The selector of ``text``; ``SelectorError`` naming the position if it is bad."""
    if not isinstance(text, str):
        raise SelectorError(f"expected a string, got {type(text).__name__}", 0, "")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_TEXT_BYTES:
        at = len(text.encode("utf-8", "surrogatepass")[:MAX_TEXT_BYTES].decode("utf-8", "ignore"))
        raise SelectorError(f"longer than {MAX_TEXT_BYTES} bytes ({size})", at, text)
    root = _Parser(text).parse()
    return Selector(
        root,
        render(root),
        _prefilter(root, TAG),
        _prefilter(root, KEY),
        compile_program(root),
    )


def _prefilter(root: Node, kind: int) -> frozenset[bytes] | None:
    """The values of field ``kind`` that top-level conjuncts allow (None: any)."""
    conjuncts = root.children if isinstance(root, And) else (root,)
    allowed: frozenset[bytes] | None = None
    for node in conjuncts:
        values = _allowed_values(node, kind)
        if values is not None:
            allowed = values if allowed is None else allowed & values
    return allowed


def _allowed_values(node: Node, kind: int) -> frozenset[bytes] | None:
    if isinstance(node, Compare) and node.op == EQ and node.type in {T_STR, T_BYTES}:
        pair = (node.left, node.right)
        for field_, lit in (pair, pair[::-1]):
            if isinstance(field_, Field) and field_.kind == kind and isinstance(lit, Literal):
                return frozenset() if lit.raw is None else frozenset({lit.raw})
    if (
        isinstance(node, In)
        and not node.negated
        and node.type in {T_STR, T_BYTES}
        and isinstance(node.operand, Field)
        and node.operand.kind == kind
    ):
        return frozenset(item.raw for item in node.items if item.raw is not None)
    return None


# -- rendering (the normalized text) ---------------------------------------------------

_FIELD_TEXT = {
    TAG: "tag", KEY: "key", KEYS: "keys", TIMESTAMP: "timestamp",
    STORE_TIMESTAMP: "storeTimestamp",
}  # fmt: skip


def _operand_text(operand: Operand) -> str:
    if isinstance(operand, Literal):
        return operand.text
    if operand.kind == HEADER:
        plain = _IDENT.fullmatch(operand.name) and operand.name.upper() not in _KEYWORDS
        if plain and operand.name not in _NAMED:
            return operand.name
        return _quote(operand.name, '"')
    return _FIELD_TEXT[operand.kind]


def render(node: Node) -> str:
    """``node`` as text that parses back to it."""
    if isinstance(node, Compare):
        left, right = _operand_text(node.left), _operand_text(node.right)
        return f"{left} {_OP_TEXT[node.op]} {right}"
    if isinstance(node, In):
        items = ", ".join(item.text for item in node.items)
        neg = "NOT " if node.negated else ""
        return f"{_operand_text(node.operand)} {neg}IN ({items})"
    if isinstance(node, IsNull):
        return f"{_operand_text(node.operand)} IS {'NOT ' if node.negated else ''}NULL"
    if isinstance(node, Const):
        return "TRUE" if node.value else "FALSE"
    if isinstance(node, Not):
        return f"NOT ({render(node.child)})"
    joiner = " AND " if isinstance(node, And) else " OR "
    return joiner.join(f"({render(c)})" for c in node.children)


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
#   OP_IN     u8 type | u8 negated | operand x | u16 count | count x literal
#   OP_ISNULL u8 negated | operand x
#   OP_NOT
#   OP_AND    u16 n   (pops n)              OP_OR u16 n
#   OP_END
# operand := u8 0 (NULL) | u8 1 literal | u8 2 u8 field kind | u16 name length | name
# literal (converted to the comparison's type at compile time):
#   u8 0 (NULL after conversion) | u8 1 u32 length | bytes (string/bytes)
#   | u8 2 i64 (int) | u8 3 f64 (float) | u8 4 u8 (boolean)

OP_END, OP_CONST, OP_CMP, OP_IN, OP_ISNULL, OP_NOT, OP_AND, OP_OR = range(8)


def _literal_code(raw: bytes | None, type_: int) -> bytes:
    value = convert(raw, type_)
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
        out += bytes([OP_IN, node.type, int(node.negated)])
        out += _operand_code(node.operand, node.type) + struct.pack("<H", len(node.items))
        for item in node.items:
            out += _literal_code(item.raw, node.type)
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


def compile_program(root: Node) -> bytes:
    """The postfix program of ``root`` (format above)."""
    out = bytearray()
    _emit(root, out)
    out.append(OP_END)
    return bytes(out)
