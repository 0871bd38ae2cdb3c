"""The master side of log replication (the Replication service's logic).

Master side, ``Replicate`` (the gRPC servicer: server/service_replication.py):
one bidirectional stream per replica. Each request carries the position the
replica needs next; each is answered by one reply (flow control by request,
whatever gRPC's windows would allow: at most two replies in flight), built by
``Store.read_log`` (storage/log/positioned.py): up to ``MAX_REPLY_BYTES`` of whole
records within one chunk, or, at the end of the log, an empty reply after at
most the request's ``wait_ms`` (woken through ``LogGrowth`` by the store's
listener when records are appended). The group's metadata rides along when it
changed and at least every ``METADATA_INTERVAL_S`` (encoded only then:
``Store.metadata_generation``). Here: those limits, ``LogGrowth``, and the
epoch checks of a request (fencing, divergence).

The replica side is ``follower.Follower``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from equeue_broker.replication.errors import StaleEpoch
from equeue_broker.replication.role import REPLICA, BrokerRole
from equeue_broker.storage import Store
from equeue_proto.v1 import broker_pb2 as pb

log = logging.getLogger("equeue.replication")

MAX_REPLY_BYTES = 4 << 20
"""Most log bytes in one reply (at least one record is sent, whatever its size):
a 1,000-message batch of 1 KiB messages fits one (a sync-mode ack waits for
every reply its write needs)."""
MAX_WAIT_MS = 10_000
"""Longest a request may ask the master to wait at the end of the log."""
METADATA_INTERVAL_S = 2.0
"""Metadata is sent at least this often (and whenever it changes)."""
HW_LINGER_S = 0.02
"""Sync mode: a new high watermark alone waits this long for records to ride
with. Every ack moves the HW: sent at once, each write would cost a second
exchange with each replica (CPU both sides, on a shared machine the writes'
own). A replica's reads lag the master's by at most this much more; a HW
lower than the master's is never unsafe (it hides, never shows)."""


class LogGrowth:
    """Wakes replication streams parked at the end of the log."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.get_ident()
        """The loop's thread (this is built on it)."""
        self._event = asyncio.Event()
        self.waiting = 0
        self.wakes = 0
        """Counts ``wake`` calls: a stream that read before one re-reads instead
        of parking (the wake may have come while it was not waiting yet)."""

    def notify_threadsafe(self, _topic: str, _queue_id: int, _end: int) -> None:
        """A store listener (any thread): records became readable."""
        if not self.waiting:
            return
        if threading.get_ident() == self._thread:  # an append on the loop (async flush)
            self._wake()  # no self-pipe write and extra loop pass per write
        else:
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def wake(self) -> None:
        """On the loop: wake the parked streams (sync replication: a write is
        durable here, or the high watermark or the metadata version moved)."""
        self.wakes += 1
        if self.waiting:
            self._wake()

    async def wait(self, timeout_s: float) -> None:
        event = self._event
        self.waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)
        finally:
            self.waiting -= 1


# -- epochs: fencing and divergence (docs/replication.md, "Epochs in the log") --------


def check_request_epoch(role: BrokerRole, request: pb.ReplicateRequest, replica: str) -> int:
    """This master's epoch, to stamp the reply with. A replica that has seen a
    newer epoch means this master was deposed: it stops taking writes (a replica
    with no master, until told or elected) and refuses the stream (StaleEpoch)."""
    view = role.view
    if request.epoch > view.epoch and view.is_master:
        role.set(
            REPLICA, "", request.epoch,
            why=f"deposed: replica {replica} has seen epoch {request.epoch}",
        )  # fmt: skip
        log.error(
            "DEPOSED: replica %s has seen epoch %d, this master is of epoch %d: no longer "
            "taking writes", replica, request.epoch, view.epoch,
        )  # fmt: skip
    view = role.view
    if not view.is_master:
        raise StaleEpoch(
            f"this broker is not the master of epoch {request.epoch or view.epoch} (it is a "
            f"replica of {view.master or 'no master now'}, epoch {view.epoch}): "
            "replicate from the current master"
        )
    return view.epoch


def divergence(store: Store, last_epoch: int, log_end: int) -> int | None:
    """Where a replica whose log ends at ``log_end`` with epoch ``last_epoch``
    must cut it, if it goes beyond the end of that epoch on this log (an old
    master's tail this master never had); else None. (A pipelined request's
    unapplied bytes came from this master: only the applied log can diverge.)"""
    end = store.epochs.end_of(last_epoch)
    return end if end is not None and log_end > end else None
