"""Filtered reads' helpers: tag filters, expression filters' limits and spans.

``Reads.read_records`` (reads.py) with ``tags`` skips records by the index's tag
hash; with a ``selector`` (a filter expression, ``equeue_proto.selector``) it
runs runs of records through ``select_frames`` and takes the spans that pass,
within the read's limits (``Taken``).
"""

from __future__ import annotations

from collections.abc import Iterable

from crc32c import crc32c

from equeue_broker.storage.errors import InvalidArgument
from equeue_broker.storage.index.queue_index import ENTRY, ENTRY_SIZE
from equeue_broker.storage.results import Piece
from equeue_proto.selection import Span
from equeue_proto.selector import Selector
from equeue_proto.selector_tree import (
    T_STR,
    TAG,
    And,
    Field,
    In,
    Literal,
    Node,
    compile_program,
    cost,
)

TagFilter = dict[int, frozenset[bytes]]
"""{tag hash: tag strings with that hash} of a tag-filtered read."""

SELECT_BATCH = 16_384
"""Index entries a filtered read plans at a time (it stops at a limit between)."""
SELECT_RUN_BYTES = 4 << 20
"""Bytes of records a filtered read plans at a time (one record more if larger):
bounds the copy a run of transactions' records takes to be patched as served."""
FREE_COST = 64
"""An expression costing up to this many comparisons a record (``Selector.cost``)
scans the whole ``max_filter_scan``; a costlier one proportionally fewer entries,
so that one read's work under the engine lock stays bounded (``keys IN`` a long
list compares each of a record's 33 keys)."""


def scan_limit(max_scan: int, selector: Selector | None) -> int:
    """The index entries a read filtered by ``selector`` may inspect."""
    if selector is None or selector.cost <= FREE_COST:
        return max_scan
    return max(1, max_scan * FREE_COST // selector.cost)


def before_damage(run: bytes, start: int, stop_at: int, bad: int | None) -> tuple[int, int]:
    """(records, end position) of a run's records before the damaged one at ``bad``."""
    if bad is None:
        return len(run) // ENTRY_SIZE, stop_at
    at, good = start, 0
    for _position, size, _tag, _ts in ENTRY.iter_unpack(run):
        if at + size > bad:
            break
        at, good = at + size, good + 1
    return good, at


class Taken:
    """The records a filtered read has taken so far, within its limits."""

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        self.pieces: list[Piece] = []
        self.count = self.total = 0
        self._max_messages = max_messages
        self._max_bytes = max_bytes

    def detach(self) -> None:
        """Copy the pieces (views of a log chunk that may be unmapped next)."""
        self.pieces = [bytes(p) for p in self.pieces]

    def take(self, piece: memoryview, spans: list[Span], run: bytes) -> int | None:
        """Take the spans of passing frames of ``piece`` (whose entries are ``run``);
        the index of the first passing frame not taken if a limit was reached."""
        for start, end, index, frames in spans:
            whole = (
                self.count + frames <= self._max_messages
                and self.total + (end - start) <= self._max_bytes
            )  # the common case, decided without a look at each record
            fits = (
                frames
                if whole
                else self._room(run[index * ENTRY_SIZE : (index + frames) * ENTRY_SIZE])
            )
            if fits < frames:
                sizes = ENTRY.iter_unpack(run[index * ENTRY_SIZE : (index + fits) * ENTRY_SIZE])
                end = start + sum(size for _p, size, _t, _s in sizes)  # noqa: PLW2901 (cut)
            if fits:
                self.pieces.append(piece[start:end])
                self.count += fits
                self.total += end - start
            if fits < frames:
                return index + fits
        return None

    def _room(self, entries: bytes) -> int:
        """How many of these records fit the limits (a read's first always does)."""
        fits, total = 0, self.total
        for _position, size, _tag, _ts in ENTRY.iter_unpack(entries):
            if self.count + fits >= self._max_messages or (
                self.count + fits and total + size > self._max_bytes
            ):
                break
            total += size
            fits += 1
        return fits

    def result(self, next_offset: int) -> tuple[list[Piece], int, int, int]:
        return self.pieces, self.count, self.total, next_offset


def with_tags(selector: Selector | None, tags: Iterable[str]) -> Selector | None:
    """``selector AND tag IN (tags)`` (or ``tag IN (tags)`` alone), so that C
    checks it run by run over the records in place (faster than a skip by the
    index's tag hashes entry by entry in Python, at any selectivity); None if
    ``tags`` names the empty tag, which an untagged record matches but ``tag
    IN`` (NULL for it) does not."""
    items = tuple(Literal(t.encode(), T_STR, "") for t in dict.fromkeys(tags))
    if not items:
        raise InvalidArgument("tags must name at least one tag (None reads every message)")
    if any(not item.raw for item in items):
        return None
    listed = In(Field(TAG), T_STR, items, False)
    root: Node = listed if selector is None else And((selector.root, listed))
    return Selector(root, "", None, None, compile_program(root), cost(root))


def wanted_tags(tags: Iterable[str] | None, selector: Selector | None) -> TagFilter | None:
    """The tag filter of a read: its ``tags``, narrowed by the selector's tag
    prefilter (tags its expression requires), if any."""
    allowed = None if tags is None else frozenset(t.encode() for t in tags)
    if allowed is not None and not allowed:
        raise InvalidArgument("tags must name at least one tag (None reads every message)")
    prefilter = None if selector is None else selector.tag_prefilter
    if prefilter is not None:
        allowed = prefilter if allowed is None else allowed & prefilter
    if allowed is None:
        return None
    by_hash: dict[int, set[bytes]] = {}
    for tag in allowed:
        by_hash.setdefault(crc32c(tag), set()).add(tag)
    return {h: frozenset(v) for h, v in by_hash.items()}


def tag_filter(tags: Iterable[str] | None) -> TagFilter | None:
    """{tag hash: tag strings with that hash} for a tag-filtered read, else None."""
    if tags is None:
        return None
    encoded = frozenset(t.encode() for t in tags)
    if not encoded:
        raise InvalidArgument("tags must name at least one tag (None reads every message)")
    by_hash: dict[int, set[bytes]] = {}
    for tag in encoded:
        by_hash.setdefault(crc32c(tag), set()).add(tag)
    return {h: frozenset(v) for h, v in by_hash.items()}
