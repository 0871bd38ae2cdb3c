"""``Producer``: send messages in batches, in column form.

``send_batch`` sends one request now. ``send`` buffers messages per topic and
sends a batch when ``batch_size`` messages or ``max_batch_bytes`` have
accumulated, when ``linger_ms`` has passed since the first buffered message
(a background thread), or on ``flush``/``close``; it returns a
``concurrent.futures.Future`` per message.

A message goes to its explicit ``queue_id``, else to its key's queue (Kafka's
murmur2 partitioner, ``equeue_proto.protocol.key_queue``), else a keyless
batch goes whole to one queue, round robin per request.

Idempotent by default (``enable_idempotence``; idempotence.py): each batch
carries the producer id its broker group gave, an epoch and a sequence
number per queue, so a retry of a batch the broker appended but never
acknowledged (a lost reply, a master killed after replicating it, a broken
stream) gets the original offsets and is not appended again. A keyless
batch's queue is then chosen here (round robin per batch): a group whose
master cannot be reached at all is left for the next, but once the batch
may have been appended it stays with its queue and waits for the group's
new master like a keyed one. With
``enable_idempotence=False`` retries on UNAVAILABLE may duplicate a batch:
at-least-once. The first batch to a topic that a single broker creates on
first use goes without sequences (its queues are not known yet).

The producer routes through ``Routes`` (routing.py), for one broker (a
cluster of one group) as for a cluster (``namesrv=``): a topic's queues are
the ordered (broker name, queue id) list of its route, a key goes to
``key_queue(key, len(writable queues))`` of that list, and a batch is split
into one request per broker (each appended atomically on its broker; a batch
spanning brokers is not atomic across them). A keyless batch goes whole to
one broker, round robin; if that broker is unreachable the batch is retried
on the next one. A keyed message stays on its broker group (its key must not
move): when the group's master is unreachable, or the broker it reached is a
replica now, the route is fetched again and the part retried on the group's
new master for up to ``failover_timeout_s`` (``Routes.on_master``), then it
fails with an error naming the group. Each broker's part is retried on its
own: a part once acknowledged is never sent again.

Transaction check-back (checks.py): with ``group`` every staged request names
the producer group, so the broker asks a live producer of the group what
became of a transaction whose commit or rollback is late; with ``checker``
this producer answers such checks, from a thread of its own.
"""

from __future__ import annotations

import collections
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
from equeue_spark.client.cancel import cancel_delayed
from equeue_spark.client.checks import Checker, CheckResponder, group_problem
from equeue_spark.client.cluster import connect
from equeue_spark.client.connection import ClientConfig, Connection
from equeue_spark.client.delays import When, deliver_at_ms, refuse_staged
from equeue_spark.client.errors import (
    BrokerUnavailable,
    DeadlineExceeded,
    EqueueError,
    NotMasterError,
    NotSent,
    OutOfOrderSequenceError,
    UnknownProducerError,
)
from equeue_spark.client.extra_keys import keyed_headers
from equeue_spark.client.idempotence import Init, Sequencer, init_producer
from equeue_spark.client.route import name_broker, split_request
from equeue_spark.client.routing import Brokers, Routed, Routes
from equeue_spark.client.schemas import ProduceChecks, send_one
from equeue_spark.client.transactions import Stage, Transaction

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
STREAM_RESTARTS = 3
"""Times in a row an idempotent stream to one broker is started again after
it broke without acknowledging anything."""
MAX_STREAMS = 10_000
"""Streams one ``send_batches`` call may open in all (a bound, not a budget)."""


def columns_count(request: pb.ProduceRequest) -> int:
    return int(request.messages.count)


def _keyless(request: pb.ProduceRequest) -> bool:
    """No message names a queue or has a key: the batch goes whole to one queue."""
    return not len(request.queue_ids) and all(k < 0 for k in request.messages.key_lengths)


