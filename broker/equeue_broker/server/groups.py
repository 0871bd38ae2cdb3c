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

Memory is bounded by ``GroupLimits`` (groups, members in all and per group,
queue locks in all): every heartbeat may add a group, so a client naming a new
group each time would otherwise grow the broker without end. Expired members
and empty groups are swept on heartbeats (at most every ``timeout_s / 2``, and
always before a limit refuses), not only when someone lists the groups.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from equeue_broker.storage.errors import LimitExceeded, PreconditionFailed
from equeue_proto.protocol import allocate_average

MAX_LOCKS_PER_GROUP = 65_536
"""Queue locks one group may hold (one per queue of its subscribed topics)."""


@dataclass(frozen=True)
class GroupLimits:
    """What heartbeats may make the broker keep (config.py's settings)."""

    max_groups: int = 1_000
    max_consumers: int = 10_000
    """Members of all groups together."""
    max_consumers_per_group: int = 1_024
    max_queue_locks: int = 262_144
    """Queue locks of all groups together."""


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
    def __init__(
        self,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        limits: GroupLimits = GroupLimits(),
    ) -> None:
        self._timeout_s = timeout_s
        self._clock = clock
        self._limits = limits
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}
        self._sessions = itertools.count(time.time_ns())
        self._last_sweep = clock()
        self._lock_budget = limits.max_queue_locks
        """Locks the heartbeat being served may still grant (set per heartbeat)."""

    def __len__(self) -> int:
        """Groups held in memory (live or not yet swept)."""
        with self._lock:
            return len(self._groups)

    def _sweep(self, now: float, force: bool = False) -> None:
        """Drop expired members and empty groups everywhere; at most every
        ``timeout_s / 2`` unless ``force`` (a limit is about to refuse)."""
        if not force and now - self._last_sweep < self._timeout_s / 2:
            return
        self._last_sweep = now
        for group, state in list(self._groups.items()):
            self._expire(group, state, now)

    def _check_join(self, group: str, state: _Group, now: float) -> None:
        """Raise ``LimitExceeded`` if one more member (maybe in a new group) is too many."""
        limits = self._limits
        if len(state.members) >= limits.max_consumers_per_group:
            raise LimitExceeded(f"group {group!r} has {len(state.members)} consumers already")
        if group not in self._groups and len(self._groups) >= limits.max_groups:
            self._sweep(now, force=True)
            if len(self._groups) >= limits.max_groups:
                raise LimitExceeded(
                    f"{len(self._groups)} consumer groups are live (max_consumer_groups)"
                )
        total = sum(len(g.members) for g in self._groups.values())
        if total >= limits.max_consumers:
            raise LimitExceeded(f"{total} consumers are live in all groups (max_consumers)")

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
        # Interned: thousands of members naming the same topics share one string each.
        topics = frozenset(sys.intern(t) for t in queues)
        with self._lock:
            self._sweep(now)
            state = self._live_group(group, now)
            if check_topic is not None:
                for topic in sorted({t for m in state.members.values() for t in m.topics}):
                    check_topic(topic)
            member = state.members.get(consumer_id)
            if member is None:
                self._check_join(group, state, now)
                member = _Member(now, topics, next(self._sessions))
                state.members[consumer_id] = member
                self._groups[group] = state
            member.last_seen = now
            member.topics = topics
            for key in released:
                if state.locks.get(key) == consumer_id:
                    del state.locks[key]
            self._lock_budget = self._limits.max_queue_locks - sum(
                len(g.locks) for g in self._groups.values()
            )
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
                if self._lock_budget <= 0:
                    raise LimitExceeded("all groups together hold max_queue_locks queue locks")
                self._lock_budget -= 1
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

    def _live_group(self, group: str, now: float) -> _Group:
        """The group's state with expired members (and their locks) gone; an empty
        one is not kept (only a heartbeat's join adds a group)."""
        state = self._groups.get(group, _Group())
        self._expire(group, state, now)
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
