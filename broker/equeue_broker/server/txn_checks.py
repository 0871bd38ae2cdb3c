"""Transaction check-back on the broker: the producer groups' check streams and
the task that checks late transactions with them.

RocketMQ's ``TransactionalMessageCheckService``, adapted (docs/client.md,
"Transaction check-back"). Producers of a group hold a ``TransactionChecks``
stream open (service_checks.py); ``CheckStreams`` keeps them per group.
``TransactionChecker`` ticks about once a second while this broker is a
master: for each open transaction due for a check (storage/txn/check_policy.py)
it first writes the check record (write-ahead: the count survives a crash
after sending, and a crash before it only repeats a check, whose answers are
idempotent), then sends a ``TransactionCheck`` down one live stream of the
group, round robin ("none" in the record when no producer is there: it counts
as an unknown answer). Transactions checked ``check_max`` times are then rolled
back, with a WARNING, unless ``check_exhausted`` is "keep".

Answers: COMMIT commits, ROLLBACK aborts, UNKNOWN does nothing (the count has
moved already). Only a master applies one (``active``, looked at right before
each write: a replica's log is the master's copy), and only to an open
transaction of the stream's own group checked at least once
(``Transactions.resolve_checked``): any other answer is moot, logged at DEBUG
(the producer itself or another answer won, or it is not the group's to end).
Ids from clients are logged through ``shown`` (truncated, repr).

Token namespaces (auth.py): a non-admin token's transaction ids are stored as
``<name>@<id>``; a stream opened with such a token is asked only about ids of
its namespace, without the prefix (the id its producer knows), and its answers
get the prefix back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from equeue_broker.storage import Store
from equeue_broker.storage.errors import (
    InvalidArgument,
    LimitExceeded,
    NotFound,
    StorageError,
)
from equeue_broker.storage.txn.check_policy import CheckDue, CheckPolicy
from equeue_broker.storage.txn.transactions import CommitResult
from equeue_proto.v1 import broker_pb2 as pb

log = logging.getLogger(__name__)

Call = Callable[..., Awaitable[Any]]
"""Runs a blocking storage call off the event loop (``BrokerState.call``)."""

FEATURE = "txn-check"
"""This broker's word in ``BrokerStats.features``: it serves TransactionChecks."""
TICK_S = 1.0
STREAM_QUEUE = 1_000
"""Checks waiting to be sent on one stream; a full stream is skipped."""


@dataclass(eq=False)
class CheckStream:
    """One producer's open check stream: the checks waiting to go down it."""

    group: str
    client_id: str
    namespace: str
    """"<token>@" for a non-admin token: the ids it is asked about; "" for all."""
    queue: asyncio.Queue[pb.TransactionCheck] = field(
        default_factory=lambda: asyncio.Queue(STREAM_QUEUE)
    )

    def knows(self, txn_id: str) -> bool:
        return txn_id.startswith(self.namespace)

    def offer(self, check: pb.TransactionCheck) -> bool:
        """Queue ``check`` (its id as the producer knows it); False if full."""
        check.transaction_id = check.transaction_id[len(self.namespace) :]
        try:
            self.queue.put_nowait(check)
        except asyncio.QueueFull:
            return False
        return True


