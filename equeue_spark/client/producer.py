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
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
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
from equeue_spark.client.connection import ClientConfig, Connection
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
        config: ClientConfig | None = None,
        batch_size: int = 1000,
        max_batch_bytes: int = 16 << 20,
        linger_ms: int = 0,
    ) -> None:
        if batch_size < 1 or max_batch_bytes < 1 or linger_ms < 0:
            raise ValueError("batch_size and max_batch_bytes must be >= 1, linger_ms >= 0")
        self._conn = Connection(config or ClientConfig(broker=broker))
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
    ) -> SendResults:
        """Send ``values`` (and the optional columns) in one request, now.

        With ``transaction_id`` the messages are staged (see ``transaction``),
        and the call is not retried.
        """
        columns = BatchColumns(values, keys, tags, headers, queue_ids, timestamps_ms)
        return send_request(self._conn, columns.request(topic, transaction_id))

    def transaction(self, txn_id: str) -> Transaction:
        """A transaction staged through this producer (see transactions.py)."""
        return Transaction(self._conn, txn_id)

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
        Arrow buffers by the Spark writer): pipelined on one ``ProduceStream``."""
        return stream_requests(self._conn, requests)

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
            results = send_request(self._conn, pending.columns().request(topic))
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
            self._lingerer.join(timeout=self._conn.config.timeout_s)
        self.flush()
        self._conn.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
