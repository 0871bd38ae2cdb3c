"""Filter expressions (equeue_proto/selector.py): grammar, errors, three-valued
logic, limits; and the C evaluator over stored frames held equal to the
Python reference (equeue_proto/selection.py)."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from equeue_proto.accel import CODEC
from equeue_proto.message_keys import KEYS_HEADER
from equeue_proto.selection import FrameRecord, select_frames, select_frames_py
from equeue_proto.selector import (
    FALSE,
    MAX_DEPTH,
    MAX_IN_ITEMS,
    MAX_NODES,
    MAX_TEXT_BYTES,
    TRUE,
    UNKNOWN,
    Selector,
    SelectorError,
    evaluate,
    parse,
)
from equeue_proto.selector_tree import (
    EQ,
    IN_SORTED,
    OP_CMP,
    OP_IN,
    SORT_IN_FROM,
    T_NUM,
    T_STR,
)
from tests.support.frames import Row, encode_frames


@dataclass
class Rec:
    """A record as an expression reads it."""

    tag_: bytes | None = None
    key_: bytes | None = None
    headers: dict[str, bytes] = field(default_factory=dict)
    producer: int = 1000
    store: int = 2000

    def tag(self) -> bytes | None:
        return self.tag_

    def key(self) -> bytes | None:
        return self.key_

    def header(self, name: str) -> bytes | None:
        return self.headers.get(name)

    def producer_ms(self) -> int:
        return self.producer

    def store_ms(self) -> int:
        return self.store


ORDER = Rec(
    tag_=b"created", key_=b"order-7",
    headers={"region": b"eu", "amount": b"150", "rate": b"0.25", "vip": b"TRUE",
             "name": "Zoë".encode(), "bad": b"\xff\xfe", "tag": b"header-tag",
             KEYS_HEADER: b"alt-1 alt-2", "empty": b""},
    producer=1_700_000_000_000, store=1_700_000_000_500,
)  # fmt: skip


def truth(text: str, record: Rec = ORDER) -> int:
    return evaluate(parse(text).root, record)


GRAMMAR = [
    # comparisons, each operator, by the literal's type
    ("region = 'eu'", TRUE), ("region = 'us'", FALSE), ("region <> 'us'", TRUE),
    ("region != 'eu'", FALSE), ("amount > 100", TRUE), ("amount >= 150", TRUE),
    ("amount < 150", FALSE), ("amount <= 150", TRUE), ("amount = 150.0", TRUE),
    ("amount > 1.5e2", FALSE), ("rate < 1", TRUE), ("rate = 0.25", TRUE), ("amount > -1", TRUE),
    ("amount > '2'", FALSE),  # a string literal: compared as text
    ("name = 'Zoë'", TRUE), ("name > 'Zoa'", TRUE), ("vip = TRUE", TRUE), ("vip <> false", TRUE),
    ("100 < amount", TRUE), ("'eu' = region", TRUE), ("1 = 1", TRUE), ("'a' < 'b'", TRUE),
    ("1 = '1.0'", TRUE), ("region = name", FALSE), ("region <> name", TRUE),
    # BETWEEN, IN, IS NULL
    ("amount BETWEEN 100 AND 200", TRUE), ("amount NOT BETWEEN 100 AND 200", FALSE),
    ("amount BETWEEN 151 AND 200", FALSE), ("region IN ('us', 'eu')", TRUE),
    ("region NOT IN ('us', 'eu')", FALSE), ("amount IN (1, 2, 150)", TRUE),
    ("region IS NULL", FALSE), ("region IS NOT NULL", TRUE), ("missing IS NULL", TRUE),
    ("empty IS NULL", FALSE), ("empty = ''", TRUE),
    # fixed fields and aliases
    ("tag = 'created'", TRUE), ("TAGS = 'created'", TRUE), ('"tag" = \'header-tag\'', TRUE),
    ("key = 'order-7'", TRUE), ("key = X'6f726465722d37'", TRUE), ("keys = 'alt-2'", TRUE),
    ("KEYS = 'order-7'", TRUE), ("keys IN ('x', 'alt-1')", TRUE), ("keys = 'nope'", FALSE),
    ("keys <> 'nope'", TRUE), ("keys IS NULL", FALSE),
    ("timestamp = 1700000000000", TRUE), ("storeTimestamp > timestamp", TRUE),
    # constants, keywords in any case, precedence
    ("TRUE", TRUE), ("false", FALSE), ("not false", TRUE),
    ("region = 'us' OR amount > 100 AND tag = 'created'", TRUE),  # AND binds tighter
    ("(region = 'us' OR amount > 100) AND tag = 'x'", FALSE),
    ("NOT region = 'us' AND NOT amount < 1", TRUE), ("NOT NOT region = 'eu'", TRUE),
    ("region = 'eu' or missing = 1", TRUE), ("region = 'us' and missing = 1", FALSE),
    # quoting and escapes
    ("'it''s' = 'it''s'", TRUE), ('"we""ird" IS NULL', TRUE), ("bad = X'FFFE'", TRUE),
    ("x'' = ''", TRUE), ("bad = 'x'", UNKNOWN),  # not UTF-8: NULL as a string
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), GRAMMAR)
def test_grammar_table(text: str, expected: int) -> None:
    assert truth(text) == expected
    again = parse(parse(text).text)  # the normalized text means the same
    assert evaluate(again.root, ORDER) == expected


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("a=1 and b='x' or not c is null", "a = 1 AND b = 'x' OR NOT c IS NULL"),
        ("(a=1 or b=2) and not (c=3 or d=4)", "(a = 1 OR b = 2) AND NOT (c = 3 OR d = 4)"),
        ("x between 1 and 2", "x BETWEEN 1 AND 2"),
        ("not x between 1 and 2 or not not y = 1", "x NOT BETWEEN 1 AND 2 OR NOT NOT y = 1"),
        ("\"tag\" in ('a')", "\"tag\" IN ('a')"),
        ("key = x'0a'", "key = X'0A'"),
    ],
)
def test_normalized_text(text: str, normal: str) -> None:
    assert parse(text).text == normal


BAD = [
    ("", 0, "empty expression"), ("a >", 3, "expected a value after '>'"),
    ("region = 'eu' AND amount >", 26, "expected a value"), ("a IN ()", 6, "in the IN list"),
    ("'open", 0, "unterminated string"), ("a BETWEEN 1", 11, "expected AND"),
    ("1 = ", 4, "expected a value"), ("a", 1, "expected an operator"),
    ("a = 1 b", 6, "unexpected 'b'"), ("(a = 1", 6, "expected ')'"),
    ("a = 1)", 5, "unexpected ')'"),
    ("a == 1", 3, "expected a value after '='"), ("a = 'x", 4, "unterminated string"),
    ('"a = 1', 0, "unterminated quoted identifier"), ("a = X'0g'", 7, "hex digits"),
    ("a = X'abc'", 4, "odd number"), ("a = 1 AND", 9, "expected a condition"),
    ("a IN (1, 'x')", 9, "mixes number and string"), ("a IN (1,", 8, "expected a value"),
    ("a IN 1", 5, "expected '('"), ("a IN (NULL)", 6, "NULL is not allowed"),
    ("a IS 1", 5, "expected NULL after IS"), ("a = 1 OR OR b = 2", 9, "expected a condition"),
    ("a # 1", 2, "unexpected character '#'"), ("a = 12abc", 4, "bad number"),
    ("a > TRUE", 2, "TRUE/FALSE compare only"), ("keys > 'a'", 5, "keys compares only"),
    ("keys = region", 5, "keys compares only with literals"), ('"" = 1', 0, "empty quoted"),
    ("a BETWEEN TRUE AND FALSE", 2, "BETWEEN does not apply"), ("NOT", 3, "expected a condition"),
    ("a IN (1 2)", 8, "expected ',' or ')'"), ("a = \u0663", 4, "unexpected character"),
    ("a = -\u0663", 4, "unexpected character '-'"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "position", "what"), BAD)
def test_bad_expressions_name_their_position(text: str, position: int, what: str) -> None:
    with pytest.raises(SelectorError) as caught:
        parse(text)
    assert caught.value.position == position
    assert what in str(caught.value)
    assert str(caught.value).startswith("filter: ")
    assert f"at position {position}" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_limits() -> None:
    parse("a = '" + "x" * (MAX_TEXT_BYTES - 7) + "'")
    with pytest.raises(SelectorError, match="longer than 4096 bytes") as long:
        parse("a = '" + "x" * MAX_TEXT_BYTES + "'")
    assert long.value.position == MAX_TEXT_BYTES
    parse("(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH)
    with pytest.raises(SelectorError, match="nested deeper than 32") as deep:
        parse("(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1))
    assert deep.value.position == MAX_DEPTH
    with pytest.raises(SelectorError, match="nested deeper"):
        parse("NOT " * (MAX_DEPTH + 1) + "a = 1")
    items = ",".join(str(i) for i in range(MAX_IN_ITEMS))
    parse(f"a IN ({items})")
    with pytest.raises(SelectorError, match="more than 1000 items") as many:
        parse(f"a IN ({items},1)")
    assert many.value.position == len(f"a IN ({items},")
    parse(" OR ".join(["a = 1"] * (MAX_NODES - 1)))
    with pytest.raises(SelectorError, match="more than 256 nodes"):
        parse(" OR ".join(["a = 1"] * (MAX_NODES + 1)))


VALUES = {"T": "a = 1", "F": "a = 2", "U": "missing = 1"}
"""A condition of each truth value over a record whose header a is "1"."""
ONE = Rec(headers={"a": b"1"})


def _and(x: int, y: int) -> int:
    return FALSE if FALSE in (x, y) else UNKNOWN if UNKNOWN in (x, y) else TRUE


def _or(x: int, y: int) -> int:
    return TRUE if TRUE in (x, y) else UNKNOWN if UNKNOWN in (x, y) else FALSE


def _not(x: int) -> int:
    return UNKNOWN if x == UNKNOWN else 1 - x


def test_three_valued_truth_table() -> None:
    value = {"T": TRUE, "F": FALSE, "U": UNKNOWN}
    for name, text in VALUES.items():
        assert truth(text, ONE) == value[name]
        assert truth(f"NOT ({text})", ONE) == _not(value[name])
    for (a, x), (b, y) in itertools.product(VALUES.items(), repeat=2):
        assert truth(f"({x}) AND ({y})", ONE) == _and(value[a], value[b]), (a, b)
        assert truth(f"({x}) OR ({y})", ONE) == _or(value[a], value[b]), (a, b)
    # comparisons with NULL are UNKNOWN, whatever the operator; IN of NULL too
    for op in ("=", "<>", "<", "<=", ">", ">="):
        assert truth(f"missing {op} 1", ONE) == UNKNOWN
        assert truth(f"a {op} NULL", ONE) == UNKNOWN
    assert truth("missing IN (1, 2)", ONE) == UNKNOWN
    assert truth("missing NOT IN (1, 2)", ONE) == UNKNOWN
    assert truth("missing NOT BETWEEN 1 AND 2", ONE) == UNKNOWN
    assert truth("NULL IS NULL", ONE) == TRUE
    # unparsable as the literal's type: NULL
    assert truth("a = TRUE", ONE) == UNKNOWN
    assert truth("a > 'x'", Rec(headers={"a": b"\xff"})) == UNKNOWN
    assert truth("a > 1", Rec(headers={"a": b"1x"})) == UNKNOWN


def test_prefilters() -> None:
    assert parse("tag = 'a' AND x = 1").tag_prefilter == frozenset({b"a"})
    assert parse("tag IN ('a', 'b') AND TAGS = 'b'").tag_prefilter == frozenset({b"b"})
    assert parse("tag = 'a' OR x = 1").tag_prefilter is None
    assert parse("NOT tag = 'a'").tag_prefilter is None
    assert parse("tag NOT IN ('a')").tag_prefilter is None
    assert parse("'a' = tag").tag_prefilter == frozenset({b"a"})
    assert parse("\"tag\" = 'a'").tag_prefilter is None  # a header called tag
    assert parse("key = X'00' AND tag = 'a'").key_prefilter == frozenset({b"\x00"})


# -- over stored frames: C == Python ----------------------------------------------------

NAMES = ["region", "amount", "tag", KEYS_HEADER, "x"]
header_values = st.sampled_from(
    [b"eu", b"us", b"", b"5", b"150", b"-3", b"2.5", b"1e2", b"true", b"FALSE", b"\xff", b"a b",
     b"99999999999999999999", b"007", "é".encode()]
)  # fmt: skip
records = st.builds(
    lambda tag, key, headers, ts: (tag, key, headers, ts),
    st.sampled_from(["", "a", "b", "é"]),
    st.one_of(st.none(), st.sampled_from([b"", b"k", b"a", b"\xff", b"150"])),
    st.lists(st.tuples(st.sampled_from(NAMES), header_values), max_size=4),
    st.integers(-5, 3000),
)
operands = st.sampled_from(
    ["region", "amount", "tag", "key", "x", "timestamp", "storeTimestamp", '"tag"', "TAGS"]
)
literals = st.sampled_from(
    ["'eu'", "'5'", "''", "5", "150", "-3", "2.5", "1e2", "TRUE", "false", "NULL", "X'FF'",
     "X''", "'a b'", "99999999999999999999", "'é'", "0.0"]
)  # fmt: skip
ops = st.sampled_from(["=", "<>", "<", "<=", ">", ">="])


def _long_lists() -> st.SearchStrategy[list[str]]:
    """IN lists long enough to be compiled sorted (SORT_IN_FROM), duplicates and
    values that convert to NULL included; ints alone, floats alone, or mixed."""
    strings = st.sampled_from(["'eu'", "'us'", "'a'", "'k'", "''", "'5'", "'150'", "'é'", "'a b'"])
    ints = st.sampled_from(["5", "150", "-3", "0", "7", "99999999999999999999", "-9", "1000"])
    floats = st.sampled_from(["2.5", "1e2", "0.0", "-0.5", "150.0", "3.25", "5.0"])
    low, high = SORT_IN_FROM, SORT_IN_FROM + 6
    return (
        st.lists(strings, min_size=low, max_size=high)
        | st.lists(ints, min_size=low, max_size=high)
        | st.lists(ints | floats, min_size=low, max_size=high)
    )


def _condition() -> st.SearchStrategy[str]:
    compare = st.builds(lambda a, o, b: f"{a} {o} {b}", operands, ops, literals | operands)
    keys = st.builds(lambda o, b: f"keys {o} {b}", st.sampled_from(["=", "<>"]), literals)
    listed = st.builds(
        lambda a, n, items: f"{a} {n}IN ({', '.join(items)})", operands | st.just("keys"),
        st.sampled_from(["", "NOT "]),
        st.lists(st.sampled_from(["'eu'", "'a'", "'k'", "''"]), min_size=1, max_size=3)
        | st.lists(st.sampled_from(["5", "150", "2.5", "-3"]), min_size=1, max_size=3)
        | _long_lists(),
    )  # fmt: skip
    between = st.builds(
        lambda a, lo, hi: f"{a} BETWEEN {lo} AND {hi}", operands, literals, literals
    )
    null = st.builds(lambda a, n: f"{a} IS {n}NULL", operands | st.just("keys"),
                     st.sampled_from(["", "NOT "]))  # fmt: skip
    return compare | keys | listed | between | null | st.sampled_from(["TRUE", "FALSE"])


def _combined(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    joined = st.builds(
        lambda a, j, b: f"({a}) {j} ({b})", inner, st.sampled_from(["AND", "OR"]), inner
    )
    return joined | st.builds(lambda a: f"NOT ({a})", inner)


expressions = st.recursive(_condition(), _combined, max_leaves=6)


def _parsed(text: str) -> Selector | None:
    try:
        return parse(text)
    except SelectorError:
        return None


@pytest.mark.skipif(CODEC is None, reason="the C accelerator is not built")
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=expressions, rows=st.lists(records, min_size=1, max_size=12))
def test_c_evaluator_equals_the_python_reference(text: str, rows: list[Row]) -> None:
    selector = _parsed(text)
    if selector is None:
        return
    view = encode_frames(rows)
    assert select_frames(selector, view, 1000) == select_frames_py(selector, view, 1000)
    assert select_frames(selector, view, 3) == select_frames_py(selector, view, 3)


def test_frame_record_reads_the_stored_fields() -> None:
    view = encode_frames([("t", b"k", [("a", b"1"), ("a", b"2")], 77)])
    record = FrameRecord(view, 0)
    assert (record.tag(), record.key(), record.header("a"), record.producer_ms()) == (
        b"t",
        b"k",
        b"2",
        77,
    )  # fmt: skip  (the last of a repeated header, as Message.header)
    assert record.header("b") is None
    assert select_frames_py(parse("a = 2 AND timestamp = 77"), view, 10) == (
        [(0, len(view), 0, 1)], 1,
    )  # fmt: skip


GRAMMAR_CHARS = st.sampled_from(
    [*"()=<>!,'\"xX- .e0123456789abn_\u0663\u00e9\t", "AND", "OR", "NOT", "IN", "IS", "NULL",
     "BETWEEN", "TRUE", "keys", "tag"]
)  # fmt: skip


@settings(max_examples=2000, deadline=None)
@given(text=st.text(max_size=60) | st.lists(GRAMMAR_CHARS, max_size=40).map(" ".join))
def test_any_text_parses_or_names_a_position(text: str) -> None:
    try:
        selector = parse(text)
    except SelectorError as exc:
        assert 0 <= exc.position <= len(text)
        return
    assert parse(selector.text).text == selector.text  # the normalized text is stable


FIXED_FRAMES = encode_frames(
    [("a", b"k", [(KEYS_HEADER, b"x y"), ("n", b"5")], 10), ("", None, [("n", b"7")], 3)]
)
FIXED_SELECTORS = [
    parse(t)
    for t in (
        "n = 5",
        "keys IN ('x', 'z') AND NOT tag IS NULL",
        "n BETWEEN 1 AND 9",
        "keys IS NULL",
    )
]


def _outcome(run: Callable[[], object]) -> object:
    try:
        return run()
    except ValueError:
        return "refused"


@pytest.mark.skipif(CODEC is None, reason="the C accelerator is not built")
@settings(max_examples=500, deadline=None)
@given(
    which=st.integers(0, len(FIXED_SELECTORS) - 1),
    flips=st.lists(st.tuples(st.integers(0, len(FIXED_FRAMES) - 1), st.integers(0, 255)),
                   min_size=1, max_size=3),
    program_flips=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=3),
)  # fmt: skip
def test_damaged_frames_and_programs_are_refused_never_misread(
    which: int, flips: list[tuple[int, int]], program_flips: list[tuple[int, int]]
) -> None:
    selector = FIXED_SELECTORS[which]
    frames = bytearray(FIXED_FRAMES)
    for at, value in flips:
        frames[at] = value
    c = _outcome(lambda: select_frames(selector, bytes(frames), 10))
    assert c == _outcome(lambda: select_frames_py(selector, bytes(frames), 10))
    assert CODEC is not None
    program = bytearray(selector.program)
    for at, value in program_flips:
        program[at % len(program)] = value
    _outcome(lambda: CODEC.select_frames(bytes(program), FIXED_FRAMES, 10))  # no crash


# -- regressions -----------------------------------------------------------------------


@pytest.mark.parametrize(("text", "position"), [("a = '\ud800'", 5), ("\udcff = 1", 0)])
def test_a_lone_surrogate_is_refused_at_its_position(text: str, position: int) -> None:
    """A surrogate (argv bytes that are not UTF-8 decode to one) has no UTF-8:
    refused with its position, in a message that itself encodes."""
    with pytest.raises(SelectorError) as caught:
        parse(text)
    assert caught.value.position == position
    assert "is not valid text" in str(caught.value)
    str(caught.value).encode("utf-8")


def test_long_in_lists_are_compiled_sorted() -> None:
    items = ", ".join(f"'k{i}'" for i in range(500, 0, -1))
    selector = parse(f"a IN ({items}, 'k7')")
    assert selector.program[2] & IN_SORTED  # OP_IN, type, flags
    rows: list[Row] = [("", None, [("a", f"k{i}".encode())], 1) for i in (0, 1, 7, 250, 500, 501)]
    view = encode_frames(rows)
    assert select_frames(selector, view, 100) == select_frames_py(selector, view, 100)
    assert [frames for _s, _e, _i, frames in select_frames(selector, view, 100)[0]] == [4]


def _program(*parts: bytes) -> bytes:
    return b"".join(parts)


_HEADER_A = b"\x02\x06" + struct.pack("<H", 1) + b"a"
_BYTES_ABC = b"\x01" + struct.pack("<I", 3) + b"abc"
_INT = b"\x02" + struct.pack("<q", 5)


@pytest.mark.skipif(CODEC is None, reason="the C accelerator is not built")
@pytest.mark.parametrize(
    "program",
    [
        # a bytes literal in a number comparison (scompare would read an int it lacks)
        _program(bytes([OP_CMP, EQ, T_NUM]), _HEADER_A, b"\x01", _BYTES_ABC, b"\x00"),
        _program(bytes([OP_CMP, EQ, T_NUM]), b"\x01", _BYTES_ABC, _HEADER_A, b"\x00"),
        _program(bytes([OP_IN, T_NUM, 0]), _HEADER_A, struct.pack("<H", 1), _BYTES_ABC, b"\x00"),
        _program(bytes([OP_CMP, EQ, T_STR]), _HEADER_A, b"\x01", _INT, b"\x00"),
        # a sorted list out of order, or whose offsets do not name its items
        _program(
            bytes([OP_IN, T_NUM, IN_SORTED]),
            _HEADER_A,
            struct.pack("<HII", 2, 0, 9),
            b"\x02" + struct.pack("<q", 9),
            _INT,
            b"\x00",
        ),
        _program(
            bytes([OP_IN, T_NUM, IN_SORTED]),
            _HEADER_A,
            struct.pack("<HII", 2, 0, 8),
            _INT,
            b"\x02" + struct.pack("<q", 9),
            b"\x00",
        ),
        _program(bytes([OP_IN, T_NUM, 4]), _HEADER_A, struct.pack("<H", 1), _INT, b"\x00"),
    ],
)
def test_crafted_programs_with_wrong_literals_are_refused(program: bytes) -> None:
    assert CODEC is not None
    frames = encode_frames([("t", b"k", [("a", b"5")], 1)])
    with pytest.raises(ValueError, match="malformed program"):
        CODEC.select_frames(program, frames, 10)


@settings(max_examples=300, deadline=None)
@given(text=expressions)
def test_the_normalized_text_parses_back_to_the_same_tree(text: str) -> None:
    selector = _parsed(text)
    if selector is not None:
        assert parse(selector.text).root == selector.root


@pytest.mark.parametrize(
    "text",
    [
        "NOT " * (MAX_DEPTH - 1) + "a = 1",  # each NOT nests a level; "NOT (" would nest two
        "(" * (MAX_DEPTH - 1) + "a = 1 OR b = 2" + ")" * (MAX_DEPTH - 1),
        " OR ".join(["a NOT BETWEEN 1 AND 2"] * 60),
    ],
)
def test_the_normalized_text_of_a_text_at_the_limits_parses(text: str) -> None:
    selector = parse(text)
    assert parse(selector.text).root == selector.root
