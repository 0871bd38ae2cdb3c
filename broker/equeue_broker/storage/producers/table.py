"""Idempotent producers: which batches each producer id appended, per queue.

The table is derived state, like the queue indexes: every entry comes from a
producer record in the log (records.py). At runtime the store applies a
batch's record under its lock right after writing it; recovery applies the
records it scans after the checkpoint (the checkpoint keeps the table as of
its position, ``snapshot``/``restore``); a replica applies the records of the
bytes it copies, and cuts the table with its log (``truncate``).

Rules (``check``), per producer id, for a batch of ``epoch`` and ``sequence``
for one queue:

* an epoch older than the id's latest: ``ProducerFenced``;
* a newer epoch: the id's sequences start again, the batch must be 0;
* the next sequence of the queue (0 for a queue the epoch has not written):
  appended;
* a sequence among the queue's last ``window`` batches: a duplicate, answered
  with the original batch (its first offset and count);
* anything else: ``OutOfOrderSequence`` (a gap, or older than the window);
* an id the table does not know: sequence 0 starts it, another is
  ``UnknownProducer`` (the producer asks for a new epoch and starts at 0).

Bounds: ``max_producers`` ids (the least recently written is forgotten to
make room), ``window`` batches per queue, ``max_queues_per_producer`` queues
per id, and ids idle for ``idle_expiry_ms`` are forgotten.

Not thread-safe: the store calls it with its lock held (recovery before the
store is shared).
"""

from __future__ import annotations

import os
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from equeue_broker.storage.config import ProducerConfig
from equeue_broker.storage.errors import (
    LimitExceeded,
    OutOfOrderSequence,
    ProducerFenced,
    UnknownProducer,
)
from equeue_broker.storage.index.queue_index import ENTRY_SIZE
from equeue_broker.storage.index.queue_state import QueueKey, QueueState
from equeue_broker.storage.producers.records import ProducerBatch
from equeue_broker.storage.results import AppendResult

MAX_PRODUCER_ID = (1 << 63) - 1
MAX_EPOCH = (1 << 32) - 1


@dataclass(frozen=True, slots=True)
class Idempotence:
    """What an idempotent append carries for one queue."""

    producer_id: int
    epoch: int
    sequence: int


@dataclass(frozen=True, slots=True)
class Appended:
    """A remembered batch: its sequence, first offset (-1: staged in a
    transaction), record count and the log position of its first record."""

    sequence: int
    first_offset: int
    count: int
    position: int


@dataclass(slots=True)
class _Run:
    """One queue's batches of one producer epoch."""

    last: int
    """The sequence of the queue's last batch."""
    batches: deque[Appended]


@dataclass(slots=True)
class _Producer:
    epoch: int
    last_ms: int
    queues: dict[QueueKey, _Run] = field(default_factory=dict)


