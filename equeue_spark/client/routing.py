"""Where a client's calls go: one broker is a cluster of one.

``Routes`` is the one view of the brokers that ``Producer``, ``Consumer``,
``Admin``, the CLI and the Spark connector use (aiokafka's
``ClusterMetadata`` is the model): a topic's route lists its broker groups,
each with its master, replicas and queues. Two implementations:

- ``StaticRoutes``: a broker address (``broker=`` or ``$EQUEUE_BROKER``).
  Every topic has one broker group, named ``""`` (a single broker's queues
  are named by their id alone, as they always were: ``Message.broker_id``,
  ``QueueInfo.broker`` and Spark's offsets stay as before), whose master is
  that address and whose queues are the broker's own.
- ``NameServerRoutes`` (cluster.py): routes from name servers, cached.

``cluster.connect(config)`` picks one by the settings; nothing else in the client
asks which one it has (tests/project/test_one_shape.py): where the two differ
it is a method here with one meaning and two implementations (``names_groups``
and ``misnamed``, answered by the class, so also before connecting through
``cluster.routes_type``; ``shown_group``; ``group``; ``leave_out``;
``send_requests``' ``pipeline``). ``Routes`` also owns what to do when a member fails,
the only failover code of the client: ``on_master`` (writes: the group's
master, the route fetched again and the call retried there until
``failover_timeout_s``), ``on_master_now`` (offset commits: the master or an
error at once, the next commit sends them again), ``read_on`` (reads: the
members in read order, the next one when one does not answer),
``reader_on`` (the member a consumer reads a group from, probed; moving
back once the first choice answers, ``keep_reader``) and ``on_any`` (a
keyless batch: any group with a writable queue). ``members_in_turn`` is
the loop over a group's members that reads use, a Spark read task's too.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.batches import stream_requests
from equeue_spark.client.connection import ClientConfig, Connection
from equeue_spark.client.errors import (
    BrokerUnavailable,
    DeadlineExceeded,
    EqueueError,
    InvalidRequest,
    NotFoundError,
    NotMasterError,
    NotSent,
    PermissionDeniedError,
)
from equeue_spark.client.replica_reads import DOWN_S, DownMarks, read_order
from equeue_spark.client.route import Route, name_broker, split_request
from equeue_spark.client.transactions import abort_transactions

PROBE_S = 1.0
"""Deadline of the call that checks a broker group's member answers before reading there."""

T = TypeVar("T")

log = logging.getLogger(__name__)

Brokers = Sequence[str | None] | None
"""The broker group of each message's explicit queue id (``brokers=``), or None."""
Routed = tuple[pb.ProduceRequest, Brokers]
"""A produce request and the groups of its explicit queue ids."""

Pipeline = Callable[[Connection, Iterable[Routed]], Iterator[Any]]
"""How a producer pipelines requests on one ``ProduceStream`` to one broker
(an idempotent producer stamps each as it leaves): ``Routes.send_requests``."""

Call = Callable[[Connection, bool], T]
"""A call on one member: ``(connection, may_retry)``. ``may_retry`` is False
when a failure is better retried elsewhere (another member, the group's new
master) than on the same connection."""


def members_in_turn(
    addresses: Sequence[str],
    attempt: Callable[[str, bool], Iterator[T]],
    moved: Callable[[str, EqueueError], None],
) -> Iterator[T]:
    """What ``attempt(address, last)`` yields on the first of ``addresses``;
    when a member does not answer (BrokerUnavailable, DeadlineExceeded, also
    part way through), ``moved(address, error)`` and the next one's, to the
    last, whose error is raised. The one loop over a group's members: reads
    (``Routes.read_on``), a consumer's member (``Routes.reader_on``) and a
    Spark read task's range (read_task.py) go through it."""
    for index, address in enumerate(addresses):
        last = index == len(addresses) - 1
        try:
            yield from attempt(address, last)
            return
        except (BrokerUnavailable, DeadlineExceeded) as exc:
            if last:
                raise
            moved(address, exc)


