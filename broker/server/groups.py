"""Consumer-group membership and queue ownership, from heartbeats.

A consumer heartbeats about every second with its group and topics; one that
has been silent for ``timeout_s`` is dropped. Joining gives a member a
``session``, a number no other membership on this broker gets (the counter
starts at the wall clock in ns, so it also differs across restarts): pulls
and commits carry it, so a member that expired and joined again cannot go on
with what it read before.

Ownership (RocketMQ's queue lock, fenced by the session): each heartbeat the
broker computes ``allocate_average`` of a topic's consumer-visible queues over
the topic's live subscribers, and grants the caller the lock of every queue
allocated to it that no live member holds. A holder whose queue is allocated
elsewhere is told so (``revoked``); it commits, then releases the lock, and
only then can the new owner get it. A lock lives as long as its holder's
membership, so a member that stops heartbeating loses its queues after
``timeout_s``. Pulls and commits by a member that does not hold the queue
are refused (``NotOwner``), as are commits from outside the group on a queue
a live member holds. See the "Queue ownership" section of broker.proto.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from equeue_broker.storage.errors import LimitExceeded, PreconditionFailed
from equeue_proto.protocol import allocate_average

MAX_CONSUMERS_PER_GROUP = 1024
MAX_TOPICS_PER_CONSUMER = 1024
MAX_LOCKS_PER_GROUP = 65_536
"""Queue locks one group may hold (one per queue of its subscribed topics)."""

QueueKey = tuple[str, int]


class NotOwner(PreconditionFailed):
    """A pull or commit on a queue the caller does not hold (a rebalance is under way)."""


@dataclass
class _Member:
    last_seen: float
    topics: frozenset[str]
    session: int


@dataclass
class _Group:
    members: dict[str, _Member] = field(default_factory=dict)
    locks: dict[QueueKey, str] = field(default_factory=dict)
    """(topic, queue) -> consumer id of its holder, always a live member."""


@dataclass
class Membership:
    """What a heartbeat tells the caller."""

    session: int
    members: list[str]
    owned: dict[str, list[int]]
    """Per topic: queues the caller holds and is allocated: read these."""
    revoked: dict[str, list[int]]
    """Per topic: queues the caller holds but must give up (commit, then release)."""


class ConsumerRegistry:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}
        self._sessions = itertools.count(time.time_ns())

    def heartbeat(
        self,
        group: str,
        consumer_id: str,
        queues: Mapping[str, Sequence[int]],
        released: Iterable[QueueKey] = (),
        check_topic: Callable[[str], None] | None = None,
    ) -> Membership:
        """Record a heartbeat from a member subscribed to ``queues`` (topic ->
        consumer-visible queue ids): release what it gave up, grant what it may
        take, and say what it holds. ``check_topic`` (the caller's token scope)
        runs on every topic the live members subscribe to, under the lock, so
        no one joins in between and the caller never sees a group it may not."""
        now = self._clock()
        with self._lock:
            state = self._live_group(group, now)
            if check_topic is not None:
                for topic in sorted({t for m in state.members.values() for t in m.topics}):
                    check_topic(topic)
            state = self._live_group(group, now, create=True)
            member = state.members.get(consumer_id)
            if member is None:
                if len(state.members) >= MAX_CONSUMERS_PER_GROUP:
                    raise LimitExceeded(
                        f"group {group!r} has {len(state.members)} consumers already"
                    )
                member = _Member(now, frozenset(queues), next(self._sessions))
                state.members[consumer_id] = member
            member.last_seen = now
            member.topics = frozenset(queues)
            for key in released:
                if state.locks.get(key) == consumer_id:
                    del state.locks[key]
            owned = {t: self._grant(group, state, consumer_id, t, q) for t, q in queues.items()}
            keep = {(t, q) for t, queue_ids in owned.items() for q in queue_ids}
            revoked: dict[str, list[int]] = {topic: [] for topic in queues}
            for key, holder in list(state.locks.items()):
                if holder != consumer_id or key in keep:
                    continue
                if key[0] in queues:
                    revoked[key[0]].append(key[1])
                else:  # a topic it no longer subscribes to is no longer read by it
                    del state.locks[key]
            return Membership(
                member.session,
                sorted(state.members),
                owned,
                {topic: sorted(queue_ids) for topic, queue_ids in revoked.items()},
            )

    def _grant(
        self, group: str, state: _Group, consumer_id: str, topic: str, queue_ids: Sequence[int]
    ) -> list[int]:
        """The queues of ``topic`` allocated to the caller whose lock it holds,
        taking the free ones."""
        subscribers = [c for c, m in state.members.items() if topic in m.topics]
        owned = []
        for queue_id in allocate_average(queue_ids, subscribers).get(consumer_id, []):
            holder = state.locks.get((topic, queue_id))
            if holder is None:
                if len(state.locks) >= MAX_LOCKS_PER_GROUP:
                    raise LimitExceeded(
                        f"group {group!r} holds {len(state.locks)} queue locks already"
                    )
                state.locks[(topic, queue_id)] = holder = consumer_id
            if holder == consumer_id:
                owned.append(queue_id)
            # else: its holder gives it up after its next heartbeat; we take it then.
        return owned

    def check_owner(
        self, group: str, consumer_id: str, session: int, keys: Iterable[QueueKey]
    ) -> None:
        """Raise ``NotOwner`` unless membership (consumer_id, session) holds every queue."""
        now = self._clock()
        with self._lock:
            state = self._live_group(group, now)
            member = state.members.get(consumer_id)
            for topic, queue_id in keys:
                if member is None or member.session != session:
                    raise NotOwner(
                        f"group {group!r}: consumer {consumer_id!r} is not a member with "
                        f"session {session} (rebalance in progress; heartbeat to join again)"
                    )
                holder = state.locks.get((topic, queue_id))
                if holder != consumer_id:
                    raise NotOwner(
                        f"group {group!r}: consumer {consumer_id!r} does not hold queue "
                        f"{topic}/{queue_id} (rebalance in progress; "
                        f"{'no one holds it' if holder is None else 'another member holds it'})"
                    )

    def check_unheld(self, group: str, keys: Iterable[QueueKey]) -> None:
        """Raise ``NotOwner`` if a live member holds one of the queues: a commit from
        outside the group must not move an offset under a member's feet."""
        now = self._clock()
        with self._lock:
            state = self._live_group(group, now)
            for topic, queue_id in keys:
                holder = state.locks.get((topic, queue_id))
                if holder is not None:
                    raise NotOwner(
                        f"group {group!r}: live consumer {holder!r} holds queue "
                        f"{topic}/{queue_id}; only it may commit there (stop the group's "
                        "consumers first)"
                    )

    def leave(self, group: str, consumer_id: str) -> list[str]:
        """Drop a consumer that is closing (and its locks); return the remaining members."""
        now = self._clock()
        with self._lock:
            state = self._live_group(group, now)
            if state.members.pop(consumer_id, None) is not None:
                self._drop_locks(state)
                if not state.members:
                    self._groups.pop(group, None)
            return sorted(state.members)

    def live(self, group: str, topic: str | None = None) -> list[str]:
        """Live consumers of a group (subscribed to ``topic`` if given), sorted."""
        now = self._clock()
        with self._lock:
            state = self._live_group(group, now)
            return sorted(c for c, m in state.members.items() if topic is None or topic in m.topics)

    def topics(self, group: str) -> set[str]:
        """The topics the group's live members subscribe to."""
        now = self._clock()
        with self._lock:
            state = self._live_group(group, now)
            return {t for m in state.members.values() for t in m.topics}

    def groups(self) -> list[str]:
        now = self._clock()
        with self._lock:
            for group, state in list(self._groups.items()):
                self._expire(group, state, now)
            return sorted(self._groups)

    def forget(self, group: str) -> None:
        with self._lock:
            self._groups.pop(group, None)

    def _live_group(self, group: str, now: float, create: bool = False) -> _Group:
        """The group's state with expired members (and their locks) gone; an empty
        one, not kept unless ``create`` (only heartbeats add groups)."""
        state = self._groups.get(group, _Group())
        self._expire(group, state, now)
        if create:
            self._groups[group] = state
        return state

    def _expire(self, group: str, state: _Group, now: float) -> None:
        expired = [c for c, m in state.members.items() if now - m.last_seen > self._timeout_s]
        for consumer_id in expired:
            del state.members[consumer_id]
        if expired:
            self._drop_locks(state)
        if not state.members:
            self._groups.pop(group, None)

    @staticmethod
    def _drop_locks(state: _Group) -> None:
        """Locks die with their holder's membership."""
        for key in [k for k, h in state.locks.items() if h not in state.members]:
            del state.locks[key]
