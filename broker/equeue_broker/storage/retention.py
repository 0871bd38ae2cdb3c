"""Retention: which sealed log chunks may go, and deleting them with their index chunks.

The policy (``RetentionConfig``): delete the oldest sealed chunks while there
are more than ``max_chunks`` of them or the oldest was sealed more than
``max_age_ms`` ago; never the active chunk; with ``keep_unconsumed``, keep a
chunk while some group has committed on a queue but not consumed a record in
it or before it. Once log chunks are gone, index chunks that only point into
them go too. ``Store.apply_retention`` (run by the store's maintenance thread)
flushes first, then calls ``delete_expired`` with the engine state (engine.py)
under its lock.

Transactions (transactions.py) add two rules. A chunk holding a record of an
open transaction is never deleted, nor any chunk after it (``pinned``): the
transaction may still commit them. And since a commit's index entries point
at its staged records where they lie, a queue's entries are not in log order:
deleting the log below position B retires each queue's offsets below some
``k`` (``queue.index.earliest`` becomes ``k``), which is allowed only if
every entry below ``k`` points below B and every entry from ``k`` on at or
after B (``retirable``). Otherwise the chunk waits, at most until the later
chunks holding the other side of the split expire too, and goes with them: no record an index
still serves is ever deleted, and none is retired before the records of
lower offsets.

Locking: ``delete_expired`` must be called with the engine lock held, and
asserts it; ``settle_earliest`` runs at open, before the engine state exists;
the other functions look at one queue, for those two.
"""

from __future__ import annotations

from equeue_broker.storage.engine import EngineState
from equeue_broker.storage.index.queue_state import QueueKey, QueueState
from equeue_broker.storage.meta.offsets import OffsetStore
from equeue_broker.storage.results import RetentionReport


def delete_expired(
    state: EngineState, now_ms: int, *, pinned: int | None = None
) -> RetentionReport:
    """Delete the log chunks the retention rules (``state.config.retention``)
    let go at ``now_ms`` that end at or before ``pinned`` (the first record of
    the oldest open transaction), then the index chunks that only point into
    deleted log chunks (lock held)."""
    assert state.held()
    rules, message_log = state.config.retention, state.log
    queues, offsets = state.queues, state.offsets
    deleted = 0
    keeps: dict[QueueKey, int] = {}
    chunks = message_log.chunks
    for count in range(1, len(chunks)):  # delete chunks[:count]?
        chunk = chunks[count - 1]
        by_count = rules.max_chunks is not None and len(chunks) - count > rules.max_chunks
        by_age = (
            rules.max_age_ms is not None and now_ms - (chunk.sealed_ms or now_ms) > rules.max_age_ms
        )
        if not (by_count or by_age):
            break
        boundary = message_log.start_of(chunks[count])
        if pinned is not None and boundary > pinned:
            break
        split = _split_all(queues, boundary, offsets if rules.keep_unconsumed else None)
        if split is not None:  # else: maybe together with the next chunks
            deleted, keeps = count, split
    for _ in range(deleted):
        message_log.delete_oldest()
    index_deleted = 0
    if deleted:
        for key, queue in queues.items():
            index_deleted += queue.index.delete_chunks_below(message_log.start_position)
            queue.index.earliest = min(max(keeps[key], queue.index.earliest), queue.index.end)
        if state.keys is not None:  # key index windows go with the records they name
            state.keys.drop_below(message_log.start_position)
    return RetentionReport(deleted, index_deleted, message_log.start_position)


def _split_all(
    queues: dict[QueueKey, QueueState], boundary: int, offsets: OffsetStore | None
) -> dict[QueueKey, int] | None:
    """Each queue's first kept offset if the log below ``boundary`` goes; None
    if that must wait (a split is not clean, or, with ``offsets``, a group has
    not consumed what would be retired)."""
    keeps = {}
    for key, queue in queues.items():
        keep = retirable(queue, boundary)
        if keep is None:
            return None
        if offsets is not None:
            low = offsets.min_committed(*key)
            if low is not None and keep > max(low, queue.index.earliest):
                return None
        keeps[key] = keep
    return keeps


def settle_earliest(queue: QueueState, log_start: int, known: int | None = None) -> None:
    """At open: delete index chunks only pointing below ``log_start`` and set the
    queue's earliest offset (the first whose record is kept): ``known`` (the
    checkpoint's, saved with the same log start) or found by a scan."""
    index = queue.index
    index.delete_chunks_below(log_start, find_earliest=known is None)
    numbers = index.chunk_numbers()
    if not numbers or index.end <= index.earliest:
        return
    lowest = numbers[0] * index.entries_per_chunk
    if known is not None:
        index.earliest = min(max(known, lowest), index.end)
        return
    index.earliest = lowest
    keep = retirable(queue, log_start)
    # Not a clean split only if retention was interrupted by a crash part-way:
    # what points below the log start is gone, so start after the last of it.
    index.earliest = keep if keep is not None else _last_below(queue, log_start) + 1


def retirable(queue: QueueState, boundary: int) -> int | None:
    """The offset ``k`` such that the entries of ``[earliest, k)`` all point
    below ``boundary`` and those of ``[k, end)`` all at or after it; None if
    there is no such offset. Whole index chunks are judged by their lowest and
    highest positions (cached once a chunk is full); only a chunk holding both
    sides is looked at entry by entry."""
    index = queue.index
    limit = boundary + 1  # entries hold position + 1; an empty one (0) counts as below
    keep = index.earliest
    above = False  # an entry at or after the boundary was seen
    offset = index.earliest
    while offset < index.end:
        stop = min((offset // index.entries_per_chunk + 1) * index.entries_per_chunk, index.end)
        low, high = _bounds(queue, offset, stop)
        if high < limit:
            if above:
                return None
            keep = stop
        elif low >= limit:
            above = True
        else:
            for i, value in enumerate(_values(queue, offset, stop)):
                if value < limit:
                    if above:
                        return None
                    keep = offset + i + 1
                else:
                    above = True
        offset = stop
    return keep


def _last_below(queue: QueueState, boundary: int) -> int:
    """The highest offset whose entry points below ``boundary`` (earliest - 1 if none)."""
    index = queue.index
    last = index.earliest - 1
    offset = index.earliest
    while offset < index.end:
        stop = min((offset // index.entries_per_chunk + 1) * index.entries_per_chunk, index.end)
        for i, value in enumerate(_values(queue, offset, stop)):
            if value <= boundary:
                last = offset + i
        offset = stop
    return last


def _values(queue: QueueState, offset: int, stop: int) -> memoryview:
    """The ``position + 1`` words of the entries of ``[offset, stop)`` (one index chunk)."""
    raw = queue.index.read_raw(offset, stop - offset)
    return memoryview(raw).cast("Q")[::4]


def _bounds(queue: QueueState, offset: int, stop: int) -> tuple[int, int]:
    """(lowest, highest) ``position + 1`` of the entries of ``[offset, stop)``;
    those of a full chunk, read from its start, are cached (it never changes)."""
    index = queue.index
    number, slot = divmod(offset, index.entries_per_chunk)
    cached = queue.spans.get(number) if slot == 0 else None
    if cached is not None:
        return cached
    values = _values(queue, offset, stop)
    bounds = (min(values), max(values)) if len(values) else (0, 0)
    if slot == 0 and stop - offset == index.entries_per_chunk:
        queue.spans[number] = bounds
    return bounds
