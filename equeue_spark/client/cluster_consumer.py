"""``ClusterConsumer``: a ``Consumer`` over a cluster's brokers (``Consumer(namesrv=...)``).

One single-broker ``Consumer`` per broker group of its topics' routes; reads
follow ``replica_reads.read_order`` (the master, or a replica with
``read_from_replicas``, moving to another member when one stops answering);
commits go to each group's master. The module docstring of consumer.py
describes the behaviour.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from equeue_proto.protocol import consumer_id_problem, default_consumer_id
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.admin import commit_offsets
from equeue_spark.client.cluster import Cluster, name_broker
from equeue_spark.client.connection import ClientConfig
from equeue_spark.client.consumer import (
    Consumer,
    Member,
    OnDataLoss,
    QueueKey,
    Start,
)
from equeue_spark.client.errors import (
    BrokerUnavailable,
    DeadlineExceeded,
    EqueueError,
    InvalidRequest,
    NotMasterError,
)
from equeue_spark.client.records import Message
from equeue_spark.client.replica_reads import read_order

log = logging.getLogger("equeue_spark.client.consumer")

MAX_POLL_THREADS = 16
"""Brokers a cluster consumer polls at once."""
PROBE_S = 1.0
"""Deadline of the call that checks a broker group's member answers before reading there."""
CHECK_S = 1.0
"""How often a cluster consumer reading a group's second choice looks for its first."""


