"""The store's maintenance loop: periodic steps on a background thread.

``Store`` runs ``maintain`` on its thread with its steps (flush, persist
offsets, expire transactions, apply retention). Each step runs even if another
failed: retention and expiry free the disk space whose lack may be why a
flush fails.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from equeue_broker.storage.errors import StorageError, StoreClosed

log = logging.getLogger("equeue_broker.storage.store")

Step = tuple[str, Callable[[], object], float | None]
"""(name, call, period in seconds; None: every interval)."""


def maintain(stop: threading.Event, interval_s: float, steps: Sequence[Step]) -> None:
    """Run ``steps`` every ``interval_s`` (or their own period) until ``stop`` is
    set or a step finds the store closed. A failed step is retried next interval."""
    due = {name: time.monotonic() for name, _, period in steps if period is not None}
    errors: dict[str, str] = {}
    while not stop.wait(interval_s):
        for name, step, period in steps:
            now = time.monotonic()
            if name in due and now < due[name]:
                continue
            try:
                step()
            except StoreClosed:
                return
            except Exception as exc:  # logged once per distinct failure, not per interval
                if errors.get(name) != str(exc):
                    log.error("background %s failed (retrying): %s", name, exc,
                              exc_info=not isinstance(exc, StorageError))  # fmt: skip
                    errors[name] = str(exc)
                continue
            errors.pop(name, None)
            if period is not None:
                due[name] = now + period
