"""Spark filter pushdown: which of a query's ``where`` filters the source applies
itself, and how.

Spark (4.1+, with ``spark.sql.python.filterPushdown.enabled``) hands a batch
reader's ``pushFilters`` the query's conjuncts; the ones it takes are removed
from Spark's plan, so ``push`` takes only what it applies **exactly**, and
returns everything else (the same objects) for Spark to evaluate:

- ``topic``, ``broker`` (a cluster's group names), ``queue``: which queues are read;
- ``offset`` and ``storeTimestamp``: the offset ranges read (store times never
  decrease within a queue, so a store-time bound is an offset bound);
- ``tag`` equality: the broker's tag filter (index skip, records never read);
- ``timestamp`` (the producer's time, in no order), ``key`` (raw bytes only:
  not with a ``keyFormat``), and the other
  ``tag`` comparisons: a broker filter expression (equeue_proto's selector
  grammar) evaluated on the broker, so failing records are never sent; the
  keys of a ``key`` equality also go to the planner, which asks the broker's
  key index for their offsets (``key_plan.py``).

Nothing on ``value`` is pushed (decoded, it may be null), nor on the decoding
columns (``valueSchemaVersion``, the corrupt-record column).
Value types are checked: a filter whose value is not what the column holds
(after a cast, a naive datetime, a null) is returned. Spark's times are
microseconds, the broker's milliseconds: bounds are rounded so that the rows
kept are exactly the rows the filter keeps (a row's time is a whole ms).
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
)

from equeue_proto.selector import MAX_TEXT_BYTES, SelectorError, parse
from equeue_spark.client.cluster import routes_type
from equeue_spark.spark.offsets import (
    EVERYTHING,
    Span,
    complement,
    intersect,
    normalized,
    points,
)
from equeue_spark.spark.options import ReadOptions, and_filters

PLANNER_MODULE = "pyspark.sql.worker.data_source_pushdown_filters"
"""The Python worker Spark runs to plan a read when pushdown is on (4.1-4.3);
while pushdown is off it runs ``plan_data_source_read``, which fails a read
whose reader defines ``pushFilters`` (DATA_SOURCE_PUSHDOWN_DISABLED)."""
CONF = "spark.sql.python.filterPushdown.enabled"
"""The Spark setting that turns pushdown for Python data sources on (off by default)."""

MAX_IN_VALUES = 1000
"""Longest ``IN`` list pushed (the selector's limit too)."""
MAX_SPANS = 64
"""Most offset ranges per queue planned from offset filters; an ``IN`` of
offsets that makes more is narrowed to its hull and left to Spark."""
MAX_KEYS = 100
"""Most keys a ``key`` equality may list for the key-index plan."""
MAX_SELECTOR = MAX_TEXT_BYTES
"""Longest filter a read sends (the option's and the pushed expressions)."""

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)
_NON_NULL = frozenset(
    {"topic", "queue", "offset", "timestamp", "tag", "message_id", "broker",
     "timestampType", "storeTimestamp", "headers"}
)  # fmt: skip
"""Columns the source never leaves null (``key`` is null without a key).
``value`` is left out: decoded (``valueFormat``) it may be null, and nothing
on it is pushed in any format (Spark's check of raw bytes costs nothing)."""


def pushdown_planner() -> bool:
    """True in the Python worker Spark runs to push filters down (module
    ``PLANNER_MODULE`` loaded, by the daemon or as ``__main__``)."""
    if PLANNER_MODULE in sys.modules:
        return True
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == PLANNER_MODULE


@dataclass(frozen=True)
class Names:
    """Allowed names (``topic``/``broker``): in ``only`` (None: any) and not in ``not_in``."""

    only: frozenset[str] | None = None
    not_in: frozenset[str] = frozenset()

    def admits(self, name: str) -> bool:
        return (self.only is None or name in self.only) and name not in self.not_in


