"""What a master knows of its replicas.

``ReplicaTracker`` records, per replication stream, the position the replica
asked from last (everything below it is on the replica), its address and when
it last asked; GetStats shows them. (The gate that keeps a replica read-only
is the server's: server/replica_gate.py.)
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

from equeue_broker.storage.errors import LimitExceeded


@dataclass
class ReplicaView:
    address: str
    position: int
    last_seen: float
    connected: bool
    replica_id: str = ""
    """Its data directory's id (ReplicateRequest.replica_id): the in-sync set names it so."""


class ReplicaTracker:
    """The replicas following this master (thread-safe)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._streams: dict[int, ReplicaView] = {}
        self._gone: dict[str, ReplicaView] = {}
        """Replicas whose stream ended, by address (kept so stats show them)."""

    def open(self, address: str) -> int:
        with self._lock:
            live = sum(1 for v in self._streams.values() if v.connected)
            if live >= self.limit:
                raise LimitExceeded(
                    f"replica {address!r} refused: {live} replicas follow this master "
                    f"already (max_replicas={self.limit})"
                )
            slot = next(self._ids)
            self._streams[slot] = ReplicaView(address, 0, time.monotonic(), True)
            return slot

    def update(self, slot: int, address: str, position: int, replica_id: str = "") -> None:
        with self._lock:
            view = self._streams[slot]
            view.address, view.position, view.last_seen = address, position, time.monotonic()
            view.replica_id = replica_id

    def close(self, slot: int) -> None:
        with self._lock:
            view = self._streams.pop(slot)
            view.connected = False
            self._gone[view.address] = view
            while len(self._gone) > self.limit:  # bounded: the oldest goes
                self._gone.pop(next(iter(self._gone)))

    def views(self) -> list[ReplicaView]:
        with self._lock:
            live = {v.address: v for v in self._streams.values()}
            gone = [v for a, v in self._gone.items() if a not in live]
            return sorted([*live.values(), *gone], key=lambda v: v.address)