class Routes:
    """Routes and broker connections of one client (thread-safe)."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._connections: dict[str, Connection] = {}
        self._down = DownMarks()
        self._waits: set[str] = set()
        """Broker groups whose writes wait for a new master (logged once each)."""

    # -- what an implementation says -------------------------------------------------

    def route(self, topic: str, refresh: bool = False) -> Route:
        """The topic's route, from the cache while it is fresh."""
        raise NotImplementedError

    def invalidate(self, topic: str) -> None:
        """Fetch the route again at its next use (after an error on it)."""

    def brokers(
        self, cluster: str = "", include_down: bool = False, with_topic_names: bool = False
    ) -> list[pb.BrokerEntry]:
        """The live brokers; with ``include_down`` also those the name servers
        remember as down (``BrokerEntry.state``)."""
        raise NotImplementedError

    def broker_address(self, broker: str) -> str:
        """A broker group's master, topic-independent."""
        raise NotImplementedError

    def group(self, broker: str, missing: str) -> str:
        """The broker group a call about one queue (or transaction) goes to:
        ``broker``; none given, the only group if there is one, else
        InvalidRequest(``missing``)."""
        raise NotImplementedError

    def only_address(self, what: str) -> str:
        """The one broker a call about a broker (not a topic) goes to;
        InvalidRequest naming ``what`` where there are many."""
        raise NotImplementedError

    def message_address(self, message_id: str) -> str:
        """The broker that stored the message ``message_id`` names."""
        raise NotImplementedError

    @classmethod
    def names_groups(cls) -> bool:
        """Whether queues are named (broker group, queue id) rather than by id
        alone; a message's ``broker`` is then its group's name, which routes
        list. The class answers, so a question asked before connecting (Spark's
        filter pushdown) gets it from ``cluster.routes_type``."""
        raise NotImplementedError

    @classmethod
    def misnamed(cls, group: str) -> bool:
        """Whether a queue named with broker group ``group`` (``""``: by its id
        alone) is named for the other kind of routes, so it can never be one of
        these routes' queues (a checkpoint's offsets written by a query of the
        other kind)."""
        return bool(group) != cls.names_groups()

    @classmethod
    def misnamed_why(cls, shown: str, topic: str, ref: tuple[str, int]) -> str | None:
        """Why the queue ``shown`` of ``topic`` (``ref``: its broker group, ``""``
        for none, and id) can never be one of these routes' queues, with how
        to write it; None when it can be (``misnamed``)."""
        return cls._naming_hint(shown, topic, ref) if cls.misnamed(ref[0]) else None

    @classmethod
    def _naming_hint(cls, shown: str, topic: str, ref: tuple[str, int]) -> str:
        raise NotImplementedError

    def leave_out(self, group: str, error: EqueueError) -> str:
        """Why ``group``, which does not answer (``error``), is left out of a
        view spanning the broker groups (``Admin.list_topics``,
        ``list_groups``, ``describe_group``) whose other groups answered.
        Raises ``error`` where the group is the whole view (one broker: its
        error is the answer)."""
        return f"not answering: {error}"

    def shown_group(self, broker_id: str) -> str | None:
        """The broker group to show beside a message read from ``broker_id``
        (a cluster's broker ids are its group names), or None where the queue
        id alone names the queue (one broker)."""
        raise NotImplementedError

    kind = ""
    """What these routes read, for messages: "one broker" or "a cluster"."""
    other_kind = ""
    """The kind a checkpoint or an argument of the other shape was written for."""

    def cluster_view(self, what: str) -> None:
        """Nothing where the routes come from name servers (``what`` shows
        what they know); InvalidRequest naming ``what`` for one broker."""
        raise NotImplementedError

    def group_members(self, group: str, given: Sequence[str] | None) -> list[str]:
        """The addresses of broker group ``group``'s members: ``given``
        (a list the caller names) for one broker, else the name servers'
        registrations; InvalidRequest when there is none, or both."""
        raise NotImplementedError

    def groups_of(self, topic: str) -> list[str]:
        """The broker groups hosting ``topic`` (a consumer joins its group on each)."""
        return self.route(topic).broker_names()

    def message_group(self, broker_id: str) -> str:
        """The broker group of a message whose ``Message.broker_id`` is ``broker_id``
        (a broker names itself by its group's name in a cluster)."""
        return broker_id

    # -- members -----------------------------------------------------------------------

    def connection(self, address: str) -> Connection:
        """The one connection to the broker at ``address``."""
        with self._lock:
            conn = self._connections.get(address)
            if conn is None:
                conn = Connection(self.config.for_broker(address))
                self._connections[address] = conn
            return conn

    def broker_connection(self, topic: str, broker: str) -> Connection:
        """The connection to ``broker``'s master, where ``topic``'s route says it is."""
        return self.connection(self.route(topic).address(broker))

    def read_addresses(self, topic: str, broker: str, seed: str = "") -> list[str]:
        """The members of ``broker``'s group that serve ``topic``'s reads, in
        the order to try them (members marked down last)."""
        entry = self.route(topic).entry(broker)
        order = read_order(entry, self.config.read_from_replicas, seed)
        if not order:
            raise BrokerUnavailable(f"broker group {broker!r} has no live member")
        return self._down.order(order)

    def mark_down(self, address: str, for_s: float = DOWN_S) -> None:
        """``address`` failed a call: try it last for ``for_s``."""
        self._down.mark(address, for_s)

    def is_down(self, address: str) -> bool:
        return self._down.is_down(address)

    def keep_reader(
        self, topic: str, broker: str, address: str, failed: bool, seed: str = ""
    ) -> bool:
        """Whether a reader of ``broker``'s group stays on ``address``: its
        calls answer and it is the group's first choice (``reads_first``).
        Otherwise the member is marked down if it ``failed``, the route is
        fetched again at its next use, and ``reader_on`` chooses anew."""
        if not failed and self.reads_first(topic, broker, address, seed):
            return True
        if failed:
            self.mark_down(address)
        self.invalidate(topic)
        return False

    def reads_first(self, topic: str, broker: str, address: str, seed: str = "") -> bool:
        """Whether ``address`` is the member ``broker``'s group is best read
        from (the master; a replica with ``read_from_replicas``)."""
        entry = self.route(topic).entry(broker)
        return read_order(entry, self.config.read_from_replicas, seed)[:1] == [address]

    def probe(self, address: str) -> None:
        """One quick call: does the member answer at all? (Any answer counts,
        a refusal too: a token without the admin role gets PERMISSION_DENIED.)"""
        conn = self.connection(address)
        try:
            conn.call(conn.admin.GetStats, pb.GetStatsRequest(), timeout_s=PROBE_S, retry=False)
        except (BrokerUnavailable, DeadlineExceeded):
            raise
        except EqueueError:
            return

    # -- failover: the one place ---------------------------------------------------------

    def on_master(self, topic: str, broker: str, call: Call[T], deadline: float | None = None) -> T:
        """``call`` on ``broker``'s master. When the master cannot be reached,
        or the broker called is a replica now, the route is fetched again and
        the call retried on the group's master, with backoff, until
        ``deadline`` (monotonic; default: ``failover_timeout_s`` from now),
        then BrokerUnavailable naming the group. The wait is bounded by what
        can end it (the rule in docs/client.md, "A broker down"):

        - a group with replicas in its route waits for a new master, up to
          ``failover_timeout_s``, logging once when it starts waiting and
          once when it has one;
        - a group with no replica cannot fail over: only the broker coming
          back ends the wait, which is bounded by the call's ``timeout_s``;
        - a group the name servers no longer list (its registration expired,
          or it stopped) is not waited for: BrokerUnavailable at once,
          saying so (down or unregistered)."""
        config = self.config
        started = time.monotonic()
        limit = started + config.failover_timeout_s if deadline is None else deadline
        delay = config.backoff_s
        last: EqueueError | None = None
        address = ""
        replicas = True
        for _ in range(100_000):  # bounded by the deadline long before
            entry = self._entry_or_gone(topic, broker, last)
            address = entry.address
            replicas = bool(entry.replica_addresses)
            if address:
                try:
                    result = call(self.connection(address), False)
                except (BrokerUnavailable, DeadlineExceeded, NotMasterError) as exc:
                    self.mark_down(address)
                    last = exc
                else:
                    self._waited(broker, address, started)
                    return result
            else:
                self.invalidate(topic)
            if not replicas:  # nothing to fail over to: the call's own timeout
                limit = min(limit, started + config.timeout_s)
            else:
                self._waiting(broker, address, last, limit - started)
            if time.monotonic() + delay > limit:
                break
            _sleep(delay)
            delay = min(delay * 2, config.max_backoff_s)
        self._gave_up(broker)
        why = f"last error: {last}" if last else "the name servers list no master"
        if not replicas:
            raise BrokerUnavailable(
                f"broker group {broker!r} is unreachable ({why}); "
                f"it has no replica to fail over to, so the client gave up after its "
                f"timeout_s={config.timeout_s:g}; retry once the broker is back"
            )
        waited = min(config.failover_timeout_s, round(limit - started, 1))
        raise BrokerUnavailable(
            f"broker group {broker!r} has no reachable master (waited "
            f"failover_timeout_s={waited:g}; {why}); retry later"
        )

    def _entry_or_gone(self, topic: str, broker: str, last: EqueueError | None) -> pb.BrokerRoute:
        """``broker``'s entry in ``topic``'s route; BrokerUnavailable naming it
        as down or unregistered when the name servers no longer list it."""
        try:
            route = self.route(topic)
        except NotFoundError as exc:  # the topic is on no live broker now
            state = str(exc)
        else:
            try:
                return route.entry(broker)
            except NotFoundError:
                state = (
                    "down: its registration expired, not heard from within the name "
                    "servers' expiry" if broker in route.down
                    else "not registered: stopped, or expired and forgotten"
                )  # fmt: skip
        self._gave_up(broker)
        after = f"; last error: {last}" if last else ""
        raise BrokerUnavailable(
            f"broker group {broker!r} is unreachable: the name servers no longer list it "
            f"for topic {topic!r} ({state}){after}; retry once it is back"
        )

    def _waiting(self, broker: str, address: str, last: EqueueError | None, for_s: float) -> None:
        """Log once per wait that ``broker``'s writes wait for a new master."""
        with self._lock:
            if broker in self._waits:
                return
            self._waits.add(broker)
        why = f"master {address} does not answer ({last})" if address else "it has no master"
        log.warning(
            "broker group %r: %s; writes wait up to %.0f s for a new master",
            broker, why, for_s,
        )  # fmt: skip

    def _waited(self, broker: str, address: str, started: float) -> None:
        """Log once that a wait for ``broker``'s master ended on ``address``."""
        with self._lock:
            if broker not in self._waits:
                return
            self._waits.discard(broker)
        log.info(
            "broker group %r: writing to master %s (waited %.1f s)",
            broker, address, time.monotonic() - started,
        )  # fmt: skip

    def _gave_up(self, broker: str) -> None:
        with self._lock:
            self._waits.discard(broker)

    def read_on(self, topic: str, broker: str, call: Call[T], seed: str = "") -> T:
        """``call`` on the member of ``broker``'s group that serves ``topic``'s
        reads (the master; a replica with ``read_from_replicas``), moving to
        the next member when one does not answer. For reads only: a replica
        refuses writes. A member that is not the last to try does not retry
        on its own (the next member is the better retry)."""
        addresses = self.read_addresses(topic, broker, seed)
        errors: list[str] = []

        def attempt(address: str, last: bool) -> Iterator[T]:
            yield call(self.connection(address), last)

        def moved(address: str, exc: EqueueError) -> None:
            self.mark_down(address)
            errors.append(f"{address}: {exc}")

        try:
            return next(members_in_turn(addresses, attempt, moved))
        except (BrokerUnavailable, DeadlineExceeded) as exc:
            moved(addresses[-1], exc)
        tried = "; ".join(errors)
        raise BrokerUnavailable(f"no member of broker group {broker!r} answers: {tried}")

    def reader_on(
        self, topic: str, broker: str, current: str, start: Callable[[Connection], T],
        seed: str = "",
    ) -> T | None:  # fmt: skip
        """Where a long-lived reader of ``broker``'s group (a consumer's) reads:
        the first member in read order that answers (probed). None when that
        is ``current`` (the reader there stays), or when none answers and
        there is a current reader (it stays: its member may come back); else
        ``start`` on the member's connection. BrokerUnavailable when no member
        answers and there is no reader yet."""
        errors: list[str] = []

        def attempt(address: str, last: bool) -> Iterator[T | None]:
            if address == current:
                yield None
                return
            self.probe(address)
            yield start(self.connection(address))

        def moved(address: str, exc: EqueueError) -> None:
            self.mark_down(address)
            errors.append(f"{address}: {exc}")

        addresses = self.read_addresses(topic, broker, seed)
        try:
            return next(members_in_turn(addresses, attempt, moved))
        except (BrokerUnavailable, DeadlineExceeded) as exc:
            moved(addresses[-1], exc)
        if current:
            return None
        tried = "; ".join(errors)
        raise BrokerUnavailable(f"no member of broker group {broker!r} answers: {tried}")

    def on_master_now(
        self, topic: str, broker: str, call: Call[T], unreachable: Callable[[str], EqueueError]
    ) -> T:
        """``call`` on ``broker``'s master without waiting for a new one (an
        offset commit: the next commit sends the offsets again). A master
        that fails is marked down and skipped by the calls that follow until
        it answers again; ``unreachable(why)`` is raised then."""
        master = self.route(topic).entry(broker).address
        why = "the name servers list no master" if not master else "it does not answer"
        if master and not self.is_down(master):
            try:
                # The connection's retries ride out a blip.
                return call(self.connection(master), True)
            except (BrokerUnavailable, DeadlineExceeded, NotMasterError) as exc:
                self.mark_down(master)
                why = str(exc)
        self.invalidate(topic)
        raise unreachable(why)

    def _writable_in_turn(self, route: Route, start: int) -> list[str]:
        """The groups with a writable queue of ``route``'s topic, round robin
        from ``start``, those that failed lately last (``on_any``, ``on_some``)."""
        writable = {b for b, _ in route.queues("writable")}
        names = [n for n in route.broker_names() if n in writable]
        if not names:
            raise BrokerUnavailable(f"topic {route.topic!r} has no writable queue on a live broker")
        return sorted(
            (names[(start + i) % len(names)] for i in range(len(names))),
            key=lambda n: self.is_down(route.entry(n).address),
        )

    def on_any(self, topic: str, start: int, call: Call[T], again: bool = True) -> tuple[str, T]:
        """``call`` on the master of a group with a writable queue of ``topic``,
        round robin from ``start`` (groups that failed lately last); on one
        that cannot be reached (or a replica, the route being stale), again
        on the next, the route fetched again, until ``failover_timeout_s``.
        Returns (group, result). A non-retriable error (any error without
        ``again``: a staged batch is never sent twice) is raised at once,
        naming its group."""
        config = self.config
        errors: list[str] = []
        delay = config.backoff_s
        deadline = time.monotonic() + max(config.failover_timeout_s, 0.0)
        for _ in range(100_000):  # bounded by the deadline long before
            route = self.route(topic)
            ordered = self._writable_in_turn(route, start)
            for broker in ordered:
                address = route.entry(broker).address
                try:
                    address = route.address(broker)
                    return broker, call(self.connection(address), len(ordered) == 1 and again)
                except EqueueError as exc:
                    if not again or not (exc.retriable or isinstance(exc, NotMasterError)):
                        raise name_broker(exc, broker, address) from exc
                    errors.append(f"{broker}: {exc}")
                    if address:
                        self.mark_down(address, config.max_backoff_s * 5)
                    self.invalidate(topic)
            if time.monotonic() + delay > deadline:
                break
            _sleep(delay)
            delay = min(delay * 2, config.max_backoff_s)
        raise BrokerUnavailable(
            f"no broker of topic {topic!r} took the batch within failover_timeout_s="
            f"{config.failover_timeout_s:g}: " + "; ".join(errors[-3:])
        )

    def on_some(self, topic: str, start: int, call: Callable[[str, Connection], T]) -> T:
        """``call(group, connection to its master)`` on a group with a writable
        queue of ``topic``, round robin from ``start`` (groups that failed
        lately last). A group without a master, or whose call raises
        ``NotSent`` (nothing reached the broker), is left for the next one,
        the route fetched again, until ``failover_timeout_s``; any other error
        is raised: the call decides when a group must be kept (an idempotent
        batch that may have been appended waits for its group's master)."""
        config = self.config
        errors: list[str] = []
        delay = config.backoff_s
        deadline = time.monotonic() + max(config.failover_timeout_s, 0.0)
        for _ in range(100_000):  # bounded by the deadline long before
            route = self.route(topic)
            ordered = self._writable_in_turn(route, start)
            for broker in ordered:
                address = route.entry(broker).address
                try:
                    return call(broker, self.connection(route.address(broker)))
                except NotSent as exc:
                    errors.append(f"{broker}: {exc}")
                    if address:
                        self.mark_down(address, config.max_backoff_s * 5)
                    self.invalidate(topic)
                except BrokerUnavailable as exc:
                    if address:  # raised by a call that reached the broker: its own
                        raise name_broker(exc, broker, address) from exc
                    errors.append(f"{broker}: {exc}")  # no master listed
                    self.invalidate(topic)
            if time.monotonic() + delay > deadline:
                break
            _sleep(delay)
            delay = min(delay * 2, config.max_backoff_s)
        raise BrokerUnavailable(
            f"no broker of topic {topic!r} took the batch within failover_timeout_s="
            f"{config.failover_timeout_s:g}: " + "; ".join(errors[-3:])
        )

    def send_requests(
        self, requests: Iterable[Routed], send: Callable[[pb.ProduceRequest, Brokers], T],
        pipeline: Pipeline | None = None,
    ) -> Iterator[T]:  # fmt: skip
        """Many requests of a producer, each with the broker groups of its
        explicit queue ids: each routed and sent on its own (``send``), which
        is what lets a write fail over. ``pipeline`` is how the producer
        pipelines requests on one stream where the routes have one member to
        send them all to (``StaticRoutes``); None: as they are."""
        return (send(request, brokers) for request, brokers in requests)

    def stage_requests(
        self, requests: Iterable[Routed], txn_id: str,
        stage: Callable[[pb.ProduceRequest, Brokers], dict[str, int]],
    ) -> Iterator[dict[str, int]]:  # fmt: skip
        """Many requests staged in transaction ``txn_id`` (the same id on each
        group they route to), each routed and staged on its own (``stage``:
        messages staged per group). On an error the transaction is aborted on
        the groups that staged some (best effort), and the error raised."""
        staged: set[str] = set()
        try:
            for request, brokers in requests:
                counts = stage(request, brokers)
                staged.update(counts)
                yield counts
        except BaseException:
            for broker in sorted(staged):
                self._abort_quietly(broker, txn_id)
            raise

    def _abort_quietly(self, broker: str, txn_id: str) -> None:
        """Best effort: the driver's commit (by prefix) or the broker's
        timeout aborts the transaction anyway if this fails."""
        try:
            abort_transactions(self.connection(self.broker_address(broker)), [txn_id])
        except EqueueError as exc:
            log.warning("could not abort transaction %s on %r: %s", txn_id, broker, exc)

    def close(self) -> None:
        with self._lock:
            connections = list(self._connections.values())
            self._connections.clear()
        for conn in connections:
            conn.close()