@dataclass(frozen=True)
class Pushdown:
    """What ``push`` took, for planning and the read tasks (picklable)."""

    topics: Names = field(default_factory=Names)
    brokers: Names = field(default_factory=Names)
    queues: tuple[Span, ...] = EVERYTHING
    offsets: tuple[Span, ...] = EVERYTHING
    store_ms: tuple[int | None, int | None] = (None, None)
    """``[lo, hi)`` of store times in ms (None: unbounded)."""
    tags: tuple[str, ...] | None = None
    """The tags read (the ``tags`` option's intersected with pushed ones); None: the option's."""
    keys: tuple[bytes, ...] = ()
    """Keys of a pushed ``key`` equality (for the key-index plan)."""
    selector: str = ""
    """AND of the expressions the broker evaluates (without the filter option)."""
    empty: bool = False
    """A pushed filter no row passes: nothing is read."""
    pushed: tuple[str, ...] = ()
    """The filters taken, for logs and tests."""

    def read_filter(self, option: str) -> str:
        """The broker filter of a read: the ``filter`` option AND the pushed expressions."""
        return and_filters(option, self.selector)


@dataclass(frozen=True)
class _Cond:
    """A filter as (column, operator, value); operators are SQL's, plus
    ``in``, ``not in``, ``null``, ``not null``."""

    column: str
    op: str
    value: Any = None


_OPS: dict[type, str] = {
    EqualTo: "=", GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<",
    LessThanOrEqual: "<=", In: "in", IsNull: "null", IsNotNull: "not null",
}  # fmt: skip
_NEGATED = {"=": "<>", ">": "<=", ">=": "<", "<": ">=", "<=": ">", "in": "not in",
            "null": "not null", "<>": "=", "not in": "in", "not null": "null"}  # fmt: skip


def _cond(f: Filter) -> _Cond | None:
    """``f`` as a condition on a top-level column; None for anything else.
    ``NOT`` is folded into the operator (in SQL's three-valued logic
    ``NOT (a > b)`` is ``a <= b``, also when ``a`` is null)."""
    if isinstance(f, Not):
        inner = _cond(f.child)
        return None if inner is None else _Cond(inner.column, _NEGATED[inner.op], inner.value)
    op = _OPS.get(type(f))
    attribute: tuple[str, ...] = getattr(f, "attribute", ())
    if op is None or len(attribute) != 1:
        return None
    value: Any = getattr(f, "value", None)
    if op == "in":
        value = tuple(value or ())
        if not value or len(value) > MAX_IN_VALUES:
            return None
    return _Cond(attribute[0], op, value)


