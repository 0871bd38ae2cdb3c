"""Filter expressions: RocketMQ's SQL92 subset over tags, keys and headers.

The contract: client, CLI and Spark parse an expression here to refuse a bad
one early; the broker parses it here and evaluates it on every record a
filtered pull inspects (``equeue_proto.selection`` runs it over stored frames,
in C when built). The tree, its reference meaning (``evaluate``) and the program
the C evaluator runs are in ``selector_tree.py``; this module is the syntax.

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
from dataclasses import dataclass, field

from equeue_proto.selector_tree import (
    EQ,
    FALSE,
    GE,
    GT,
    HEADER,
    KEY,
    KEYS,
    LE,
    LT,
    NE,
    STORE_TIMESTAMP,
    T_BOOL,
    T_BYTES,
    T_NUM,
    T_STR,
    TAG,
    TIMESTAMP,
    TRUE,
    UNKNOWN,
    And,
    Compare,
    Const,
    Field,
    In,
    IsNull,
    Literal,
    Node,
    Not,
    Operand,
    Or,
    Record,
    compile_program,
    evaluate,
)
from equeue_proto.selector_tree import cost as tree_cost

__all__ = [
    "FALSE", "MAX_DEPTH", "MAX_IN_ITEMS", "MAX_NODES", "MAX_TEXT_BYTES", "TRUE", "UNKNOWN",
    "Selector", "SelectorError", "evaluate", "parse", "render",
]  # fmt: skip

MAX_TEXT_BYTES = 4096
MAX_NODES = 256
MAX_DEPTH = 32
MAX_IN_ITEMS = 1000
ERROR_KIND = "bad-filter"
"""The broker's error kind (``protocol.ERROR_KIND_KEY`` trailer) for a bad expression."""

_NAMED = {
    "tag": TAG, "TAGS": TAG, "key": KEY, "keys": KEYS, "KEYS": KEYS,
    "timestamp": TIMESTAMP, "storeTimestamp": STORE_TIMESTAMP,
}  # fmt: skip

_TYPE_NAMES = {T_STR: "string", T_BYTES: "bytes", T_NUM: "number", T_BOOL: "boolean"}
_OPS = {"=": EQ, "<>": NE, "!=": NE, "<": LT, "<=": LE, ">": GT, ">=": GE}
_OP_TEXT = {EQ: "=", NE: "<>", LT: "<", LE: "<=", GT: ">", GE: ">="}

_SURROGATE = re.compile("[\ud800-\udfff]")
"""A lone surrogate (from ``surrogateescape``d argv bytes, say): no UTF-8 for it."""

_KEYWORDS = frozenset({"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE"})


class SelectorError(ValueError):
    """A filter expression that does not parse; ``position`` is the 0-based
    character index of the problem in the text."""

    def __init__(self, what: str, position: int, text: str) -> None:
        # backslashreplace: a lone surrogate shown as \udXXX (it has no UTF-8).
        shown = text.encode("utf-8", "backslashreplace").decode("utf-8")
        position_shown = len(text[:position].encode("utf-8", "backslashreplace").decode("utf-8"))
        before = shown[max(0, position_shown - 20) : position_shown]
        after = shown[position_shown : position_shown + 20]
        lead = "..." if position > 20 else ""
        tail = "..." if position + 20 < len(text) else ""
        super().__init__(
            f"filter: {what} at position {position}: {lead}{before} ^ {after}{tail}".rstrip()
        )
        self.what = what
        self.position = position


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
    cost: int = 1
    """About how many comparisons it makes over a record at most (``selector_tree.cost``)."""

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
_DIGITS = frozenset("0123456789")
"""ASCII digits only (``str.isdigit`` takes other scripts' digits too)."""


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
        elif c in _DIGITS or (c == "-" and i + 1 < n and text[i + 1] in _DIGITS):
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
    surrogate = _SURROGATE.search(text)
    if surrogate is not None:  # not UTF-8: the wire and the C evaluator carry UTF-8 only
        at = surrogate.start()
        raise SelectorError(f"character U+{ord(text[at]):04X} is not valid text", at, text)
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
        tree_cost(root),
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
    between = _between_text(node, "")
    if between is not None:
        return between
    if isinstance(node, Not):
        between = _between_text(node.child, "NOT ")
        if between is not None:
            return between
        inner = render(node.child)
        # NOT binds tighter than AND and OR; no parentheses a text did not need
        # (each one nests a level, and MAX_DEPTH applies to the text again).
        return f"NOT ({inner})" if isinstance(node.child, And | Or) else f"NOT {inner}"
    if isinstance(node, And):
        return " AND ".join(_conjuncts_text(node.children))
    return " OR ".join(f"({render(c)})" if isinstance(c, Or) else render(c) for c in node.children)


def _conjuncts_text(children: tuple[Node, ...]) -> list[str]:
    """An AND's operands as text (an OR in parentheses: AND binds tighter). A
    BETWEEN flattened into the AND is written as one again: its type comes from
    both bounds, which its two comparisons written apart may not have."""
    out: list[str] = []
    i = 0
    while i < len(children):
        pair = _between_text(And(children[i : i + 2]), "") if i + 1 < len(children) else None
        if pair is not None:
            out.append(pair)
            i += 2
            continue
        child = children[i]
        out.append(f"({render(child)})" if isinstance(child, Or | And) else render(child))
        i += 1
    return out


def _between_text(node: Node, negation: str) -> str | None:
    """``x [NOT ]BETWEEN lo AND hi`` if ``node`` is the tree BETWEEN parses to."""
    if not isinstance(node, And) or len(node.children) != 2:
        return None
    low, high = node.children
    if not (
        isinstance(low, Compare)
        and isinstance(high, Compare)
        and (low.op, high.op) == (GE, LE)
        and low.left == high.left
        and low.type == high.type == _type_of(low.left, low.right, high.right)
        and low.type != T_BOOL
        and not (isinstance(low.left, Field) and low.left.kind == KEYS)
    ):
        return None
    x, lo, hi = (_operand_text(o) for o in (low.left, low.right, high.right))
    return f"{x} {negation}BETWEEN {lo} AND {hi}"
