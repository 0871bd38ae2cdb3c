"""A batch of messages on the wire: its columns, its ProduceRequest, its acknowledgements.

``Producer`` and ``Transaction`` both send batches; this module is what they
share, so neither imports the other for it (producer.py imports
transactions.py, never the reverse):

* ``BatchColumns``: one batch's message columns, the one home of the optional
  column keywords (``keys``, ``tags``, ``headers``, ``queue_ids``,
  ``timestamps_ms``); ``build_request`` makes a ``ProduceRequest`` of them.
* ``send_request`` / ``stream_requests``: one request on a ``Produce`` call,
  or many pipelined on one ``ProduceStream``, checked against their replies.
* ``SendResult`` / ``SendResults``: the acknowledgements.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import grpc

from equeue_proto.accel import CODEC
from equeue_proto.protocol import BROKER_TIME, format_message_id
from equeue_proto.record import encode_headers
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.wire import varint
from equeue_spark.client.connection import Connection
from equeue_spark.client.delays import refuse_staged
from equeue_spark.client.errors import BrokerError, from_rpc_error

Headers = Sequence[tuple[str, bytes]]

_VARINTS = CODEC.varints if CODEC is not None else None
"""Packs lengths as varints in C (``encoded_request``); None: protobuf's setters."""

STREAM_TIMEOUT_FACTOR = 10
"""A ``ProduceStream`` carries many batches: it gets this many call deadlines."""


@dataclass(slots=True)  # not frozen: a frozen dataclass costs 5x more to build
class SendResult:
    topic: str
    queue_id: int
    offset: int
    position: int
    """Global log position on its broker."""
    broker_id: str
    deliver_at_ms: int = 0
    """A delayed message: when it is due (ms since the epoch); its ``offset``
    is -1 until then (it takes one when delivered). 0: not delayed."""

    @property
    def message_id(self) -> str:
        """``<broker_id>-<position>``: fetch it again with ``Admin.get_message``."""
        return format_message_id(self.broker_id, self.position)


class SendResults(Sequence[SendResult]):
    """The acknowledgements of one ``send_batch``, in request order.

    A view over the reply's columns: a ``SendResult`` is built only for the
    items a caller looks at, so acknowledging a batch costs nothing per message.
    """

    __slots__ = (
        "_broker_id", "_broker_ids", "_deliver_at", "_offsets", "_positions", "_queue_ids",
        "_topic",
    )  # fmt: skip

    def __init__(self, topic: str, reply: pb.ProduceReply) -> None:
        self._topic = topic
        self._broker_id = reply.broker_id
        self._broker_ids: Sequence[str] | None = None
        """Per message, when the batch went to several brokers (``merged``)."""
        self._queue_ids: Sequence[int] = reply.queue_ids
        self._offsets: Sequence[int] = reply.offsets
        self._positions: Sequence[int] = reply.positions
        self._deliver_at: Sequence[int] = reply.deliver_at_ms
        """Delayed messages: one due time per message (or one for all); else empty."""

    @classmethod
    def merged(
        cls, topic: str, count: int, parts: Sequence[tuple[Sequence[int], SendResults]]
    ) -> SendResults:
        """One batch's results from the parts sent to several brokers:
        ``parts`` = [(the batch's row indexes of the part, its results)]."""
        out = cls(topic, pb.ProduceReply())
        broker_ids = [""] * count
        queue_ids = [0] * count
        offsets = [-1] * count
        positions = [-1] * count
        deliver_at = [0] * count
        staged = delayed = False
        for rows, results in parts:
            staged = staged or not results.offsets
            delayed = delayed or bool(results._deliver_at)
            for j, i in enumerate(rows):
                broker_ids[i] = results.broker_of(j)
                queue_ids[i] = results.queue_ids[j]
                deliver_at[i] = results.deliver_at_of(j)
                if results.offsets:
                    offsets[i] = results.offsets[j]
                    positions[i] = results._positions[j]
        out._deliver_at = deliver_at if delayed else []
        out._broker_ids = broker_ids
        out._queue_ids = queue_ids
        out._offsets = [] if staged else offsets
        out._positions = [] if staged else positions
        return out

    def broker_of(self, index: int) -> str:
        """The id (in a cluster: the name) of the broker that took message ``index``."""
        return self._broker_id if self._broker_ids is None else self._broker_ids[index]

    def deliver_at_of(self, index: int) -> int:
        """When delayed message ``index`` is due (ms since the epoch); 0 if not delayed."""
        due = self._deliver_at
        return 0 if not due else due[index] if len(due) > 1 else due[0]

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
            self.broker_of(index),
            self.deliver_at_of(index),
        )

    @property
    def offsets(self) -> Sequence[int]:
        """Queue offset of each message (no per-message objects); empty for
        staged messages, which get offsets when their transaction commits;
        -1 for delayed ones, which get theirs when they are delivered."""
        return self._offsets

    @property
    def delayed(self) -> bool:
        """Whether the messages were sent for later delivery (``deliver_at_of``)."""
        return bool(self._deliver_at)

    @property
    def queue_ids(self) -> Sequence[int]:
        """Queue of each message."""
        return self._queue_ids


