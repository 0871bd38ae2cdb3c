"""Transactions: messages staged out of sight, then committed atomically or aborted.

In the spirit of RocketMQ's half messages. A writer stages batches under a
transaction id it chooses; staged messages live in the transaction's stage file
(staging.py), not in any queue, so no reader can see them. Commit appends them
to their queues; abort deletes the file; a transaction left idle longer than
``TransactionConfig.timeout_ms`` is aborted.

Offsets: a transaction's messages get their queue offsets when it commits,
after whatever the queue holds then, in staging order. Aborted messages never
get offsets, so the offsets readers see stay contiguous.

Sinks: a commit may name a sink (e.g. a streaming query) and a batch id. The
last committed batch id of every sink is remembered, so replaying a batch that
was committed already is a no-op (its transactions are aborted instead), and a
batch id below the last one is refused (the sink id was reused).

Files under ``<data_dir>/txn/``::

    <hash>.stage         one per open transaction (format: staging.py)
    commit-<seq>.json    a commit decision not yet completely applied
    sinks.json[.bak]     {sink: [last committed batch id, when (ms)]}

Commit, and why a crash at any step is safe:

1. The transactions are checked (open, holding the expected message count)
   and marked committing; their stage files are fsynced.
2. Under the store's append lock, with each target queue's end offset as the
   first offset the transaction will get, the decision (ids, sink, batch, per
   queue first offset and count) is saved and fsynced. Before this point a
   crash leaves the transactions open.
3. The staged batches are appended; readers see all of them at once.
4. The sink's batch is saved, then the stage files and the decision deleted.

Recovery finds a decision file only if step 2 completed: for each of its
queues ``end - first`` messages are in the log already (no other append can
come between the decision and its batches, see ``Store.append_atomically``),
and the rest are appended from the stage files: the commit rolls forward. If an
append fails at runtime after step 2 (e.g. the disk is full), the queues
involved refuse other appends until the same roll-forward succeeds, which is
retried by the next commit and by the store's maintenance thread.

Durability follows the stage files and the decision: both are fsynced before
the commit's records are written, whatever the store's flush mode.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from equeue_broker.storage.atomic_file import (
    keep_damaged,
    load_json,
    remove_temp_files,
    save_json,
)
from equeue_broker.storage.config import TransactionConfig
from equeue_broker.storage.errors import (
    CorruptionError,
    LimitExceeded,
    NotFound,
    PreconditionFailed,
    StorageError,
    io_error,
)
from equeue_broker.storage.names import validate_transaction_id
from equeue_broker.storage.queue_state import QueueKey
from equeue_broker.storage.record import EncodedBatch, MessageBatch, PreparedBatch
from equeue_broker.storage.results import QueueInfo
from equeue_broker.storage.staging import SUFFIX, StageFile, encode_entry

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

    def append_atomically(
        self,
        queues: Sequence[QueueKey],
        decide: Callable[[dict[QueueKey, int]], None],
        batches: Callable[[], Iterable[tuple[str, int, EncodedBatch]]],
        resume: bool = False,
    ) -> dict[QueueKey, int]:
        """Append ``batches()`` to ``queues`` as one unit, after ``decide(first
        offsets)`` ran under the append lock (see ``Store.append_atomically``)."""
        ...

    def queue_info(self, topic: str, queue_id: int) -> QueueInfo:
        """The queue's state; ``NotFound`` if it does not exist."""
        ...

    def unblock(self, topic: str, queue_id: int) -> None:
        """Let a queue take appends again (its interrupted commit is resolved)."""
        ...


class _Txn:
    """An open transaction. ``lock`` serialises writes to its stage file."""

    def __init__(self, stage: StageFile, last_ms: int) -> None:
        self.stage = stage
        self.last_ms = last_ms
        self.messages = 0
        self.bytes = 0
        self.queues: dict[QueueKey, int] = {}
        self.committing = False
        self.ended = False
        self.lock = threading.Lock()

    def add(self, topic: str, queue_id: int, count: int) -> None:
        key = (topic, queue_id)
        self.queues[key] = self.queues.get(key, 0) + count
        self.messages += count


