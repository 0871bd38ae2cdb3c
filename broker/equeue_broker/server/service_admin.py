"""The administration servicer (``Admin``): topics, queues, groups, offsets
resets, single messages, statistics and open transactions; the schema calls
are service_schemas.py's (mixed in).

Every handler runs its storage work on the thread pool (``BrokerState.call``):
these calls walk topics and queues and are not latency-critical.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from typing import Any

from equeue_broker.replication.failover import ZOOKEEPER
from equeue_broker.replication.role import MASTER, REPLICA
from equeue_broker.server.auth import Principal
from equeue_broker.server.dead_letters import DeadLetters, Resent
from equeue_broker.server.disk_usage import filesystem
from equeue_broker.server.errors import BadRequest, DamagedMessage, PermissionDenied
from equeue_broker.server.group_view import group_queues
from equeue_broker.server.retry import check_reshape, check_user_name, group_topics, user_group
from equeue_broker.server.service_base import BrokerState, rpc
from equeue_broker.server.service_schemas import SchemaServiceMixin
from equeue_broker.server.stats import fill_stats
from equeue_broker.storage import NotFound, Store
from equeue_broker.storage.errors import PreconditionFailed
from equeue_broker.storage.keys.query import DEFAULT_LIMIT, MAX_LIMIT, NO_END
from equeue_broker.storage.meta.names import validate_group
from equeue_proto.protocol import format_message_id, parse_message_id
from equeue_proto.record import check_frame, read_meta
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

log = logging.getLogger("equeue.broker")


class AdminService(SchemaServiceMixin, pb_grpc.AdminServicer):
    def __init__(self, state: BrokerState) -> None:
        self.s = state
        ids = (state.broker_id, state.instance_id)
        # Resends run on the thread pool; the name servers are told on the loop.
        loop = asyncio.get_running_loop()

        def created() -> None:
            loop.call_soon_threadsafe(state.topology_changed)

        self.dead_letters = DeadLetters(state.store, ids, created, state.counters.appended)
        if state.registrar is not None:  # registrations carry the fetch port once it listens
            state.registrar.fetch_address = lambda: state.fetch_address

    def _topic_info(self, name: str) -> pb.TopicInfo:
        store = self.s.store
        meta = store.topic_admin.describe(name)
        pending, next_due = store.delayed_summary(name)
        info = pb.TopicInfo(
            name=name, created_ms=meta.created_ms, incarnation=meta.incarnation,
            delayed_pending=pending, delayed_next_due_ms=next_due or 0,
        )  # fmt: skip
        for q in meta.queues:
            queue = store.topic_admin.queue_info(name, q.queue_id)
            low = store.min_committed(name, q.queue_id)
            info.queues.add(
                queue_id=q.queue_id,
                earliest_offset=queue.earliest,
                end_offset=queue.end,
                min_committed_offset=-1 if low is None else low,
                backlog=queue.end - (queue.earliest if low is None else max(low, queue.earliest)),
                producer_visible=q.producer_visible,
                consumer_visible=q.consumer_visible,
            )
        return info

    @rpc
    async def CreateTopic(self, request: pb.CreateTopicRequest, context: Any) -> pb.TopicInfo:
        check_user_name("topic", request.name)

        def create() -> pb.TopicInfo:
            meta = self.s.store.topic_admin.create_topic(request.name, request.queue_count or None)
            log.info("topic created", extra={"topic": meta.name, "queues": len(meta.queues)})
            return self._topic_info(request.name)

        try:
            return await self.s.call(create)
        finally:
            self.s.topology_changed()

    @rpc
    async def DeleteTopic(
        self, request: pb.DeleteTopicRequest, context: Any
    ) -> pb.DeleteTopicReply:
        check_reshape(request.name, "deleted on its own")
        try:
            await self.s.call(self.s.store.topic_admin.delete_topic, request.name)
        finally:
            self.s.topology_changed()
        self.s.counters.forget(request.name)
        log.info("topic deleted", extra={"topic": request.name})
        return pb.DeleteTopicReply()

    def _visible_topics(self, scope: Principal | None) -> list[str]:
        """The topics a token may see: a topic-scoped admin token sees its own only."""
        names = [t.name for t in self.s.store.topic_admin.listing()]
        return names if scope is None else [n for n in names if scope.may_use_topic(n)]

    def _replicas(self, end: int, in_sync: list[str]) -> list[pb.ReplicaStatus]:
        now = time.monotonic()
        return [
            pb.ReplicaStatus(
                address=v.address,
                position=v.position,
                lag_bytes=max(0, end - v.position),
                last_seen_s=now - v.last_seen,
                connected=v.connected,
                replica_id=v.replica_id,
                in_sync=v.connected and v.replica_id in in_sync[1:],
            )
            for v in self.s.replicas.views()
        ]

    def _visible_groups(self, scope: Principal | None) -> list[str]:
        """The groups a token may see: those all of whose topics it covers."""
        groups = sorted(set(self.s.store.groups()) | set(self.s.consumers.groups()))
        if scope is None:
            return groups
        return [g for g in groups if all(scope.may_use_topic(t) for t in self.s.group_topics(g))]

    @rpc
    async def ListTopics(self, request: pb.ListTopicsRequest, context: Any) -> pb.ListTopicsReply:
        scope = self.s.scope(context)

        def list_() -> pb.ListTopicsReply:
            names = self._visible_topics(scope)
            return pb.ListTopicsReply(topics=[self._topic_info(n) for n in names])

        return await self.s.call(list_)

    @rpc
    async def DescribeTopic(self, request: pb.DescribeTopicRequest, context: Any) -> pb.TopicInfo:
        return await self.s.call(self._topic_info, request.name)

    @rpc
    async def AddQueues(self, request: pb.AddQueuesRequest, context: Any) -> pb.TopicInfo:
        check_reshape(request.name, "given more queues")

        def add() -> pb.TopicInfo:
            if request.count < 1:
                raise BadRequest(f"count must be at least 1, got {request.count}")
            self.s.store.topic_admin.add_queues(request.name, request.count)
            return self._topic_info(request.name)

        try:
            return await self.s.call(add)
        finally:
            self.s.topology_changed()

    @rpc
    async def SetQueueVisibility(
        self, request: pb.SetQueueVisibilityRequest, context: Any
    ) -> pb.TopicInfo:
        check_reshape(request.name, "hidden from its producers or consumers")

        def set_() -> pb.TopicInfo:
            self.s.store.topic_admin.set_queue_visibility(
                request.name,
                request.queue_id,
                producer=request.producer_visible if request.HasField("producer_visible") else None,
                consumer=request.consumer_visible if request.HasField("consumer_visible") else None,
            )
            return self._topic_info(request.name)

        try:
            return await self.s.call(set_)
        finally:
            self.s.topology_changed()

    @rpc
    async def DeleteQueue(self, request: pb.DeleteQueueRequest, context: Any) -> pb.TopicInfo:
        check_reshape(request.name, "left without its queue")

        def delete() -> pb.TopicInfo:
            dropped = self.s.store.topic_admin.delete_queue(
                request.name, request.queue_id, request.force
            )
            self.s.counters.forget(request.name, request.queue_id)
            fields = {"topic": request.name, "queue": request.queue_id, "dropped": dropped}
            # Dropping unconsumed messages is data loss an operator asked for:
            # say so louder than a routine delete.
            log.log(logging.WARNING if dropped else logging.INFO, "queue deleted", extra=fields)
            return self._topic_info(request.name)

        try:
            return await self.s.call(delete)
        finally:
            self.s.topology_changed()

    @rpc
    async def ListGroups(self, request: pb.ListGroupsRequest, context: Any) -> pb.ListGroupsReply:
        return pb.ListGroupsReply(groups=self._visible_groups(self.s.scope(context)))

    @rpc
    async def DescribeGroup(self, request: pb.DescribeGroupRequest, context: Any) -> pb.GroupInfo:
        user_group(request.group)
        self.s.check_group(self.s.scope(context), request.group)
        return await self.s.call(self._group_info, request.group)

    def _group_info(self, group: str) -> pb.GroupInfo:
        """The group's progress (group_view.py: the one lag definition)."""
        validate_group(group)
        live = self.s.consumers.live(group)
        if not live and not self.s.store.committed_offsets(group):
            raise NotFound(f"group {group!r} has no committed offsets and no live consumers")
        info = pb.GroupInfo(group=group, consumer_ids=live)
        now_ms = int(time.time() * 1000)
        for view in group_queues(self.s.store, self.s.consumers, group, now_ms):
            info.queues.add(
                topic=view.topic,
                queue_id=view.queue_id,
                committed_offset=view.committed,
                end_offset=view.end,
                lag=view.lag,
                consumer_id=view.consumer_id,
                lag_ms=view.lag_ms,
            )
            info.total_lag += view.lag
            info.max_lag_ms = max(info.max_lag_ms, view.lag_ms)
        return info

    @rpc
    async def ResetOffsets(self, request: pb.ResetOffsetsRequest, context: Any) -> pb.GroupInfo:
        user_group(request.group)
        self.s.check_group(self.s.scope(context), request.group)  # the topic: auth.py

        def reset() -> pb.GroupInfo:
            store = self.s.store
            meta = store.topic_admin.describe(request.topic)
            target = request.WhichOneof("target")
            if target is None:
                raise BadRequest("give one of earliest, latest, timestamp_ms, explicit")
            entries = []
            for q in meta.queues:
                info = store.topic_admin.queue_info(request.topic, q.queue_id)
                if target == "earliest":
                    entries.append((request.topic, q.queue_id, info.earliest))
                elif target == "latest":
                    entries.append((request.topic, q.queue_id, info.end))
                elif target == "timestamp_ms":
                    offset = store.reads.offset_for_timestamp(
                        request.topic, q.queue_id, request.timestamp_ms
                    )
                    entries.append((request.topic, q.queue_id, offset))
            if target == "explicit":
                for queue_id, offset in sorted(request.explicit.offsets.items()):
                    if offset < 0:
                        raise BadRequest(f"offset {offset} for queue {queue_id} is negative")
                    entries.append((request.topic, queue_id, offset))
            # Like any commit from outside the group: not under a live member's feet.
            self.s.consumers.check_unheld(request.group, [(t, q) for t, q, _ in entries])
            store.commit_offsets(request.group, entries, reset=True)
            fields = {"group": request.group, "topic": request.topic, "to": target}
            log.info("offsets reset", extra=fields)
            return self._group_info(request.group)

        return await self.s.call(reset)

    @rpc
    async def DeleteGroup(
        self, request: pb.DeleteGroupRequest, context: Any
    ) -> pb.DeleteGroupReply:
        user_group(request.group)
        self.s.check_group(self.s.scope(context), request.group)
        try:
            await self.s.call(self._delete_group, request.group)
        finally:
            self.s.topology_changed()
        self.s.consumers.forget(request.group)
        log.info("group deleted", extra={"group": request.group})
        return pb.DeleteGroupReply()

    def _delete_group(self, group: str) -> None:
        """The group's offsets and the topics the broker keeps for it (retry,
        dead letters, resend records); NotFound if it had neither."""
        store = self.s.store
        deleted = []
        for topic in group_topics(group):
            try:
                store.topic_admin.delete_topic(topic)
            except NotFound:
                continue
            self.s.counters.forget(topic)
            deleted.append(topic)
        try:
            store.delete_group(group)
        except NotFound:
            if not deleted:
                raise
        if deleted:
            log.info("group topics deleted", extra={"group": group, "topics": deleted})

    @rpc
    async def ResendDeadLetters(
        self, request: pb.ResendDeadLettersRequest, context: Any
    ) -> pb.ResendDeadLettersReply:
        user_group(request.group)
        scope = self.s.scope(context)
        self.s.check_group(scope, request.group)
        ids, every = list(request.message_ids), request.all

        async def resend() -> Resent:
            return await self.s.call(self.dead_letters.resend, request.group, ids, every, scope)

        insync = self.s.insync  # sync replication: acked once on the in-sync replicas
        done = await (insync.replicated(resend) if insync.sync else resend())
        log.info(
            "dead letters resent",
            extra={"group": request.group, "resent": done.resent, "skipped": done.already_resent},
        )
        return pb.ResendDeadLettersReply(
            resent=done.resent, already_resent=done.already_resent,
            not_found=done.not_found, new_message_ids=done.new_message_ids,
        )  # fmt: skip

    @rpc
    async def QueryMessages(
        self, request: pb.QueryMessagesRequest, context: Any
    ) -> pb.QueryMessagesReply:
        """A topic's messages by key and/or store-time range (storage/keys/query.py);
        served by replicas too (a read). The topic was checked against the
        caller's token by the interceptor (``auth.topics_of``)."""
        limit, start, end = query_bounds(request)
        if not request.topic:
            raise BadRequest("give the topic to query")
        if request.key and not request.by_key:
            raise BadRequest("a key was given with by_key false: set by_key, or leave the key out")
        max_key = self.s.store.config.limits.max_key_bytes
        if len(request.key) > max_key:
            raise BadRequest(
                f"key of {len(request.key)} bytes is above max_key_bytes ({max_key}): "
                "no stored message has such a key"
            )

        def query() -> pb.QueryMessagesReply:
            keys = self.s.store.keys
            if request.by_key:
                result = keys.by_key(request.topic, request.key, start, end, limit)
            else:
                result = keys.by_time(request.topic, start, end, limit)
            broker_id = self.s.broker_id
            return pb.QueryMessagesReply(
                messages=[
                    pb.GetMessageReply(
                        record=m.record, message_id=format_message_id(broker_id, m.position)
                    )
                    for m in result.messages
                ],
                truncated=result.truncated,
                broker_id=broker_id,
            )

        return await self.s.call(query)

    @rpc
    async def PurgeDeadLetters(
        self, request: pb.PurgeDeadLettersRequest, context: Any
    ) -> pb.PurgeDeadLettersReply:
        user_group(request.group)
        self.s.check_group(self.s.scope(context), request.group)
        try:
            purged = await self.s.call(self.dead_letters.purge, request.group)
        finally:
            self.s.topology_changed()
        log.warning("dead letters purged", extra={"group": request.group, "purged": purged})
        return pb.PurgeDeadLettersReply(purged=purged)

    @rpc
    async def GetMessage(self, request: pb.GetMessageRequest, context: Any) -> pb.GetMessageReply:
        scope = self.s.scope(context)

        def get() -> pb.GetMessageReply:
            store = self.s.store
            which = request.WhichOneof("key")
            if which == "message_id":
                try:
                    broker_id, position = parse_message_id(request.message_id)
                except ValueError as exc:
                    raise BadRequest(str(exc)) from None
                if broker_id not in (self.s.broker_id, self.s.instance_id):
                    raise NotFound(f"message {request.message_id!r} is from broker {broker_id!r}")
            elif which == "address":
                a = request.address
                position = store.reads.position_of(a.topic, a.queue_id, a.offset)
            else:
                raise BadRequest("give message_id or address")
            try:
                record = store.reads.record_at(position)
            except NotFound:
                raise _not_yet(store, position, request, scope) from None
            verdict = check_frame(record, 0, len(record))
            if isinstance(verdict, str) or verdict != len(record):
                # Never served with status OK (a pull answers the same way).
                raise _damaged(record, position, request, scope, str(verdict))
            if scope is not None:  # a message id does not name its topic: the record does
                scope.check_topic(read_meta(record, 0).topic.decode())
            return pb.GetMessageReply(
                record=record, message_id=format_message_id(self.s.broker_id, position)
            )

        return await self.s.call(get)

    @rpc
    async def GetStats(self, request: pb.GetStatsRequest, context: Any) -> pb.BrokerStats:
        scope = self.s.scope(context)

        def stats() -> pb.BrokerStats:
            store = self.s.store
            raw = store.stats()
            pending, next_due = store.delayed_summary()
            damage = store.damage()
            backlog = 0
            queues: set[tuple[str, int]] = set()
            topics = self._visible_topics(scope)
            storage = self.s.config.storage
            data_dir, retention = storage.data_dir, storage.retention
            free, size = filesystem(data_dir)
            for name in topics:
                info = self._topic_info(name)
                backlog += sum(q.backlog for q in info.queues)
                queues.update((name, q.queue_id) for q in info.queues)
            produce_rate, consume_rate = self.s.counters.rates()
            produced, consumed = self.s.counters.totals()
            # Only existing queues: a produce or pull still in flight when its
            # topic was deleted may count after DeleteTopic made it forget.
            counters = [
                pb.QueueCounters(topic=t, queue_id=q, produced=p, consumed=c)
                for t, q, p, c in self.s.counters.per_queue()
                if (t, q) in queues
            ]
            return fill_stats(pb.BrokerStats(
                queue_counters=counters,
                broker_id=self.s.broker_id,
                # A topic-scoped token counts its own topics, queues and groups;
                # the broker-wide figures (disk, chunks, rates, totals) stay.
                topics=raw["topics"] if scope is None else len(topics),
                queues=raw["queues"] if scope is None else len(queues),
                groups=len(self._visible_groups(scope)),
                total_backlog=backlog,
                chunk_count=raw["log_chunks"],
                bytes_on_disk=self.s.disk.used(data_dir),
                data_dir_free_bytes=free,
                data_dir_size_bytes=size,
                retention_max_age_ms=retention.max_age_ms or 0,
                # A chunk-count rule bounds the log's bytes: that many full chunks.
                retention_max_bytes=(retention.max_chunks or 0) * storage.chunk_capacity_bytes,
                produce_rate=produce_rate,
                consume_rate=consume_rate,
                produced_total=produced,
                consumed_total=consumed,
                flush_mode=self.s.config.storage.flush_mode.value,
                uptime_s=time.monotonic() - self.s.counters.started,
                open_transactions=raw["open_transactions"],
                idempotent_producers=raw["idempotent_producers"],
                staged_bytes=raw["staged_bytes"],
                **self.s.checker.stats(),  # transaction check-back (txn_checks.py)
                quarantined_chunks=[
                    pb.QuarantinedChunk(
                        file=str(c.path),
                        reason=c.reason,
                        start_position=c.start_position,
                        end_position=c.end_position,
                    )
                    for c in damage.quarantined_chunks
                ],
                damaged_metadata=damage.metadata(),
                role=view.role,
                master=view.master,
                epoch=view.epoch,
                replicas=self._replicas(raw["log_write_position"], in_sync),
                log_end_position=raw["log_write_position"],
                replication=self.s.config.replication,
                min_insync_replicas=self.s.config.min_insync_replicas,
                in_sync=in_sync,
                high_watermark=store.high_watermark,
                failover=self.s.role_switch.mode,
                role_reason=self.s.role.why,
                role_since_ms=self.s.role.since_ms,
                delayed_pending=pending,
                delayed_next_due_ms=next_due or 0,
                schema_subjects=store.schemas.subject_count(),
                fetch_address=self.s.fetch_address,
            ), self.s.counters)  # fmt: skip

        view = self.s.role.view
        # The in-sync set lives on the event loop (insync.py): read it here.
        in_sync = self.s.insync.members if view.is_master else []
        return await self.s.call(stats)

    @rpc
    async def SetRole(self, request: pb.SetRoleRequest, context: Any) -> pb.BrokerStats:
        await set_role(self.s, request, self.s.scope(context))
        reply: pb.BrokerStats = await self.GetStats(pb.GetStatsRequest(), context)
        return reply

    @rpc
    async def ListTransactions(
        self, request: pb.ListTransactionsRequest, context: Any
    ) -> pb.ListTransactionsReply:
        scope = self.s.scope(context)
        # A topic-scoped admin token works in its own namespace (auth.py) and
        # sees only that: other teams' transaction ids and sinks are theirs.
        mine = "" if scope is None else f"{scope.name}@"

        def list_() -> pb.ListTransactionsReply:
            transactions = self.s.store.transactions
            reply = pb.ListTransactionsReply()
            for t in transactions.list_open(mine + request.prefix):
                info = reply.transactions.add(
                    transaction_id=t.txn_id, created_ms=t.created_ms,
                    last_write_ms=t.last_write_ms, messages=t.messages, bytes=t.bytes,
                    committing=t.committing, group=t.group, checks=t.checks,
                    last_check_ms=t.last_check_ms, next_check_ms=t.next_check_ms,
                )  # fmt: skip
                for (topic, queue_id), count in sorted(t.queues.items()):
                    info.queues.add(topic=topic, queue_id=queue_id, count=count)
            for sink in transactions.sinks():
                if not sink.sink.startswith(mine):
                    continue
                reply.sinks.add(sink=sink.sink, batch_id=sink.batch_id, updated_ms=sink.updated_ms)
            return reply

        return await self.s.call(list_)