def header_section(headers: Headers | None) -> bytes:
    """One message's headers as a produce request carries them (the record
    format's headers section; no headers at all is empty)."""
    return encode_headers(headers) if headers else b""


# Frozen: built once per batch (not per message), and never changed after.
@dataclass(frozen=True, slots=True)
class BatchColumns:
    """One batch's messages in column form: ``values`` and the optional columns,
    each None or one item per value (a None key, queue id or timestamp: none
    for that message; a message without a timestamp gets the broker's store time).

    The fields are in the order of ``send_batch``'s keywords, so the public
    signatures that take them hand them over in one positional call.
    """

    values: Sequence[bytes]
    keys: Sequence[bytes | None] | None = None
    tags: Sequence[str] | None = None
    headers: Sequence[Headers] | None = None
    queue_ids: Sequence[int | None] | None = None
    timestamps_ms: Sequence[int | None] | None = None
    deliver_at_ms: Sequence[int] = ()
    """``ProduceRequest.deliver_at_ms`` (delays.py): empty = now, one = the
    batch's, else one per message."""

    def request(self, topic: str, transaction_id: str = "") -> pb.ProduceRequest:
        """A ProduceRequest in column form (one blob per column, packed lengths)."""
        values, keys, headers, queue_ids = self.values, self.keys, self.headers, self.queue_ids
        if keys is not None and not any(k is not None for k in keys):
            keys = None
        request = encoded_request(topic, values, keys)
        columns = request.messages
        if self.tags is not None and any(self.tags):
            columns.tags.extend(self.tags)
        if headers is not None and any(headers):
            encoded = [header_section(h) for h in headers]
            columns.headers = b"".join(encoded)
            columns.header_lengths.extend(map(len, encoded))
        if self.timestamps_ms is not None:
            columns.timestamps_ms.extend(
                BROKER_TIME if t is None else t for t in self.timestamps_ms
            )
        if queue_ids is not None and any(q is not None for q in queue_ids):
            request.queue_ids.extend(-1 if q is None else q for q in queue_ids)
        request.transaction_id = transaction_id
        request.deliver_at_ms.extend(self.deliver_at_ms)
        refuse_staged(request)
        return request


def encoded_request(
    topic: str, values: Sequence[bytes], keys: Sequence[bytes | None] | None
) -> pb.ProduceRequest:
    """A ProduceRequest of ``topic`` with ``values`` (and ``keys``, None: no
    keys at all) as its columns: written as wire bytes and parsed once.

    Why by hand: protobuf copies a blob into each message it is set on (the
    columns, then the request) and extends a packed field one Python int at
    a time; here the values are joined straight into the request's bytes
    (one copy, plus protobuf's parse) and the lengths packed in C.
    ``fill_columns`` is the reference (the pure-Python path, and the test).
    """
    if _VARINTS is None or not isinstance(topic, str):
        return fill_columns(topic, values, keys)
    try:
        return _encode(topic, values, keys)
    except (TypeError, ValueError):  # not bytes: protobuf's setters raise their own errors
        return fill_columns(topic, values, keys)


def _encode(
    topic: str, values: Sequence[bytes], keys: Sequence[bytes | None] | None
) -> pb.ProduceRequest:
    lengths = list(map(len, values))
    total = sum(lengths)
    head = b"\x08" + varint(len(values)) + b"\x12" + varint(total)
    tail = _packed(b"\x1a", lengths)
    key_parts: list[bytes] = []
    if keys is not None:
        present = [k for k in keys if k is not None]
        if len(present) == len(keys):
            zigzag = [n << 1 for n in map(len, present)]  # sint32: n >= 0 is 2n
        else:
            zigzag = [1 if k is None else len(k) << 1 for k in keys]  # -1 (no key) is 1
        key_parts = [b"\x22", varint(sum(map(len, present))), *present]
        tail += b"".join(key_parts) + _packed(b"\x2a", zigzag)
    name = topic.encode()
    size = len(head) + total + len(tail)
    start = b"\x0a" + varint(len(name)) + name + b"\x12" + varint(size) + head
    return pb.ProduceRequest.FromString(b"".join([start, *values, tail]))