class Transactions:
    """The open transactions of one store (``Store.transactions``)."""

    def __init__(self, store: TransactionStore, directory: Path, config: TransactionConfig) -> None:
        self._store = store
        self._dir = directory
        self.config = config
        self._lock = threading.Lock()
        """Guards the dictionaries below."""
        self._commit_lock = threading.Lock()
        """One commit or roll-forward at a time."""
        self._open: dict[str, _Txn] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._pending: dict[Path, dict[str, Any]] = {}
        """Decisions whose appends failed part-way: rolled forward later."""
        self._seq = 0
        """Number of the last commit decision file (set by recovery; names sort by it)."""
        directory.mkdir(mode=0o700, exist_ok=True)
        remove_temp_files(directory)
        self.sinks_lost: str | None = None
        """What was lost when no copy of sinks.json was intact (damage.py)."""
        self._sinks = self._load_sinks()
        self._recover()

    # -- staging ---------------------------------------------------------------------

    def stage(self, txn_id: str, topic: str, parts: Sequence[tuple[int, MessageBatch]]) -> int:
        """Stage ``(queue_id, batch)`` parts under ``txn_id`` (created on first use);
        return the transaction's staged message count.

        Batches are checked as an append would check them, so a commit cannot
        fail on their content.
        """
        validate_transaction_id(txn_id)
        entries = []
        counts = []
        staged_ms = _now_ms()
        for queue_id, batch in parts:
            prepared = self._store.prepare(topic, queue_id, batch)
            entries.append(encode_entry(topic, queue_id, prepared, staged_ms))
            counts.append((queue_id, len(batch)))
        size = sum(map(len, entries))
        if size > self.config.max_bytes:  # before an empty transaction is created
            raise LimitExceeded(
                f"{size} bytes to stage exceed max_transaction_bytes={self.config.max_bytes}"
            )
        txn = self._get_or_create(txn_id)
        with txn.lock:
            if txn.ended or txn.committing:
                state = "being committed" if txn.committing else "ended"
                raise PreconditionFailed(f"transaction {txn_id!r} is {state}; stage into a new one")
            if txn.bytes + size > self.config.max_bytes:
                raise LimitExceeded(
                    f"transaction {txn_id!r} would hold {txn.bytes + size} staged bytes; "
                    f"max_transaction_bytes={self.config.max_bytes}"
                )
            try:
                txn.stage.append(entries)
            except OSError as exc:
                raise io_error(f"staging transaction {txn_id!r}", exc) from exc
            for queue_id, count in counts:
                txn.add(topic, queue_id, count)
            txn.bytes += size
            txn.last_ms = _now_ms()
            return txn.messages

    def _get_or_create(self, txn_id: str) -> _Txn:
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
            try:
                stage = StageFile.create(self._dir, txn_id, now)
            except OSError as exc:
                raise io_error(f"creating transaction {txn_id!r}", exc) from exc
            txn = self._open[txn_id] = _Txn(stage, now)
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
        aborted (a replay); if it is older, ``PreconditionFailed``.
        """
        self._check_commit_args(refs, sink, batch_id, abort_prefix)
        with self._commit_lock:
            self._retry_pending()
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
                        txn.stage.sync()
            except OSError as exc:
                self._unclaim(txns)
                raise io_error("syncing staged messages", exc) from exc
            except BaseException:
                self._unclaim(txns)
                raise
            queues = self._apply_new(txns, sink, batch_id)
        aborted = self._abort_where([], abort_prefix) if abort_prefix else 0
        return CommitResult(False, queues, aborted)

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

    def _apply_new(self, txns: list[_Txn], sink: str, batch_id: int) -> tuple[CommittedQueue, ...]:
        counts: dict[QueueKey, int] = {}
        for txn in txns:
            for key, count in txn.queues.items():
                counts[key] = counts.get(key, 0) + count
        self._seq += 1  # under the commit lock
        path = self._dir / f"commit-{self._seq:012d}.json"
        decision: dict[str, Any] = {
            "txns": [t.stage.txn_id for t in txns],
            "sink": sink,
            "batch": batch_id,
        }
        gate = threading.Lock()
        started = cancelled = durable = False

        def decide(firsts: dict[QueueKey, int]) -> None:
            nonlocal started, durable
            with gate:  # a caller that gave up waiting must not be committed behind its back
                if cancelled:
                    raise StorageError("the commit timed out before it started; nothing appended")
                started = True
            decision["queues"] = [[t, q, firsts[(t, q)], n] for (t, q), n in counts.items()]
            try:
                save_json(path, decision)
            except OSError as exc:  # no decision: no append may follow (recovery must not find one)
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
                raise io_error("saving a commit decision", exc) from exc
            durable = True

        def batches() -> Iterator[tuple[str, int, EncodedBatch]]:
            for txn in txns:
                for staged in txn.stage.batches():
                    yield staged.topic, staged.queue_id, staged.records

        try:
            firsts = self._store.append_atomically(list(counts), decide, batches)
        except TimeoutError:
            with gate:
                cancelled = not started
            if cancelled:
                self._unclaim(txns)
            else:  # it runs later: the retry, queued behind it, completes or undoes it
                self._pending[path] = decision
            raise StorageError("the commit did not finish in time; retry it") from None
        except BaseException:
            if not durable:
                self._unclaim(txns)
            else:
                self._pending[path] = decision
                log.exception("commit %s failed part-way; it will be rolled forward", path.name)
            raise
        self._complete(decision, path, txns)
        return tuple(CommittedQueue(t, q, firsts[(t, q)], n) for (t, q), n in counts.items())

    def _complete(self, decision: dict[str, Any], path: Path, txns: Sequence[_Txn]) -> None:
        """``_finish``, or, if that fails (disk full), a pending decision retried later."""
        try:
            self._finish(decision, path, txns)
        except OSError as exc:
            self._pending[path] = decision
            raise io_error("completing a commit (it will be retried)", exc) from exc

    def _finish(self, decision: dict[str, Any], path: Path, txns: Sequence[_Txn]) -> None:
        """Step 4: the commit is complete; forget what made it recoverable."""
        sink = decision["sink"]
        last = self._sinks.get(sink)
        if sink and (last is None or decision["batch"] > last.batch_id):  # never backwards
            self._sinks[sink] = SinkProgress(sink, decision["batch"], _now_ms())
            self._save_sinks()
        with self._lock:
            for txn in txns:
                self._end(txn, "committed")
        for txn in txns:
            txn.stage.delete()
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".bak").unlink(missing_ok=True)
        self._pending.pop(path, None)

    # -- roll-forward ----------------------------------------------------------------

    def _retry_pending(self) -> None:
        for path, decision in sorted(self._pending.items()):
            self._roll_forward(decision, path)

    def _roll_forward(self, decision: dict[str, Any], path: Path) -> None:
        """Append what a decided commit has not appended yet (see module doc)."""
        txns = [self._open.get(txn_id) for txn_id in decision["txns"]]
        wanted: dict[QueueKey, tuple[int, int]] = {}
        for topic, queue_id, first, count in decision["queues"]:
            try:
                self._store.queue_info(topic, queue_id)
            except NotFound:
                log.error("commit %s: queue %s/%d is gone; skipping it", path.name, topic, queue_id)
                self._store.unblock(topic, queue_id)  # a topic made again must take appends
                continue
            wanted[(topic, queue_id)] = (first, count)
        done: dict[QueueKey, int] = {}

        def measure(ends: dict[QueueKey, int]) -> None:
            # Under the append lock, after every earlier append: what is in the
            # log now is exactly what this commit appended before it stopped.
            if not path.exists():  # never decided (a timed-out commit that then failed)
                raise _Undecided()
            for key, end in ends.items():
                first, count = wanted[key]
                applied = min(max(end - first, 0), count)
                if applied < count:
                    done[key] = applied

        live = [t for t in txns if t is not None]
        if len(live) < len(txns):
            missing = [i for i, t in zip(decision["txns"], txns, strict=True) if t is None]
            log.error("commit %s: stage files of %s are gone", path.name, missing)
        try:
            self._store.append_atomically(
                list(wanted), measure, lambda: _remaining(live, done), resume=True
            )
        except _Undecided:
            self._pending.pop(path, None)
            self._unclaim(live)
            return
        if done:
            log.warning("commit %s rolled forward on %d queues", path.name, len(done))
        self._complete(decision, path, live)

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
        for txn in victims:
            with txn.lock:
                txn.stage.delete()
        return len(victims)

    def expire(self, now_ms: int | None = None) -> int:
        """Abort transactions idle longer than the timeout, and roll forward
        commits that failed part-way; return how many were aborted."""
        now = _now_ms() if now_ms is None else now_ms
        with self._commit_lock:
            if self._pending:
                try:
                    self._retry_pending()
                except StorageError as exc:
                    log.warning("rolling forward an interrupted commit failed again: %s", exc)
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
        self._open.pop(txn.stage.txn_id, None)
        self._ended[txn.stage.txn_id] = outcome
        while len(self._ended) > MAX_REMEMBERED_ENDINGS:
            self._ended.popitem(last=False)

    # -- state -----------------------------------------------------------------------

    def list_open(self, prefix: str = "") -> list[TransactionInfo]:
        with self._lock:
            return [
                TransactionInfo(
                    txn_id,
                    t.stage.created_ms,
                    t.last_ms,
                    t.messages,
                    t.bytes,
                    dict(t.queues),
                    t.committing,
                )
                for txn_id, t in sorted(self._open.items())
                if txn_id.startswith(prefix)
            ]

    def sinks(self) -> list[SinkProgress]:
        return sorted(self._sinks.values(), key=lambda s: s.sink)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "open_transactions": len(self._open),
                "staged_bytes": sum(t.bytes for t in self._open.values()),
            }

    def close(self) -> None:
        with self._lock:
            for txn in self._open.values():
                txn.stage.close()

    # -- persistence -----------------------------------------------------------------

    def _load_sinks(self) -> dict[str, SinkProgress]:
        try:
            document = load_json(self._dir / "sinks.json") or {}
        except CorruptionError as exc:
            # The broker still serves; what is lost is each sink's last batch id,
            # so a batch replayed after this may be committed a second time.
            self.sinks_lost = f"txn/sinks.json: sink progress lost ({exc})"
            kept = keep_damaged(self._dir / "sinks.json")
            log.error("SINK PROGRESS LOST: %s; damaged copies kept as %s", exc, kept)
            return {}
        return {s: SinkProgress(s, int(b), int(ms)) for s, (b, ms) in document.items()}

    def _save_sinks(self) -> None:
        now = _now_ms()
        live = [s for s in self._sinks.values() if now - s.updated_ms <= self.config.sink_ttl_ms]
        live.sort(key=lambda s: s.updated_ms)
        self._sinks = {s.sink: s for s in live[-self.config.max_sinks :]}
        document = {s.sink: [s.batch_id, s.updated_ms] for s in self._sinks.values()}
        save_json(self._dir / "sinks.json", document)

    def _recover(self) -> None:
        for path in sorted(self._dir.glob("*" + SUFFIX)):
            try:
                stage, counts = StageFile.open(path)
            except CorruptionError as exc:  # a crash while creating it: nothing was staged
                log.warning("removing a stage file without a whole header: %s", exc)
                path.unlink()
                continue
            txn = _Txn(stage, max(stage.created_ms, int(path.stat().st_mtime * 1000)))
            for topic, queue_id, count in counts:
                txn.add(topic, queue_id, count)
            txn.bytes = stage.size
            self._open[stage.txn_id] = txn
        decisions = sorted(self._dir.glob("commit-*.json"))
        self._seq = max((int(p.stem.split("-")[1]) for p in decisions), default=0)
        for path in decisions:
            decision = load_json(path, repair=False)  # no .bak: it is deleted once applied
            if not isinstance(decision, dict) or "queues" not in decision:
                raise CorruptionError("unreadable commit decision", str(path))
            self._roll_forward(decision, path)
        if self._open or decisions:
            log.info(
                "transactions: %d open, %d commits completed after a restart",
                len(self._open), len(decisions),
            )  # fmt: skip


class _Undecided(Exception):
    """A pending decision that never reached the disk: nothing of it was appended."""


def _check_count(txn: _Txn, txn_id: str, expected: int) -> None:
    if expected >= 0 and txn.messages != expected:
        raise PreconditionFailed(
            f"transaction {txn_id!r} holds {txn.messages} staged messages; "
            f"the writer staged {expected}"
        )


def _remaining(
    txns: Sequence[_Txn], done: dict[QueueKey, int]
) -> Iterator[tuple[str, int, EncodedBatch]]:
    """The staged batches of ``done``'s queues, minus the first ``done[queue]``
    messages of each (those are in the log already)."""
    skip = dict(done)
    for txn in txns:
        for staged in txn.stage.batches():
            key = (staged.topic, staged.queue_id)
            if key not in skip:
                continue
            records = staged.records
            if skip[key] >= records.count:
                skip[key] -= records.count
                continue
            if skip[key]:
                _, records = records.split(skip[key])
                skip[key] = 0
            yield staged.topic, staged.queue_id, records


def _now_ms() -> int:
    return int(time.time() * 1000)
