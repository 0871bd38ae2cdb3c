"""The data directory's lock: one store (or offline tool) at a time."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from equeue_broker.storage.errors import PreconditionFailed


def lock_data_dir(root: Path) -> int:
    """flock ``<root>/LOCK``; the fd holding it, or ``PreconditionFailed`` if
    another store (a running broker) has it."""
    fd = os.open(root / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise PreconditionFailed(f"data directory {root} is in use by another store") from None
    return fd