def _whole_to(request: pb.ProduceRequest, queue_id: int) -> pb.ProduceRequest:
    """A keyless ``request`` marked for one queue, in place (the producer's
    own request, or one given to ``send_request(s)``, which it owns from
    then on): no queue id per message, its one sequence entry names the
    queue (broker.proto, "Idempotent produce"), so a batch costs neither a
    loop over its messages nor a copy nor their queue ids on the wire.
    ``Sequencer.stamp`` gives it its sequence."""
    del request.sequences[:]
    request.sequences.add(queue_id=queue_id)
    return request


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
        enable_idempotence: bool = True,
        group: str = "",
        checker: Checker | None = None,
        validate: bool = False,
    ) -> None:
        """``failover_timeout_s`` (cluster only; default: the config's, 30 s):
        how long a batch waits for its broker group's new master.
        ``enable_idempotence``: no batch appended twice by this producer's
        retries (module doc); False: at-least-once, for brokers older than
        InitProducer. ``group``: the producer group its transactions belong
        to (the broker checks late ones with the group); ``checker``:
        ``fn(transaction_id)`` -> "commit" | "rollback" | "unknown", answering
        the broker's checks (checks.py; needs ``group``). ``validate``: check
        values (and keys) against the topic's latest schema and record its
        version in a header (schemas.py, docs/client.md "Schemas")."""
        if batch_size < 1 or max_batch_bytes < 1 or linger_ms < 0:
            raise ValueError("batch_size and max_batch_bytes must be >= 1, linger_ms >= 0")
        if checker is not None and not group:
            raise ValueError("a checker answers for a producer group: give group= too")
        if group and (problem := group_problem(group)) is not None:
            raise ValueError(problem)
        config = config or ClientConfig(broker=broker, namesrv=namesrv)
        if failover_timeout_s is not None:
            config = dataclasses.replace(config, failover_timeout_s=failover_timeout_s)
        self._routes = connect(config)
        self._config = config
        self._round_robin = itertools.count(random.randrange(1 << 16))
        """Which broker group a keyless batch goes to next."""
        self._queue_turns: dict[str, Iterator[int]] = {}
        """Per group, which of its queues a keyless batch takes next: a counter of
        its own (one shared with the groups' turns would, with two groups, give
        each group every other queue only)."""
        self._pool: ThreadPoolExecutor | None = None
        """Sends a keyed batch's per-broker parts at once (made on first use)."""
        self.batch_size = batch_size
        self.max_batch_bytes = max_batch_bytes
        self.linger_ms = linger_ms
        self._lock = threading.Lock()
        """Guards the buffers."""
        self._send_lock = threading.Lock()
        """Held while batches are cut and sent (taken before ``_lock``)."""
        self._pending: dict[str, _Pending] = {}
        self._sequencer = Sequencer() if enable_idempotence else None
        self._closed = threading.Event()
        self.group = group
        self._checks = None if checker is None else CheckResponder(self._routes, group, checker)
        self._schemas = ProduceChecks(self._routes) if validate else None
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
        delay_s: float | Sequence[float] | None = None,
        deliver_at: When | Sequence[When] | None = None,
        extra_keys: Sequence[Sequence[str | bytes] | None] | None = None,
    ) -> SendResults:
        """Send ``values`` (and the optional columns) in one request, now.
        ``extra_keys``: per message, keys beside its key that the broker
        indexes for queries (the ``keys`` header).

        With ``transaction_id`` the messages are staged (see ``transaction``),
        and the call is not retried. In a cluster an explicit queue id needs
        the broker name beside it (``brokers``).

        Delayed delivery (delays.py): ``delay_s`` seconds from now, or
        ``deliver_at`` (an aware ``datetime``, a naive one being UTC, or ms
        since the epoch); one for the batch or a sequence, one per message.
        Nobody reads a delayed message before its time; its result has offset
        -1 (it takes one when delivered), its ``message_id`` (for
        ``cancel_delayed``) and ``deliver_at_ms``. Not with ``transaction_id``.
        """
        due = deliver_at_ms(len(values), delay_s, deliver_at)
        if extra_keys is not None:
            headers = keyed_headers(len(values), headers, extra_keys)
        if self._schemas is not None:  # before the request: a bad value sends nothing
            headers = self._schemas.stamp(topic, values, keys, headers)
        columns = BatchColumns(values, keys, tags, headers, queue_ids, timestamps_ms, due)
        return self._send(columns.request(topic, transaction_id), brokers)

    def cancel_delayed(self, message_id: str) -> pb.CancelDelayedReply:
        """Withdraw a delayed message that is still pending (the id its send
        returned): it is never delivered. ``NotFoundError`` when the id names
        no pending delayed message (unknown, delivered or cancelled already).
        Returns where and when it would have been delivered."""
        return cancel_delayed(self._routes, message_id)

    def transaction(self, txn_id: str, broker: str = "") -> Transaction:
        """A transaction staged through this producer (see transactions.py).

        In a cluster a transaction lives on one broker: name it (``broker``);
        its messages go to that broker's queues."""
        routes = self._routes
        group = routes.group(broker, "in a cluster a transaction lives on one broker: give broker=")
        conn = routes.connection(routes.broker_address(group))
        return Transaction(conn, txn_id, self._staging(group, conn), self.group)

    def send_request(
        self, request: pb.ProduceRequest, brokers: Sequence[str | None] | None = None
    ) -> SendResults:
        """Send a request built by the caller (``build_request``) now; in a
        cluster routed like ``send_batch`` (``brokers``: beside explicit queue ids).
        The producer may set the request's routing and idempotence fields
        (its producer id and sequences): do not send it again elsewhere."""
        return self._send(request, brokers)

    def stage(
        self,
        request: pb.ProduceRequest,
        txn_id: str,
        brokers: Sequence[str | None] | None = None,
        seed: int = 0,
    ) -> dict[str, int]:
        """Stage ``request``'s messages in transaction ``txn_id`` on each
        broker they route to (the same id on each); return the messages
        staged per broker. Keyed messages route by key; keyless ones all go
        to the writable queue ``seed`` picks, so staging the same request
        again with the same seed (a replay) routes it the same way while the
        route is unchanged."""
        request.transaction_id = txn_id
        request.producer_group = self.group
        refuse_staged(request)
        routes = self._routes
        route = routes.route(request.topic)
        writable = route.queues("writable")
        sticky = writable[seed % len(writable)] if writable else ("", 0)
        staged: dict[str, int] = {}
        parts = split_request(request, writable, sticky, brokers, route.only_group())
        for broker, (rows, part) in sorted(parts.items()):
            part.transaction_id = txn_id
            address = route.address(broker)
            try:
                send_request(routes.connection(address), part)
            except EqueueError as exc:
                routes.invalidate(request.topic)
                raise name_broker(exc, broker, address) from exc
            staged[broker] = len(rows)
        return staged

    def cluster(self) -> Routes:
        """The routes and broker connections."""
        return self._routes

    def _send(
        self, request: pb.ProduceRequest, brokers: Sequence[str | None] | None = None
    ) -> SendResults:
        if request.transaction_id:
            request.producer_group = self.group
        if _keyless(request):
            if self._idempotent(request):
                return self._send_keyless(request)
            return self._send_anywhere(request)
        return self._send_routed(request, brokers)

    def _idempotent(self, request: pb.ProduceRequest) -> bool:
        return self._sequencer is not None and not request.transaction_id

    def _send_routed(
        self, request: pb.ProduceRequest, brokers: Sequence[str | None] | None
    ) -> SendResults:
        """Keyed (or explicit) messages: each to its (broker, queue); one request per broker."""
        routes = self._routes
        topic = request.topic
        route = routes.route(topic)
        writable = route.queues("writable")
        sticky = writable[next(self._round_robin) % len(writable)] if writable else ("", 0)
        parts = sorted(
            split_request(request, writable, sticky, brokers, route.only_group()).items()
        )

        def send(broker: str, part: pb.ProduceRequest) -> SendResults:
            try:
                if part.transaction_id:  # a failed staging may have staged: never again
                    return send_request(routes.connection(route.address(broker)), part)
                if self._idempotent(part) and len(part.queue_ids):
                    return self._send_idempotent(broker, part)
                return routes.on_master(
                    topic, broker, lambda conn, retry: send_request(conn, part, retry=retry)
                )
            except EqueueError as exc:
                routes.invalidate(topic)
                raise name_broker(exc, broker, route.entry(broker).address) from exc

        if len(parts) == 1:
            ((broker, (rows, part)),) = parts
            done: list[tuple[Sequence[int], SendResults]] = [(rows, send(broker, part))]
        else:  # the brokers' parts at once: a batch costs one round trip, not one per broker
            futures = [(rows, self._fan_out().submit(send, b, part)) for b, (rows, part) in parts]
            wait([f for _, f in futures])
            done = [(rows, f.result()) for rows, f in futures]  # the first error, by broker name
        if self._idempotent(request) and not writable:
            routes.invalidate(topic)  # a topic the broker just created: its queues next time
        count = columns_count(request)
        if len(done) == 1 and list(done[0][0]) == list(range(count)):
            return done[0][1]
        return SendResults.merged(topic, columns_count(request), done)

    def _send_idempotent(self, broker: str, part: pb.ProduceRequest) -> SendResults:
        """Send a part (explicit queue ids) to its group's master, stamped."""
        routes = self._routes
        deadline = self._deadline()  # one wait for the part: its InitProducer and its send

        def send() -> SendResults:
            return routes.on_master(
                part.topic,
                broker,
                lambda conn, retry: send_request(conn, part, retry=retry),
                deadline,
            )

        return self._stamped(broker, part, send, deadline=deadline)

    def _deadline(self) -> float:
        """When a part stops waiting for its group's master (``Routes.on_master``)."""
        return time.monotonic() + self._config.failover_timeout_s

    def _send_keyless(self, request: pb.ProduceRequest) -> SendResults:
        """An idempotent keyless batch: whole to one queue of a group chosen
        round robin (``Routes.on_some``), stamped for it. A group whose master
        the first attempt cannot reach (nothing sent) is left for the next;
        once the batch may have been appended, it stays with its group and
        waits for its master like a keyed one."""
        routes = self._routes
        topic = request.topic

        def call(broker: str, conn: Connection) -> SendResults:
            writable = [q for q in routes.route(topic).queues("writable") if q[0] == broker]
            if not writable:  # a topic one broker creates now: its queues next time
                routes.invalidate(topic)
                return send_request(conn, request)
            part = _whole_to(request, writable[self._queue_turn(broker) % len(writable)][1])
            first = [True]

            def send() -> SendResults:
                if first[0]:
                    first[0] = False
                    try:
                        return send_request(conn, part, retry=False)
                    except NotMasterError as exc:  # a replica refused it: not appended
                        raise NotSent(str(exc), exc.code) from exc
                    except NotSent:
                        raise
                    except (BrokerUnavailable, DeadlineExceeded):
                        pass  # it may have been appended: its group's master only
                return routes.on_master(
                    topic,
                    broker,
                    lambda c, retry: send_request(c, part, retry=retry),
                    self._deadline(),
                )

            return self._stamped(broker, part, send, self._init_on(conn))

        return routes.on_some(topic, next(self._round_robin), call)

    def _queue_turn(self, broker: str) -> int:
        with self._lock:
            turns = self._queue_turns.get(broker)
            if turns is None:
                turns = self._queue_turns[broker] = itertools.count(random.randrange(1 << 16))
            return next(turns)

    @staticmethod
    def _init_on(conn: Connection) -> Init:
        """``InitProducer`` on ``conn``, once: it appends nothing, so any
        failure to reach the group leaves the batch free to go elsewhere."""

        def call(request: pb.InitProducerRequest) -> pb.InitProducerReply:
            try:
                reply: pb.InitProducerReply = conn.call(
                    conn.broker.InitProducer, request, retry=False
                )
            except (BrokerUnavailable, DeadlineExceeded, NotMasterError) as exc:
                raise NotSent(str(exc), exc.code) from exc
            return reply

        return init_producer(call)

    def _stamped(
        self, broker: str, part: pb.ProduceRequest, send: Callable[[], SendResults],
        init: Init | None = None, deadline: float | None = None,
    ) -> SendResults:  # fmt: skip
        """``send`` a part stamped for ``broker``'s group (idempotence.py): its
        retries repeat the same sequences; sent once more under a new epoch if
        the broker lost the producer's state or misses an earlier batch."""
        sequencer = self._sequencer
        assert sequencer is not None
        with sequencer.lock(broker):
            for attempt in range(2):
                sequencer.stamp(broker, part, init or self._init(part.topic, broker, deadline))
                try:
                    return send()
                except (OutOfOrderSequenceError, UnknownProducerError):
                    sequencer.reset(broker)  # nothing of this batch was appended
                    if attempt:
                        raise
                except NotSent:
                    sequencer.unstamp(broker, part)  # another group may take it
                    raise
                except BaseException:
                    sequencer.reset(broker)  # its sequence may or may not be taken
                    raise
        raise AssertionError("unreachable")

    def _staging(self, broker: str, conn: Connection) -> Stage | None:
        """How a ``Transaction`` on ``broker``'s group stages a request: its
        queues chosen over the group's queues, stamped, sent with retries."""
        if self._sequencer is None:
            return None
        routes = self._routes

        def stage(request: pb.ProduceRequest) -> SendResults:
            route = routes.route(request.topic)
            writable = [q for q in route.queues("writable") if q[0] == broker]
            sticky = writable[next(self._round_robin) % len(writable)] if writable else ("", 0)
            ((_, (_, part)),) = split_request(request, writable, sticky, None, broker).items()
            if not len(part.queue_ids):  # a topic the broker creates now
                routes.invalidate(request.topic)
                return send_request(conn, part)
            return self._stamped(broker, part, lambda: send_request(conn, part))

        return stage

    def _init(self, topic: str, broker: str, deadline: float | None = None) -> Init:
        """``InitProducer`` on ``broker``'s master (waiting for one like a batch,
        until ``deadline``: the batch's own)."""
        routes = self._routes

        def call(request: pb.InitProducerRequest) -> pb.InitProducerReply:
            def on(conn: Connection, retry: bool) -> pb.InitProducerReply:
                reply: pb.InitProducerReply = conn.call(
                    conn.broker.InitProducer, request, retry=retry
                )
                return reply

            return routes.on_master(topic, broker, on, deadline)

        return init_producer(call)

    def producer_identity(self, broker: str = "") -> tuple[int, int]:
        """(producer id, epoch) this producer uses with ``broker``'s group
        (``""``: one broker); (0, 0) before its first idempotent batch there."""
        return self._sequencer.identity(broker) if self._sequencer else (0, 0)

    def _fan_out(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(MAX_FAN_OUT, thread_name_prefix="equeue-produce")
            return self._pool

    def _send_anywhere(self, request: pb.ProduceRequest) -> SendResults:
        """A keyless batch: whole to one broker group, round robin
        (``Routes.on_any``); a staged one is never sent twice."""
        staged = bool(request.transaction_id)
        _, results = self._routes.on_any(
            request.topic,
            next(self._round_robin),
            lambda conn, retry: send_request(conn, request, retry=retry),
            again=not staged,
        )
        return results

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
        return self.send_routed((r, None) for r in requests)

    def send_routed(self, requests: Iterable[Routed]) -> Iterator[SendResults]:
        """``send_requests`` of (request, the broker group of each explicit queue
        id, or None) pairs (the Spark writer's queue and broker columns).
        Where the routes pipeline them on one stream (one broker), an
        idempotent producer stamps each as it leaves (``_stream_idempotent``)."""
        stamping = self._stream_idempotent if self._sequencer is not None else None
        return self._routes.send_requests(requests, self._send, stamping)

    def _stream_idempotent(
        self, conn: Connection, requests: Iterable[Routed]
    ) -> Iterator[SendResults]:
        """The requests pipelined on a ``ProduceStream`` on ``conn``, the one
        broker's (``Routes.send_requests``' ``pipeline``), each given its queues
        and sequences as it leaves, at most the broker's window of them
        unacknowledged. When the stream breaks, what it did not acknowledge is
        sent again, with the next request if there is one (in order, each with
        the connection's retries: the broker answers those it has with their
        offsets), then a new stream carries on (given up after
        ``STREAM_RESTARTS`` streams in a row broke without an acknowledgement).
        A stream that breaks after its last acknowledgement has done its work."""
        sequencer = self._sequencer
        assert sequencer is not None
        sent: collections.deque[pb.ProduceRequest] = collections.deque()
        pull = threading.Lock()
        """Taking from ``requests`` (your code runs under it, never the acks')."""
        acks = threading.Condition()
        """Notified at each acknowledgement, and when a stream breaks."""
        turn = [0]
        source = iter(requests)
        patience = self._config.timeout_s * 4

        def room(mine: int) -> None:
            """Wait until fewer than the window are unacknowledged (bounded:
            the stream's own deadline ends a stream that stalls)."""
            deadline = time.monotonic() + patience
            with acks:
                while len(sent) >= sequencer.window("") and turn[0] == mine:
                    if not acks.wait(max(0.0, deadline - time.monotonic())):
                        return

        def take_next() -> bool:
            """Take the next request, stamped, into ``sent`` (``pull`` held);
            False when there is none."""
            try:
                request, brokers = next(source)
            except StopIteration:
                return False
            sent.append(self._one_group_part(request, brokers))
            return True

        def stamped(mine: int) -> Iterator[pb.ProduceRequest]:
            while True:
                room(mine)
                with pull:  # a broken stream's sender stops here; none is lost
                    if turn[0] != mine or not take_next():
                        return
                    part = sent[-1]
                yield part

        acked = [0]

        def acknowledged(results: SendResults) -> SendResults:
            with acks:
                acked[0] += 1
                acks.notify_all()
            return results

        failures = 0
        with sequencer.lock(""):
            for attempt in range(MAX_STREAMS):
                acked_before = acked[0]
                try:
                    stream = stream_requests(conn, stamped(attempt), sent)
                    yield from map(acknowledged, stream)
                    return
                except (BrokerUnavailable, DeadlineExceeded):
                    with acks:
                        turn[0] += 1
                        acks.notify_all()
                    failures = 0 if acked[0] > acked_before else failures + 1
                    if failures > STREAM_RESTARTS or attempt == MAX_STREAMS - 1:
                        sequencer.reset("")
                        raise
                try:
                    with pull:
                        more = take_next()
                    if not sent and not more:
                        return  # every request was acknowledged before the break
                    while sent:  # in order, each with the connection's retries
                        yield send_request(conn, sent[0])
                        sent.popleft()
                except BaseException:
                    sequencer.reset("")
                    raise

    def _one_group_part(self, request: pb.ProduceRequest, brokers: Brokers) -> pb.ProduceRequest:
        """``request`` for one broker, every message's queue chosen and the
        batch stamped (``Sequencer.lock("")`` held)."""
        sequencer = self._sequencer
        assert sequencer is not None
        if request.transaction_id:
            return request
        route = self._routes.route(request.topic)
        writable = route.queues("writable")
        if not writable:
            self._routes.invalidate(request.topic)
        sticky = writable[next(self._round_robin) % len(writable)] if writable else ("", 0)
        if writable and _keyless(request):
            part = _whole_to(request, sticky[1])
        else:
            ((_, (_, part)),) = split_request(request, writable, sticky, brokers, "").items()
        if len(part.queue_ids) or len(part.sequences):
            sequencer.stamp("", part, self._init(request.topic, ""))
        return part

    def stage_requests(
        self, requests: Iterable[Routed], txn_id: str, seed: int = 0
    ) -> Iterator[dict[str, int]]:
        """``stage`` many (request, brokers) pairs in transaction ``txn_id``;
        yields the messages staged per broker group of each (pipelined on one
        stream for one broker). On an error the transaction is aborted where
        it staged messages (best effort) and the error raised."""

        def stage(request: pb.ProduceRequest, brokers: Brokers) -> dict[str, int]:
            return self.stage(request, txn_id, brokers, seed)

        return self._routes.stage_requests(requests, txn_id, stage)

    def send(
        self,
        topic: str,
        value: bytes | object,
        *,
        key: bytes | object | None = None,
        tag: str = "",
        headers: Headers = (),
        queue_id: int | None = None,
        extra_keys: Sequence[str | bytes] | None = None,
    ) -> Future[SendResult]:
        """Buffer one message; its future completes when its batch is acknowledged.
        ``extra_keys``: keys beside ``key`` that the broker indexes (the ``keys`` header).
        With ``validate``, a value (key) that is not bytes is encoded with the latest schema."""
        if self._closed.is_set():
            raise RuntimeError("producer is closed")
        value, key, headers = send_one(self._schemas, topic, value, key, headers)
        if extra_keys is not None:
            headers = keyed_headers(1, [headers], [extra_keys])[0]
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
        if self._checks is not None:
            self._checks.close()
        if self._lingerer is not None:
            self._lingerer.join(timeout=self._config.timeout_s)
        self.flush()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._routes.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
