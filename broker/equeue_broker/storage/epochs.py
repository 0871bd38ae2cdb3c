"""Epoch markers in the log, and the epoch history derived from them.

When a broker becomes master of group epoch N (an election through
ZooKeeper, or an operator's promotion) it appends an epoch marker before it
takes any write. Replicas copy it byte for byte with the rest of the log, so
every member's log says where each epoch it holds began: its epoch history
``[(epoch, start position), ...]`` (Kafka's leader-epoch cache, KIP-101).
The history is derived state: kept in ``checkpoint.json`` (recovery.py) and
rebuilt from the records scanned after the checkpoint, like transactions.

A marker is a control record (txn_records.py's framing: CONTROL flag, topic
"", queue 0, offset 0) with the tag ``epoch`` and the value
``{"epoch": N, "start": S}``: S is the log end when the marker was written,
where the previous epoch's data ends. The marker itself lies at S, or at the
next chunk's start when it did not fit the active chunk (chunks end where
their data ends, so S, not the marker's position, is the boundary replicas
compare).

The history answers the divergence question of replication: where did epoch
``n`` end on this log (``end_of``)? A replica whose last marker is of epoch
``n`` and whose log goes beyond that point on its master holds records the
master never had (an old master's unreplicated tail): it truncates there.
"""

from __future__ import annotations

import json
import threading

from equeue_broker.storage.config import MessageLimits
from equeue_broker.storage.errors import CorruptionError
from equeue_broker.storage.log.record import MessageBatch, PreparedBatch, prepare_batch

EPOCH_TAG = "epoch"
_LIMITS = MessageLimits(max_batch_bytes=1 << 20, max_message_bytes=1 << 20)

Entry = tuple[int, int]
"""(epoch, start position)."""


def prepare_marker(epoch: int, start: int) -> PreparedBatch:
    """The marker of ``epoch`` starting at log end ``start``, as a one-record
    batch for the log writer."""
    value = json.dumps({"epoch": epoch, "start": start}, separators=(",", ":")).encode()
    return prepare_batch(MessageBatch([value], tags=[EPOCH_TAG]), b"", _LIMITS)


def decode_marker(value: bytes) -> Entry:
    """(epoch, start) of a marker's value; ``CorruptionError`` if it is not one."""
    try:
        document = json.loads(value)
        epoch, start = int(document["epoch"]), int(document["start"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptionError(f"unreadable epoch marker: {exc}") from None
    if epoch < 1 or start < 0:
        raise CorruptionError(f"epoch marker with epoch {epoch}, start {start}")
    return epoch, start


class EpochHistory:
    """``[(epoch, start position)]`` of the markers in one log, oldest first
    (thread-safe: the replication stream reads it while a replica appends)."""

    def __init__(self, entries: list[Entry] | None = None) -> None:
        self._lock = threading.Lock()
        self._entries: list[Entry] = []
        for epoch, start in entries or ():
            self.add(epoch, start)

    def add(self, epoch: int, start: int) -> None:
        """A marker at ``start``; seen again (a rescan) or out of order: ignored."""
        with self._lock:
            if self._entries and epoch <= self._entries[-1][0]:
                return  # a rescanned marker (or an older epoch's: cannot be)
            self._entries.append((epoch, start))

    def cut(self, position: int) -> list[Entry]:
        """Forget the markers at or after ``position`` (the log was cut there);
        return them."""
        with self._lock:
            kept = [e for e in self._entries if e[1] < position]
            gone = self._entries[len(kept) :]
            self._entries = kept
            return gone

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries)

    @property
    def last_epoch(self) -> int:
        """The epoch of the newest marker (0: none)."""
        with self._lock:
            return self._entries[-1][0] if self._entries else 0

    def end_of(self, epoch: int) -> int | None:
        """Where ``epoch`` (and every older one) ended on this log: the start of
        the first marker of a newer epoch; None when there is none (``epoch``
        is this log's newest, or newer)."""
        with self._lock:
            return next((start for e, start in self._entries if e > epoch), None)