async def set_role(state: BrokerState, request: pb.SetRoleRequest, scope: Principal | None) -> None:
    """Admin ``SetRole``: an operator's promotion or re-pointing (no ZooKeeper)."""
    if scope is not None:  # the role is the whole broker's, not some topics'
        raise PermissionDenied(
            f"token {scope.name!r} is limited to some topics: SetRole needs an admin "
            "token for every topic"
        )
    switch = state.role_switch
    if switch.mode == ZOOKEEPER:
        raise PreconditionFailed(
            "this group fails over through ZooKeeper: its members elect the master "
            "(stop a member to move mastership); SetRole is for groups run without --zookeeper"
        )
    if request.role == MASTER:
        if request.master:
            raise BadRequest(f"a master follows nobody: drop master {request.master!r}")
        await switch.promote(request.epoch, why=f"SetRole: promoted to epoch {request.epoch}")
    elif request.role == REPLICA:
        host, sep, port = request.master.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise BadRequest(
                f"master {request.master!r} is not HOST:PORT: a replica needs its master"
            )
        await switch.follow(request.master, request.epoch, why=f"SetRole: follow {request.master}")
    else:
        raise BadRequest(f"role {request.role!r}: give master or replica")


def _damaged(
    record: bytes, position: int, request: pb.GetMessageRequest, scope: Principal | None, why: str
) -> DamagedMessage:
    """The DATA_LOSS for a record GetMessage found damaged: by address, the
    topic, queue and offset asked for; by message id, the ones the record's
    header names if it still reads (checked against the token's topics),
    else the log position alone."""
    if request.WhichOneof("key") == "address":
        a = request.address
        return DamagedMessage(position, why, a.topic, a.queue_id, a.offset)
    try:
        meta = read_meta(record, 0)
        topic = meta.topic.decode()
    except (ValueError, struct.error):
        return DamagedMessage(position, why)
    if scope is not None:
        scope.check_topic(topic)
    return DamagedMessage(position, why, topic, meta.queue_id, meta.queue_offset)


