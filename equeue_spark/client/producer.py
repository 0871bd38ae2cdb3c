"""``Producer``: send messages in batches, in column form.

``send_batch`` sends one request now. ``send`` buffers messages per topic and
sends a batch when ``batch_size`` messages or ``max_batch_bytes`` have
accumulated, when ``linger_ms`` has passed since the first buffered message
(a background thread), or on ``flush``/``close``; it returns a
``concurrent.futures.Future`` per message.

Routing happens on the broker: an explicit ``queue_id``, else the key's hash
(Kafka's murmur2 partitioner, ``equeue_proto.protocol.key_queue``),
else round robin per request. Retries on UNAVAILABLE may duplicate a batch
whose first attempt was applied but not acknowledged: at-least-once.

In a cluster (``namesrv=``) the producer routes: a topic's queues are the
ordered (broker name, queue id) list of its route, a key goes to
``key_queue(key, len(writable queues))`` of that list, and a batch is split
into one request per broker (each appended atomically on its broker; a batch
spanning brokers is not atomic across them). A keyless batch goes whole to
one broker, round robin; if that broker is unreachable the batch is retried
on the next one. A keyed message stays on its broker group (its key must not
move): when the group's master is unreachable, or the broker it reached is a
replica now, the route is fetched again and the part retried on the group's
new master for up to ``failover_timeout_s`` (``Cluster.on_master``), then it
fails with an error naming the group. Each broker's part is retried on its
own: a part once acknowledged is never sent again.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.batches import (
    BatchColumns,
    Headers,
    SendResult,
    SendResults,
    build_request,
    send_request,
    stream_requests,
)
from equeue_spark.client.cluster import Cluster, name_broker, split_request
from equeue_spark.client.connection import ClientConfig, Connection
from equeue_spark.client.errors import (
    BrokerUnavailable,
    EqueueError,
    InvalidRequest,
    NotMasterError,
)
from equeue_spark.client.transactions import Transaction

__all__ = ["Producer"]


@dataclass
class _Pending:
    """The messages ``send`` buffered for one topic, column by column."""

    values: list[bytes] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    headers: list[Headers] = field(default_factory=list)
    queue_ids: list[int] = field(default_factory=list)
    """-1: no explicit queue."""
    futures: list[Future[SendResult]] = field(default_factory=list)
    nbytes: int = 0
    since: float = 0.0

    def columns(self) -> BatchColumns:
        return BatchColumns(
            self.values,
            keys=self.keys,
            tags=self.tags,
            headers=self.headers,
            queue_ids=[None if q < 0 else q for q in self.queue_ids],
        )


MAX_FAN_OUT = 16
"""Brokers a keyed batch's parts are sent to at once."""


def columns_count(request: pb.ProduceRequest) -> int:
    return int(request.messages.count)


def _older_than(cutoff: float, _topic: str, pending: _Pending) -> bool:
    return pending.since <= cutoff


