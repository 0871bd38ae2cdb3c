"""This broker's role in its group now: master or replica, its master, its epoch.

Set at start from ``--role``/``--master``; changed at run time by failover
(an election through ZooKeeper, or an operator's promotion). Everything that
depends on the role reads it here, per call, never from the config: the
replica gate (replicas.py), GetStats, the name-server registration and the
replication loops.

The epoch is the newest group epoch this broker has seen (0: no epoch yet,
a group run by hand without promotions). A request stamped with an older one
comes from a deposed master and is refused (``fence``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from equeue_broker.replication.errors import StaleEpoch

MASTER = "master"
REPLICA = "replica"


@dataclass(frozen=True)
class RoleView:
    role: str
    """MASTER or REPLICA."""
    master: str
    """A replica's master (``HOST:PORT``); empty on a master, or when a
    replica's group has no master now."""
    epoch: int
    """The newest group epoch seen."""

    @property
    def is_master(self) -> bool:
        return self.role == MASTER


Listener = Callable[[RoleView, RoleView], None]


class BrokerRole:
    """The current ``RoleView`` (thread-safe; listeners run on the changing thread)."""

    def __init__(self, role: str, master: str = "", epoch: int = 0, why: str = "") -> None:
        self._lock = threading.Lock()
        self._view = RoleView(role, master, epoch)
        self._listeners: list[Listener] = []
        self.why = why
        """What gave this broker its role (GetStats ``role_reason``): an
        operator's flags or call, an election, a replica or name server that
        knew a newer epoch."""
        self.since_ms = int(time.time() * 1000)
        """When it got it (wall clock, ms)."""

    @property
    def view(self) -> RoleView:
        return self._view  # one immutable object: a consistent snapshot

    @property
    def is_master(self) -> bool:
        return self._view.is_master

    def set(self, role: str, master: str = "", epoch: int | None = None, *, why: str) -> RoleView:
        """Change the role (an epoch never goes back) for the reason ``why``;
        tell the listeners."""
        with self._lock:
            old = self._view
            new = RoleView(role, master, old.epoch if epoch is None else max(epoch, old.epoch))
            self._view = new
            if new != old:
                self.why, self.since_ms = why, int(time.time() * 1000)
            listeners = list(self._listeners)
        if new != old:
            for listener in listeners:
                listener(old, new)
        return new

    def see_epoch(self, epoch: int) -> bool:
        """Remember ``epoch`` if newer; True if it was."""
        with self._lock:
            old = self._view
            if epoch <= old.epoch:
                return False
            self._view = RoleView(old.role, old.master, epoch)
            return True

    def fence(self, epoch: int, who: str = "the request") -> None:
        """Refuse ``epoch`` if older than the newest seen (StaleEpoch)."""
        current = self._view.epoch
        if epoch < current:
            raise StaleEpoch(
                f"{who} is from epoch {epoch}, older than this group's epoch {current}: "
                "a deposed master's requests are refused; find the current master"
            )

    def add_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)