def query_bounds(request: pb.QueryMessagesRequest) -> tuple[int, int, int]:
    """(limit, start ms, end ms) of a query, checked: 0 means the default
    limit / an unbounded side."""
    limit = request.limit or DEFAULT_LIMIT
    if limit > MAX_LIMIT:
        raise BadRequest(f"limit {limit} is above the maximum {MAX_LIMIT}: ask for fewer")
    start, end = request.start_ms, request.end_ms or NO_END
    for name, value in (("start_ms", start), ("end_ms", request.end_ms)):
        if value < 0:
            raise BadRequest(f"{name} {value} is negative: give ms since 1970 (0: unbounded)")
    if start >= end:
        raise BadRequest(f"time range [{start}, {end}) is empty: start_ms must be below end_ms")
    return limit, start, end


def _not_yet(
    store: Store, position: int, request: pb.GetMessageRequest, scope: Principal | None
) -> NotFound:
    """GetMessage of a message that is not readable: a pending delayed one says
    when it is due (to a token covering its topic)."""
    pending = store.delivery.pending(position) if request.message_id else None
    if pending is None or (scope is not None and not scope.may_use_topic(pending.topic)):
        return NotFound(f"no message at log position {position}")
    due = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(pending.deliver_at_ms / 1000))
    return NotFound(
        f"message {request.message_id!r} is a delayed message for {pending.topic}/"
        f"{pending.queue_id}, pending until {due} ({pending.deliver_at_ms} ms): readable "
        "once delivered (equeue message cancel ID withdraws it)"
    )
