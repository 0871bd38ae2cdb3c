"""Transactions: messages staged out of sight, then committed atomically or aborted.

In the spirit of RocketMQ's half messages, kept in the one message log. A
writer stages batches under a transaction id it chooses. Staged records are
written to the log once, when they are staged, flagged TXN and carrying the
transaction's serial instead of a queue offset (``equeue_proto.record``): no
queue index points at them, so no reader sees them, and no reader waits for
them either (an open transaction never holds back a queue's readable end).

* The first stage call of a transaction writes a *begin* record (id, serial)
  just before its records (txn_records.py).
* A *commit* writes one small commit record, then, per queue, index entries
  for the staged records in staging order, at the queue's end: the records
  take their offsets then, after whatever the queue holds, and readers see
  every queue's records at once (txn_writes.py). Nothing is copied: the
  entries point where the records already lie, possibly in older chunks.
* An *abort*, or the idle timeout (``TransactionConfig.timeout_ms``), writes
  an abort record; the staged records stay in the log, unindexed, until
  retention deletes their chunks. Aborted records never take an offset, so
  the offsets readers see stay contiguous.

Sinks: a commit may name a sink (e.g. a streaming query) and a batch id. The
last committed batch id of every sink is remembered (in the commit records,
and in the checkpoint), so replaying a batch that was committed already is a
no-op (its transactions are aborted instead), and a batch id below the last
one is refused (the sink id was reused).

Check-back: a transaction staged with a producer group is checked with a
live producer of the group when its outcome is late (check_policy.py,
server/txn_checks.py); each check is a check record in the log.

Recovery rebuilds all of it from the log (txn_recovery.py). Durability is
the log's (docs/storage.md): staging is never fsynced on its own; in sync
mode a commit returns once its commit record, and so every staged record
before it, is fsynced; in async mode everything is fsynced by the next flush.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from equeue_broker.storage.config import TransactionConfig
from equeue_broker.storage.errors import (
    LimitExceeded,
    NotFound,
    PreconditionFailed,
    StorageError,
)
from equeue_broker.storage.index.queue_index import ENTRY_SIZE
from equeue_broker.storage.index.queue_state import QueueKey
from equeue_broker.storage.log.record import MessageBatch, PreparedBatch
from equeue_broker.storage.meta.names import validate_group, validate_transaction_id
from equeue_broker.storage.producers.table import Idempotence
from equeue_broker.storage.txn.check_policy import (
    MAX_DUE_PER_TICK,
    CheckDue,
    CheckPolicy,
    is_due,
    is_exhausted,
    next_check_ms,
)
from equeue_broker.storage.txn.txn_records import Abort, Begin, Check, Commit, prepare_control
from equeue_broker.storage.txn.txn_recovery import RecoveredTxns, Sinks, StagedTxn

log = logging.getLogger(__name__)

MAX_REMEMBERED_ENDINGS = 100_000
"""Ended transaction ids remembered, to refuse staging into them again."""


@dataclass(frozen=True)
class TransactionInfo:
    txn_id: str
    created_ms: int
    last_write_ms: int
    messages: int
    bytes: int
    queues: dict[QueueKey, int]
    """Staged messages per (topic, queue)."""
    committing: bool
    group: str = ""
    checks: int = 0
    last_check_ms: int = 0
    next_check_ms: int = 0
    """The next check (or the rollback after the last one); 0: none."""


@dataclass(frozen=True)
class CommittedQueue:
    topic: str
    queue_id: int
    first_offset: int
    count: int


@dataclass(frozen=True)
class CommitResult:
    already_committed: bool
    """The sink had committed this batch before: nothing was appended."""
    queues: tuple[CommittedQueue, ...]
    aborted: int
    """Transactions aborted by this call (a replay's, and those matching the prefix)."""


@dataclass(frozen=True)
class SinkProgress:
    sink: str
    batch_id: int
    updated_ms: int


class TransactionStore(Protocol):
    """What transactions need of the store; ``Store`` provides it.

    A protocol, not an import of ``store.py``: the store creates its
    ``Transactions`` and so imports this module, and this keeps the dependency
    one way.
    """

    def prepare(self, topic: str, queue_id: int, batch: MessageBatch) -> PreparedBatch:
        """Check ``batch`` as an append to the queue would, without writing it."""
        ...

    def stage_records(  # noqa: PLR0917 (Store.stage_records)
        self,
        topic: str,
        queue_id: int,
        prepared: PreparedBatch,
        serial: int,
        begin: PreparedBatch | None,
        on_written: Callable[[int, bytearray], None],
        idem: Idempotence | None = None,
    ) -> bool:
        """Append staged records, invisible (``Store.stage_records``); False
        if ``idem`` says they were staged already."""
        ...

    def write_control(self, prepared: PreparedBatch) -> None:
        """Append a control record (``Store.write_control``)."""
        ...

    @property
    def log_end(self) -> int:
        """The log's write position (``Store.log_end``)."""
        ...

    def commit_staged(
        self,
        entries: dict[QueueKey, bytearray],
        record: Callable[[dict[QueueKey, int]], PreparedBatch],
        on_written: Callable[[], None],
    ) -> dict[QueueKey, int]:
        """Write a commit record and its index entries (``Store.commit_staged``)."""
        ...


class _Txn:
    """An open transaction. ``lock`` serialises its stage calls and its commit."""

    def __init__(self, staged: StagedTxn, last_ms: int) -> None:
        self.staged = staged
        self.last_ms = last_ms
        self.committing = False
        self.ended = False
        self.lock = threading.Lock()

    @property
    def txn_id(self) -> str:
        return self.staged.txn_id

    @property
    def begun(self) -> bool:
        """Its begin record is in the log (its first stage call wrote something)."""
        return self.staged.first_position >= 0


class Transactions:
    """The open transactions of one store (``Store.transactions``)."""

    def __init__(
        self, store: TransactionStore, config: TransactionConfig, recovered: RecoveredTxns
    ) -> None:
        self._store = store
        self.config = config
        self._lock = threading.Lock()
        """Guards the dictionaries below; never held while taking the store lock."""
        self._commit_lock = threading.Lock()
        """One commit at a time (a sink's batches are decided in order)."""
        now = _now_ms()
        self._open = {t.txn_id: _Txn(t, now) for t in recovered.open.values()}
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._next_serial = recovered.next_serial
        self._sinks = {s: SinkProgress(s, b, ms) for s, (b, ms) in recovered.sinks.items()}
        self.sinks_lost: str | None = None
        """Sink progress is rebuilt from the log: never lost on its own (damage.py)."""

    # -- staging ---------------------------------------------------------------------

    def stage(
        self,
        txn_id: str,
        topic: str,
        parts: Sequence[tuple[int, MessageBatch]],
        idems: Mapping[int, Idempotence] | None = None,
        group: str = "",
    ) -> int:
        """Stage ``(queue_id, batch)`` parts under ``txn_id`` (created on first use);
        return the transaction's staged message count.

        ``group``: the producer group checked about the transaction if its
        outcome is late; fixed by the call that creates the transaction.

        Batches are checked as an append would check them, so a commit cannot
        fail on their content. ``idems``: an idempotent producer's batch per
        queue (producers/table.py): a part staged already is not staged again.
        """
        validate_transaction_id(txn_id)
        if group:
            validate_group(group)
        prepared = [(queue_id, self._store.prepare(topic, queue_id, b)) for queue_id, b in parts]
        size = sum(p.total_bytes for _, p in prepared)
        if size > self.config.max_bytes:  # before an empty transaction is created
            raise LimitExceeded(
                f"{size} bytes to stage exceed max_transaction_bytes={self.config.max_bytes}"
            )
        txn = self._get_or_create(txn_id, group)
        if group and txn.staged.group != group:
            had = f"group {txn.staged.group!r}" if txn.staged.group else "no producer group"
            raise PreconditionFailed(
                f"transaction {txn_id!r} belongs to {had}, not to group {group!r}: "
                "a transaction's group is fixed by its first stage call"
            )
        with txn.lock:
            if txn.ended or txn.committing:
                state = "being committed" if txn.committing else "ended"
                raise PreconditionFailed(f"transaction {txn_id!r} is {state}; stage into a new one")
            if txn.staged.size + size > self.config.max_bytes:
                raise LimitExceeded(
                    f"transaction {txn_id!r} would hold {txn.staged.size + size} staged "
                    f"bytes; max_transaction_bytes={self.config.max_bytes}"
                )
            for queue_id, batch in prepared:
                idem = None if idems is None else idems[queue_id]
                self._stage_one(txn, topic, queue_id, batch, idem)
            txn.last_ms = _now_ms()
            return txn.staged.messages

    def _stage_one(
        self, txn: _Txn, topic: str, queue_id: int, batch: PreparedBatch,
        idem: Idempotence | None = None,
    ) -> None:  # fmt: skip
        staged = txn.staged
        begin = None
        if not txn.begun:
            begin = prepare_control(
                Begin(staged.serial, staged.txn_id, staged.created_ms, staged.group)
            )

        def written(first: int, entries: bytearray) -> None:
            # Under the store lock: a checkpoint sees the transaction and its
            # records; after a failed write, those that reached the log.
            if first >= 0:
                staged.first_position = first
            if entries:
                sizes = memoryview(entries).cast("I")[2 :: ENTRY_SIZE // 4]
                staged.add((topic, queue_id), entries, sum(sizes))
                staged.last_staged_ms = _now_ms()

        self._store.stage_records(topic, queue_id, batch, staged.serial, begin, written, idem)

    def _get_or_create(self, txn_id: str, group: str = "") -> _Txn:
        with self._lock:
            txn = self._open.get(txn_id)
            if txn is not None:
                return txn
            ended = self._ended.get(txn_id)
            if ended is not None:
                raise PreconditionFailed(f"transaction {txn_id!r} was {ended} already")
            if len(self._open) >= self.config.max_open:
                raise LimitExceeded(
                    f"{len(self._open)} transactions are open; "
                    f"max_open_transactions={self.config.max_open}"
                )
            now = _now_ms()
            serial = self._next_serial
            self._next_serial += 1
            staged = StagedTxn(serial, txn_id, now, -1, group=group)
            txn = self._open[txn_id] = _Txn(staged, now)
            return txn

    # -- commit ----------------------------------------------------------------------

    def commit(
        self,
        refs: Sequence[tuple[str, int]],
        sink: str = "",
        batch_id: int = -1,
        abort_prefix: str = "",
    ) -> CommitResult:
        """Commit the transactions ``refs`` = [(id, expected message count or -1)]
        atomically; then abort every other open transaction whose id starts with
        ``abort_prefix`` (a failed or speculative task's, say).

        With ``sink``, ``batch_id`` is recorded as the sink's last committed
        batch; if it is that batch already, nothing is appended and ``refs`` are
        aborted (a replay); if it is older, ``PreconditionFailed``. Without
        ``sink``, if every one of ``refs`` is remembered as committed (a check
        answer, or a retry of this call, won), nothing is appended and the
        result says ``already_committed``.
        """
        self._check_commit_args(refs, sink, batch_id, abort_prefix)
        if not sink and self._all_committed(refs):
            # A check answer (or an earlier try of this call) committed them:
            # the outcome the caller wants, not an error (docs/client.md).
            aborted = self._abort_where([], abort_prefix) if abort_prefix else 0
            return CommitResult(True, (), aborted)
        with self._commit_lock:
            if sink and self._is_replay(sink, batch_id):
                aborted = self._abort_where([i for i, _ in refs], abort_prefix)
                log.info(
                    "sink %s batch %d was committed before; aborted %d", sink, batch_id, aborted
                )
                return CommitResult(True, (), aborted)
            txns = self._claim(refs)
            try:
                for txn, (txn_id, expected) in zip(txns, refs, strict=True):
                    with txn.lock:  # waits for a stage call that passed its check before the claim
                        _check_count(txn, txn_id, expected)
            except BaseException:
                self._unclaim(txns)
                raise
            queues = self._commit_claimed(txns, sink, batch_id)
        aborted = self._abort_where([], abort_prefix) if abort_prefix else 0
        return CommitResult(False, queues, aborted)

    def _commit_claimed(
        self, txns: list[_Txn], sink: str, batch_id: int
    ) -> tuple[CommittedQueue, ...]:
        entries: dict[QueueKey, bytearray] = {}
        for txn in txns:
            for key, parts in txn.staged.entries.items():
                entries.setdefault(key, bytearray()).extend(b"".join(parts))
        counts = {key: len(e) // 32 for key, e in entries.items()}
        # Only those with a begin record: recovery must find every serial a
        # commit names (one whose first stage call failed staged nothing).
        serials = tuple(t.staged.serial for t in txns if t.begun)
        gate = threading.Lock()
        started = cancelled = written = False

        def record(firsts: dict[QueueKey, int]) -> PreparedBatch:
            nonlocal started
            with gate:  # a caller that gave up waiting must not be committed behind its back
                if cancelled:
                    raise StorageError("the commit timed out before it started; nothing written")
                started = True
            queues = tuple((key, firsts[key], n) for key, n in counts.items())
            return prepare_control(Commit(serials, sink, batch_id, queues))

        def on_written() -> None:  # under the store lock, so a checkpoint sees all of it
            nonlocal written
            written = True
            self._record_sink(sink, batch_id)
            with self._lock:
                for txn in txns:
                    self._end(txn, "committed")

        try:
            firsts = self._store.commit_staged(entries, record, on_written)
        except TimeoutError:
            with gate:
                cancelled = not started
            if cancelled:
                self._unclaim(txns)
                raise StorageError("the commit did not start in time; retry it") from None
            raise StorageError(
                "the commit is written but not yet durable; retrying it is safe (a sink's "
                "batch is then a replay, a transaction is then found committed)"
            ) from None
        except BaseException:
            if not written:
                self._unclaim(txns)
            raise
        return tuple(CommittedQueue(t, q, firsts[(t, q)], n) for (t, q), n in counts.items())

    def _all_committed(self, refs: Sequence[tuple[str, int]]) -> bool:
        """Every one of ``refs`` is remembered as committed (none is open)."""
        with self._lock:
            return bool(refs) and all(self._ended.get(i) == "committed" for i, _ in refs)

    def _record_sink(self, sink: str, batch_id: int) -> None:
        last = self._sinks.get(sink)
        if sink and (last is None or batch_id > last.batch_id):  # never backwards
            self._sinks[sink] = SinkProgress(sink, batch_id, _now_ms())

    def _check_commit_args(
        self, refs: Sequence[tuple[str, int]], sink: str, batch_id: int, abort_prefix: str
    ) -> None:
        if len(refs) > self.config.max_per_commit:
            raise LimitExceeded(
                f"commit names {len(refs)} transactions; "
                f"max_transactions_per_commit={self.config.max_per_commit}"
            )
        for txn_id, _ in refs:
            validate_transaction_id(txn_id)
        if len({txn_id for txn_id, _ in refs}) != len(refs):
            raise PreconditionFailed("commit names a transaction twice")
        if sink:
            validate_transaction_id(sink, "sink id")
            if not isinstance(batch_id, int) or batch_id < 0:
                raise PreconditionFailed(f"a commit for sink {sink!r} needs a batch id >= 0")
        if abort_prefix:
            validate_transaction_id(abort_prefix, "abort prefix")

    def _is_replay(self, sink: str, batch_id: int) -> bool:
        last = self._sinks.get(sink)
        if last is None or batch_id > last.batch_id:
            return False
        if batch_id < last.batch_id:
            raise PreconditionFailed(
                f"sink {sink!r} committed batch {last.batch_id} already; batch {batch_id} is "
                "older (is the sink id reused by a query with a new checkpoint?)"
            )
        return True

    def _claim(self, refs: Sequence[tuple[str, int]]) -> list[_Txn]:
        """The open transactions ``refs`` names, marked committing (all or none)."""
        with self._lock:
            txns = []
            for txn_id, expected in refs:
                txn = self._open.get(txn_id)
                if txn is None:
                    ended = self._ended.get(txn_id)
                    why = f" (it was {ended})" if ended else ""
                    raise NotFound(f"transaction {txn_id!r} is not open{why}")
                if txn.committing:
                    raise PreconditionFailed(f"transaction {txn_id!r} is being committed")
                _check_count(txn, txn_id, expected)
                txns.append(txn)
            for txn in txns:
                txn.committing = True
            return txns

    def _unclaim(self, txns: Sequence[_Txn]) -> None:
        with self._lock:
            for txn in txns:
                txn.committing = False

    # -- abort and expiry ------------------------------------------------------------

    def abort(self, ids: Sequence[str] = (), prefix: str = "") -> int:
        """Abort the open transactions named or whose id starts with ``prefix``;
        return how many. Unknown ids are ignored (aborting is idempotent)."""
        for txn_id in ids:
            validate_transaction_id(txn_id)
        if prefix:
            validate_transaction_id(prefix, "abort prefix")
        return self._abort_where(ids, prefix)

    def _abort_where(self, ids: Sequence[str], prefix: str) -> int:
        wanted = set(ids)
        with self._lock:
            victims = [
                txn
                for txn_id, txn in self._open.items()
                if not txn.committing
                and (txn_id in wanted or (prefix and txn_id.startswith(prefix)))
            ]
            for txn in victims:
                self._end(txn, "aborted")
        self._log_aborts(victims)
        return len(victims)

    def _log_aborts(self, victims: Sequence[_Txn]) -> None:
        """Write the abort record of ``victims`` (ended already, lock not held)."""
        serials = []
        for txn in victims:
            with txn.lock:  # a stage call in flight finishes first: its records are covered
                if txn.begun:
                    serials.append(txn.staged.serial)
        if serials:
            try:
                self._store.write_control(prepare_control(Abort(tuple(serials))))
            except StorageError as exc:
                # Not lost: without the record, a restart finds them open again
                # and the idle timeout aborts them once more.
                log.warning("could not log the abort of %d transactions: %s", len(serials), exc)

    def expire(self, now_ms: int | None = None) -> int:
        """Abort transactions idle longer than the timeout; return how many."""
        now = _now_ms() if now_ms is None else now_ms
        with self._lock:
            idle = [
                txn_id
                for txn_id, txn in self._open.items()
                if not txn.committing and now - txn.last_ms > self.config.timeout_ms
            ]
        if idle:
            log.warning(
                "aborting %d transactions idle for over %d ms", len(idle), self.config.timeout_ms
            )
        return self._abort_where(idle, "") if idle else 0

    def _end(self, txn: _Txn, outcome: str) -> None:
        """Forget an open transaction (lock held)."""
        txn.ended = True
        self._open.pop(txn.txn_id, None)
        self._ended[txn.txn_id] = outcome
        while len(self._ended) > MAX_REMEMBERED_ENDINGS:
            self._ended.popitem(last=False)

    # -- state -----------------------------------------------------------------------

    def list_open(self, prefix: str = "") -> list[TransactionInfo]:
        policy = CheckPolicy.of(self.config)
        with self._lock:
            return [
                TransactionInfo(
                    txn_id,
                    t.staged.created_ms,
                    t.last_ms,
                    t.staged.messages,
                    t.staged.size,
                    {key: t.staged.count(key) for key in t.staged.entries},
                    t.committing,
                    t.staged.group,
                    t.staged.checks,
                    t.staged.last_check_ms,
                    0 if t.committing else next_check_ms(t.staged, policy),
                )
                for txn_id, t in sorted(self._open.items())
                if txn_id.startswith(prefix)
            ]

    # -- check-back (check_policy.py) ------------------------------------------------

    def due_checks(self, now_ms: int, policy: CheckPolicy | None = None) -> list[CheckDue]:
        """Open transactions due for a check with their producer group now, the
        oldest first, at most ``MAX_DUE_PER_TICK``."""
        policy = CheckPolicy.of(self.config) if policy is None else policy
        with self._lock:
            due = [
                t.staged
                for t in self._open.values()
                if t.begun and not t.committing and is_due(t.staged, now_ms, policy)
            ]
            due.sort(key=lambda s: (s.created_ms, s.serial))
            return [_check_due(s) for s in due[:MAX_DUE_PER_TICK]]

    def record_check(
        self, txn_id: str, checks: int, answer: str, now_ms: int | None = None
    ) -> bool:
        """Write the check record of check ``checks`` of ``txn_id`` (before the
        check is sent: a crash after sending still counts it); False if the
        transaction is no longer open (nothing written)."""
        now = _now_ms() if now_ms is None else now_ms
        with self._lock:
            txn = self._open.get(txn_id)
        if txn is None:
            return False
        with txn.lock:  # not while its stage call or commit is running
            if txn.ended or txn.committing or not txn.begun:
                return False
            staged = txn.staged
            self._store.write_control(prepare_control(Check(staged.serial, checks, now, answer)))
            # Not its exact position (the store does not say): the log end, past
            # it; a cut below that un-counts it at worst once too often.
            staged.checked(self._store.log_end - 1, checks, now)
        return True

    def resolve_checked(self, txn_id: str, group: str, commit: bool) -> CommitResult:
        """Apply a check answer of producer group ``group``: commit (or roll
        back) ``txn_id`` if it is open, of that group, not being committed and
        checked at least once; otherwise ``NotFound`` saying why the answer is
        moot. Decided under the lock, so nothing else ends it in between."""
        validate_transaction_id(txn_id)
        with self._commit_lock:  # as commit(): one commit at a time
            with self._lock:
                txn = self._checked(txn_id, group)
                if commit:
                    txn.committing = True
                else:
                    self._end(txn, "aborted")
            if not commit:
                self._log_aborts([txn])
                return CommitResult(False, (), 1)
            with txn.lock:  # waits for a stage call that passed its check before the claim
                pass
            return CommitResult(False, self._commit_claimed([txn], "", -1), 0)

    def _checked(self, txn_id: str, group: str) -> _Txn:
        """The open transaction a check answer of ``group`` may end (lock held)."""
        txn = self._open.get(txn_id)
        if txn is None:
            ended = self._ended.get(txn_id)
            raise NotFound("it is not open" + (f" (it was {ended})" if ended else ""))
        if not group or txn.staged.group != group:
            had = f"group {txn.staged.group!r}" if txn.staged.group else "no producer group"
            raise NotFound(f"it belongs to {had}, not to the answering group {group!r}")
        if txn.staged.checks < 1:
            raise NotFound("it was never checked")
        if txn.committing:
            raise NotFound("it is being committed")
        return txn

    def exhausted(self, now_ms: int, policy: CheckPolicy | None = None) -> list[CheckDue]:
        """Transactions checked ``max_checks`` times without an answer, an
        interval ago: to be rolled back (none with ``on_exhausted == "keep"``)."""
        policy = CheckPolicy.of(self.config) if policy is None else policy
        with self._lock:
            return [
                _check_due(t.staged)
                for t in self._open.values()
                if not t.committing and is_exhausted(t.staged, now_ms, policy)
            ]

    def sinks(self) -> list[SinkProgress]:
        return sorted(self._sinks.values(), key=lambda s: s.sink)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "open_transactions": len(self._open),
                "staged_bytes": sum(t.staged.size for t in self._open.values()),
            }

    def pinned(self) -> int | None:
        """Log position of the first record of the oldest open transaction
        (retention keeps it and everything after); None if none is open."""
        with self._lock:
            return min((t.staged.first_position for t in self._open.values() if t.begun),
                       default=None)  # fmt: skip

    def checkpoint_state(self) -> tuple[int | None, int, Sinks]:
        """(``pinned()``, next serial, sink progress) for a checkpoint; called
        under the store lock, so it agrees with the log position taken there.
        Sinks not committed for ``sink_ttl_ms`` are forgotten (the oldest first
        beyond ``max_sinks``)."""
        now = _now_ms()
        live = [s for s in self._sinks.values() if now - s.updated_ms <= self.config.sink_ttl_ms]
        live.sort(key=lambda s: s.updated_ms)
        self._sinks = {s.sink: s for s in live[-self.config.max_sinks :]}
        with self._lock:
            serial = self._next_serial
        sinks = {s.sink: (s.batch_id, s.updated_ms) for s in self._sinks.values()}
        return self.pinned(), serial, sinks

    def adopt(self, found: RecoveredTxns) -> None:
        """A replica: take the open transactions, next serial and sink progress
        its replicated log holds (replicated.py), so its checkpoints and a restart
        agree with what the log says."""
        now = _now_ms()
        with self._lock:
            kept = {t.txn_id: t for t in self._open.values()}
            self._open = {t.txn_id: kept.get(t.txn_id) or _Txn(t, now) for t in found.open.values()}
            self._next_serial = max(self._next_serial, found.next_serial)
            self._sinks = {s: SinkProgress(s, b, ms) for s, (b, ms) in found.sinks.items()}

    def recovered(self) -> RecoveredTxns:
        """The open transactions, next serial and sinks, as a scan of the log finds them."""
        with self._lock:
            return RecoveredTxns(
                {t.staged.serial: t.staged for t in self._open.values()},
                self._next_serial,
                {s.sink: (s.batch_id, s.updated_ms) for s in self._sinks.values()},
            )

    def close(self) -> None:
        """Nothing to release: transactions keep no files of their own."""


def _check_count(txn: _Txn, txn_id: str, expected: int) -> None:
    if expected >= 0 and txn.staged.messages != expected:
        raise PreconditionFailed(
            f"transaction {txn_id!r} holds {txn.staged.messages} staged messages; "
            f"the writer staged {expected}"
        )


def _check_due(staged: StagedTxn) -> CheckDue:
    queues = {key: staged.count(key) for key in staged.entries}
    return CheckDue(
        staged.txn_id, staged.serial, staged.group, staged.created_ms, staged.checks, queues
    )


def _now_ms() -> int:
    return int(time.time() * 1000)
