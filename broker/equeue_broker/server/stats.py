"""Produce/consume counters per queue and broker-wide rates over the last minute.

Counted once per RPC (a batch), never per message: messages and stored bytes
(an append's ``AppendResult.nbytes``, a pull reply's ``RecordsResult.nbytes``,
both O(1)) under the one lock ``add`` takes anyway.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Collection

from equeue_broker.storage import AppendResult
from equeue_broker.storage.txn.transactions import Transactions
from equeue_proto.v1 import broker_pb2 as pb

WINDOW_S = 60

FEATURES: tuple[str, ...] = ("filter", "query", "schemas", "lag_ms")
"""``BrokerStats.features``: what this broker serves that older ones do not
(clients check before relying on it): "filter" = Pull/PullStream ``filter``,
"schemas" = the schema calls (SetSchema, GetSchema...), "lag_ms" =
``GroupQueue.lag_ms`` and ``GroupInfo.max_lag_ms`` (an older broker sends 0);
"fetch" is added while a fetch port listens (``BrokerStats.fetch_address``)."""


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.produced: collections.Counter[tuple[str, int]] = collections.Counter()
        self.consumed: collections.Counter[tuple[str, int]] = collections.Counter()
        self.produced_bytes: collections.Counter[tuple[str, int]] = collections.Counter()
        """Stored bytes appended per queue (records as the log holds them)."""
        self.consumed_bytes: collections.Counter[tuple[str, int]] = collections.Counter()
        """Stored bytes sent in pull replies per queue."""
        self._seconds: collections.deque[tuple[int, int, int]] = collections.deque()
        # Kept apart from the per-queue counters, which forget deleted topics.
        self._produced_total = 0
        self._consumed_total = 0
        self.filtered: collections.Counter[tuple[str, int]] = collections.Counter()
        self._served_total = 0
        self._filtered_total = 0

    def add(  # noqa: PLR0917 (two figures each way, all optional)
        self,
        topic: str,
        queue_id: int,
        produced: int = 0,
        consumed: int = 0,
        produced_bytes: int = 0,
        consumed_bytes: int = 0,
    ) -> None:
        second = int(time.monotonic())
        key = (topic, queue_id)
        with self._lock:
            self._produced_total += produced
            self._consumed_total += consumed
            if produced:
                self.produced[key] += produced
                self.produced_bytes[key] += produced_bytes
            if consumed:
                self.consumed[key] += consumed
                self.consumed_bytes[key] += consumed_bytes
            if self._seconds and self._seconds[-1][0] == second:
                _, p, c = self._seconds[-1]
                self._seconds[-1] = (second, p + produced, c + consumed)
            else:
                self._seconds.append((second, produced, consumed))
            while self._seconds and self._seconds[0][0] <= second - WINDOW_S:
                self._seconds.popleft()

    def appended(self, result: AppendResult) -> None:
        """An append the broker made itself (Nack's retry and dead-letter
        copies, resent dead letters): counted like a produce, a repeat not."""
        if not result.duplicate:
            self.add(
                result.topic, result.queue_id, produced=result.count,
                produced_bytes=result.nbytes,
            )  # fmt: skip

    def pulled(
        self, topic: str, queue_id: int, served: int, filtered: int, nbytes: int = 0
    ) -> None:
        """A pull reply: ``served`` records sent (``nbytes`` stored bytes of
        them), ``filtered`` inspected and left out by its tags or filter
        expression (``add`` counts them consumed)."""
        if served:
            self.add(topic, queue_id, consumed=served, consumed_bytes=nbytes)
        with self._lock:
            self._served_total += served
            self._filtered_total += filtered
            if filtered:
                self.filtered[(topic, queue_id)] += filtered

    def pull_totals(self) -> tuple[int, int]:
        """(records served in pull replies, records filtered out) since start."""
        with self._lock:
            return self._served_total, self._filtered_total

    def forget(self, topic: str, queue_id: int | None = None) -> None:
        """Drop a deleted topic's (or queue's) counters: a topic or queue created
        later under the same name or id starts at zero. The broker-wide totals
        and rates keep counting what it did (they are since the broker started)."""
        with self._lock:
            counters = (
                self.produced, self.consumed, self.filtered, self.produced_bytes,
                self.consumed_bytes,
            )  # fmt: skip
            for counter in counters:
                for key in [k for k in counter if k[0] == topic and queue_id in (None, k[1])]:
                    del counter[key]

    def rates(self) -> tuple[float, float]:
        """(produced, consumed) messages per second over the last minute."""
        now = time.monotonic()
        span = max(1.0, min(WINDOW_S, now - self.started))
        with self._lock:
            recent = [s for s in self._seconds if s[0] > int(now) - WINDOW_S]
        return sum(s[1] for s in recent) / span, sum(s[2] for s in recent) / span

    def per_queue(self) -> list[tuple[str, int, int, int]]:
        """(topic, queue_id, produced, consumed), sorted."""
        with self._lock:
            keys = sorted(set(self.produced) | set(self.consumed))
            return [(t, q, self.produced[(t, q)], self.consumed[(t, q)]) for t, q in keys]

    def per_queue_bytes(self) -> list[tuple[str, int, int, int]]:
        """(topic, queue_id, bytes in, bytes out) since start, sorted."""
        with self._lock:
            keys = sorted(set(self.produced_bytes) | set(self.consumed_bytes))
            return [
                (t, q, self.produced_bytes[(t, q)], self.consumed_bytes[(t, q)]) for t, q in keys
            ]

    def totals(self) -> tuple[int, int]:
        with self._lock:
            return self._produced_total, self._consumed_total


def staged_bytes(transactions: Transactions, ids: Collection[str]) -> dict[tuple[str, int], int]:
    """Stored bytes the transactions ``ids`` staged, per (topic, queue), read
    before they are committed (the commit's result counts messages only).
    The store keeps staged bytes per transaction, so a transaction's bytes are
    shared among its queues by their message counts: exact for a transaction
    that writes one queue, and per topic for one that writes one topic."""
    shares: dict[tuple[str, int], int] = {}
    if not ids:
        return shares
    first, last = min(ids), max(ids)  # their common prefix: the ids in between share it
    same = 0
    while same < min(len(first), len(last)) and first[same] == last[same]:
        same += 1
    for info in transactions.list_open(first[:same]):
        if info.txn_id not in ids or not info.messages:
            continue
        for key, count in info.queues.items():
            shares[key] = shares.get(key, 0) + info.bytes * count // info.messages
    return shares


def fill_stats(reply: pb.BrokerStats, counters: Counters) -> pb.BrokerStats:
    """``reply`` (GetStats) with the pull figures and features filled in."""
    served, filtered = counters.pull_totals()
    reply.records_served = served
    reply.records_filtered = filtered
    reply.features.extend(FEATURES)
    if reply.fetch_address:
        reply.features.append("fetch")
    with counters._lock:
        for queue in reply.queue_counters:
            queue.filtered = counters.filtered[(queue.topic, queue.queue_id)]
    return reply
