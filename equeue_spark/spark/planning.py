"""Driver-side planning: which queues a query reads, where it starts and stops,
how ranges become Spark partitions, and committing group progress.

Every broker call here goes through ``Admin`` and so has a deadline (the
``timeoutMs`` option): a dead broker fails the query's planning with a clear
error instead of hanging the driver. Pyspark-free.
"""

from __future__ import annotations

import datetime
import functools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.admin import Admin
from equeue_spark.client.cluster import target
from equeue_spark.client.errors import BrokerUnavailable, EqueueError, NotFoundError
from equeue_spark.spark.errors import InvalidOption, NoOffsetForTimestamp, OffsetsLostError
from equeue_spark.spark.key_plan import key_offsets
from equeue_spark.spark.offsets import (
    Incarnations,
    Offsets,
    QueueKey,
    Span,
    cluster_key,
    contains,
    from_json,
    intersect,
    recreated_topics,
    split_key,
    task_spans,
)
from equeue_spark.spark.options import (
    EARLIEST,
    LATEST,
    ReadOptions,
    StartSpec,
    TimestampSpec,
)
from equeue_spark.spark.read_task import QueueRange

if TYPE_CHECKING:  # pushdown.py imports pyspark; planning stays free of it
    from equeue_spark.spark.pushdown import Pushdown

log = logging.getLogger("equeue.spark")

Queues = dict[QueueKey, pb.QueueOffsets]


@dataclass
class Listing:
    """One look at the query's topics: the offsets of their consumer-visible
    queues and, from the same broker replies, each topic's incarnation."""

    queues: Queues = field(default_factory=dict)
    incarnations: Incarnations = field(default_factory=dict)
    unreachable: set[str] = field(default_factory=set)
    """Cluster only: ``BROKER/TOPIC`` names whose broker did not answer; their
    queues are missing from ``queues`` and keep their offsets meanwhile."""


