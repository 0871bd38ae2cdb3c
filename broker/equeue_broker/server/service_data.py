"""The data-plane servicer (``Broker``): produce, pull, streams, commits,
offsets, heartbeats and transactions.

A thin translation between the contract and the store: requests are
validated and routed here (``_route``: explicit queue, key hash or round
robin), the storage calls run through ``BrokerState`` and the replies that
carry records are pre-encoded by wire.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, NamedTuple

import grpc

from equeue_broker.replication.pipelined import confirmed_in_order
from equeue_broker.server.budgets import Held, StalledStream
from equeue_broker.server.config import max_delay_ms
from equeue_broker.server.connections import close_connection
from equeue_broker.server.delayed import append_delayed, cancel, delivery_times
from equeue_broker.server.errors import BadRequest
from equeue_broker.server.filters import Selectors, left_out
from equeue_broker.server.groups import MAX_LOCKS_PER_GROUP
from equeue_broker.server.retry import (
    NackEntry,
    Outcome,
    Retries,
    check_user_name,
    user_group,
)
from equeue_broker.server.service_base import BrokerState, check_group_topic, rpc, rpc_stream
from equeue_broker.server.service_checks import CheckServiceMixin
from equeue_broker.server.stats import staged_bytes
from equeue_broker.server.wire import decode_columns, produce_reply, pull_reply_framer
from equeue_broker.storage import AppendResult, MessageBatch, NotFound, ReadStatus, RecordsResult
from equeue_broker.storage.config import FlushMode
from equeue_broker.storage.errors import AlreadyExists, LimitExceeded
from equeue_broker.storage.meta.names import validate_topic
from equeue_broker.storage.producers.table import Idempotence
from equeue_broker.storage.txn.transactions import CommitResult
from equeue_proto.protocol import consumer_id_problem, key_queue
from equeue_proto.retry_topics import dlq_topic, retry_topic
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

DEFAULT_PULL_MESSAGES = 1000
DEFAULT_PULL_BYTES = 1 << 20
MAX_STREAM_BATCHES = 1_000_000
"""Bound on the replies of one PullStream (each carries at least one record)."""

_PULL_STATUS = {
    ReadStatus.OK: pb.PULL_STATUS_OK,
    ReadStatus.OFFSET_TOO_SMALL: pb.PULL_STATUS_OFFSET_TOO_SMALL,
    ReadStatus.OFFSET_TOO_BIG: pb.PULL_STATUS_OFFSET_TOO_BIG,
}


class BrokerService(CheckServiceMixin, pb_grpc.BrokerServicer):
    def __init__(self, state: BrokerState) -> None:
        self.s = state
        self.pull_framer = pull_reply_framer(state.broker_id, _PULL_STATUS)
        self.selectors = Selectors()
        # A sync-mode append waits for its fsync, so it runs off the event loop.
        self.sync_appends = state.config.storage.flush_mode is FlushMode.SYNC
        config = state.config
        # Nack runs on the thread pool; the name servers are told on the loop.
        loop = asyncio.get_running_loop()

        def created() -> None:
            loop.call_soon_threadsafe(state.topology_changed)

        self.retries = Retries(
            state.store, state.broker_id, config.backoff_steps(), max_delay_ms(config.storage),
            created=created, group_backoff_ms=config.retry_backoff_groups,
            appended=state.counters.appended,
        )  # fmt: skip

    @rpc
    async def Produce(self, request: pb.ProduceRequest, context: Any) -> pb.ProduceReply | bytes:
        return await self._produce_within_budget(request)

    async def _produce_within_budget(self, request: pb.ProduceRequest) -> pb.ProduceReply | bytes:
        if self.s.insync.sync and not request.transaction_id:  # acked once on the replicas
            return await self.s.insync.replicated(functools.partial(self._append, request))
        return await self._append(request)

    async def _append(self, request: pb.ProduceRequest) -> pb.ProduceReply | bytes:
        """Decoding and appending copy the batch: at most ``max_produce_bytes``
        of requests do so at once; the rest wait in turn, briefly, then get
        RESOURCE_EXHAUSTED (and their request is freed)."""
        async with self.s.produce_bytes.hold(request.messages.ByteSize()):
            if self.sync_appends:
                return await self._produce_durable(request)
            reply = self.s.inline(self._produce, request)
        await self.s.waiters.yield_to_woken()  # the woken pulls' replies first (longpoll.py)
        return reply

    async def _produce_durable(self, request: pb.ProduceRequest) -> pb.ProduceReply | bytes:
        """Sync flush: a batch for one queue is decoded on the loop and handed to
        the store's committer thread, the loop free until it is durable; no thread
        of the pool blocked per append, two thread hand-offs fewer (issue 31).
        Delayed, staged and split batches: on the thread pool, as they were."""
        prepared = self.s.inline(self._prepare, request)
        queue_id = prepared.targets
        if prepared.times is not None or request.transaction_id or not isinstance(queue_id, int):
            return await self.s.call(self._write, request, prepared)
        idem = None if prepared.sequences is None else prepared.sequences[queue_id]
        loop = asyncio.get_running_loop()
        durable: asyncio.Future[object] = loop.create_future()

        def then(outcome: object) -> None:  # on the committer thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, durable, outcome)

        store = self.s.store
        result = self.s.inline(
            store.append_then, request.topic, queue_id, prepared.batch, idem, then
        )
        if result is None:
            timeout_s = self.s.config.storage.sync_timeout_ms / 1000
            try:
                async with asyncio.timeout(timeout_s):
                    outcome = await durable
            except TimeoutError:
                raise TimeoutError(f"append not durable after {timeout_s} s") from None
            assert isinstance(outcome, AppendResult)
            result = outcome
        return self._appended(request.topic, queue_id, result)

    @rpc_stream
    async def ProduceStream(
        self,
        requests: AsyncIterator[pb.ProduceRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.ProduceReply | bytes]:
        if self.s.produce_streams >= self.s.config.max_produce_streams:
            raise LimitExceeded(
                f"{self.s.produce_streams} produce streams are open (max_produce_streams);"
                " retry later or use Produce"
            )
        self.s.produce_streams += 1
        try:
            async for reply in self._produce_stream(requests):
                yield reply
        finally:
            self.s.produce_streams -= 1

    async def _produce_stream(
        self, requests: AsyncIterator[pb.ProduceRequest]
    ) -> AsyncIterator[pb.ProduceReply | bytes]:
        requests = _at_most(requests, MAX_STREAM_BATCHES)
        if self.s.insync.sync:  # batches written while earlier ones wait for the replicas
            async for reply in confirmed_in_order(requests, self._produce_confirmed_later):
                yield reply
            return
        async for request in requests:
            yield await self._produce_within_budget(request)

    async def _produce_confirmed_later(
        self, request: pb.ProduceRequest
    ) -> asyncio.Future[pb.ProduceReply | bytes]:
        """Sync replication: the batch written now, its reply's future (pipelined.py)."""
        if not request.transaction_id:  # acked once on the replicas
            return await self.s.insync.begin(functools.partial(self._append, request))
        done: asyncio.Future[pb.ProduceReply | bytes] = asyncio.get_running_loop().create_future()
        done.set_result(await self._append(request))
        return done

    def _produce(self, request: pb.ProduceRequest) -> pb.ProduceReply | bytes:
        """The reply, pre-encoded (wire.py) when the batch went to one queue."""
        return self._write(request, self._prepare(request))

    def _prepare(self, request: pb.ProduceRequest) -> _Prepared:
        """The batch decoded and routed (nothing written yet)."""
        batch = decode_columns(request.messages)
        meta = self._topic_for_produce(request.topic)
        visible = [q.queue_id for q in meta.queues if q.producer_visible]
        if not visible:
            raise BadRequest(f"topic {request.topic!r} has no producer-visible queue")
        one = _one_sequenced_queue(request)
        targets = self._route(request, batch, visible) if one is None else one
        sequences = _sequences(request, targets)
        return _Prepared(batch, targets, sequences, delivery_times(request, len(batch)))

    def _write(self, request: pb.ProduceRequest, prepared: _Prepared) -> pb.ProduceReply | bytes:
        store = self.s.store
        batch, targets, sequences, times = prepared
        count = len(batch)
        if times is not None:
            parts = [
                (queue_id, indexes, batch if indexes is None else _take(batch, indexes))
                for queue_id, indexes in _group_by_queue(targets, count)
            ]
            counted = functools.partial(self._counted, request.topic)
            return append_delayed(
                store, request.topic, parts, times, broker_id=self.s.broker_id, count=count,
                sequences=sequences, counted=counted,
            )  # fmt: skip
        if request.transaction_id:
            return self._stage(request, batch, targets, sequences)
        if isinstance(targets, int):  # the common case: the whole batch went to one queue
            idem = None if sequences is None else sequences[targets]
            result = store.append(request.topic, targets, batch, idem)
            return self._appended(request.topic, targets, result)
        reply = pb.ProduceReply(broker_id=self.s.broker_id)
        queue_ids = [0] * count
        offsets = [0] * count
        positions = [0] * count
        for queue_id, indexes in _group_by_queue(targets, count):
            sub = batch if indexes is None else _take(batch, indexes)
            idem = None if sequences is None else sequences[queue_id]
            result = store.append(request.topic, queue_id, sub, idem)
            if not result.duplicate:
                self.s.counters.add(
                    request.topic, queue_id, produced=result.count, produced_bytes=result.nbytes
                )
            where = range(count) if indexes is None else indexes
            for n, (i, position) in enumerate(zip(where, result.positions(), strict=True)):
                queue_ids[i] = queue_id
                offsets[i] = result.first_offset + n
                positions[i] = position
        reply.queue_ids.extend(queue_ids)
        reply.offsets.extend(offsets)
        reply.positions.extend(positions)
        return reply

    def _appended(self, topic: str, queue_id: int, result: AppendResult) -> bytes:
        """Counted (unless a repeat), and the reply's bytes: a batch for one queue."""
        if not result.duplicate:
            self.s.counters.add(
                topic, queue_id, produced=result.count, produced_bytes=result.nbytes
            )
        return produce_reply(self.s.broker_id, queue_id, result.first_offset, result.entries)

    def _counted(self, topic: str, queue_id: int, count: int, nbytes: int = 0) -> None:
        """Delayed messages appended (delayed.py): ``nbytes`` when it gives them."""
        self.s.counters.add(topic, queue_id, produced=count, produced_bytes=nbytes)

    def _stage(
        self,
        request: pb.ProduceRequest,
        batch: MessageBatch,
        targets: list[int] | int,
        sequences: dict[int, Idempotence] | None,
    ) -> pb.ProduceReply:
        """A produce request with a transaction id: stage, do not append (an
        idempotent one's repeat: not again)."""
        reply = pb.ProduceReply(broker_id=self.s.broker_id)
        count = len(batch)
        parts = [
            (queue_id, batch if indexes is None else _take(batch, indexes))
            for queue_id, indexes in _group_by_queue(targets, count)
        ]
        total = self.s.store.transactions.stage(
            request.transaction_id, request.topic, parts, sequences, request.producer_group
        )
        reply.queue_ids.extend([targets] * count if isinstance(targets, int) else targets)
        reply.transaction_messages = total
        return reply

    @rpc
    async def CommitTransactions(
        self, request: pb.CommitTransactionsRequest, context: Any
    ) -> pb.CommitTransactionsReply:
        refs = [(t.transaction_id, t.expected_messages) for t in request.transactions]
        # Read before: committed transactions are gone (bytes in: stats.py).
        staged = await self.s.call(staged_bytes, self.s.store.transactions, {i for i, _ in refs})

        async def commit() -> CommitResult:
            return await self.s.call(
                self.s.store.transactions.commit,
                refs,
                sink=request.sink,
                batch_id=request.batch_id,
                abort_prefix=request.abort_prefix,
            )

        insync = self.s.insync  # sync replication: acked once on the in-sync replicas
        result = await (insync.replicated(commit) if insync.sync else commit())
        reply = pb.CommitTransactionsReply(
            already_committed=result.already_committed, aborted=result.aborted
        )
        for q in result.queues:
            nbytes = staged.get((q.topic, q.queue_id), 0)
            self.s.counters.add(q.topic, q.queue_id, produced=q.count, produced_bytes=nbytes)
            reply.queues.add(
                topic=q.topic, queue_id=q.queue_id, first_offset=q.first_offset, count=q.count
            )
        return reply

    @rpc
    async def InitProducer(
        self, request: pb.InitProducerRequest, context: Any
    ) -> pb.InitProducerReply:
        producer_id, epoch = self.s.store.init_producer(request.producer_id)
        window = self.s.config.storage.producers.window
        return pb.InitProducerReply(producer_id=producer_id, producer_epoch=epoch, window=window)

    @rpc
    async def AbortTransactions(
        self, request: pb.AbortTransactionsRequest, context: Any
    ) -> pb.AbortTransactionsReply:
        if not request.transaction_ids and not request.prefix:
            raise BadRequest("name transaction_ids or a prefix to abort")
        aborted = await self.s.call(
            self.s.store.transactions.abort, list(request.transaction_ids), request.prefix
        )
        return pb.AbortTransactionsReply(aborted=aborted)

    def _topic_for_produce(self, topic: str) -> Any:
        store = self.s.store
        check_user_name("topic", topic)  # the broker alone writes its % topics
        validate_topic(topic)
        try:
            return store.topic_admin.describe(topic)
        except NotFound:
            if not self.s.config.auto_create_topics:
                raise
        try:
            return store.topic_admin.create_topic(topic)
        except AlreadyExists:  # another request created it meanwhile
            return store.topic_admin.describe(topic)

    def _route(
        self, request: pb.ProduceRequest, batch: MessageBatch, visible: list[int]
    ) -> list[int] | int:
        """The queue of each message, or one queue for all of them.

        Explicit queue id, else the key's queue among the producer-visible
        queues (``key_queue``: Kafka's murmur2 partitioner), else round robin
        by request (keyless messages of one request stay together, as Kafka's
        sticky partitioner keeps a batch).
        """
        count = len(batch)
        explicit = list(request.queue_ids)
        if explicit and len(explicit) != count:
            raise BadRequest(f"queue_ids has {len(explicit)} entries for {count} messages")
        if explicit and len(set(explicit)) == 1 and explicit[0] >= 0:
            return explicit[0]  # one queue named for all: no loop over the messages
        keys = batch.keys
        if not explicit and keys is None:
            return visible[self.s.next_round_robin(request.topic) % len(visible)]
        sticky = visible[self.s.next_round_robin(request.topic) % len(visible)]
        targets = []
        for i in range(count):
            queue_id = explicit[i] if explicit else -1
            if queue_id < -1:
                raise BadRequest(f"queue_ids[{i}] is {queue_id}; use -1 to route by key")
            if queue_id == -1:
                key = keys[i] if keys is not None else None
                queue_id = sticky if key is None else visible[key_queue(key, len(visible))]
            targets.append(queue_id)
        first = targets[0]
        return first if all(t == first for t in targets) else targets

    @rpc
    async def Pull(self, request: pb.PullRequest, context: Any) -> bytes:
        """Replies with PullReply wire bytes built around the records (wire.py).

        The reply's bytes are held in ``max_reply_bytes`` until the call is
        done (sent), so many pulls (or many parked pulls woken by one large
        append) are served in turn instead of each building its reply at once.
        """
        config = self.s.config
        max_messages = request.max_messages or DEFAULT_PULL_MESSAGES
        max_bytes = request.max_bytes or DEFAULT_PULL_BYTES
        if request.max_wait_ms > config.max_wait_ms:
            raise BadRequest(
                f"max_wait_ms {request.max_wait_ms} exceeds the broker's limit {config.max_wait_ms}"
            )
        tags = list(request.tags) or None
        selector = await self.selectors.compiled(request.filter, self.s.call)
        topic, queue_id = request.topic, request.queue_id
        owner_check = self._owner_check(request)
        owner_check()
        read = functools.partial(
            self.s.store.reads.read_records, topic, queue_id, max_messages=max_messages,
            max_bytes=max_bytes, tags=tags, frame=self.pull_framer, selector=selector,
        )  # fmt: skip
        offload = selector is not None  # may inspect many records: off the event loop
        result, held = await self._budgeted_read(read, request.offset, max_bytes, offload)
        filtered = left_out(result, request.offset)
        if (
            result.status is ReadStatus.OK
            and result.count == 0
            and request.max_wait_ms > 0
            and result.next_offset >= result.end
            # A read that skipped records answers at once with its new offset:
            # a parked pull the client cancels (a consumer polling other queues)
            # would lose it, and the next pull would scan the same records again.
            and result.next_offset == request.offset
        ):
            held.release()  # a parked pull holds no budget
            arrived = await self.s.waiters.wait(
                (topic, queue_id),
                result.end,
                request.max_wait_ms / 1000,
                lambda: self.s.store.reads.visible_end(topic, queue_id),
            )
            if arrived:
                owner_check()  # the queue may have changed hands while we waited
                # Woken but no budget in time: answer as a timeout would (empty).
                with contextlib.suppress(LimitExceeded):
                    parked_at = result.next_offset
                    result, held = await self._budgeted_read(read, parked_at, max_bytes, offload)
                    filtered = left_out(result, parked_at)
        # The reply's bytes stay counted until gRPC is done with the call.
        context.add_done_callback(lambda _: held.release())
        # Counted as answered (a pull cancelled while parked never gets here).
        self.s.counters.pulled(topic, queue_id, result.count, filtered, result.nbytes)
        return result.records

    async def _budgeted_read(
        self, read: Callable[..., Any], offset: int, max_bytes: int, offload: bool = False
    ) -> tuple[RecordsResult, Held]:
        """``read(offset)`` within ``max_reply_bytes`` (on the thread pool if
        ``offload``), and the bytes its reply holds there (the caller gives them back)."""
        held = await Held.take(self.s.reply_bytes, max_bytes)
        try:
            if offload:
                result: RecordsResult = await self.s.call(read, offset)
            else:
                result = self.s.inline(read, offset)
        except BaseException:
            held.release()
            raise
        held.shrink_to(len(result.records))
        return result, held

    @rpc_stream
    async def PullStream(
        self, request: pb.PullStreamRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        """Streams PullReply wire bytes, like ``Pull``.

        gRPC resumes this generator only once it has taken the previous reply,
        so an unread stream stops here and reads no more of the log; the reply
        it is stuck on stays counted in the streams' half of ``max_reply_bytes``
        until the client takes it or ``stream_send_timeout_ms`` ends the stream,
        and at most ``max_pull_streams`` streams are open.
        """
        if self.s.pull_streams >= self.s.config.max_pull_streams:
            raise LimitExceeded(f"{self.s.pull_streams} pull streams are open (max_pull_streams)")
        self.s.pull_streams += 1
        try:
            async for reply in self._stream_replies(request, context):
                yield reply
        finally:
            self.s.pull_streams -= 1

    async def _stream_replies(
        self, request: pb.PullStreamRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        store = self.s.store
        budget = self.s.stream_reply_bytes
        batch = request.batch_messages or DEFAULT_PULL_MESSAGES
        # One stuck stream holds at most an eighth of the streams' budget, so a few
        # unread streams slow the others down rather than stop them (a reply
        # carries at most batch_bytes anyway: smaller replies change nothing else),
        # and only until stream_send_timeout_ms ends them.
        share = max(DEFAULT_PULL_BYTES, budget.limit // 8)
        batch_bytes = min(request.batch_bytes or DEFAULT_PULL_BYTES, share)
        selector = await self.selectors.compiled(request.filter, self.s.call)
        read = functools.partial(
            store.reads.read_records, request.topic, request.queue_id,
            max_bytes=batch_bytes, tags=list(request.tags) or None, frame=self.pull_framer,
            selector=selector,
        )  # fmt: skip
        offset = request.offset
        stop = request.end_offset or store.reads.visible_end(request.topic, request.queue_id)
        if stop < 0:  # no such queue: let the read raise the precise error
            read(offset, max_messages=1)
        read = functools.partial(read, until=stop)  # a filtered read scans no further
        stalled = StalledStream(
            context, self.s.config.stream_send_timeout_ms / 1000,
            f"{request.topic}/{request.queue_id}", close_connection,
        )  # fmt: skip
        try:
            for _ in range(MAX_STREAM_BATCHES):
                if offset >= stop:
                    return
                held = await Held.take(budget, batch_bytes)
                try:
                    count = min(batch, stop - offset)
                    if selector is None:
                        result = self.s.inline(read, offset, max_messages=count)
                    else:  # may inspect many records: off the event loop
                        result = await self.s.call(read, offset, max_messages=count)
                    held.shrink_to(len(result.records))
                    stalled.watch(held)
                    yield result.records
                    # Resumed: gRPC took the reply, so it counts (a cancelled stream's does not).
                    self.s.counters.pulled(
                        request.topic,
                        request.queue_id,
                        result.count,
                        left_out(result, offset),
                        result.nbytes,
                    )
                finally:
                    stalled.taken()
                    held.release()  # gRPC took the reply (or the stream is gone)
                if result.status is not ReadStatus.OK or result.next_offset >= result.end:
                    return
                offset = result.next_offset
        finally:
            stalled.stop()  # its timer, if one is pending, has nothing to watch

    @rpc
    async def CommitOffsets(
        self, request: pb.CommitOffsetsRequest, context: Any
    ) -> pb.CommitOffsetsReply:
        entries = [(o.topic, o.queue_id, o.offset) for o in request.offsets]
        if not entries:
            raise BadRequest("offsets must not be empty")
        user_group(request.group)
        self.s.check_group(self.s.scope(context), request.group)
        keys = [(topic, queue_id) for topic, queue_id, _ in entries]
        if request.consumer_id:
            check_consumer_id(request.consumer_id)
            self.s.consumers.check_owner(request.group, request.consumer_id, request.session, keys)
        else:
            self.s.consumers.check_unheld(request.group, keys)

        async def commit() -> None:
            await self.s.call(self.s.store.commit_offsets, request.group, entries)

        insync = self.s.insync  # sync replication: acked once the in-sync replicas applied it
        await (insync.replicated(commit, metadata=True) if insync.sync else commit())
        return pb.CommitOffsetsReply()

    @rpc
    async def FetchOffsets(
        self, request: pb.FetchOffsetsRequest, context: Any
    ) -> pb.FetchOffsetsReply:
        self.s.check_group(self.s.scope(context), request.group)
        committed = await self.s.call(self.s.store.committed_offsets, request.group)
        reply = pb.FetchOffsetsReply()
        for topic in sorted(committed):
            if request.topic and topic != request.topic:
                continue
            for queue_id, offset in sorted(committed[topic].items()):
                reply.offsets.add(topic=topic, queue_id=queue_id, offset=offset)
        return reply

    @rpc
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatReply:
        user_group(request.group)
        check_consumer_id(request.consumer_id)
        limit = self.s.config.max_heartbeat_topics
        if len(request.topics) > limit:
            raise BadRequest(
                f"{len(request.topics)} topics; the limit is {limit} (max_heartbeat_topics)"
            )
        topics = [validate_topic(t) for t in request.topics]
        scope = self.s.scope(context)
        if request.leave:
            self.s.check_group(scope, request.group)
            members = self.s.consumers.leave(request.group, request.consumer_id)
            return pb.HeartbeatReply(consumer_ids=members)
        in_scope: Callable[[str], None] | None = None
        if scope is not None:  # live members' topics are checked under the registry's lock
            in_scope = functools.partial(check_group_topic, scope, request.group)
            for topic in sorted(self.s.store.committed_offsets(request.group)):
                in_scope(topic)
        released = [(r.topic, q) for r in request.released for q in r.queue_ids]
        if len(released) > MAX_LOCKS_PER_GROUP:
            raise BadRequest(f"{len(released)} released queues; the limit is {MAX_LOCKS_PER_GROUP}")
        queues: dict[str, list[int]] = {}
        for topic in topics:
            # An unknown topic is refused, not remembered: a heartbeat naming
            # made-up topics would otherwise make the broker keep them.
            try:
                meta = self.s.store.topic_admin.describe(topic)
            except NotFound:
                raise NotFound(
                    f"topic {topic!r} does not exist (a consumer group subscribes to existing"
                    " topics; create it first)"
                ) from None
            queues[meta.name] = [q.queue_id for q in meta.queues if q.consumer_visible]
        joined = self.s.consumers.heartbeat(
            request.group, request.consumer_id, queues, released, check_topic=in_scope
        )
        reply = pb.HeartbeatReply(consumer_ids=joined.members, session=joined.session)
        for topic in topics:
            reply.topics.add(
                topic=topic,
                queue_ids=queues[topic],
                owned_queue_ids=joined.owned[topic],
                revoked_queue_ids=joined.revoked[topic],
            )
        return reply

    def _owner_check(self, request: pb.PullRequest) -> Callable[[], None]:
        """What a pull must pass before each read: a member's pull needs the
        queue's lock (groups.py); a plain read (no consumer_id) needs nothing."""
        if not request.consumer_id:
            return lambda: None
        user_group(request.group)
        check_consumer_id(request.consumer_id)
        check = self.s.consumers.check_owner
        key = [(request.topic, request.queue_id)]
        return functools.partial(check, request.group, request.consumer_id, request.session, key)

    @rpc
    async def CancelDelayed(
        self, request: pb.CancelDelayedRequest, context: Any
    ) -> pb.CancelDelayedReply:
        scope = self.s.scope(context)
        # A message id does not name its topic: the store checks the topic of
        # the pending record before it cancels anything.
        check = None if scope is None else scope.check_topic
        ids = (self.s.broker_id, self.s.instance_id)

        async def cancel_() -> pb.CancelDelayedReply:
            return await self.s.call(cancel, self.s.store, ids, request.message_id, check)

        insync = self.s.insync  # sync replication: acked once on the in-sync replicas
        return await (insync.replicated(cancel_) if insync.sync else cancel_())

    @rpc
    async def Nack(self, request: pb.NackRequest, context: Any) -> pb.NackReply:
        user_group(request.group)
        scope = self.s.scope(context)
        self.s.check_group(scope, request.group)
        if scope is not None:  # it writes them: the token must cover them (docs/operations.md)
            scope.check_topic(retry_topic(request.group))
            scope.check_topic(dlq_topic(request.group))
        entries = [
            NackEntry(e.topic, e.queue_id, e.offset, e.delay_ms, e.error) for e in request.entries
        ]
        retries = request.max_reconsume_times or self.s.config.max_reconsume_times

        async def nack() -> list[Outcome]:
            return await self.s.call(self.retries.nack, request.group, entries, retries)

        insync = self.s.insync  # sync replication: acked once on the in-sync replicas
        outcomes = await (insync.replicated(nack) if insync.sync else nack())
        reply = pb.NackReply()
        for o in outcomes:
            reply.outcomes.add(
                action=o.action, deliveries=o.deliveries, deliver_at_ms=o.deliver_at_ms,
                message_id=o.message_id,
            )  # fmt: skip
        return reply

    @rpc
    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: Any
    ) -> pb.ListOffsetsReply:
        store = self.s.store
        timestamp = request.timestamp_ms if request.HasField("timestamp_ms") else None

        def list_() -> pb.ListOffsetsReply:
            meta = store.topic_admin.describe(request.topic)
            reply = pb.ListOffsetsReply(incarnation=meta.incarnation)
            for q in meta.queues:
                info = store.topic_admin.queue_info(request.topic, q.queue_id)
                found = -1
                if timestamp is not None:
                    found = store.reads.offset_for_timestamp(request.topic, q.queue_id, timestamp)
                reply.queues.add(
                    queue_id=q.queue_id,
                    earliest_offset=info.earliest,
                    end_offset=info.end,
                    timestamp_offset=found,
                    consumer_visible=q.consumer_visible,
                )
            return reply

        return await self.s.call(list_)

    @rpc
    async def OffsetForBytes(
        self, request: pb.OffsetForBytesRequest, context: Any
    ) -> pb.OffsetForBytesReply:
        end, size = await self.s.call(
            self.s.store.reads.offset_for_bytes,
            request.topic,
            request.queue_id,
            request.start_offset,
            request.end_offset,
            request.max_bytes,
        )
        return pb.OffsetForBytesReply(end_offset=end, bytes=size)


class _Prepared(NamedTuple):
    """A produce request decoded and routed (``BrokerService._prepare``)."""

    batch: MessageBatch
    targets: list[int] | int
    """Each message's queue, or the one queue of all."""
    sequences: dict[int, Idempotence] | None
    times: list[int] | None
    """Delivery times of a delayed batch (delayed.py), else None."""


def _settle(future: asyncio.Future[object], outcome: object) -> None:
    """On the loop: a committed append's outcome (a result or its exception)."""
    if future.done():  # timed out meanwhile
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def check_consumer_id(consumer_id: str) -> None:
    problem = consumer_id_problem(consumer_id)
    if problem is not None:
        raise BadRequest(problem)


def _one_sequenced_queue(request: pb.ProduceRequest) -> int | None:
    """The queue of an idempotent batch for one queue that names it once, in
    its one sequence entry, instead of per message; else None."""
    if request.producer_id and not len(request.queue_ids) and len(request.sequences) == 1:
        return int(request.sequences[0].queue_id)
    return None


def _sequences(
    request: pb.ProduceRequest, targets: list[int] | int
) -> dict[int, Idempotence] | None:
    """Each written queue's ``Idempotence`` of an idempotent request, or None.
    Its messages must name their queues (or its one sequence entry the one
    queue of all), and ``sequences`` each queue once."""
    if not request.producer_id:
        if len(request.sequences):
            raise BadRequest("sequences given without a producer_id; ask InitProducer for one")
        return None
    if _one_sequenced_queue(request) is not None:
        pass
    elif not len(request.queue_ids) or min(request.queue_ids) < 0:
        raise BadRequest(
            "an idempotent request (producer_id set) must name every message's queue in "
            "queue_ids: a retry must reach the same queue"
        )
    given: dict[int, Idempotence] = {}
    for entry in request.sequences:
        if entry.queue_id in given:
            raise BadRequest(f"sequences names queue {entry.queue_id} twice")
        given[entry.queue_id] = Idempotence(
            request.producer_id, request.producer_epoch, entry.sequence
        )
    written = {targets} if isinstance(targets, int) else set(targets)
    if set(given) != written:
        raise BadRequest(
            f"sequences name queues {sorted(given)} but the messages go to queues "
            f"{sorted(written)}: give one sequence per queue written"
        )
    return given


def _group_by_queue(targets: list[int] | int, count: int) -> list[tuple[int, list[int] | None]]:
    """[(queue, message indexes)]; indexes None means every message."""
    if isinstance(targets, int):
        return [(targets, None)]
    groups: dict[int, list[int]] = {}
    for i, queue_id in enumerate(targets):
        groups.setdefault(queue_id, []).append(i)
    return sorted(groups.items())


def _take(batch: MessageBatch, indexes: Sequence[int]) -> MessageBatch:
    def pick(column: Sequence[Any] | None) -> list[Any] | None:
        return None if column is None else [column[i] for i in indexes]

    return MessageBatch(
        [batch.values[i] for i in indexes],
        pick(batch.keys),
        pick(batch.tags),
        pick(batch.headers),
        pick(batch.timestamps_ms),
    )


async def _at_most(
    requests: AsyncIterator[pb.ProduceRequest], limit: int
) -> AsyncIterator[pb.ProduceRequest]:
    count = 0
    async for request in requests:
        count += 1
        if count > limit:
            raise BadRequest(f"more than {limit} requests on one stream")
        yield request
