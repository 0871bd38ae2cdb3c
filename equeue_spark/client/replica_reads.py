"""Which member of a broker group serves a client's reads.

A broker group (one broker name) is a master and its replicas; a route names
both (``BrokerRoute.address`` and ``replica_addresses``). Reads go to the
master; with ``read_from_replicas`` to a replica, falling back to the master.
A member that just failed a call is "down" for ``DOWN_S``: it is tried last
until then, so reads move to another member at once and come back on their
own (the mark expires, the member is tried first again).

The replica a reader picks is a pure function of the route and a seed (the
consumer group, else empty): every member of a consumer group picks the same
replica, so that replica's queue locks keep the group's members apart, while
different groups spread over the replicas.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Sequence

from equeue_proto.v1 import broker_pb2 as pb

DOWN_S = 5.0
"""How long a member that failed a call is tried last."""


def replica_order(replicas: Sequence[str], seed: str) -> list[str]:
    """``replicas`` sorted, then rotated by the seed's CRC-32: deterministic."""
    ordered = sorted(replicas)
    if not ordered:
        return []
    first = zlib.crc32(seed.encode()) % len(ordered)
    return ordered[first:] + ordered[:first]


def read_order(entry: pb.BrokerRoute, from_replicas: bool, seed: str = "") -> list[str]:
    """The group's members in the order reads try them: the master first
    (replicas first with ``from_replicas``)."""
    replicas = replica_order([a for a in entry.replica_addresses if a != entry.address], seed)
    master = [entry.address] if entry.address else []
    return [*replicas, *master] if from_replicas else [*master, *replicas]


class DownMarks:
    """Members that failed a call lately (thread-safe, bounded)."""

    LIMIT = 1024

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}

    def mark(self, address: str, for_s: float = DOWN_S) -> None:
        with self._lock:
            now = self._clock()
            if len(self._until) >= self.LIMIT:
                self._until = {a: t for a, t in self._until.items() if t > now}
            self._until[address] = now + for_s

    def clear(self, address: str) -> None:
        with self._lock:
            self._until.pop(address, None)

    def is_down(self, address: str) -> bool:
        with self._lock:
            return self._until.get(address, 0.0) > self._clock()

    def order(self, addresses: Sequence[str]) -> list[str]:
        """``addresses`` with the down ones last (each part in its order)."""
        down = [a for a in addresses if self.is_down(a)]
        return [a for a in addresses if a not in down] + down
