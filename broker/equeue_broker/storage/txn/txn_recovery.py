"""Recovering transactions from the log alone, at open.

Transactions keep no files of their own (transactions.py): recovery reads them
back from the message log, in the same scan that rebuilds index entries
(recovery.py), from ``Checkpoint.scan_from``: the lower of the index
checkpoint and the first record of the oldest transaction open at the
checkpoint. Each record there is one of:

* a begin record: a transaction is open, with the serial its records carry;
* a TXN record: a staged record of the open transaction of its serial (one
  whose serial is not open was aborted or expired before the scan began);
* a commit record: its transactions are no longer open and its sink's batch is
  recorded; if it lies at or after the index checkpoint, its index entries may
  not have been written (or fsynced) before a crash, so they are derived again
  from the staged records and the commit (``Commit.queues``), which is what the
  commit wrote at runtime;
* an abort record: its transactions are no longer open;
* a check record: the open transaction of its serial was checked with its
  producer group once more (its count and time; server/txn_checks.py).

What is open at the end of the log stays open, with every staged record the
log kept. Sink progress is the checkpoint's, plus every commit after it (a
batch id only moves forward, so applying one twice is harmless).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from equeue_broker.storage.epochs import EPOCH_TAG, EpochHistory, decode_marker
from equeue_broker.storage.errors import CorruptionError, PreconditionFailed
from equeue_broker.storage.index.index_repair import derived_entries, entry_for
from equeue_broker.storage.index.queue_state import QueueKey
from equeue_broker.storage.log.message_log import MessageLog
from equeue_broker.storage.meta.atomic_file import load_json
from equeue_broker.storage.producers.records import PRODUCER_TAG
from equeue_broker.storage.producers.records import decode_value as decode_producer
from equeue_broker.storage.producers.table import ProducerTable
from equeue_broker.storage.timer.timer import Timer
from equeue_broker.storage.timer.timer_records import TAGS as TIMER_TAGS
from equeue_broker.storage.txn.txn_records import Abort, Begin, Check, Commit, decode_value
from equeue_proto.record import FLAG_DELAYED, RecordMeta

log = logging.getLogger(__name__)

_CHECK_LOG = 64
"""Check records remembered per transaction (a count above it is never cut
back by a truncation below it: at worst a check is repeated)."""

Sinks = dict[str, tuple[int, int]]
"""sink -> (last committed batch id, when (ms))."""


@dataclass
class StagedTxn:
    """An open transaction: where it starts in the log and its staged records'
    index entries to be (store time: staging), per queue in log order."""

    serial: int
    txn_id: str
    created_ms: int
    first_position: int
    entries: dict[QueueKey, list[bytearray]] = field(default_factory=dict)
    messages: int = 0
    size: int = 0
    """Staged bytes (frames)."""
    group: str = ""
    """The producer group its check-backs go to ("": never checked)."""
    checks: int = 0
    """Checks made so far (the check records' count)."""
    last_check_ms: int = 0
    last_staged_ms: int = 0
    """When its last staged record was written (its store time): checks wait
    ``check_after_ms`` from it, so a producer still staging is not asked."""
    check_log: list[tuple[int, int, int]] = field(default_factory=list)
    """(log position, count, ms) of its check records, so a replica's
    truncation un-counts the checks it cuts (``TxnScan.cut``)."""

    def add(self, key: QueueKey, entries: bytearray, nbytes: int) -> None:
        self.entries.setdefault(key, []).append(entries)
        self.messages += len(entries) // 32
        self.size += nbytes

    def checked(self, position: int, checks: int, ms: int) -> None:
        """A check record (at ``position``) counted ``checks`` at ``ms``."""
        self.checks = max(self.checks, checks)
        self.last_check_ms = max(self.last_check_ms, ms)
        self.check_log.append((position, checks, ms))
        del self.check_log[:-_CHECK_LOG]

    def cut(self, position: int) -> None:
        """Forget the check records at or after ``position`` (cut from the log)."""
        kept = [c for c in self.check_log if c[0] < position]
        if len(kept) == len(self.check_log):
            return
        if kept:
            self.checks = max(n for _, n, _ in kept)
            self.last_check_ms = max(ms for _, _, ms in kept)
        else:
            # Every remembered record is cut, but older ones (beyond
            # _CHECK_LOG) may not be: the oldest remembered one counted the
            # checks before it too. Its time stands in for the one before it
            # (that check comes a little late at worst).
            _, oldest, ms = self.check_log[0]
            self.checks = oldest - 1
            self.last_check_ms = ms if self.checks else 0
        self.check_log = kept

    def count(self, key: QueueKey) -> int:
        return sum(len(e) for e in self.entries.get(key, ())) // 32


@dataclass
class RecoveredTxns:
    """What the scan found: open transactions by serial, the next serial to use,
    sink progress; how many commits and aborts it read."""

    open: dict[int, StagedTxn]
    next_serial: int
    sinks: Sinks
    commits: int = 0
    aborts: int = 0


class TxnScan:
    """Feeds on the records of recovery's scan (``rebuild_indexes``)."""

    def __init__(
        self, next_serial: int, sinks: Sinks, whole_log: bool, epochs: EpochHistory | None = None,
        producers: ProducerTable | None = None,
    ) -> None:  # fmt: skip
        self.found = RecoveredTxns({}, next_serial, dict(sinks))
        self.epochs = EpochHistory() if epochs is None else epochs
        """Epoch markers are control records too (epochs.py): the same scan finds them."""
        self.producers = producers
        """So are producer records (producers/records.py), applied to this table."""
        self.timer: Timer | None = None
        """Delayed records and timer control records (timer/timer.py) are
        applied to it; the store sets it before a scan."""
        self._whole_log = whole_log
        """The scan starts at the log's start: a commit may name transactions
        whose records retention deleted (their offsets are gone with them)."""

    def staged(self, position: int, meta: RecordMeta) -> None:
        if meta.flags & FLAG_DELAYED:
            if self.timer is not None:
                self.timer.scan_added(position, meta)
            return
        txn = self.found.open.get(meta.queue_offset)
        if txn is not None:
            key = (meta.topic.decode(), meta.queue_id)
            txn.add(key, bytearray(entry_for(position, meta)), meta.frame_size)
            txn.last_staged_ms = max(txn.last_staged_ms, meta.store_timestamp_ms)

    def cut(self, position: int) -> None:
        """A replica's log was cut at ``position``: check records at or after
        it no longer count (``positioned.truncate_at``)."""
        for txn in self.found.open.values():
            txn.cut(position)

    def control(
        self, message_log: MessageLog, position: int, meta: RecordMeta, derive: bool
    ) -> list[tuple[QueueKey, int, bytearray]]:
        """Apply a control record; for a commit with ``derive``, return the index
        entries it makes: (queue, first offset, entries)."""
        record = message_log.read(position, meta.frame_size)
        if record.tag == EPOCH_TAG:
            self.epochs.add(*decode_marker(record.value))
            return []
        if record.tag == PRODUCER_TAG:
            if self.producers is not None:  # the batch follows its record at once
                batch = decode_producer(record.value)
                after = position + meta.frame_size
                self.producers.apply(batch, after, record.store_timestamp_ms)
            return []
        if record.tag in TIMER_TAGS:
            return [] if self.timer is None else self.timer.scan_control(position, record, derive)
        control = decode_value(record.tag, record.value)
        found = self.found
        if isinstance(control, Begin):
            found.open[control.serial] = StagedTxn(
                control.serial, control.txn_id, control.created_ms, position, group=control.group
            )
            found.next_serial = max(found.next_serial, control.serial + 1)
            return []
        if isinstance(control, Check):
            checked = found.open.get(control.serial)
            if checked is not None:  # one of a transaction already ended: nothing to count
                checked.checked(position, control.checks, control.ms)
            return []
        txns = [found.open.pop(serial, None) for serial in control.serials]
        if isinstance(control, Abort):
            found.aborts += 1
            return []
        found.commits += 1
        _apply_sink(found.sinks, control, record.store_timestamp_ms)
        if not derive:
            return []
        if any(t is None for t in txns):
            if self._whole_log:
                log.warning("commit at %d: records of its transactions were deleted", position)
                return []
            raise CorruptionError(
                f"commit record at log position {position} names transactions whose "
                "records are not in the log after the checkpoint"
            )
        return _derive(control, [t for t in txns if t is not None], record.store_timestamp_ms)


def _apply_sink(sinks: Sinks, commit: Commit, store_ms: int) -> None:
    last = sinks.get(commit.sink)
    if commit.sink and (last is None or commit.batch > last[0]):
        sinks[commit.sink] = (commit.batch, store_ms)


def _derive(
    commit: Commit, txns: list[StagedTxn], store_ms: int
) -> list[tuple[QueueKey, int, bytearray]]:
    found = {
        key: bytearray(b"".join(e for txn in txns for e in txn.entries.get(key, ())))
        for key, _, _ in commit.queues
    }
    return derived_entries(commit.queues, found, store_ms, "commit", "staged records")


def migrate_stage_dir(data_dir: Path) -> Sinks | None:
    """The sink progress of a data directory written before transactions lived
    in the log (``<data_dir>/txn/``), or None if there is none. Refuses to
    open one holding open transactions or an unfinished commit: their records
    are in stage files this broker does not read."""
    directory = data_dir / "txn"
    if not directory.is_dir():
        return None
    leftovers = sorted(p.name for p in directory.iterdir() if p.suffix == ".stage" or
                       p.name.startswith("commit-"))  # fmt: skip
    if leftovers:
        raise PreconditionFailed(
            f"{directory} holds {len(leftovers)} open or committing transactions in the "
            "format of earlier equeue versions (stage files): start the previous version "
            "on this data directory, commit or abort them (equeue txn list / abort), stop "
            f"it cleanly, then start this version. Found: {', '.join(leftovers[:5])}"
        )
    try:
        document = load_json(directory / "sinks.json") or {}
    except CorruptionError as exc:
        log.error("txn/sinks.json unreadable (%s): sink progress starts empty", exc)
        document = {}
    return {str(s): (int(b), int(ms)) for s, (b, ms) in document.items()}


def remove_stage_dir(data_dir: Path) -> None:
    """After the migrated sinks are in a checkpoint: the old directory goes."""
    shutil.rmtree(data_dir / "txn", ignore_errors=True)