class _Builder:
    """What the filters taken so far amount to."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.pd = Pushdown()
        self.conjuncts: list[tuple[str, Filter]] = []

    def take(self, f: Filter) -> bool:
        c = _cond(f)
        if c is None:
            return False
        if c.column == "key" and self.decoded():
            return False  # Spark's key is the decoded one; the broker's are bytes
        if c.op == "not null" and c.column in _NON_NULL:
            return True
        if c.op == "null" and c.column in _NON_NULL:
            return self._nothing()
        handler = _HANDLERS.get(c.column)
        return handler is not None and handler(self, c, f)

    def decoded(self) -> bool:
        """Whether Spark sees ``key`` decoded (a ``keyFormat`` other than
        binary): its text or struct (or a null for a corrupt key) is not the
        bytes the broker compares and indexes, so no condition on it is pushed."""
        return self.options.formats.key_format != "binary"

    def _nothing(self) -> bool:
        self.pd = replace(self.pd, empty=True)
        return True

    def where(self, f: Filter, expression: str) -> bool:
        self.conjuncts.append((expression, f))
        return True

    # -- columns --------------------------------------------------------------------

    def names(self, c: _Cond, current: Names) -> Names | None:
        values = c.value if c.op in ("in", "not in") else (c.value,)
        if c.op not in ("=", "<>", "in", "not in") or not all(type(v) is str for v in values):
            return None
        if c.op in ("=", "in"):
            only = frozenset(values) if current.only is None else current.only & set(values)
            return replace(current, only=only)
        return replace(current, not_in=current.not_in | set(values))

    def topic(self, c: _Cond, f: Filter) -> bool:
        names = self.names(c, self.pd.topics)
        if names is None:
            return False
        self.pd = replace(self.pd, topics=names)
        return True

    def broker(self, c: _Cond, f: Filter) -> bool:
        # Pushed where the column holds the group names routes list (a
        # cluster's); one broker's holds its id, which planning does not know.
        named = routes_type(self.options.client).names_groups()
        names = self.names(c, self.pd.brokers) if named else None
        if names is None:
            return False
        self.pd = replace(self.pd, brokers=names)
        return True

    def queue(self, c: _Cond, f: Filter) -> bool:
        spans = _int_spans(c)
        if spans is None:
            return False
        self.pd = replace(self.pd, queues=intersect(self.pd.queues, spans))
        return True

    def offset(self, c: _Cond, f: Filter) -> bool:
        spans = _int_spans(c)
        if spans is None:
            return False
        narrowed = intersect(self.pd.offsets, spans)
        if len(narrowed) <= MAX_SPANS:
            self.pd = replace(self.pd, offsets=narrowed)
            return True
        if c.op == "in":  # read the hull; Spark picks the offsets
            self.pd = replace(self.pd, offsets=intersect(self.pd.offsets, _hull(spans)))
        return False

    def store_timestamp(self, c: _Cond, f: Filter) -> bool:
        if c.op not in ("=", "<", "<=", ">", ">=") or _micros(c.value) is None:
            return False
        lo, hi = _ms_bounds(c.op, _micros(c.value) or 0)
        old_lo, old_hi = self.pd.store_ms
        if old_lo is not None:
            lo = old_lo if lo is None else max(lo, old_lo)
        if old_hi is not None:
            hi = old_hi if hi is None else min(hi, old_hi)
        self.pd = replace(self.pd, store_ms=(lo, hi))
        return self._nothing() if lo is not None and hi is not None and lo >= hi else True

    def timestamp(self, c: _Cond, f: Filter) -> bool:
        if c.op in ("in", "not in"):
            micros = [_micros(v) for v in c.value]
            if any(u is None for u in micros):
                return False
            exact = sorted({u // 1000 for u in micros if u is not None and u % 1000 == 0})
            if not exact:  # no row's time is a fraction of a ms
                return self._nothing() if c.op == "in" else True
            listed = ", ".join(str(ms) for ms in exact)
            return self.where(f, f"timestamp {c.op.upper()} ({listed})")
        u = _micros(c.value)
        if u is None or c.op not in ("=", "<>", "<", "<=", ">", ">="):
            return False
        if c.op in ("=", "<>"):
            if u % 1000:  # no row's time is a fraction of a ms
                return self._nothing() if c.op == "=" else True
            return self.where(f, f"timestamp {c.op} {u // 1000}")
        lo, hi = _ms_bounds(c.op, u)
        return self.where(f, f"timestamp >= {lo}" if lo is not None else f"timestamp < {hi}")

    def tag(self, c: _Cond, f: Filter) -> bool:
        values = c.value if c.op in ("in", "not in") else (c.value,)
        if c.op not in ("=", "<>", "in", "not in") or not all(type(v) is str for v in values):
            return False
        named = sorted(set(values) - {""})
        untagged = "" in values  # Spark's "" is the selector's NULL
        if c.op in ("=", "in") and not untagged:
            return self._tags(named)
        listed = ", ".join(_string(v) for v in named)
        if c.op in ("=", "in"):
            return self.where(f, f"(tag IS NULL OR tag IN ({listed}))" if named else "tag IS NULL")
        if untagged:
            return self.where(
                f, f"(tag IS NOT NULL AND tag NOT IN ({listed}))" if named else "tag IS NOT NULL"
            )
        return self.where(f, f"(tag IS NULL OR tag NOT IN ({listed}))")

    def _tags(self, named: list[str]) -> bool:
        current = self.pd.tags if self.pd.tags is not None else self.options.tags or None
        kept = tuple(named) if current is None else tuple(t for t in current if t in named)
        self.pd = replace(self.pd, tags=kept)
        return True if kept else self._nothing()

    def key(self, c: _Cond, f: Filter) -> bool:
        if c.op == "null":
            return self.where(f, "key IS NULL")
        if c.op == "not null":
            return self.where(f, "key IS NOT NULL")
        values = c.value if c.op in ("in", "not in") else (c.value,)
        if c.op not in ("=", "<>", "in", "not in") or not all(type(v) is bytes for v in values):
            return False
        listed = ", ".join(_hex(v) for v in sorted(set(values)))
        if c.op in ("=", "in"):
            keys = tuple(sorted(set(values)))
            if self.pd.keys:  # two equalities: the keys both allow
                keys = tuple(k for k in self.pd.keys if k in keys)
                if not keys:
                    return self._nothing()
            self.pd = replace(self.pd, keys=keys if len(keys) <= MAX_KEYS else ())
        if c.op == "=":
            return self.where(f, f"key = {listed}")
        if c.op == "<>":
            return self.where(f, f"key <> {listed}")
        return self.where(f, f"key {c.op.upper()} ({listed})")

    # -- result ---------------------------------------------------------------------

    def result(self, taken: list[Filter], returned: list[Filter]) -> Pushdown:
        """The pushdown. Selector conjuncts the broker would refuse together
        with the filter option (beyond its limits of text and nodes) are given
        back to Spark, the longest first (appended to ``returned``)."""
        kept = sorted(self.conjuncts, key=lambda c: len(c[0]))
        while kept and not _acceptable(self.options.filter, [e for e, _ in kept]):
            _, f = kept.pop()
            returned.append(f)
            taken.remove(f)
        selector = " AND ".join(e for e, _ in kept)
        return replace(self.pd, selector=selector, pushed=tuple(repr(f) for f in taken))


_HANDLERS: dict[str, Callable[[_Builder, _Cond, Filter], bool]] = {
    "topic": _Builder.topic, "broker": _Builder.broker, "queue": _Builder.queue,
    "offset": _Builder.offset, "storeTimestamp": _Builder.store_timestamp,
    "timestamp": _Builder.timestamp, "tag": _Builder.tag, "key": _Builder.key,
}  # fmt: skip


def push(filters: Sequence[Filter], options: ReadOptions) -> tuple[Pushdown, list[Filter]]:
    """(what the source applies, the filters Spark must still evaluate: the
    same objects, in their order)."""
    builder = _Builder(options)
    taken: list[Filter] = []
    returned: list[Filter] = []
    for f in filters:
        (taken if builder.take(f) else returned).append(f)
    pushdown = builder.result(taken, returned)
    order = {id(f): i for i, f in enumerate(filters)}
    return pushdown, sorted(returned, key=lambda f: order[id(f)])


# -- values ---------------------------------------------------------------------------


def _acceptable(option: str, conjuncts: list[str]) -> bool:
    """Whether the broker takes the filter option AND ``conjuncts``."""
    text = and_filters(option, " AND ".join(conjuncts))
    if len(text.encode()) > MAX_SELECTOR:
        return False
    try:
        parse(text)
    except SelectorError:
        return False
    return True


def _is_int(value: object) -> bool:
    return type(value) is int


def _int_spans(c: _Cond) -> tuple[Span, ...] | None:
    """The ids/offsets a condition on an integer column allows; None when its
    operator or value is not one taken."""
    values = c.value if c.op in ("in", "not in") else (c.value,)
    if c.op in ("null", "not null") or not all(_is_int(v) for v in values):
        return None
    v = values[0]
    spans: tuple[Span, ...] = {
        "=": lambda: points([v]),
        "<>": lambda: complement(points([v])),
        "<": lambda: normalized([(0, v)]),
        "<=": lambda: normalized([(0, v + 1)]),
        ">": lambda: normalized([(max(v + 1, 0), EVERYTHING[0][1])]),
        ">=": lambda: normalized([(max(v, 0), EVERYTHING[0][1])]),
        "in": lambda: points(values),
        "not in": lambda: complement(points(values)),
    }[c.op]()
    return intersect(spans, EVERYTHING)


def _hull(spans: tuple[Span, ...]) -> tuple[Span, ...]:
    return ((spans[0][0], spans[-1][1]),) if spans else ()


def _micros(value: object) -> int | None:
    """A Spark timestamp value (an aware datetime) in microseconds since the
    epoch, exactly; None for anything else (a naive datetime, a date, a null)."""
    if not isinstance(value, dt.datetime) or value.utcoffset() is None:
        return None
    return (value - _EPOCH) // _US


def _ms_bounds(op: str, u: int) -> tuple[int | None, int | None]:
    """``[lo, hi)`` in whole ms of the rows ``column <op> u`` keeps (``u`` in us;
    a row's time is ``ms * 1000``). ``=`` of a fraction of a ms: an empty range."""
    floor, ceil = u // 1000, -(-u // 1000)
    return {
        ">": (floor + 1, None),
        ">=": (ceil, None),
        "<": (None, ceil),
        "<=": (None, floor + 1),
        "=": (floor, floor + 1) if u % 1000 == 0 else (0, 0),
    }[op]


def _string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _hex(value: bytes) -> str:
    return f"X'{value.hex()}'"
