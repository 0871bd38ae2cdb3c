"""What the store does when a sync-mode round's fsync fails (store.py).

Its appends were not made durable, so they must never become readable, now
or after a restart: they are cut out of the log (and out of the key index),
and the store refuses writes until a restart (after a failed fsync the
kernel's view of the file cannot be trusted; recovery rebuilds it).
"""

from __future__ import annotations

import logging

from equeue_broker.storage.engine import EngineState

log = logging.getLogger("equeue_broker.storage.store")


def abandon_round(state: EngineState, start: int, cause: OSError) -> None:
    """Cut a failed round's appends (from log ``start``) and fail the store."""
    with state.lock:
        state.fail(cause)
        state.visibility.cut(start)
        try:
            message_log = state.log
            if message_log.start_of(message_log.active) <= start < message_log.write_position:
                message_log.truncate(start)
            if state.keys is not None:
                state.keys.truncate(start)
        except OSError as exc:
            log.error("cannot cut a failed round out of the log: %s", exc)
    log.error("fsync failed (%s); the store refuses writes until restarted", cause)
