"""Consumer-group membership: who is alive, from heartbeats.

A consumer heartbeats about every second with its group and topics; one that
has been silent for ``timeout_s`` is dropped. Queue assignment is computed by
every member from the same member list (``equeue_proto.protocol.allocate_average``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from equeue_broker.storage.errors import LimitExceeded

MAX_CONSUMERS_PER_GROUP = 1024
MAX_TOPICS_PER_CONSUMER = 1024


@dataclass
class _Member:
    last_seen: float
    topics: frozenset[str]


class ConsumerRegistry:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, _Member]] = {}

    def heartbeat(self, group: str, consumer_id: str, topics: frozenset[str]) -> list[str]:
        """Record a heartbeat; return the group's live consumer ids, sorted."""
        now = self._clock()
        with self._lock:
            self._expire(group, self._groups.get(group, {}), now)
            members = self._groups.setdefault(group, {})
            if consumer_id not in members and len(members) >= MAX_CONSUMERS_PER_GROUP:
                raise LimitExceeded(f"group {group!r} has {len(members)} consumers already")
            members[consumer_id] = _Member(now, topics)
            return sorted(members)

    def leave(self, group: str, consumer_id: str) -> list[str]:
        """Drop a consumer that is closing; return the remaining members."""
        now = self._clock()
        with self._lock:
            members = self._groups.get(group, {})
            members.pop(consumer_id, None)
            self._expire(group, members, now)
            return sorted(members)

    def live(self, group: str, topic: str | None = None) -> list[str]:
        """Live consumers of a group (subscribed to ``topic`` if given), sorted."""
        now = self._clock()
        with self._lock:
            members = self._groups.get(group, {})
            self._expire(group, members, now)
            return sorted(c for c, m in members.items() if topic is None or topic in m.topics)

    def topics(self, group: str) -> set[str]:
        with self._lock:
            return {t for m in self._groups.get(group, {}).values() for t in m.topics}

    def groups(self) -> list[str]:
        now = self._clock()
        with self._lock:
            for group, members in list(self._groups.items()):
                self._expire(group, members, now)
            return sorted(self._groups)

    def forget(self, group: str) -> None:
        with self._lock:
            self._groups.pop(group, None)

    def _expire(self, group: str, members: dict[str, _Member], now: float) -> None:
        for consumer_id in [c for c, m in members.items() if now - m.last_seen > self._timeout_s]:
            del members[consumer_id]
        if not members:
            self._groups.pop(group, None)