class CheckStreams:
    """The open check streams, per producer group (event loop only)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._groups: dict[str, list[CheckStream]] = {}
        self._turns: dict[str, itertools.count[int]] = {}

    def __len__(self) -> int:
        return sum(len(s) for s in self._groups.values())

    def open(self, group: str, client_id: str, namespace: str) -> CheckStream:
        if len(self) >= self.limit:
            raise LimitExceeded(
                f"{len(self)} transaction check streams are open (max_check_streams="
                f"{self.limit}); close some producers or raise --max-check-streams"
            )
        stream = CheckStream(group, client_id, namespace)
        self._groups.setdefault(group, []).append(stream)
        return stream

    def close(self, stream: CheckStream) -> None:
        streams = self._groups.get(stream.group, [])
        if stream in streams:
            streams.remove(stream)
        if not streams:
            self._groups.pop(stream.group, None)
            self._turns.pop(stream.group, None)

    def pick(self, group: str, txn_id: str) -> CheckStream | None:
        """A live stream of ``group`` that may be asked about ``txn_id`` and has
        room for a check (a full one is skipped), round robin."""
        streams = [s for s in self._groups.get(group, ()) if s.knows(txn_id) and not s.queue.full()]
        if not streams:
            return None
        turn = next(self._turns.setdefault(group, itertools.count()))
        return streams[turn % len(streams)]


class TransactionChecker:
    """Checks late transactions with their producer groups, while a master."""

    def __init__(
        self, store: Store, streams: CheckStreams, broker_id: str, call: Call,
        counted: Callable[[str, int, int], None] | None = None,
    ) -> None:  # fmt: skip
        self.store = store
        self.counted = counted
        """Told (topic, queue id, count) of the messages a commit answer made visible."""
        self.streams = streams
        self.broker_id = broker_id
        self.call = call
        self.policy = CheckPolicy.of(store.transactions.config)
        self.active = False
        """Set by the role (app.py): only a master checks."""
        self.sent = 0
        self.answered = 0
        self._task: asyncio.Task[None] | None = None

    def set_active(self, active: bool) -> None:
        """Check (a master) or not; any thread (role listeners run on the changer's)."""
        self.active = active

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def stats(self) -> dict[str, Any]:
        """GetStats' fields (``features`` lists ``FEATURE``; other packages' words
        are added to it by stats.py)."""
        return {
            "transaction_checks_sent": self.sent,
            "transaction_checks_answered": self.answered,
            "check_streams": len(self.streams),
            "features": [FEATURE],
        }

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            if not self.active:
                continue
            try:
                await self.tick(int(time.time() * 1000))
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed tick is retried by the next one
                log.exception("transaction check tick failed")

    async def tick(self, now_ms: int) -> None:
        transactions = self.store.transactions
        due: list[CheckDue] = await self.call(transactions.due_checks, now_ms, self.policy)
        if due:
            targets = [self.streams.pick(d.group, d.txn_id) for d in due]
            answers = ["none" if t is None else "unknown" for t in targets]
            written = await self.call(self._record, due, answers, now_ms)
            for d, target, ok in zip(due, targets, written, strict=True):
                if ok and target is not None and target.offer(self._check(d)):
                    self.sent += 1
        exhausted: list[CheckDue] = await self.call(transactions.exhausted, now_ms, self.policy)
        if not self.active:
            return
        for d in exhausted:
            log.warning(
                "rolling back transaction %s of producer group %s: %d checks unanswered",
                d.txn_id, d.group, d.checks,
            )  # fmt: skip
        if exhausted:
            await self.call(self._roll_back, [d.txn_id for d in exhausted])

    def _roll_back(self, ids: list[str]) -> None:
        """Roll back exhausted transactions (a thread of the pool), if still a master."""
        if self.active:
            self.store.transactions.abort(ids)

    def _record(self, due: list[CheckDue], answers: list[str], now_ms: int) -> list[bool]:
        """Write the check records (a thread of the pool); which were written."""
        record = self.store.transactions.record_check
        written = []
        for d, answer in zip(due, answers, strict=True):
            if not self.active:  # demoted while this tick ran: a replica writes nothing
                written.append(False)
                continue
            try:
                written.append(record(d.txn_id, d.checks + 1, answer, now_ms))
            except StorageError as exc:  # demoted meanwhile, or the disk: next tick
                log.warning("could not record a check of transaction %s: %s", shown(d.txn_id), exc)
                written.append(False)
        return written

    def _check(self, due: CheckDue) -> pb.TransactionCheck:
        check = pb.TransactionCheck(
            transaction_id=due.txn_id,
            check=due.checks + 1,
            created_ms=due.created_ms,
            broker_id=self.broker_id,
        )
        for (topic, queue_id), count in sorted(due.queues.items()):
            check.queues.add(topic=topic, queue_id=queue_id, count=count)
        return check

    async def answer(self, stream: CheckStream, answer: pb.CheckAnswer) -> None:
        """Apply a producer's answer (COMMIT, ROLLBACK; UNKNOWN: nothing), only
        to an open transaction of the stream's group that was checked, and only
        on a master: a replica's log is the master's copy (it writes nothing)."""
        resolution = answer.resolution
        if resolution not in _APPLIED:
            return
        commit = resolution == pb.TRANSACTION_RESOLUTION_COMMIT
        txn_id = stream.namespace + answer.transaction_id
        try:
            result = await self.call(self._apply, txn_id, stream.group, commit)
        except (NotFound, InvalidArgument) as exc:  # ended, another group's, unchecked, no id
            log.debug("check answer for %s is moot: %s", shown(txn_id), exc)
            return
        except StorageError as exc:  # a demoted master, the disk: the next check asks again
            log.warning("check answer for %s not applied: %s", shown(txn_id), exc)
            return
        if result is None:
            log.debug("check answer for %s ignored: this broker is not a master", shown(txn_id))
            return
        self.answered += 1
        if self.counted is not None:
            for q in result.queues:
                self.counted(q.topic, q.queue_id, q.count)
        log.info(
            "transaction %s %s on check %d by producer group %s (%s)", shown(txn_id),
            "committed" if commit else "rolled back", answer.check, stream.group,
            stream.client_id,
        )  # fmt: skip

    def _apply(self, txn_id: str, group: str, commit: bool) -> CommitResult | None:
        """A thread of the pool: None when not a master (looked at right before
        writing, so a demotion meanwhile writes nothing)."""
        if not self.active:
            return None
        return self.store.transactions.resolve_checked(txn_id, group, commit)


_APPLIED = (pb.TRANSACTION_RESOLUTION_COMMIT, pb.TRANSACTION_RESOLUTION_ROLLBACK)
SHOWN_ID = 64
"""Characters of a transaction id a log line shows."""


def shown(txn_id: str) -> str:
    """``txn_id`` for a log line: truncated, and printable on one line."""
    cut = txn_id[:SHOWN_ID] + ("..." if len(txn_id) > SHOWN_ID else "")
    return repr(cut)
