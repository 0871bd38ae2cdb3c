"""The store's delayed-delivery calls: delayed appends, the timer thread, cancels.

``Store`` keeps its public API (``append(..., deliver_at_ms=)``,
``cancel_delayed``, ``delayed_summary``, ``set_delivering``) and hands the
work to ``Delivery``, which writes through the store's own paths: a delayed
batch is written like a transaction's staged batch (``LogWriter.write_staged``
with due times, with its producer record when idempotent), and deliveries and
cancels like a transaction commit (``Store.commit_staged``), so sync mode's
group commit, replication's high watermark and the listeners work unchanged.
The timer state itself (what is pending, the index on disk) is timer.py's.

Locking: ``write_locked`` runs with the engine lock held; the others take it.
A delivery's choice and its write, and a cancel's check and its write, are
ordered by ``Timer.deliver_lock`` (a cancel never races a delivery of the same
record); appends are not: a new record's due time is kept above what a
delivery may have chosen already (``Timer.clamp``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from equeue_broker.storage.engine import EngineState
from equeue_broker.storage.errors import NotFound, StorageError
from equeue_broker.storage.index.index_repair import entry_for
from equeue_broker.storage.index.queue_index import ENTRY_SIZE
from equeue_broker.storage.index.queue_state import QueueKey
from equeue_broker.storage.log.log_writer import LogWriter
from equeue_broker.storage.log.record import PreparedBatch
from equeue_broker.storage.producers.records import ProducerBatch, prepare_record
from equeue_broker.storage.producers.table import Appended, Idempotence, ProducerTable
from equeue_broker.storage.results import AppendResult
from equeue_broker.storage.timer.timer import Picked, Timer
from equeue_broker.storage.timer.timer_records import Cancel, Deliver, prepare_timer_control
from equeue_proto.record import FLAG_CONTROL, FLAG_DELAYED

log = logging.getLogger(__name__)

CommitStaged = Callable[..., dict[QueueKey, int]]
TopicCheck = Callable[[str], None] | None
"""Given a pending record's topic, refuses its cancel by raising (a token's reach)."""


@dataclass(frozen=True)
class DelayedMessage:
    """A pending delayed record (``Store.cancel_delayed``)."""

    topic: str
    queue_id: int
    deliver_at_ms: int


class Delivery:
    """Delayed appends, deliveries and cancels of one store."""

    def __init__(
        self, state: EngineState, writer: LogWriter, timer: Timer, producers: ProducerTable,
        commit_staged: CommitStaged,
    ) -> None:  # fmt: skip
        self._state = state
        self._writer = writer
        self.timer = timer
        self._producers = producers
        self._commit_staged = commit_staged
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- appends ---------------------------------------------------------------------

    def work(
        self, queue_key: QueueKey, prepared: PreparedBatch, deliver_at_ms: Sequence[int],
        idem: Idempotence | None,
    ) -> Callable[[], AppendResult]:  # fmt: skip
        """The write of a delayed append (``write_locked``), its times checked."""
        dues = self.timer.due_times(deliver_at_ms, len(prepared.batch), int(time.time() * 1000))
        return functools.partial(self.write_locked, queue_key, prepared, dues, idem)

    def write_locked(
        self, queue_key: QueueKey, prepared: PreparedBatch, dues: Sequence[int],
        idem: Idempotence | None,
    ) -> AppendResult:  # fmt: skip
        """Write a checked batch of delayed records (lock held); an idempotent
        repeat is answered with the original's positions."""
        state, timer = self._state, self.timer
        assert state.held()
        topic, queue_id = queue_key
        queue = state.writable_queue(topic, queue_id)
        count = len(prepared.batch)
        lead = said = None
        if idem is not None:
            seen = self._producers.check(queue_key, idem, count)
            if seen is not None:
                return self._repeated(queue_key, seen)
            said = ProducerBatch(
                idem.producer_id, idem.epoch, idem.sequence, topic, queue_id, -1, count
            )
            lead = prepare_record(said)
        clamped = timer.clamp(dues)
        entries, done = bytearray(count * ENTRY_SIZE), [0]
        try:
            self._writer.write_staged(queue, prepared, 0, entries, done, lead=lead, dues=clamped)
        finally:  # what reached the log is pending, as recovery will see
            n = done[0]
            timer.added(topic, _positions(entries[: n * ENTRY_SIZE]), clamped[:n])
        if said is not None:
            self._producers.apply(said, _positions(entries[:ENTRY_SIZE])[0], self._writer.now_ms())
        return AppendResult(topic, queue_id, -1, count, entries, deliver_at_ms=tuple(clamped))

    def _repeated(self, queue_key: QueueKey, seen: Appended) -> AppendResult:
        """The result of the remembered delayed batch ``seen``: its records'
        positions, found in the log from its first (lock held)."""
        topic, queue_id = queue_key
        entries, dues = bytearray(), list[int]()
        name = topic.encode()
        if seen.position >= self._state.log.start_position:
            for position, meta in self._state.log.iter_records(seen.position):
                if len(dues) >= seen.count:
                    break
                if meta.flags & FLAG_CONTROL or not meta.flags & FLAG_DELAYED:
                    continue
                if (meta.topic, meta.queue_id) == (name, queue_id):
                    entries += entry_for(position, meta)
                    dues.append(meta.queue_offset)
        return AppendResult(
            topic, queue_id, -1, seen.count, entries, duplicate=True, deliver_at_ms=tuple(dues)
        )

    # -- delivery --------------------------------------------------------------------

    def start(self) -> None:
        """Start the timer thread (ticks every ``tick_ms`` while delivering)."""
        self._thread = threading.Thread(target=self._run, name="equeue-timer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        interval = self.timer.config.tick_ms / 1000
        while not self._stop.wait(interval):
            if not self.timer.delivering:
                continue
            try:
                while self.deliver_due() >= self._batch_limit():
                    if self._stop.is_set() or not self.timer.delivering:
                        break
            except StorageError as exc:
                log.warning("delayed delivery failed (retried next tick): %s", exc)
            except Exception:
                log.exception("delayed delivery failed (retried next tick)")

    def deliver_due(self, now_ms: int | None = None) -> int:
        """Deliver what is due (at most ``max_deliver_batch``); return how many
        (none while not delivering: a replica)."""
        timer = self.timer
        with timer.deliver_lock:
            with self._state.lock:
                if not timer.delivering or self._state.closed or self._state.failed is not None:
                    return 0
                now = int(time.time() * 1000) if now_ms is None else now_ms
                picked = timer.select(now, self._batch_limit())
                if not picked:
                    return 0
                entries = self._entries(picked)
                before = timer.through

            def record(firsts: dict[QueueKey, int]) -> PreparedBatch:
                if timer.through != before:  # an earlier one timed out, then ran after all
                    raise StorageError("the timer moved since this delivery was chosen")
                queues = tuple((k, firsts[k], len(e) // ENTRY_SIZE) for k, e in entries.items())
                positions = tuple(p.key[1] for p in picked)
                deliver = Deliver(positions, queues, picked[-1].key, before)
                written.append(deliver)
                return prepare_timer_control(deliver)

            written: list[Deliver] = []
            self._commit_staged(
                entries, record, lambda: timer.delivered(written[0], picked), hidden=True
            )
            return len(picked)

    def _batch_limit(self) -> int:
        """Records per deliver record: ``max_deliver_batch``, fewer if the
        record (about 40 bytes per record at most) would not fit a chunk."""
        return max(1, min(self.timer.config.max_deliver_batch, self._state.log.capacity // 64))

    def _entries(self, picked: Sequence[Picked]) -> dict[QueueKey, bytearray]:
        """Index entries to be of the records ``picked``, per live queue (lock
        held); a record whose queue was deleted is dropped."""
        entries: dict[QueueKey, bytearray] = {}
        for p in picked:
            key = (p.meta.topic.decode(errors="replace"), p.meta.queue_id)
            if key in self._state.queues:
                entries.setdefault(key, bytearray()).extend(entry_for(p.key[1], p.meta))
        return entries

    def summary(self, topic: str | None) -> tuple[int, int | None]:
        """(pending delayed records, earliest due ms or None), of ``topic`` or all."""
        with self._state.lock:
            return self.timer.summary(topic)

    def set_delivering(self, active: bool) -> None:
        """Deliver (a master) or not (a replica); off: returns once a delivery
        in flight is written, so none follows (a demoted master's)."""
        self.timer.delivering = active
        with self.timer.deliver_lock:
            pass

    def undo_tail(self, position: int) -> None:
        """The log is about to be cut at ``position`` (a replica): the timer
        undoes the tail's deliveries and cancels, and the index entries those
        deliveries made go (they point before the cut) (lock held)."""
        for key, first in self.timer.undo_tail(position).items():
            queue = self._state.queues.get(key)
            if queue is not None and queue.index.end > first:
                queue.index.truncate(max(first, queue.index.earliest))
                end = min(queue.visible_end, queue.index.end)
                queue.visible_end = queue.notified_end = end

    def cancel(self, position: int, check: TopicCheck = None) -> DelayedMessage:
        """Cancel the pending delayed record at ``position``; ``check(topic)``
        may refuse it (by raising) before anything is written."""
        timer = self.timer
        with timer.deliver_lock:
            with self._state.lock:
                self._state.check_writable()
                meta = None if not isinstance(position, int) else timer.pending_at(position)
                if meta is None:
                    raise NotFound(f"no pending delayed message at log position {position!r}")
            if check is not None:
                check(meta.topic.decode(errors="replace"))
            cancel = Cancel(position, meta.queue_offset)

            def record(_: dict[QueueKey, int]) -> PreparedBatch:
                if timer.pending_at(position) is None:  # delivered meanwhile (a timeout)
                    raise NotFound(f"no pending delayed message at log position {position}")
                return prepare_timer_control(cancel)

            self._commit_staged({}, record, lambda: timer.cancelled(cancel))
        return DelayedMessage(meta.topic.decode(errors="replace"), meta.queue_id, meta.queue_offset)


def _positions(entries: bytes | bytearray) -> list[int]:
    """The log positions index entries name."""
    return [p - 1 for p in memoryview(entries).cast("Q")[:: ENTRY_SIZE // 8]]
