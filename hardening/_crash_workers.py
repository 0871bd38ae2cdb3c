"""What the crash loop's scenarios share with their loop (``hardening/_crash_modes.py``):
the worker threads of one cycle (``Workers``) and what a scenario provides
(``Scenario``). Below both the loop and the scenarios (``_crash_delete``,
``_crash_retention``), which import it, so none of them imports another in a
circle. Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Protocol

import grpc

from equeue_broker.testing_checks import details_of, status_of
from hardening._crash_cycle import CycleResult


class Workers:
    """The threads of one cycle of a scenario; ``killed`` is set at the kill,
    ``kill_now`` by a worker that wants the kill at once."""

    def __init__(self) -> None:
        self.killed = threading.Event()
        self.kill_now = threading.Event()
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []
        self.wait_for_kill_s = 0.0
        """Set by a worker that will ask for the kill: how long the loop waits for it."""

    def spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()

    def failed(self, what: str, exc: grpc.RpcError) -> None:
        """A call failed: expected after the kill, else a problem of the cycle."""
        if not self.killed.is_set():
            self.errors.append(f"{what}: {status_of(exc).name} {details_of(exc)}")

    def stop(self, timeout_s: float) -> list[str]:
        """After the kill: wait for every worker; names of those that hang."""
        self.killed.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]


class Scenario(Protocol):
    flags: tuple[str, ...]
    """Broker flags beyond the loop's own."""
    topics: list[str]
    """Topics the final ``Store`` check covers."""

    def setup(self, address: str) -> None: ...

    def start_cycle(self, number: int, address: str, rng: random.Random) -> Workers: ...

    def verify(self, address: str, workers: Workers, outcome: CycleResult) -> None: ...
