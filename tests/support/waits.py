"""Bounded polling, for conditions that have no event to wait on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float = 60.0) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout_s``.

    For conditions with no event to wait on (rows reaching a Spark sink, a
    group's lag on the broker): the poll is the readiness signal, bounded.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.1)


def wait_routed(admin: Any, topic: str, queues: int, timeout_s: float = 30.0) -> None:
    """Wait until the name servers route all ``queues`` of a new ``topic``: brokers
    register new topics with their next heartbeat, so a call routed by topic
    (``set_schema``, ``route``) right after ``create_topic`` may get NOT_FOUND."""
    from equeue_spark.client.errors import NotFoundError

    def routed() -> bool:
        try:
            return len(admin.route(topic).queues()) == queues
        except NotFoundError:
            return False

    wait_for(f"{topic} routed ({queues} queues)", routed, timeout_s)