class Producer:
    """Send messages to a broker::

    with Producer("127.0.0.1:5000", linger_ms=5) as producer:
        producer.send("orders", b"...", key=b"customer-7")
        results = producer.send_batch("orders", [b"a", b"b"])
    """

    def __init__(
        self,
        broker: str = "",
        *,
        namesrv: str | Sequence[str] = "",
        config: ClientConfig | None = None,
        batch_size: int = 1000,
        max_batch_bytes: int = 16 << 20,
        linger_ms: int = 0,
        failover_timeout_s: float | None = None,
    ) -> None:
        """``failover_timeout_s`` (cluster only; default: the config's, 30 s):
        how long a batch waits for its broker group's new master."""
        if batch_size < 1 or max_batch_bytes < 1 or linger_ms < 0:
            raise ValueError("batch_size and max_batch_bytes must be >= 1, linger_ms >= 0")
        config = config or ClientConfig(broker=broker, namesrv=namesrv)
        if failover_timeout_s is not None:
            config = dataclasses.replace(config, failover_timeout_s=failover_timeout_s)
        self._cluster: Cluster | None = Cluster(config) if config.is_cluster else None
        self._conn: Connection | None = None if self._cluster else Connection(config)
        self._config = config
        self._round_robin = itertools.count(random.randrange(1 << 16))
        self._down: dict[str, float] = {}
        self._pool: ThreadPoolExecutor | None = None
        """Sends a keyed batch's per-broker parts at once (cluster only, made on first use)."""
        """Brokers that failed a keyless send lately: tried last until then."""
        self.batch_size = batch_size
        self.max_batch_bytes = max_batch_bytes
        self.linger_ms = linger_ms
        self._lock = threading.Lock()
        """Guards the buffers."""
        self._send_lock = threading.Lock()
        """Held while batches are cut and sent (taken before ``_lock``)."""
        self._pending: dict[str, _Pending] = {}
        self._closed = threading.Event()
        self._lingerer: threading.Thread | None = None
        if linger_ms > 0:
            self._lingerer = threading.Thread(
                target=self._linger, name="equeue-linger", daemon=True
            )
            self._lingerer.start()

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
        transaction_id: str = "",
        brokers: Sequence[str | None] | None = None,
    ) -> SendResults:
        """Send ``values`` (and the optional columns) in one request, now.

        With ``transaction_id`` the messages are staged (see ``transaction``),
        and the call is not retried. In a cluster an explicit queue id needs
        the broker name beside it (``brokers``).
        """
        columns = BatchColumns(values, keys, tags, headers, queue_ids, timestamps_ms)
        return self._send(columns.request(topic, transaction_id), brokers)

    def transaction(self, txn_id: str, broker: str = "") -> Transaction:
        """A transaction staged through this producer (see transactions.py).

        In a cluster a transaction lives on one broker: name it (``broker``);
        its messages go to that broker's queues."""
        if self._cluster is None:
            return Transaction(self._single(), txn_id)
        if not broker:
            raise InvalidRequest("in a cluster a transaction lives on one broker: give broker=")
        return Transaction(self._cluster.connection(self._cluster.broker_address(broker)), txn_id)

    def send_request(
        self, request: pb.ProduceRequest, brokers: Sequence[str | None] | None = None
    ) -> SendResults:
        """Send a request built by the caller (``build_request``) now; in a
        cluster routed like ``send_batch`` (``brokers``: beside explicit queue ids)."""
        return self._send(request, brokers)

    def stage(
        self,
        request: pb.ProduceRequest,
        txn_id: str,
        brokers: Sequence[str | None] | None = None,
        seed: int = 0,
    ) -> dict[str, int]:
        """Cluster only: stage ``request``'s messages in transaction ``txn_id``
        on each broker they route to (the same id on each); return the
        messages staged per broker. Keyed messages route by key; keyless ones
        all go to the writable queue ``seed`` picks, so staging the same
        request again with the same seed (a replay) routes it the same way
        while the route is unchanged."""
        cluster = self._cluster
        if cluster is None:
            raise InvalidRequest("stage() routes over a cluster; use transaction() on one broker")
        route = cluster.route(request.topic)
        writable = route.queues("writable")
        sticky = writable[seed % len(writable)] if writable else ("", 0)
        staged: dict[str, int] = {}
        for broker, (rows, part) in sorted(
            split_request(request, writable, sticky, brokers).items()
        ):
            part.transaction_id = txn_id
            address = route.address(broker)
            try:
                send_request(cluster.connection(address), part)
            except EqueueError as exc:
                cluster.invalidate(request.topic)
                raise name_broker(exc, broker, address) from exc
            staged[broker] = len(rows)
        return staged

    def cluster(self) -> Cluster | None:
        """The routes and broker connections (None: one broker)."""
        return self._cluster

    def _single(self) -> Connection:
        assert self._conn is not None
        return self._conn

    def _send(
        self, request: pb.ProduceRequest, brokers: Sequence[str | None] | None = None
    ) -> SendResults:
        if self._cluster is None:
            return send_request(self._single(), request)
        columns = request.messages
        keyless = not len(request.queue_ids) and all(k < 0 for k in columns.key_lengths)
        if keyless:
            return self._send_anywhere(self._cluster, request)
        return self._send_routed(self._cluster, request, brokers)

    def _send_routed(
        self, cluster: Cluster, request: pb.ProduceRequest, brokers: Sequence[str | None] | None
    ) -> SendResults:
        """Keyed (or explicit) messages: each to its (broker, queue); one request per broker."""
        topic = request.topic
        route = cluster.route(topic)
        writable = route.queues("writable")
        sticky = writable[next(self._round_robin) % len(writable)] if writable else ("", 0)
        parts = sorted(split_request(request, writable, sticky, brokers).items())

        def send(broker: str, part: pb.ProduceRequest) -> SendResults:
            try:
                if part.transaction_id:  # a failed staging may have staged: never again
                    return send_request(cluster.connection(route.address(broker)), part)
                return cluster.on_master(
                    topic, broker, lambda conn: send_request(conn, part, retry=False)
                )
            except EqueueError as exc:
                cluster.invalidate(topic)
                raise name_broker(exc, broker, route.entry(broker).address) from exc

        if len(parts) == 1:
            ((broker, (rows, part)),) = parts
            done: list[tuple[Sequence[int], SendResults]] = [(rows, send(broker, part))]
        else:  # the brokers' parts at once: a batch costs one round trip, not one per broker
            futures = [(rows, self._fan_out().submit(send, b, part)) for b, (rows, part) in parts]
            wait([f for _, f in futures])
            done = [(rows, f.result()) for rows, f in futures]  # the first error, by broker name
        count = columns_count(request)
        if len(done) == 1 and list(done[0][0]) == list(range(count)):
            return done[0][1]
        return SendResults.merged(topic, columns_count(request), done)

    def _fan_out(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(MAX_FAN_OUT, thread_name_prefix="equeue-produce")
            return self._pool

    def _send_anywhere(self, cluster: Cluster, request: pb.ProduceRequest) -> SendResults:
        """A keyless batch: whole to one broker, round robin; on a broker that
        cannot be reached (or a replica, the route being stale), again on the
        next one, the route fetched again, until ``failover_timeout_s``."""
        topic = request.topic
        config = cluster.config
        errors: list[str] = []
        delay = config.backoff_s
        deadline = time.monotonic() + max(config.failover_timeout_s, 0.0)
        for _ in range(100_000):  # bounded by the deadline long before
            route = cluster.route(topic)
            names = [
                n for n in route.broker_names() if any(b == n for b, _ in route.queues("writable"))
            ]
            if not names:
                raise BrokerUnavailable(f"topic {topic!r} has no writable queue on a live broker")
            now = time.monotonic()
            start = next(self._round_robin)
            ordered = sorted(
                (names[(start + i) % len(names)] for i in range(len(names))),
                key=lambda n: self._down.get(n, 0.0) > now,
            )
            for broker in ordered:
                address = route.entry(broker).address
                try:
                    address = route.address(broker)
                    return send_request(cluster.connection(address), request, retry=False)
                except EqueueError as exc:
                    again = exc.retriable or isinstance(exc, NotMasterError)
                    if not again or request.transaction_id:
                        raise name_broker(exc, broker, address) from exc
                    errors.append(f"{broker}: {exc}")
                    self._down[broker] = time.monotonic() + config.max_backoff_s * 5
                    if address:
                        cluster.mark_down(address)
                    cluster.invalidate(topic)
            if time.monotonic() + delay > deadline:
                break
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, config.max_backoff_s)
        raise BrokerUnavailable(
            f"no broker of topic {topic!r} took the batch within failover_timeout_s="
            f"{config.failover_timeout_s:g}: " + "; ".join(errors[-3:])
        )

    def send_batches(
        self,
        topic: str,
        batches: Iterable[Sequence[bytes]],
        *,
        keys: Iterable[Sequence[bytes | None] | None] | None = None,
    ) -> Iterator[SendResults]:
        """Send many batches pipelined on one ``ProduceStream`` call.

        Yields one ``SendResults`` per batch, in order, as acknowledgements
        arrive; the next batches are already on their way meanwhile. Each
        batch is appended atomically, as with ``send_batch``. The first
        failure raises (earlier batches stand; later ones were not appended).
        Not retried: a stream may have been partly applied.
        """
        key_columns: Iterator[Sequence[bytes | None] | None] = (
            iter(keys) if keys is not None else itertools.repeat(None)
        )
        requests = (build_request(topic, values, keys=next(key_columns)) for values in batches)
        return self.send_requests(requests)

    def send_requests(self, requests: Iterable[pb.ProduceRequest]) -> Iterator[SendResults]:
        """``send_batches`` for requests built by the caller (e.g. straight from
        Arrow buffers by the Spark writer): pipelined on one ``ProduceStream``.
        In a cluster each request is routed and sent on its own (not pipelined)."""
        if self._cluster is None:
            return stream_requests(self._single(), requests)
        return (self._send(request) for request in requests)

    def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        tag: str = "",
        headers: Headers = (),
        queue_id: int | None = None,
    ) -> Future[SendResult]:
        """Buffer one message; its future completes when its batch is acknowledged."""
        if self._closed.is_set():
            raise RuntimeError("producer is closed")
        future: Future[SendResult] = Future()
        with self._lock:
            pending = self._pending.setdefault(topic, _Pending(since=time.monotonic()))
            pending.values.append(value)
            pending.keys.append(key)
            pending.tags.append(tag)
            pending.headers.append(headers)
            pending.queue_ids.append(-1 if queue_id is None else queue_id)
            pending.futures.append(future)
            pending.nbytes += len(value) + (len(key) if key else 0)
            full = len(pending.values) >= self.batch_size or pending.nbytes >= self.max_batch_bytes
        if full or self.linger_ms == 0:
            self._send_due(lambda _topic, _pending: _topic == topic)
        return future

    def _send_due(self, due: Callable[[str, _Pending], bool]) -> None:
        """Cut the batches ``due`` selects and send them, one at a time.

        Cutting and sending happen under one lock, so batches leave in the
        order they were cut, whichever thread (caller or linger) sends them:
        messages of one topic keep their order on the broker.
        """
        with self._send_lock:
            with self._lock:
                ready = [
                    (t, self._pending.pop(t)) for t, p in list(self._pending.items()) if due(t, p)
                ]
            for topic, pending in ready:
                self._send_pending(topic, pending)

    def _send_pending(self, topic: str, pending: _Pending) -> None:
        try:
            results = self._send(pending.columns().request(topic))
        except Exception as exc:  # every waiting future learns why
            for future in pending.futures:
                future.set_exception(exc)
            return
        for future, result in zip(pending.futures, results, strict=True):
            future.set_result(result)

    def flush(self) -> None:
        """Send everything buffered and wait for the acknowledgements."""
        self._send_due(lambda _topic, _pending: True)

    def _linger(self) -> None:
        interval = self.linger_ms / 1000
        while not self._closed.wait(interval / 2):
            cutoff = time.monotonic() - interval
            self._send_due(functools.partial(_older_than, cutoff))

    def close(self) -> None:
        """Flush, stop the linger thread and close the channel."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._lingerer is not None:
            self._lingerer.join(timeout=self._config.timeout_s)
        self.flush()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._cluster is not None:
            self._cluster.close()
        else:
            self._single().close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
