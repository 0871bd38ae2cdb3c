"""Bounded polling, for conditions that have no event to wait on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

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