def _packed(field_key: bytes, numbers: list[int]) -> bytes:
    """A packed repeated field of non-negative ``numbers`` (empty: left out)."""
    if not numbers:
        return b""
    assert _VARINTS is not None
    payload: bytes = _VARINTS(struct.pack(f"<{len(numbers)}q", *numbers), len(numbers), 1, 0, 0)
    return field_key + varint(len(payload)) + payload


def fill_columns(
    topic: str, values: Sequence[bytes], keys: Sequence[bytes | None] | None
) -> pb.ProduceRequest:
    """``encoded_request`` through protobuf's own setters."""
    columns = pb.MessageColumns(count=len(values), values=b"".join(values))
    columns.value_lengths.extend(map(len, values))
    if keys is not None:
        columns.keys = b"".join(k for k in keys if k is not None)
        columns.key_lengths.extend(-1 if k is None else len(k) for k in keys)
    return pb.ProduceRequest(topic=topic, messages=columns)


def build_request(
    topic: str,
    values: Sequence[bytes],
    *,
    keys: Sequence[bytes | None] | None = None,
    tags: Sequence[str] | None = None,
    headers: Sequence[Headers] | None = None,
    queue_ids: Sequence[int | None] | None = None,
    timestamps_ms: Sequence[int | None] | None = None,
) -> pb.ProduceRequest:
    """A ProduceRequest in column form (one blob per column, packed lengths)."""
    columns = BatchColumns(values, keys, tags, headers, queue_ids, timestamps_ms)
    return columns.request(topic)


def send_request(conn: Connection, request: pb.ProduceRequest, retry: bool = True) -> SendResults:
    """Send one request on a ``Produce`` call and check its acknowledgement.

    A staged request (``transaction_id`` set) is not retried unless it is
    idempotent (``producer_id`` set): a failed attempt may or may not have
    been staged, and staging it twice would double it.
    ``retry=False``: one attempt (a cluster producer retries on another broker).
    """
    once = bool(request.transaction_id) and not request.producer_id
    reply = conn.call(conn.broker.Produce, request, retry=retry and not once)
    _check_acknowledged(request, reply)
    return SendResults(request.topic, reply)


def stream_requests(
    conn: Connection,
    requests: Iterable[pb.ProduceRequest],
    sent: collections.deque[pb.ProduceRequest] | None = None,
) -> Iterator[SendResults]:
    """Send ``requests`` pipelined on one ``ProduceStream`` call; yield each
    one's acknowledgements in order. Not retried: a stream may have been partly
    applied (an idempotent producer resends what was not acknowledged,
    producer.py).

    ``sent``: the requests taken from ``requests`` and not acknowledged yet;
    when given, ``requests`` appends each one to it as it is taken (so that a
    caller sees every request taken, even one taken as the stream broke).

    An exception raised while producing ``requests`` (a bad row in a batch
    being built) is re-raised here as itself, after the requests already sent
    are acknowledged: gRPC runs the iterator on its own thread and would only
    report ``Exception iterating requests! (UNKNOWN)``.
    """
    track = sent is None
    unacknowledged: collections.deque[pb.ProduceRequest] = (
        collections.deque() if sent is None else sent
    )
    failure: list[Exception] = []

    def tracked() -> Iterator[pb.ProduceRequest]:
        try:
            for request in requests:
                if track:
                    unacknowledged.append(request)
                yield request
        except Exception as exc:  # kept for the caller; the stream just ends here
            failure.append(exc)

    try:
        replies = conn.broker.ProduceStream(
            tracked(), timeout=conn.config.timeout_s * STREAM_TIMEOUT_FACTOR
        )
        for reply in replies:
            request = unacknowledged.popleft()
            _check_acknowledged(request, reply)
            yield SendResults(request.topic, reply)
    except grpc.RpcError as exc:
        if failure:  # the stream failed because its requests did: that is the cause
            raise failure[0] from exc
        raise from_rpc_error(exc) from exc
    if failure:
        raise failure[0]


def _check_acknowledged(request: pb.ProduceRequest, reply: pb.ProduceReply) -> None:
    """Raise ``BrokerError`` unless ``reply`` accounts for every message of ``request``."""
    count = request.messages.count
    located = len(reply.offsets) == len(reply.positions) == count
    if request.transaction_id:  # staged: offsets come at commit
        located = not reply.offsets and not reply.positions
    if len(reply.queue_ids) != count or not located:
        raise BrokerError(f"broker acknowledged {len(reply.queue_ids)} of {count} messages")
