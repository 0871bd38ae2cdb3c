"""Transactions: stage messages out of readers' sight, then commit them atomically.

::

    with Producer("127.0.0.1:5000") as producer:
        with producer.transaction("import-2026-11-21") as txn:
            txn.send_batch("orders", [b"a", b"b"], keys=[b"k1", b"k2"])
            txn.send_batch("audit", [b"imported 2"])
        # committed here: every message visible at once, or none on an exception

Staged messages are routed (explicit queue, key hash, round robin) when they
are staged, but get their offsets when the transaction commits. A commit may
name a ``sink`` and a ``batch_id``: the broker remembers each sink's last
committed batch, so committing a batch twice (a writer replaying its work
after a crash) commits it once. ``commit_transactions`` and
``abort_transactions`` are the one place those requests are built.

A transaction stages through its producer's connection with the senders of
batches.py, so this module does not import producer.py (which imports it).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.batches import (
    BatchColumns,
    Headers,
    SendResults,
    send_request,
    stream_requests,
)
from equeue_spark.client.connection import Connection
from equeue_spark.client.delays import refuse_staged, staged_delay_error
from equeue_spark.client.errors import PreconditionError

Stage = Callable[[pb.ProduceRequest], SendResults]
"""How an idempotent producer's transaction stages a request (producer.py):
queues chosen, stamped with its sequences, sent with retries."""


class TransactionResolution(enum.StrEnum):
    """What a producer group's checker says became of a transaction (checks.py)."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"


COMMIT_TIMEOUT_FACTOR = 10
"""A commit appends a whole transaction: it gets this many call deadlines."""


@dataclass(frozen=True)
class CommitOutcome:
    already_committed: bool
    """Nothing was appended: the sink had committed this batch before, or
    (no sink) every transaction named was committed already, by a check
    answer say (docs/client.md, "Transaction check-back")."""
    queues: list[tuple[str, int, int, int]]
    """(topic, queue id, first offset, count) per queue written."""
    aborted: int
    """Transactions this call aborted (a replay's own, and prefix matches)."""


def commit_transactions(
    conn: Connection,
    transactions: Sequence[tuple[str, int]],
    *,
    sink: str = "",
    batch_id: int = -1,
    abort_prefix: str = "",
) -> CommitOutcome:
    """Commit ``transactions`` = [(id, messages staged or -1)] atomically.

    Retried on UNAVAILABLE only with a ``sink``: then a repeat is harmless.
    """
    request = pb.CommitTransactionsRequest(sink=sink, batch_id=batch_id, abort_prefix=abort_prefix)
    for txn_id, expected in transactions:
        request.transactions.add(transaction_id=txn_id, expected_messages=expected)
    reply = conn.call(
        conn.broker.CommitTransactions,
        request,
        timeout_s=conn.config.timeout_s * COMMIT_TIMEOUT_FACTOR,
        retry=bool(sink),
    )
    return CommitOutcome(
        reply.already_committed,
        [(q.topic, q.queue_id, q.first_offset, q.count) for q in reply.queues],
        reply.aborted,
    )


def abort_transactions(conn: Connection, ids: Sequence[str] = (), prefix: str = "") -> int:
    """Abort open transactions by id or id prefix; return how many (idempotent)."""
    request = pb.AbortTransactionsRequest(transaction_ids=list(ids), prefix=prefix)
    return conn.call(conn.broker.AbortTransactions, request).aborted


class Transaction:
    """Messages staged under one id (see the module doc); from ``Producer.transaction``.

    ``send_batch`` through an idempotent producer is retried like a produce
    (its sequences make a repeat stage nothing more); otherwise, and for
    ``send_requests``, staging calls are not retried: a failed one may or may
    not have been staged, so the transaction should be aborted (a context
    manager does). ``commit`` checks the broker holds exactly the messages
    acknowledged here.
    """

    def __init__(
        self, conn: Connection, txn_id: str, stage: Stage | None = None, group: str = ""
    ) -> None:
        self.id = txn_id
        self.group = group
        """The producer group the broker checks the transaction with ("": none)."""
        self._conn = conn
        self._stage = stage
        self.messages = 0
        """Messages staged and acknowledged so far."""
        self.ended = False

    def send_batch(
        self,
        topic: str,
        values: Sequence[bytes],
        *,
        keys: Sequence[bytes | None] | None = None,
        tags: Sequence[str] | None = None,
        headers: Sequence[Headers] | None = None,
        queue_ids: Sequence[int | None] | None = None,
        timestamps_ms: Sequence[int | None] | None = None,
        delay_s: object = None,
        deliver_at: object = None,
    ) -> SendResults:
        """Stage one batch; results carry queue ids but no offsets yet.
        ``delay_s``/``deliver_at`` are refused (InvalidRequest): a delayed
        message cannot wait inside a transaction."""
        self._check_open()
        if delay_s is not None or deliver_at is not None:
            raise staged_delay_error(self.id)
        columns = BatchColumns(values, keys, tags, headers, queue_ids, timestamps_ms)
        request = columns.request(topic, self.id)
        request.producer_group = self.group
        if self._stage is not None:
            results = self._stage(request)
        else:
            results = send_request(self._conn, request)
        self.messages += len(results)
        return results

    def send_requests(self, requests: Iterable[pb.ProduceRequest]) -> Iterator[SendResults]:
        """Stage pre-built requests pipelined on one stream (``Producer.send_requests``)."""
        self._check_open()

        def staged() -> Iterator[pb.ProduceRequest]:
            for request in requests:
                request.transaction_id = self.id
                request.producer_group = self.group
                refuse_staged(request)
                yield request

        for results in stream_requests(self._conn, staged()):
            self.messages += len(results)
            yield results

    def commit(self, *, sink: str = "", batch_id: int = -1) -> CommitOutcome:
        """Make every staged message visible at once (see ``commit_transactions``).
        If a check answer committed the transaction first, this succeeds with
        ``already_committed``."""
        self._check_open()
        if self.messages == 0:  # nothing was staged: the broker never heard of it
            self.ended = True
            return CommitOutcome(False, [], 0)
        outcome = commit_transactions(
            self._conn, [(self.id, self.messages)], sink=sink, batch_id=batch_id
        )
        self.ended = True
        return outcome

    def abort(self) -> None:
        """Discard every staged message (a no-op if nothing was staged, or if
        the transaction ended already, e.g. a check answer rolled it back)."""
        if not self.ended:
            self.ended = True
            abort_transactions(self._conn, [self.id])

    def _check_open(self) -> None:
        if self.ended:
            raise PreconditionError(f"transaction {self.id!r} has ended")

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            if not self.ended:
                self.commit()
        else:
            self.abort()


__all__ = [
    "CommitOutcome",
    "Stage",
    "Transaction",
    "TransactionResolution",
    "abort_transactions",
    "commit_transactions",
]