class ProducerTable:
    """The producer ids a store knows and their last batches per queue."""

    def __init__(self, config: ProducerConfig) -> None:
        self.config = config
        self._producers: OrderedDict[int, _Producer] = OrderedDict()
        """Least recently written first."""
        self.version = 0
        """Counts changes: the checkpoint saves the table only when it moved."""

    def __len__(self) -> int:
        return len(self._producers)

    # -- ids and epochs -----------------------------------------------------------

    def init(self, producer_id: int, now_ms: int) -> tuple[int, int]:
        """(producer id, epoch) for a producer asking for one: a new id for 0,
        else the id's next epoch (its older epochs fenced from now on). Nothing
        is written: the first batch of the epoch records it in the log."""
        if producer_id == 0:
            return self._new_id(), 0
        if not 0 < producer_id <= MAX_PRODUCER_ID:
            raise OutOfOrderSequence(f"producer id {producer_id} is out of range")
        known = self._producers.get(producer_id)
        if known is None:
            return producer_id, 0
        if known.epoch >= MAX_EPOCH:
            return self._new_id(), 0
        known.epoch += 1
        known.queues.clear()
        known.last_ms = now_ms
        self.version += 1
        return producer_id, known.epoch

    def _new_id(self) -> int:
        for _ in range(100):  # 63 random bits: a collision is a curiosity
            candidate = int.from_bytes(os.urandom(8), "little") & MAX_PRODUCER_ID
            if candidate and candidate not in self._producers:
                return candidate
        raise AssertionError("no free producer id in 100 random draws")

    # -- batches --------------------------------------------------------------------

    def check(self, key: QueueKey, idem: Idempotence, count: int) -> Appended | None:
        """The remembered batch ``idem`` repeats (answer it again), or None
        (append it); raises for a batch that must not be appended (module
        docstring)."""
        producer = self._producers.get(idem.producer_id)
        if producer is None:
            if idem.sequence != 0:
                raise UnknownProducer(
                    f"producer id {idem.producer_id} is not known here (expired or never "
                    f"given out) and sent sequence {idem.sequence} for {key[0]}/{key[1]}: "
                    "ask InitProducer for a new epoch and start at 0"
                )
            return None
        if idem.epoch < producer.epoch:
            raise ProducerFenced(
                f"producer id {idem.producer_id} epoch {idem.epoch} is fenced: epoch "
                f"{producer.epoch} replaced it"
            )
        if idem.epoch > producer.epoch:
            return self._expect(key, idem, 0)
        run = producer.queues.get(key)
        if run is None:
            if len(producer.queues) >= self.config.max_queues_per_producer:
                raise LimitExceeded(
                    f"producer id {idem.producer_id} writes {len(producer.queues)} queues "
                    f"already; max_queues_per_producer={self.config.max_queues_per_producer}"
                )
            return self._expect(key, idem, 0)
        if idem.sequence == run.last + 1:
            return None
        if idem.sequence <= run.last:
            for batch in run.batches:
                if batch.sequence == idem.sequence:
                    if batch.count != count:
                        raise OutOfOrderSequence(
                            f"sequence {idem.sequence} of producer {idem.producer_id} for "
                            f"{key[0]}/{key[1]} had {batch.count} messages, this one {count}"
                        )
                    return batch
            raise OutOfOrderSequence(
                f"sequence {idem.sequence} of producer {idem.producer_id} for {key[0]}/{key[1]} "
                f"is older than the last {len(run.batches)} remembered (last {run.last})"
            )
        return self._expect(key, idem, run.last + 1)

    @staticmethod
    def _expect(key: QueueKey, idem: Idempotence, expected: int) -> None:
        if idem.sequence != expected:
            raise OutOfOrderSequence(
                f"producer {idem.producer_id} epoch {idem.epoch} sent sequence {idem.sequence} "
                f"for {key[0]}/{key[1]}, expected {expected}: an earlier batch is missing"
            )

    def apply(self, batch: ProducerBatch, position: int, now_ms: int) -> None:
        """Record ``batch``, whose first record lies at log ``position`` (after
        it was written, or when recovery or a replica reads its record). A
        batch the table has already (a scan over records the checkpoint
        covered) changes nothing."""
        producer = self._producers.get(batch.producer_id)
        if producer is None:
            self._make_room(now_ms)
            producer = self._producers[batch.producer_id] = _Producer(batch.epoch, now_ms)
        elif batch.epoch < producer.epoch:
            return
        elif batch.epoch > producer.epoch:
            producer.epoch = batch.epoch
            producer.queues.clear()
        key = (batch.topic, batch.queue_id)
        run = producer.queues.get(key)
        appended = Appended(batch.sequence, batch.first_offset, batch.count, position)
        if run is None:
            producer.queues[key] = _Run(
                batch.sequence, deque([appended], maxlen=self.config.window)
            )
        elif batch.sequence > run.last:
            run.last = batch.sequence
            run.batches.append(appended)
        else:
            return
        producer.last_ms = max(producer.last_ms, now_ms)
        self._producers.move_to_end(batch.producer_id)
        self.version += 1

    def _make_room(self, now_ms: int) -> None:
        """Forget idle producers, then the least recently written beyond the bound."""
        expiry = self.config.idle_expiry_ms
        producers = self._producers
        while producers:
            oldest_id, oldest = next(iter(producers.items()))
            if now_ms - oldest.last_ms < expiry and len(producers) < self.config.max_producers:
                break
            del producers[oldest_id]

    # -- the log moving under the table ---------------------------------------------

    def truncate(self, position: int) -> None:
        """Forget the batches whose records lie at or after ``position`` (the
        log was cut there). A queue whose every remembered batch goes keeps
        its last sequence before them, so the next batch continues there."""
        changed = False
        for producer_id in list(self._producers):
            producer = self._producers[producer_id]
            for key in list(producer.queues):
                run = producer.queues[key]
                if not run.batches or run.batches[-1].position < position:
                    continue
                changed = True
                kept = [b for b in run.batches if b.position < position]
                first_cut = next(b for b in run.batches if b.position >= position)
                if kept:
                    run.batches = deque(kept, maxlen=self.config.window)
                    run.last = kept[-1].sequence
                elif first_cut.sequence == 0:
                    del producer.queues[key]
                else:
                    run.batches.clear()
                    run.last = first_cut.sequence - 1
        if changed:
            self.version += 1

    # -- the checkpoint ---------------------------------------------------------------

    def snapshot(self) -> list[Any]:
        """The table as JSON-ready lists (recovery.py keeps it in the checkpoint)::

        [[producer_id, epoch, last_ms,
          [[topic, queue_id, last, [[sequence, first_offset, count, position], ...]], ...]],
         ...]   least recently written first
        """
        return [
            [pid, p.epoch, p.last_ms, [
                [t, q, run.last, [[b.sequence, b.first_offset, b.count, b.position]
                                  for b in run.batches]]
                for (t, q), run in p.queues.items()
            ]]
            for pid, p in self._producers.items()
        ]  # fmt: skip

    def restore(self, document: object) -> None:
        """Load a ``snapshot``; a malformed one is ignored (the table starts
        empty: producers then ask for a new epoch, nothing is appended twice
        that the window would have caught only if the broker crashed mid-retry)."""
        self._producers.clear()
        if not isinstance(document, list):
            return
        window = self.config.window
        try:
            for pid, epoch, last_ms, queues in document:
                producer = _Producer(int(epoch), int(last_ms))
                for topic, queue_id, last, batches in queues:
                    run = _Run(int(last), deque(maxlen=window))
                    for seq, first, count, pos in batches:
                        run.batches.append(Appended(int(seq), int(first), int(count), int(pos)))
                    producer.queues[(str(topic), int(queue_id))] = run
                self._producers[int(pid)] = producer
        except (TypeError, ValueError):
            self._producers.clear()
        self.version += 1


def repeated_append(queue: QueueState, seen: Appended) -> AppendResult:
    """The result of the remembered append ``seen`` (lock held): its entries
    from the index, or (offsets retention deleted) entries without positions."""
    first, count = seen.first_offset, seen.count
    if first >= queue.index.earliest and first + count <= queue.index.end:
        entries = bytearray(queue.index.read_raw(first, count))
    else:
        entries = bytearray(count * ENTRY_SIZE)
    return AppendResult(queue.topic, queue.queue_id, first, count, entries, duplicate=True)