class ClusterConsumer(Consumer):
    """A ``Consumer`` over a cluster's brokers (built by ``Consumer(namesrv=...)``).

    One single-broker consumer per broker of the topics' routes, all with this
    consumer's id; each heartbeats its broker, which allocates that broker's
    queues over the group's members and keeps their committed offsets. A
    broker that joins a topic's route later is picked up at the next route
    refresh. ``poll`` polls every broker in short slices (0.1 s) until one
    has messages or ``timeout_s`` passes; a broker that cannot be reached is
    skipped (its consumer logs and retries), so the others keep flowing.
    Queue calls (``assign``, ``seek``, ``position``) name the ``broker``.
    """

    SLICE_S = 0.1

    def __init__(
        self,
        broker: str = "",
        *,
        namesrv: str | Sequence[str] = "",
        group: str | None = None,
        topics: Sequence[str] = (),
        start: Start = "group",
        config: ClientConfig | None = None,
        max_messages: int = 1000,
        max_bytes: int = 1 << 20,
        max_wait_ms: int = 1000,
        tags: Sequence[str] = (),
        heartbeat_interval_s: float = 1.0,
        consumer_id: str | None = None,
        on_data_loss: OnDataLoss = "raise",
        read_from_replicas: bool = False,
    ) -> None:
        if topics and group is None:
            raise ValueError("subscribing to topics needs a group; use assign() without one")
        self.consumer_id = consumer_id or default_consumer_id(
            socket.gethostname(), os.getpid(), secrets.token_hex(3)
        )
        problem = consumer_id_problem(self.consumer_id)
        if problem is not None:
            raise ValueError(problem)
        config = config or ClientConfig(broker=broker, namesrv=namesrv)
        if read_from_replicas:
            config = dataclasses.replace(config, read_from_replicas=True)
        self._cluster = Cluster(config)
        self._seed = group or ""
        """Picks the replica read (replica_reads.py): a group's members agree."""
        self.group = group
        self.topics = list(topics)
        self.start = start
        self.on_data_loss = on_data_loss
        self._settings: dict[str, object] = {
            "group": group, "start": start, "max_messages": max_messages,
            "max_bytes": max_bytes, "max_wait_ms": max_wait_ms, "tags": tags,
            "heartbeat_interval_s": heartbeat_interval_s, "consumer_id": self.consumer_id,
            "on_data_loss": on_data_loss,
        }  # fmt: skip
        self._parts: dict[str, Consumer] = {}
        self._addresses: dict[str, str] = {}
        self._part_topic: dict[str, str] = {}
        """A topic each broker group is read for (its route names the members)."""
        self._checked = 0.0
        self._parts_lock = threading.Lock()
        self._deferred = None
        self._closed = threading.Event()
        self._refreshed = 0.0
        self._pool = ThreadPoolExecutor(MAX_POLL_THREADS, thread_name_prefix="equeue-poll")
        if self.topics:
            self._refresh_parts()

    # -- the per-broker consumers --------------------------------------------------------

    def _part(self, broker: str, topic: str, topics: Sequence[str] = ()) -> Consumer:
        """The consumer of ``broker``'s group: on the first member of its read
        order that answers (replica_reads.py); re-created there, carrying the
        positions over, when that is not the member read now. With no member
        answering the current consumer stays (its broker may come back)."""
        with self._parts_lock:
            part = self._parts.get(broker)
            current = self._addresses.get(broker, "")
        errors: list[str] = []
        for address in self._cluster.read_addresses(topic, broker, self._seed):
            if part is not None and address == current:
                return part
            try:
                self._probe(address)
                joined = tuple(topics) or (tuple(part.topics) if part is not None else ())
                config = self._cluster.config.for_broker(address)
                new = Consumer(config=config, topics=joined, **self._settings)  # type: ignore[arg-type]
            except (BrokerUnavailable, DeadlineExceeded) as exc:
                self._cluster.mark_down(address)
                errors.append(f"{address}: {exc}")
                continue
            self._install(broker, topic, address, part, new)
            return new
        if part is not None:
            return part
        tried = "; ".join(errors)
        raise BrokerUnavailable(f"no member of broker group {broker!r} answers: {tried}")

    def _probe(self, address: str) -> None:
        """One quick call: does the member answer at all? (Any answer counts,
        a refusal too: a token without the admin role gets PERMISSION_DENIED.)"""
        conn = self._cluster.connection(address)
        try:
            conn.call(conn.admin.GetStats, pb.GetStatsRequest(), timeout_s=PROBE_S, retry=False)
        except (BrokerUnavailable, DeadlineExceeded):
            raise
        except EqueueError:
            return

    def _install(
        self, broker: str, topic: str, address: str, old: Consumer | None, new: Consumer
    ) -> None:
        """``new`` reads ``broker``'s group from ``address``, where ``old`` got to."""

        def commit(group: str, offsets: dict[QueueKey, int], member: Member) -> None:
            self._commit_on_master(
                broker, topic, address, group=group, offsets=offsets, member=member
            )

        new.committer = commit
        if old is not None:
            new.adopt(old.positions())
            # Off this thread: leaving a dead broker's group waits for its calls to fail.
            self._pool.submit(old.close)
            log.warning("consumer %s: reading broker group %s from %s now (was %s)",
                        self.consumer_id, broker, address, self._addresses.get(broker))  # fmt: skip
        with self._parts_lock:
            self._parts[broker] = new
            self._addresses[broker] = address
            self._part_topic[broker] = topic

    def _commit_on_master(
        self, broker: str, topic: str, read_from: str, group: str, *,
        offsets: dict[QueueKey, int], member: tuple[str, int] | None,
    ) -> None:  # fmt: skip
        """Commit on the group's master (no waiting for a new master: the
        next commit sends the offsets again). The member identity counts
        only on the broker holding the membership (the one read from)."""
        cluster = self._cluster
        master = cluster.route(topic).entry(broker).address
        why = "the name servers list no master" if not master else "it does not answer"
        if master and not cluster.is_down(master):
            conn = cluster.connection(master)
            try:
                # The connection's retries ride out a blip; a dead master is
                # then skipped (marked down) by the commits that follow.
                commit_offsets(conn, group, offsets, member if master == read_from else None)
                return
            except (BrokerUnavailable, DeadlineExceeded, NotMasterError) as exc:
                cluster.mark_down(master)
                why = str(exc)
        cluster.invalidate(topic)
        raise BrokerUnavailable(
            f"group {group!r}: offsets not committed, broker group {broker!r} has no reachable "
            f"master ({why}); a replica cannot take them, the next commit sends them again"
        )

    def _check_members(self) -> None:
        """Move off members that stopped answering; every ``CHECK_S`` while a
        group is not read from its first choice (the master, or a replica
        with read_from_replicas), fetch its route and move back if it answers."""
        due = time.monotonic() - self._checked >= CHECK_S
        for broker, part in sorted(self.parts().items()):
            with self._parts_lock:
                address, topic = self._addresses[broker], self._part_topic[broker]
            failed = part.failed_polls > 0 or part.failed_heartbeats > 0
            if failed and not self._cluster.is_down(address):  # a new failure: act now
                self._cluster.mark_down(address)
            elif not due:  # nothing new, or a failure acted on already: once a CHECK_S
                continue
            try:
                entry = self._cluster.route(topic).entry(broker)
                if not failed and read_order(entry, self._cluster.config.read_from_replicas,
                                             self._seed)[:1] == [address]:  # fmt: skip
                    continue
                self._cluster.invalidate(topic)
                self._part(broker, topic)
            except EqueueError as exc:
                log.warning("broker group %s: %s", broker, exc)
        if due:
            self._checked = time.monotonic()

    def _refresh_parts(self) -> None:
        """Join the group on every broker of the topics' routes not joined yet."""
        self._refreshed = time.monotonic()
        hosted: dict[str, list[str]] = {}
        for topic in self.topics:
            try:
                route = self._cluster.route(topic)
            except EqueueError as exc:
                log.warning("no route for %s yet: %s", topic, exc)
                continue
            for name in route.broker_names():
                hosted.setdefault(name, []).append(topic)
        for broker, topics in sorted(hosted.items()):
            with self._parts_lock:
                part = self._parts.get(broker)
            if part is not None and sorted(part.topics) == sorted(topics):
                continue
            if part is not None:
                part.close()
                with self._parts_lock:
                    del self._parts[broker]
            try:
                self._part(broker, topics[0], topics)
            except EqueueError as exc:  # down now: the next refresh tries again
                log.warning("cannot join on broker %s: %s", broker, exc)

    def parts(self) -> dict[str, Consumer]:
        """The single-broker consumers, by broker name."""
        with self._parts_lock:
            return dict(self._parts)

    # -- what to read --------------------------------------------------------------------

    def assign(self, topic: str, queue_ids: Iterable[int], broker: str = "") -> None:
        """Read exactly these queues of ``broker`` (required in a cluster)."""
        if not broker:
            raise InvalidRequest(
                f"in a cluster a queue of {topic!r} is (broker, queue id): give broker="
            )
        self._part(broker, topic).assign(topic, queue_ids)

    def assignments(self) -> list[tuple[str, str, int]]:
        """(broker, topic, queue id) of every queue read."""
        return sorted((b, t, q) for b, part in self.parts().items() for t, q in part.assignment())

    def assignment(self) -> list[QueueKey]:
        """(topic, queue id) of every queue read; ``assignments`` names the brokers."""
        return [(t, q) for _, t, q in self.assignments()]

    def members(self) -> list[str]:
        return sorted({m for part in self.parts().values() for m in part.members()})

    def seek(self, topic: str, queue_id: int, offset: int, broker: str = "") -> None:
        self._named(topic, broker).seek(topic, queue_id, offset)

    def position(self, topic: str, queue_id: int, broker: str = "") -> int:
        return self._named(topic, broker).position(topic, queue_id)

    def _named(self, topic: str, broker: str) -> Consumer:
        part = self.parts().get(broker)
        if part is None:
            raise InvalidRequest(f"{topic}: broker {broker!r} is not read by this consumer")
        return part

    # -- reading -------------------------------------------------------------------------

    def poll(self, timeout_s: float = 1.0) -> list[Message]:
        if self._deferred is not None:
            error, self._deferred = self._deferred, None
            raise error
        if (
            self.topics
            and time.monotonic() - self._refreshed >= self._cluster.config.route_refresh_s
        ):
            self._refresh_parts()
        parts = list(self.parts().values())
        deadline = time.monotonic() + timeout_s
        while True:
            if not parts:
                self._closed.wait(min(timeout_s, self.SLICE_S))
                return []
            slice_s = min(self.SLICE_S, max(0.0, deadline - time.monotonic()))
            futures = [self._pool.submit(part.poll, slice_s) for part in parts]
            messages: list[Message] = []
            errors: list[EqueueError] = []
            for future in futures:
                try:
                    messages += future.result()
                except EqueueError as exc:
                    errors.append(exc)
            self._check_members()
            parts = list(self.parts().values())
            if errors:
                if not messages:
                    raise errors[0]
                self._deferred = errors[0]
            if messages or time.monotonic() >= deadline or self._closed.is_set():
                return messages

    # -- progress ------------------------------------------------------------------------

    def commit(self) -> None:
        """Commit on every broker (each keeps the offsets of its own queues)."""
        errors = []
        for broker, part in sorted(self.parts().items()):
            try:
                part.commit()
            except EqueueError as exc:
                errors.append(name_broker(exc, broker, self._addresses.get(broker, "")))
        if errors:
            raise errors[0]

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        for part in self.parts().values():
            part.close()
        self._pool.shutdown(wait=True)
        self._cluster.close()


Consumer.cluster_class = ClusterConsumer
