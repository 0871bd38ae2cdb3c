"""Placing an append in the log: records into chunks, entries into the queue's index.

The store's write paths (``Store.append``, the sync-mode rounds and the
transaction writes of txn_writes.py) decide *when* an append runs and when
readers see it; ``LogWriter`` does the writing itself, the same way for every path: it
keeps an append in one chunk when it can (so a crash keeps all of it or none),
splits one larger than a chunk into one atomic piece per chunk, encodes each
piece straight into the log (C when built), hands the encoded records to the
key index (keys/key_index.py) when there is one, writes its index entries, and
cuts the piece out of the log (and the key index) again if a write fails.

``LogWriter`` is given the engine state (engine.py): it writes into its log
and the queues' indexes, and marks it failed (``EngineState.fail``) when a
failed write cannot even be cut out of the log again.

Locking: every public method must be called with the engine lock held, and
asserts it (the store calls them from its append paths, which hold it); that
lock is what makes the log position an append gets, and its queue's end
offset, its alone.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence

from equeue_broker.storage.engine import EngineState
from equeue_broker.storage.errors import InvalidArgument, io_error
from equeue_broker.storage.index.queue_index import ENTRY_SIZE
from equeue_broker.storage.index.queue_state import QueueState
from equeue_broker.storage.keys.key_index import KeyIndex
from equeue_broker.storage.log.record import (
    PreparedBatch,
    clear_batch_end,
    encode_records,
    frame_sizes,
)
from equeue_broker.storage.results import AppendResult
from equeue_broker.storage.txn.txn_records import encode_control
from equeue_proto.record import FLAG_DELAYED, FLAG_TXN, FRAME_OVERHEAD

log = logging.getLogger(__name__)


class LogWriter:
    """Writes appends into the engine's log and their queues' indexes (lock held)."""

    def __init__(self, state: EngineState) -> None:
        self._state = state
        self._log = state.log
        self._last_store_ms = 0

    def _next_store_ms(self) -> int:
        # The clock, but never backwards: a queue's store times must not decrease,
        # as finding an offset by time is a binary search over them.
        self._last_store_ms = max(int(time.time() * 1000), self._last_store_ms)
        return self._last_store_ms

    def write(
        self, queue: QueueState, prepared: PreparedBatch, lead: PreparedBatch | None = None
    ) -> AppendResult:
        """Append a checked batch at the end of ``queue``.

        ``lead``: a control record (a producer record) to write just before
        the batch, in the same atomic piece: a crash keeps both or neither.
        A batch larger than a chunk is written in pieces, and ``lead`` after
        its last piece (a crash between them keeps the batch without it)."""
        assert self._state.held()
        count = len(prepared.batch)
        entries = bytearray(count * ENTRY_SIZE)
        first_offset = queue.index.end
        store_ms = self._next_store_ms()
        fixed = FRAME_OVERHEAD + len(queue.topic_bytes)
        if lead is not None and prepared.total_bytes + lead.total_bytes <= self._log.capacity:
            if prepared.total_bytes + lead.total_bytes > self._log.room():
                self._roll(queue.topic)
            self._write_piece(
                queue, prepared, start=0, stop=count, size=prepared.total_bytes,
                first_offset=first_offset, store_ms=store_ms, entries=entries, lead=lead,
            )  # fmt: skip
            return AppendResult(queue.topic, queue.queue_id, first_offset, count, entries)

        def sizes(start: int) -> Iterator[int]:
            all_sizes = frame_sizes(prepared.batch, prepared.tags, prepared.headers, fixed)
            return itertools.islice(all_sizes, start, None)

        def write(start: int, stop: int, size: int) -> None:
            self._write_piece(
                queue, prepared, start=start, stop=stop, size=size,
                first_offset=first_offset, store_ms=store_ms, entries=entries,
            )  # fmt: skip

        self._write_in_pieces(queue.topic, prepared.total_bytes, count, sizes, write)
        if lead is not None:
            self.write_control(lead, store_ms)
        return AppendResult(queue.topic, queue.queue_id, first_offset, count, entries)

    def write_staged(
        self,
        queue: QueueState,
        prepared: PreparedBatch,
        serial: int,
        entries: bytearray,
        done: list[int],
        *,
        lead: PreparedBatch | None = None,
        dues: Sequence[int] | None = None,
    ) -> None:
        """Append a transaction's checked batch for ``queue``, invisible: flagged
        TXN with ``serial`` as every record's queue offset, and no index
        entries. ``entries`` (one slot per message) gets the entries a commit
        will write (store time: now), a piece at a time, and ``done[0]`` the
        number of messages whose piece is in the log: if a piece fails, those
        before it stay (recovery will find them). ``lead``: as for ``write``.
        ``dues``: delayed records instead (timer/): flagged TXN | DELAYED, each
        with its due time as its queue offset (``serial`` unused)."""
        assert self._state.held()
        count = len(prepared.batch)
        store_ms = self._next_store_ms()
        fixed = FRAME_OVERHEAD + len(queue.topic_bytes)
        if lead is not None and prepared.total_bytes + lead.total_bytes <= self._log.capacity:
            if prepared.total_bytes + lead.total_bytes > self._log.room():
                self._roll(queue.topic)
            self._write_piece(
                queue, prepared, start=0, stop=count, size=prepared.total_bytes,
                first_offset=serial, store_ms=store_ms, entries=entries, staged=True, lead=lead,
                dues=dues,
            )  # fmt: skip
            done[0] = count
            return

        def sizes(start: int) -> Iterator[int]:
            all_sizes = frame_sizes(prepared.batch, prepared.tags, prepared.headers, fixed)
            return itertools.islice(all_sizes, start, None)

        def write(start: int, stop: int, size: int) -> None:
            self._write_piece(
                queue, prepared, start=start, stop=stop, size=size,
                first_offset=serial, store_ms=store_ms, entries=entries, staged=True, dues=dues,
            )  # fmt: skip
            done[0] = stop

        self._write_in_pieces(queue.topic, prepared.total_bytes, count, sizes, write)
        if lead is not None:
            self.write_control(lead, store_ms)

    def write_control(self, prepared: PreparedBatch, store_ms: int | None = None) -> int:
        """Append one control record (txn_records.py); return its log position."""
        assert self._state.held()
        stamp = self._next_store_ms() if store_ms is None else store_ms

        def encode(out: memoryview, position: int) -> int:
            return encode_control(out, position, prepared, stamp)

        if prepared.total_bytes > self._log.room():
            self._roll("transactions")
        try:
            return self._log.append(prepared.total_bytes, encode)
        except OSError as exc:
            raise io_error("the message log (transaction record)", exc) from exc

    def now_ms(self) -> int:
        """A store time for a commit: the clock, never backwards."""
        return self._next_store_ms()

    def undo(self, position: int, cause: OSError) -> None:
        """Cut the log back to ``position`` after a failed multi-part write."""
        assert self._state.held()
        self._undo_write(position, cause)

    def _write_in_pieces(
        self,
        topic: str,
        total: int,
        count: int,
        sizes: Callable[[int], Iterator[int]],
        write: Callable[[int, int, int], None],
    ) -> None:
        """How every append is laid out: in one piece when it fits the active
        chunk, else in one piece at the start of a new chunk, else (larger than
        a chunk) split at record boundaries, one atomic piece per chunk.
        ``write(start, stop, bytes)`` writes records ``[start, stop)``;
        ``sizes(start)`` gives frame sizes from ``start`` (a Python loop, only
        for appends larger than a chunk)."""
        if total > self._log.room() and total <= self._log.capacity:
            self._roll(topic)  # keep the append in one chunk, so it stays atomic
        if total <= self._log.room():  # the common case
            write(0, count, total)
            return
        start = 0
        while start < count:
            room = self._log.room()
            stop, used = start, 0
            for size in sizes(start):
                if used + size > room:
                    break
                used += size
                stop += 1
            if stop == start:
                assert room < self._log.capacity, "a record larger than a chunk"
                self._roll(topic)
                continue
            write(start, stop, used)
            start = stop

    def _write_piece(
        self, queue: QueueState, prepared: PreparedBatch, *, start: int, stop: int, size: int,
        first_offset: int, store_ms: int, entries: bytearray, staged: bool = False,
        lead: PreparedBatch | None = None, dues: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        entry_view = memoryview(entries)[start * ENTRY_SIZE : stop * ENTRY_SIZE]
        flags = (FLAG_TXN if staged else 0) | (FLAG_DELAYED if dues is not None else 0)

        def encode_batch(out: memoryview, position: int) -> int:
            return encode_records(
                out, position=position, topic=queue.topic_bytes, queue_id=queue.queue_id,
                first_offset=first_offset + (0 if staged else start), store_ms=store_ms,
                prepared=prepared, start=start, stop=stop, index_out=entry_view, flags=flags,
                offsets=dues,
            )  # fmt: skip

        encode = encode_batch
        if lead is not None:
            size += lead.total_bytes

            def encode(out: memoryview, position: int) -> int:
                head = encode_control(out, position, lead, store_ms)
                clear_batch_end(out, 0)  # the batch's last record ends the piece
                return head + encode_batch(out[head:], position + head)

        def bad(exc: Exception) -> Exception:  # e.g. a bad timestamp
            return InvalidArgument(f"bad message batch: {exc}")

        if staged:  # no index entries until the commit
            self._append(queue.topic, size, encode, bad)
            return
        self._append_indexed(queue, size, encode, first_offset + start, entry_view, bad)

    def _append(
        self,
        topic: str,
        size: int,
        encode: Callable[[memoryview, int], int],
        bad_input: Callable[[Exception], Exception],
    ) -> int:
        """Append ``size`` bytes that ``encode`` writes; return their position.
        The key index gets the encoded records' keys while they are in hand
        (and loses them again if the write fails)."""
        keys = self._state.keys
        if keys is not None:
            encode = _indexing(encode, keys)
        before = self._log.write_position
        try:
            return self._log.append(size, encode)
        except (TypeError, ValueError, OverflowError) as exc:
            if keys is not None:
                keys.truncate(before)
            raise bad_input(exc) from None
        except OSError as exc:
            if keys is not None:
                keys.truncate(before)
            raise io_error(topic, exc) from exc

    def _append_indexed(  # noqa: PLR0917 (private, called in two places)
        self,
        queue: QueueState,
        size: int,
        encode: Callable[[memoryview, int], int],
        first_offset: int,
        entries: bytearray | memoryview,
        bad_input: Callable[[Exception], Exception],
    ) -> None:
        """Append ``size`` bytes that ``encode`` writes, then their index
        ``entries``; an index write that fails undoes the log write. An encoder
        refusing its input raises ``bad_input(exc)``; I/O errors raise ``io_error``."""
        position = self._append(queue.topic, size, encode, bad_input)
        try:
            queue.index.write(first_offset, entries)
        except OSError as exc:
            self._undo_write(position, exc)
            raise io_error(queue.topic, exc) from exc

    def _roll(self, topic: str) -> None:
        try:
            self._log.roll()
        except OSError as exc:
            raise io_error(topic, exc) from exc

    def _undo_write(self, position: int, cause: OSError) -> None:
        """Cut a failed append out of the log; if even that fails, stop accepting writes."""
        try:
            if self._log.write_position > position:
                self._log.truncate(position)
            if self._state.keys is not None:
                self._state.keys.truncate(position)
        except OSError as exc:
            log.error("cannot undo a failed append (%s); store refuses writes until restart", exc)
            self._state.fail(cause)


def _indexing(
    encode: Callable[[memoryview, int], int], keys: KeyIndex
) -> Callable[[memoryview, int], int]:
    """``encode``, then the keys of the records it wrote into ``keys``."""

    def encode_and_index(out: memoryview, position: int) -> int:
        written = encode(out, position)
        keys.add_frames(out[:written], position)
        return written

    return encode_and_index
