"""``Producer``: send messages in batches, in column form.

``send_batch`` sends one request now. ``send`` buffers messages per topic and
sends a batch when ``batch_size`` messages or ``max_batch_bytes`` have
accumulated, when ``linger_ms`` has passed since the first buffered message
(a background thread), or on ``flush``/``close``; it returns a
``concurrent.futures.Future`` per message.

Routing happens on the broker: an explicit ``queue_id``, else the key's hash,
else round robin per request. Retries on UNAVAILABLE may duplicate a batch
whose first attempt was applied but not acknowledged: at-least-once.
"""

from __future__ import annotations

import collections
import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import overload

import grpc

from equeue_proto.protocol import format_message_id
from equeue_proto.record import encode_headers
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.connection import ClientConfig, Connection
from equeue_spark.client.errors import BrokerError, from_rpc_error
from equeue_spark.client.transactions import Transaction

Headers = Sequence[tuple[str, bytes]]


@dataclass(slots=True)  # not frozen: a frozen dataclass costs 5x more to build
class SendResult:
    topic: str
    queue_id: int
    offset: int
    position: int
    """Global log position on its broker."""
    broker_id: str

    @property
    def message_id(self) -> str:
        """``<broker_id>-<position>``: fetch it again with ``Admin.get_message``."""
        return format_message_id(self.broker_id, self.position)


class SendResults(Sequence[SendResult]):
    """The acknowledgements of one ``send_batch``, in request order.

    A view over the reply's columns: a ``SendResult`` is built only for the
    items a caller looks at, so acknowledging a batch costs nothing per message.
    """

    __slots__ = ("_broker_id", "_offsets", "_positions", "_queue_ids", "_topic")

    def __init__(self, topic: str, reply: pb.ProduceReply) -> None:
        self._topic = topic
        self._broker_id = reply.broker_id
        self._queue_ids = reply.queue_ids
        self._offsets = reply.offsets
        self._positions = reply.positions

    def __len__(self) -> int:
        return len(self._queue_ids)

    @property
    def topic(self) -> str:
        return self._topic

    @overload
    def __getitem__(self, index: int) -> SendResult: ...
    @overload
    def __getitem__(self, index: slice) -> list[SendResult]: ...
    def __getitem__(self, index: int | slice) -> SendResult | list[SendResult]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        staged = not self._offsets
        return SendResult(
            self._topic,
            self._queue_ids[index],
            -1 if staged else self._offsets[index],
            -1 if staged else self._positions[index],
            self._broker_id,
        )

    @property
    def offsets(self) -> Sequence[int]:
        """Queue offset of each message (no per-message objects); empty for
        staged messages, which get offsets when their transaction commits."""
        return self._offsets

    @property
    def queue_ids(self) -> Sequence[int]:
        """Queue of each message."""
        return self._queue_ids


@dataclass
class _Pending:
    values: list[bytes] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    headers: list[Headers] = field(default_factory=list)
    queue_ids: list[int] = field(default_factory=list)
    futures: list[Future[SendResult]] = field(default_factory=list)
    nbytes: int = 0
    since: float = 0.0


def header_section(headers: Headers | None) -> bytes:
    """One message's headers as a produce request carries them (the record
    format's headers section; no headers at all is empty)."""
    return encode_headers(headers) if headers else b""


def build_request(
    topic: str,
    values: Sequence[bytes],
    *,
    keys: Sequence[bytes | None] | None = None,
    tags: Sequence[str] | None = None,
    headers: Sequence[Headers] | None = None,
    queue_ids: Sequence[int | None] | None = None,
    timestamps_ms: Sequence[int] | None = None,
) -> pb.ProduceRequest:
    """A ProduceRequest in column form (one blob per column, packed lengths)."""
    columns = pb.MessageColumns(count=len(values), values=b"".join(values))
    columns.value_lengths.extend(map(len, values))
    if keys is not None and any(k is not None for k in keys):
        columns.keys = b"".join(k for k in keys if k is not None)
        columns.key_lengths.extend(-1 if k is None else len(k) for k in keys)
    if tags is not None and any(tags):
        columns.tags.extend(tags)
    if headers is not None and any(headers):
        encoded = [header_section(h) for h in headers]
        columns.headers = b"".join(encoded)
        columns.header_lengths.extend(map(len, encoded))
    if timestamps_ms is not None:
        columns.timestamps_ms.extend(timestamps_ms)
    request = pb.ProduceRequest(topic=topic, messages=columns)
    if queue_ids is not None and any(q is not None for q in queue_ids):
        request.queue_ids.extend(-1 if q is None else q for q in queue_ids)
    return request


def _check_acknowledged(request: pb.ProduceRequest, reply: pb.ProduceReply) -> None:
    count = request.messages.count
    located = len(reply.offsets) == len(reply.positions) == count
    if request.transaction_id:  # staged: offsets come at commit
        located = not reply.offsets and not reply.positions
    if len(reply.queue_ids) != count or not located:
        raise BrokerError(f"broker acknowledged {len(reply.queue_ids)} of {count} messages")


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
        timestamps_ms: Sequence[int] | None = None,
        transaction_id: str = "",
    ) -> SendResults:
        """Send ``values`` (and the optional columns) in one request, now.

        With ``transaction_id`` the messages are staged (see ``transaction``),
        and the call is not retried.
        """
        request = build_request(
            topic, values, keys=keys, tags=tags, headers=headers, queue_ids=queue_ids,
            timestamps_ms=timestamps_ms,
        )  # fmt: skip
        request.transaction_id = transaction_id
        reply = self._conn.call(self._conn.broker.Produce, request, retry=not transaction_id)
        _check_acknowledged(request, reply)
        return SendResults(topic, reply)

    def transaction(self, txn_id: str) -> Transaction:
        """A transaction staged through this producer (see transactions.py)."""
        return Transaction(self, txn_id, self._conn)

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
        sent: collections.deque[pb.ProduceRequest] = collections.deque()

        def tracked() -> Iterator[pb.ProduceRequest]:
            for request in requests:
                sent.append(request)
                yield request

        try:
            replies = self._conn.broker.ProduceStream(
                tracked(), timeout=self._conn.config.timeout_s * 10
            )
            for reply in replies:
                request = sent.popleft()
                _check_acknowledged(request, reply)
                yield SendResults(request.topic, reply)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc

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
            results = self.send_batch(
                topic,
                pending.values,
                keys=pending.keys,
                tags=pending.tags,
                headers=pending.headers,
                queue_ids=[None if q < 0 else q for q in pending.queue_ids],
            )
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