class Planner:
    """Talks to the broker for one query (lives in the driver's source process)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._admin: Admin | None = None
        self._committed: Offsets = {}
        self._absent_warned: set[object] = set()
        """Absent queues warned about: keys (``assign``), (option, key) (offset JSONs)."""

    @property
    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(config=self.options.client)
        return self._admin

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    # -- what there is to read -----------------------------------------------------

    def topics(self) -> list[str]:
        """The topics the query reads now (a pattern is matched against the broker's)."""
        pattern = self.options.topic_pattern
        if pattern is None:
            return list(self.options.topics)
        return sorted(t.name for t in self.admin.list_topics() if pattern.fullmatch(t.name))

    def queues(self, timestamp_ms: int | None = None) -> Queues:
        """Offsets of every consumer-visible queue of the query's topics."""
        return self.listing(timestamp_ms).queues

    def listing(self, timestamp_ms: int | None = None) -> Listing:
        """Offsets of every consumer-visible queue of the query's topics, and
        the topics' incarnations (one broker call per topic).

        In a streaming query a named topic that does not exist yet simply has
        no queues (the query waits for it), as Kafka's ``subscribe`` does; a
        batch read of one fails (``NotFoundError`` naming it), as Kafka's
        ``assign`` does. A ``topicPattern`` may match none. With ``assign``
        only the assigned queues are listed (``_check_assigned``).
        """
        found = Listing()
        missing = [t for t in self.topics() if not self._list_topic(found, t, timestamp_ms)]
        if missing and not self.options.streaming and self.options.topic_pattern is None:
            where, _ = target(self.options.client)
            option = self.options.topic_option if self.options.assigned is None else "assign"
            raise NotFoundError(
                f"topic {missing[0]!r} does not exist on {where}: check the {option} option "
                "(a batch read needs existing topics; a streaming read waits for them)"
            )
        if self.options.assigned is not None:
            self._check_assigned(found)
        return found

    def _check_assigned(self, found: Listing) -> None:
        """Option ``assign``: a queue that does not exist fails a batch read
        (``NotFoundError`` naming it); a stream warns once and reads it from its
        earliest offset when it appears (a new queue in a later listing)."""
        assigned = self.options.assigned or {}
        absent = sorted(
            (name, queue)
            for name, queues in assigned.items()
            if name not in found.unreachable
            for queue in queues
            if (name, queue) not in found.queues
        )
        if not absent:
            return
        where, _ = target(self.options.client)
        # The kind of name (BROKER/QUEUE or an id) was checked by ReadOptions.parse.
        names = ", ".join(shown(k) for k in absent[:5])
        if not self.options.streaming:
            raise NotFoundError(
                f"assign names {names}, which does not exist on {where}: check the "
                "assign option (a batch read needs existing queues)"
            )
        new = [k for k in absent if k not in self._absent_warned]
        if new:
            self._absent_warned.update(new)
            log.warning("assign names %s, which does not exist on %s; the query reads it "
                        "from its earliest offset when it appears", names, where)  # fmt: skip

    def _list_topic(self, found: Listing, topic: str, timestamp_ms: int | None) -> bool:
        """``listing`` of one topic: every broker group of its route (one
        broker: its one group); a group that does not answer is noted
        (``unreachable``), not fatal. False if the topic does not exist."""
        try:
            route = self.admin.route(topic)
        except NotFoundError:
            return False
        exists = False
        for broker in route.broker_names():
            name = cluster_key(broker, topic)
            try:  # the master, a replica when it does not answer (or readFromReplicas)
                listed = self.admin.read_on(
                    broker, topic, lambda a: a.list_topic_offsets(topic, timestamp_ms), self.seed
                )
            except NotFoundError:
                continue
            except BrokerUnavailable as exc:
                log.warning("broker %s of topic %s does not answer: %s", broker, topic, exc)
                found.unreachable.add(name)
                exists = True  # as far as anyone can tell
                continue
            exists = True
            if listed.incarnation:
                found.incarnations[name] = listed.incarnation
            kept = None if self.options.assigned is None else self.options.assigned.get(name, ())
            for q in listed.queues:
                if q.consumer_visible and (kept is None or q.queue_id in kept):
                    found.queues[(name, q.queue_id)] = q
        return exists

    @property
    def seed(self) -> str:
        """Picks the replica read with readFromReplicas (replica_reads.py)."""
        return self.options.group

    def addresses(self, name: str) -> list[str]:
        """Where ``BROKER/TOPIC``'s records are read, in the order to try:
        the group's master and replicas (replicas first with
        readFromReplicas); the broker for a bare topic (one broker)."""
        broker, topic = split_key(name)
        return self.admin.read_addresses(broker, topic, self.seed)

    def offset_for_bytes(
        self, key: QueueKey, start: int, end: int, max_bytes: int
    ) -> tuple[int, int]:
        broker, topic = split_key(key[0])
        return self.admin.read_on(
            broker, topic, lambda a: a.offset_for_bytes(topic, key[1], start, end, max_bytes),
            self.seed,
        )  # fmt: skip

    def offsets(self, document: Mapping[str, Mapping[str, int]]) -> Offsets:
        """``from_json`` of a checkpointed offset, refused (``InvalidOption``)
        if it was written by a query of the other kind: a single-broker
        query's queues name no broker, a cluster query's name one."""
        offsets = from_json(document)
        routes = self.admin.routes
        wrong = sorted({k[0] for k in offsets if routes.misnamed(split_key(k[0])[0])})
        if wrong:
            raise InvalidOption(
                f"the checkpoint's offsets were written by a query over {routes.other_kind} "
                f"(topics {', '.join(wrong[:5])}); this query reads {routes.kind}: give it a "
                "new checkpoint location and startingOffsets (e.g. group, or a JSON of "
                "BROKER/QUEUE offsets)"
            )
        return offsets

    # -- start and end offsets ------------------------------------------------------

    def resolve(
        self,
        spec: StartSpec,
        timestamp_ms: int | None,
        *,
        end: bool,
        listing: Listing | None = None,
    ) -> Offsets:
        """Offsets for a ``startingOffsets``/``endingOffsets`` spec (or the
        ``*OffsetsByTimestamp`` one, a ``TimestampSpec``) or a timestamp (in
        ``listing``, made with ``timestamp_ms``, when given)."""
        queues = (listing or self.listing(timestamp_ms)).queues
        if timestamp_ms is not None:
            times = {k: timestamp_ms for k in queues}
            return self._at_times(queues, times, end, "startingTimestamp")
        if isinstance(spec, TimestampSpec):
            return self._by_timestamp(spec, queues, end)
        if spec == "group":
            return self._group_offsets(queues)
        fallback = self._default_offset(spec, end)
        given = spec if isinstance(spec, dict) else {}
        option = "endingOffsets" if end else "startingOffsets"
        self._absent(option, [(t, q) for t, by_queue in given.items() for q in by_queue], queues)
        offsets = {}
        for key, q in queues.items():
            wanted = given.get(key[0], {}).get(key[1], fallback)
            offsets[key] = _pick(q, wanted)
        return offsets

    def _by_timestamp(self, spec: TimestampSpec, queues: Queues, end: bool) -> Offsets:
        """``*OffsetsByTimestamp``: the named queues by their times (one
        ListOffsets per distinct broker, topic and time), the others by the
        next preference (``spec.rest``)."""
        offsets = self.resolve(spec.rest, None, end=end, listing=Listing(queues=queues))
        named = {(name, q): ms for name, by_queue in spec.per_queue.items()
                 for q, ms in by_queue.items()}  # fmt: skip
        absent = self._absent(spec.option, named, queues)
        times = {k: ms for k, ms in named.items() if k not in absent}
        listed: Queues = {}
        for name, ms in sorted({(k[0], ms) for k, ms in times.items()}):
            broker, topic = split_key(name)
            reply = self.admin.read_on(
                broker, topic, functools.partial(_list_at, topic=topic, ms=ms), self.seed
            )
            for q in reply.queues:
                if times.get((name, q.queue_id)) == ms:
                    listed[(name, q.queue_id)] = q
        offsets.update(self._at_times(listed, times, end, spec.option))
        return offsets

    def _absent(self, option: str, named: Iterable[QueueKey], queues: Queues) -> set[QueueKey]:
        """The queues an offset JSON names that do not exist. A batch read
        fails naming them (``InvalidOption``); a stream warns once and leaves
        them out, so each starts at its earliest offset when it appears, as an
        assigned queue or a subscribed topic created later does (Kafka's
        source fails instead, but its ``assign`` does not wait for partitions
        either; here a stream waits, so its start options must not refuse what
        it waits for)."""
        absent = sorted(k for k in named if k not in queues)
        if not absent:
            return set()
        names = ", ".join(shown(k) for k in absent[:5])
        if not self.options.streaming:
            raise InvalidOption(
                f"option {option} names {names}, which does not exist (a batch read needs "
                "existing queues)"
            )
        new = [k for k in absent if (option, k) not in self._absent_warned]
        if new:
            self._absent_warned.update((option, k) for k in new)
            log.warning("option %s names %s, which does not exist yet; the query reads it "
                        "from its earliest offset when it appears", option, names)  # fmt: skip
        return set(absent)

    def _at_times(
        self, queues: Queues, times: Mapping[QueueKey, int], end: bool, option: str
    ) -> Offsets:
        """Each queue's first offset stored at or after its time (listed with
        it); one with no such record (the broker answers its end offset):
        ending, and ``startingOffsetsByTimestampStrategy=latest``, its end (as
        Kafka); ``error``: ``NoOffsetForTimestamp`` naming it."""
        strict = not end and self.options.timestamp_strategy == "error"
        for key, q in sorted(queues.items()):
            if strict and q.timestamp_offset >= q.end_offset:
                raise NoOffsetForTimestamp(
                    f"{option}: {shown(key)} has no record stored at or after "
                    f"{times[key]} ({_iso(times[key])}); set "
                    "startingOffsetsByTimestampStrategy=latest to start such queues at their end"
                )
        return {key: min(q.timestamp_offset, q.end_offset) for key, q in queues.items()}

    def _default_offset(self, spec: StartSpec, end: bool) -> int:
        """Where a queue starts (or ends) that the spec does not name: a JSON
        spec leaves the queues it omits at the mode's default, like Kafka's
        (latest for streams, earliest for batch reads; ends are always latest)."""
        if end or spec == "latest":
            return LATEST
        if spec == "earliest":
            return EARLIEST
        return LATEST if self.options.streaming else EARLIEST

    def _group_offsets(self, queues: Queues) -> Offsets:
        """The group's committed offsets; ``groupFallback`` where it has none."""
        committed = self._fetch_group(queues)
        fallback = EARLIEST if self.options.group_fallback == "earliest" else LATEST
        offsets = {}
        for key, q in queues.items():
            start = committed.get(key)
            offsets[key] = _pick(q, fallback) if start is None else start
        return offsets

    def _fetch_group(self, queues: Queues) -> Offsets:
        group = self.options.group
        committed: Offsets = {}
        for name in sorted({key[0] for key in queues}):
            broker, topic = split_key(name)
            fetched = self.admin.read_on(
                broker, topic, functools.partial(_fetch_group, group=group, topic=topic), self.seed
            )
            committed.update({(name, q): o for (_, q), o in fetched.items()})
        return committed

    # -- partitions -------------------------------------------------------------------

    def ranges(
        self,
        starts: Mapping[QueueKey, int],
        ends: Offsets,
        listed: Listing | None = None,
        incarnations: tuple[Incarnations, Incarnations] | None = None,
        pushdown: Pushdown | None = None,
    ) -> list[QueueRange]:
        """Spark partitions for ``[starts, ends)``: one per queue range, cut as
        Spark 4's Kafka source cuts them (``maxRecordsPerPartition``, then
        ``minPartitions``: ``offsets.task_spans``), on the offsets read (after
        pushdown's narrowing). Queues new since ``starts`` start at their
        earliest offset; starts below the earliest are data loss, and so are
        the starts of a topic recreated since (``incarnations``: the topics'
        at ``starts`` and at ``ends``, when the offsets carry them).

        ``pushdown``: a batch read's filters pushed down: only its queues and,
        within ``[starts, ends)``, its offset ranges (``narrow``), read with
        its tags and broker filter.

        ``listed``: a listing of the queues already made for this batch (a
        moment old is fine: earliest offsets only grow, and a read task that
        meets offsets removed since applies the same data-loss policy)."""
        opts = self.options
        ranges = []
        narrowed = None if pushdown is None else self.narrow(ends, pushdown)
        if narrowed is not None:
            ends = {k: e for k, e in ends.items() if k in narrowed}
        tags, read_filter = opts.tags, opts.filter
        if pushdown is not None:
            tags = opts.tags if pushdown.tags is None else pushdown.tags
            read_filter = pushdown.read_filter(opts.filter)
        current = Listing()
        if self._needs_earliest(starts, ends):
            current = self.listing() if listed is None else listed
            if incarnations is not None:
                starts, ends = self._recreated_ranges(starts, ends, incarnations, current)
        bounds = []
        for key in sorted(ends):
            end = ends[key]
            start = starts.get(key)
            q = current.queues.get(key)
            if start is None:
                start = q.earliest_offset if q is not None else end
            elif q is not None and start < q.earliest_offset:
                start = self._lost(key, start, q.earliest_offset, end)
            elif start > end:  # the queue went backwards: recreated, or data lost
                start = self._lost(key, start, q.earliest_offset if q else 0, end, behind=True)
            bounds.append((key, start, end))
        queues = []
        for key, start, end in bounds:
            spans: tuple[Span, ...] = ((start, end),) if end > start else ()
            if narrowed is not None:  # only the offsets the filters leave
                spans = intersect(spans, narrowed[key])
            queues.append((key, spans))
        addresses: dict[str, list[str]] = {}
        limits = (opts.min_partitions, opts.max_records_per_partition)
        for key, group in task_spans(queues, *limits):
            if key[0] not in addresses:
                addresses[key[0]] = self.addresses(key[0])
            at = addresses[key[0]]
            ranges.append(
                QueueRange(
                    topic=split_key(key[0])[1],
                    queue_id=key[1],
                    start=group[0][0],
                    end=group[-1][1],
                    spans=group if len(group) > 1 else (),  # spans of one queue share a task
                    broker=at[0],
                    fallbacks=tuple(at[1:]),
                    timeout_ms=opts.timeout_ms,
                    tags=tags,
                    filter=read_filter,
                    fail_on_data_loss=opts.fail_on_data_loss,
                    security=opts.security,
                    broker_name=split_key(key[0])[0],
                )
            )
        return ranges

    def narrow(self, ends: Offsets, pushdown: Pushdown) -> dict[QueueKey, tuple[Span, ...]]:
        """The queues of ``ends`` a pushdown reads, each with the offsets it
        allows: its offset ranges, cut to the store-time bounds through the
        broker's offset for a timestamp (exact: a queue's store times never
        decrease) and to the offsets the key index finds for pushed keys
        (``key_plan``). A queue the timestamp listing misses (its broker stopped
        answering) is not read, as the listing's unreachable queues are not."""
        if pushdown.empty:
            return {}
        kept = {k: pushdown.offsets for k in ends if _admits(k, pushdown)}
        lo_ms, hi_ms = pushdown.store_ms
        for bound_ms, below in ((lo_ms, False), (hi_ms, True)):
            if bound_ms is None or not kept:
                continue
            at = self.listing(max(bound_ms, 0)).queues
            for key in list(kept):
                if key not in at:
                    log.warning("%s/%d: not in the listing for storeTimestamp; not read", *key)
                    del kept[key]
                    continue
                offset = at[key].timestamp_offset
                cut: tuple[Span, ...] = ((0, offset),) if below else ((offset, 2**63),)
                kept[key] = intersect(kept[key], cut)
        if pushdown.keys and kept:  # only the offsets the key index finds
            names = {k[0] for k in kept}
            found = key_offsets(
                self.admin.routes, names, pushdown.keys, pushdown.store_ms, self.seed
            )
            if found is not None:
                kept = {k: intersect(spans, found.get(k, ())) for k, spans in kept.items()}
        return {k: spans for k, spans in kept.items() if spans}

    def _recreated_ranges(
        self,
        starts: Mapping[QueueKey, int],
        ends: Offsets,
        incarnations: tuple[Incarnations, Incarnations],
        current: Listing,
    ) -> tuple[Offsets, Offsets]:
        """``starts`` without the topics recreated between the two offsets (so
        they start at the new topic's earliest), and ``ends`` without the
        topics recreated since ``ends`` were listed (a batch replayed from the
        checkpoint: its records are gone with the old topic)."""
        at_start, at_end = incarnations
        reset = self.recreated(at_start, at_end, "reading the new topic from its earliest offset")
        gone = self.recreated(at_end, current.incarnations, "skipping this batch's records")
        kept_starts = {k: o for k, o in starts.items() if k[0] not in reset}
        return kept_starts, {k: o for k, o in ends.items() if k[0] not in gone}

    def recreated(self, before: Incarnations, now: Incarnations, then: str = "") -> set[str]:
        """Topics deleted and created again between two listings
        (``recreated_topics``): ``OffsetsLostError`` for the first with
        failOnDataLoss; else the set, with a warning each (saying what happens
        ``then``; none when empty)."""
        topics = recreated_topics(before, now)
        for topic in sorted(topics):
            why = (
                f"topic {topic} was deleted and created again: the query's offsets are "
                f"of its incarnation {before[topic]}, the topic is now incarnation {now[topic]}"
            )
            if self.options.fail_on_data_loss:
                raise OffsetsLostError(
                    f"{why}; set failOnDataLoss=false to read the new topic from its "
                    "earliest offset"
                )
            if then:
                log.warning("%s; %s", why, then)
        return topics

    @staticmethod
    def _needs_earliest(starts: Mapping[QueueKey, int], ends: Offsets) -> bool:
        return any(starts.get(k, -1) != e for k, e in ends.items())

    def _lost(
        self, key: QueueKey, start: int, earliest: int, end: int, behind: bool = False
    ) -> int:
        topic, queue_id = key
        if behind:
            why = f"the queue now ends at {end}, below the query's offset {start}"
        else:
            why = f"offsets [{start}, {earliest}) were removed by retention"
        if self.options.fail_on_data_loss:
            raise OffsetsLostError(
                f"{topic}/{queue_id}: {why}; set failOnDataLoss=false to skip lost records"
            )
        log.warning("%s/%d: %s; continuing from %d", topic, queue_id, why, earliest)
        return min(earliest, end)

    # -- group progress ------------------------------------------------------------------

    def commit(self, offsets: Offsets) -> None:
        """Commit the query's progress to its group (if any), skipping repeats.

        Best effort: a failure is logged, not raised, because Spark's checkpoint,
        not the group, is what a restarted query resumes from.
        """
        group = self.options.group
        changed = {k: o for k, o in offsets.items() if self._committed.get(k) != o}
        if not group or not changed:
            return
        by_name: dict[str, Offsets] = {}
        for key, offset in changed.items():
            by_name.setdefault(key[0], {})[key] = offset
        for name, part in sorted(by_name.items()):
            broker, topic = split_key(name)
            try:
                admin = self.admin.broker_admin(broker, topic)
                admin.commit_offsets(group, {(topic, q): o for (_, q), o in part.items()})
            except EqueueError as exc:
                log.warning("could not commit group %r progress on %s: %s", group, name, exc)
                continue
            self._committed.update(part)


def shown(key: QueueKey) -> str:
    """A queue for messages, as the options name it: ``orders/0``, over a
    cluster ``orders/a/0`` (topic, then the JSON's ``BROKER/QUEUE``)."""
    broker, topic = split_key(key[0])
    return f"{topic}/{broker}/{key[1]}" if broker else f"{topic}/{key[1]}"


def _admits(key: QueueKey, pushdown: Pushdown) -> bool:
    broker, topic = split_key(key[0])
    return (
        pushdown.topics.admits(topic)
        and pushdown.brokers.admits(broker)
        and contains(pushdown.queues, key[1])
    )


def _list_at(admin: Admin, topic: str, ms: int) -> pb.ListOffsetsReply:
    return admin.list_topic_offsets(topic, ms)


def _iso(ms: int) -> str:
    """A store time for messages: ``2026-01-01T00:00:00Z`` (ms when not whole seconds)."""
    try:
        when = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return "beyond the calendar"
    text = when.isoformat(timespec="milliseconds" if ms % 1000 else "seconds")
    return text.replace("+00:00", "Z")


def _fetch_group(admin: Admin, group: str, topic: str) -> dict[tuple[str, int], int]:
    return admin.fetch_offsets(group, topic)


def _pick(q: pb.QueueOffsets, wanted: int) -> int:
    """A concrete offset for a sentinel; explicit offsets past the end are
    clamped to it (one below the earliest is left for the data-loss check)."""
    if wanted == EARLIEST:
        return q.earliest_offset
    if wanted == LATEST:
        return q.end_offset
    return min(wanted, q.end_offset)