def _sleep(delay: float) -> None:
    time.sleep(delay * (0.5 + random.random()))  # jitter spreads reconnects


class StaticRoutes(Routes):
    """One broker at a fixed address: a cluster of one group, named ``""``.

    A topic's route is the broker's own queues (DescribeTopic), fetched at
    each use that asks for it fresh and cached like a name server's route; a
    topic the broker does not have has a route with the group and no queues
    (the broker decides, as it always did). Its master never changes, so
    ``on_master`` is one call with the connection's own retries.
    """

    def __init__(self, config: ClientConfig) -> None:
        super().__init__(config)
        self.address = config.target
        self._routes: dict[str, Route] = {}

    def route(self, topic: str, refresh: bool = False) -> Route:
        with self._lock:
            cached = self._routes.get(topic)
        limit = self.config.route_refresh_s
        if cached is not None and not refresh and time.monotonic() - cached.fetched < limit:
            return cached
        conn = self.connection(self.address)
        try:
            info = conn.call(conn.admin.DescribeTopic, pb.DescribeTopicRequest(name=topic))
        except (NotFoundError, PermissionDeniedError):
            # Not there yet (the broker creates it with the first message), or a
            # token without the admin role: the broker chooses the queues.
            info = pb.TopicInfo(name=topic)
        entry = pb.BrokerRoute(broker_name="", address=self.address, incarnation=info.incarnation)
        for q in info.queues:
            entry.queues.add(
                queue_id=q.queue_id, writable=q.producer_visible, readable=q.consumer_visible
            )
        route = Route(topic, (entry,), time.monotonic())
        with self._lock:
            self._routes[topic] = route
        return route

    def invalidate(self, topic: str) -> None:
        with self._lock:
            self._routes.pop(topic, None)

    def brokers(
        self, cluster: str = "", include_down: bool = False, with_topic_names: bool = False
    ) -> list[pb.BrokerEntry]:
        return [
            pb.BrokerEntry(broker_name="", address=self.address, routed_master=True, state="live")
        ]

    def broker_address(self, broker: str) -> str:
        if broker:
            raise InvalidRequest(
                f"broker {broker!r}: this client talks to one broker; give namesrv= for a cluster"
            )
        return self.address

    def group(self, broker: str, missing: str) -> str:
        return self.broker_address(broker) and ""

    def only_address(self, what: str) -> str:
        return self.address

    def message_address(self, message_id: str) -> str:
        return self.address

    @classmethod
    def names_groups(cls) -> bool:
        return False

    def shown_group(self, broker_id: str) -> str | None:
        return None

    kind = "one broker"
    other_kind = "a cluster (option namesrv)"

    @classmethod
    def _naming_hint(cls, shown: str, topic: str, ref: tuple[str, int]) -> str:
        return (f"queue {shown} of {topic!r} names broker group {ref[0]!r}, but the query "
                f"reads one broker (option broker): write the queue id alone, e.g. {ref[1]} "
                "(BROKER/QUEUE is for a cluster, option namesrv)")  # fmt: skip

    def cluster_view(self, what: str) -> None:
        raise InvalidRequest(f"{what} needs the cluster's name servers")

    def group_members(self, group: str, given: Sequence[str] | None) -> list[str]:
        if not given:
            raise InvalidRequest(f"name group {group!r}'s members, or the name servers")
        return list(given)

    def groups_of(self, topic: str) -> list[str]:
        return [""]

    def read_addresses(self, topic: str, broker: str, seed: str = "") -> list[str]:
        return [self.broker_address(broker)]

    def message_group(self, broker_id: str) -> str:
        return ""  # a single broker names itself by its data directory's id

    def reads_first(self, topic: str, broker: str, address: str, seed: str = "") -> bool:
        return True

    def leave_out(self, group: str, error: EqueueError) -> str:
        """Never: the one broker is the whole view, and its error the answer."""
        raise error

    def reader_on(
        self, topic: str, broker: str, current: str, start: Callable[[Connection], T],
        seed: str = "",
    ) -> T | None:  # fmt: skip
        """The one member; its reader stays once there is one (no probe: the
        reader's own calls say whether it answers)."""
        return None if current else start(self.connection(self.broker_address(broker)))

    def on_master_now(
        self, topic: str, broker: str, call: Call[T], unreachable: Callable[[str], EqueueError]
    ) -> T:
        return call(self.connection(self.broker_address(broker)), True)

    def on_master(self, topic: str, broker: str, call: Call[T], deadline: float | None = None) -> T:
        """One call with the connection's own retries (one member: nothing to
        fail over to, ``deadline`` aside)."""
        return call(self.connection(self.route(topic).address(broker)), True)

    def read_on(self, topic: str, broker: str, call: Call[T], seed: str = "") -> T:
        return call(self.connection(self.broker_address(broker)), True)

    def on_any(self, topic: str, start: int, call: Call[T], again: bool = True) -> tuple[str, T]:
        return "", call(self.connection(self.address), True)

    def on_some(self, topic: str, start: int, call: Callable[[str, Connection], T]) -> T:
        """The one group: no other to try. A call that found no connection is
        tried again with the connection's backoff (``retries`` times, as any
        call); a refusal that left the batch free (a replica's
        ``NotMasterError``) is raised as itself."""
        delay = self.config.backoff_s
        for attempt in range(self.config.retries + 1):
            try:
                return call("", self.connection(self.address))
            except NotSent as exc:
                if isinstance(exc.__cause__, EqueueError):
                    raise exc.__cause__ from None
                if attempt == self.config.retries:
                    raise
            _sleep(delay)
            delay = min(delay * 2, self.config.max_backoff_s)
        raise AssertionError("unreachable")

    def send_requests(
        self, requests: Iterable[Routed], send: Callable[[pb.ProduceRequest, Brokers], T],
        pipeline: Pipeline | None = None,
    ) -> Iterator[Any]:  # fmt: skip
        """Pipelined on one ``ProduceStream`` call to the broker: by
        ``pipeline`` when given, else as they are, each keyed request's
        queues chosen here first (``split_request``). One group: a queue id
        alone names its queue (the groups given are not needed)."""
        if pipeline is not None:
            return pipeline(self.connection(self.address), requests)
        queued = (self._queued(request) for request, _ in requests)
        return stream_requests(self.connection(self.address), queued)

    def stage_requests(
        self, requests: Iterable[Routed], txn_id: str,
        stage: Callable[[pb.ProduceRequest, Brokers], dict[str, int]],
    ) -> Iterator[dict[str, int]]:  # fmt: skip
        """Pipelined on one ``ProduceStream`` call: the broker stages them in
        the transaction; aborted there on an error (best effort)."""

        def staged() -> Iterator[pb.ProduceRequest]:
            for request, _ in requests:
                request.transaction_id = txn_id
                yield request

        try:
            for results in stream_requests(self.connection(self.address), staged()):
                yield {"": len(results)}
        except BaseException:
            self._abort_quietly("", txn_id)
            raise

    def _queued(self, request: pb.ProduceRequest) -> pb.ProduceRequest:
        if len(request.queue_ids) or all(k < 0 for k in request.messages.key_lengths):
            return request  # explicit queues, or keyless: one queue, round robin
        route = self.route(request.topic)
        writable = route.queues("writable")
        sticky = writable[0] if writable else ("", 0)
        ((_, part),) = split_request(request, writable, sticky, None, "").values()
        return part
