"""A replica's replication loop: follows its master's log (the Replication service).

``Follower`` keeps one stream open to the master named by the broker's role
(role.py; reconnecting with a bounded back-off), applies metadata and schemas, then bytes
(``ReplicaLog.append``), and cuts its log where the master says it ends or
diverges (``truncate``). The master side is master.py (its servicer: server/service_replication.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, ParamSpec, Protocol, TypeVar

import grpc

from equeue_broker.replication.liveness import STALL_S, GoneReport, MasterWatch
from equeue_broker.replication.master import MAX_REPLY_BYTES
from equeue_broker.replication.replica_log import ReplicaLog, decode_metadata
from equeue_broker.replication.role import BrokerRole
from equeue_broker.replication.wire import decode_reply
from equeue_broker.storage import Store
from equeue_broker.storage.config import FlushMode
from equeue_broker.storage.errors import InvalidArgument, StorageError
from equeue_proto.v1 import broker_pb2 as pb

log = logging.getLogger("equeue.replication")

REPLICATE_METHOD = f"/{pb.DESCRIPTOR.services_by_name['Replication'].full_name}/Replicate"


NO_MASTER_POLL_S = 0.1
"""How often a replica with no master looks at its role for one (failover names it)."""
STEADY_S = 1.0
"""A stream that replicated for this long resets the reconnection back-off
(a master that ends every stream at once is retried at most every 2 s)."""
REPEAT_LOG_S = 60.0
"""A replica's failures to replicate from one master are logged at WARNING
once, then summarised at most this often until it replicates again."""


class Failures:
    """Rate-limited warnings of one follower: the first failure in a run of
    failures at once, then one summary per ``every_s`` (how many, the last
    error), and one line when replication resumes (after how long)."""

    def __init__(self, every_s: float = REPEAT_LOG_S, clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self.clock = clock
        self.master = ""
        self.count = 0
        self.since = 0.0
        self.said = 0.0
        """When the last line about this run was logged."""
        self.suppressed = 0

    def failed(self, master: str, message: str, *args: object) -> None:
        now = self.clock()
        if master != self.master:
            self.master, self.count, self.since, self.said, self.suppressed = master, 0, now, 0.0, 0
        self.count += 1
        if self.count == 1:
            log.warning(
                message + " (retrying; repeats are summarised every %.0f s)", *args, self.every_s
            )
            self.said = now
        elif now - self.said >= self.every_s:
            log.warning(
                message + " (%d failed attempts in %.0f s, still retrying)",
                *args, self.suppressed + 1, now - self.said,
            )  # fmt: skip
            self.said, self.suppressed = now, 0
        else:
            self.suppressed += 1

    def resumed(self) -> None:
        """It replicates again: the next failure is news."""
        if self.count:
            log.warning(
                "replication from %s resumed after %d failed attempts over %.1f s",
                self.master, self.count, self.clock() - self.since,
            )  # fmt: skip
        self.master, self.count = "", 0


P = ParamSpec("P")
T = TypeVar("T")


class Runner(Protocol):
    """Where a blocking storage call runs (the server's ``BrokerState``): ``call``
    on the thread pool, ``inline`` on the event loop itself."""

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T: ...

    def inline(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T: ...


class Follower:
    """A replica's replication loop (``run`` until cancelled)."""

    def __init__(
        self,
        store: Store,
        role: BrokerRole,
        runner: Runner,
        *,
        address: str,
        instance_id: str,
        broker_name: str,
        on_master_gone: GoneReport | None = None,
    ) -> None:
        """``on_master_gone(master, epoch)``: the master this follower replicated
        from refuses connections (liveness.py); None: never asked."""
        self.store = store
        self.role = role
        self.runner = runner
        self.replica = ReplicaLog(store)
        self.address = address
        """Where this broker serves (its requests say so)."""
        self.instance_id = instance_id
        """This broker's data directory id (the in-sync set's name for it)."""
        self.broker_name = broker_name
        self.master_end = 0
        self.last_contact = 0.0
        self.stopped: str | None = None
        """Why replication stopped for good (a capacity or name mismatch)."""
        self.metadata_version = 0
        """The master's metadata version of the last reply applied (insync.py)."""
        self.sync_flush = store.config.flush_mode is FlushMode.SYNC
        self.failures = Failures()
        """The failures to replicate, logged rate-limited."""
        self.watch = MasterWatch(on_master_gone)
        """Whether the master is gone, paused or unreachable when it goes silent."""

    async def run(self) -> None:
        watchdog = asyncio.create_task(self._watch_silence())
        try:
            await self._run()
        finally:  # no longer following: nothing holds reads below a master's HW
            watchdog.cancel()
            self.store.set_hw_limit(None)

    async def _watch_silence(self) -> None:
        """A master that stops answering without breaking the stream (paused,
        overloaded, its machine gone) is probed once per silence (liveness.py)."""
        while True:
            await asyncio.sleep(STALL_S / 3)
            master, silent = self.role.view.master, time.monotonic() - self.last_contact
            if master and self.last_contact and silent > STALL_S:
                try:
                    await self.watch.stalled(master, self.role.view.epoch, silent)
                except Exception:  # a bug: said, and the watch goes on
                    log.exception("probing master %s", master)

    async def _run(self) -> None:
        backoff = 0.1
        while self.stopped is None:
            master = self.role.view.master  # read again: failover may change it
            if not master:  # no master now: look again soon (a local read, no call)
                await asyncio.sleep(NO_MASTER_POLL_S)
                continue
            contact, opened = self.last_contact, time.monotonic()
            try:
                async with grpc.aio.insecure_channel(
                    master, options=[("grpc.max_receive_message_length", 64 << 20)]
                ) as channel:
                    await self._follow(channel, master)
            except asyncio.CancelledError:
                raise
            except asyncio.InvalidStateError as exc:  # a write on a stream the master ended
                self.failures.failed(master, "replication from %s: the stream ended (%s)",
                                     master, exc)  # fmt: skip
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    self.stopped = str(exc.details())
                self.failures.failed(master, "replication from %s: %s %s", master,
                                     exc.code().name, exc.details())  # fmt: skip
            except StaleReply as exc:
                self.failures.failed(master, "replication from %s refused: %s", master, exc)
            except (StorageError, OSError) as exc:
                log.error("replication from %s stopped: %s", master, exc)
                self.stopped = str(exc)
            except Exception:  # a bug: said with its traceback, and retried (bounded back-off)
                log.exception("replication from %s failed", master)
            if self.stopped is not None:
                log.error("REPLICATION STOPPED: %s", self.stopped)
                return
            # A dead master's connections are refused at once: say so to the
            # election now rather than after its ZooKeeper session expires.
            await self.watch.broken(master, self.role.view.epoch)
            if self.last_contact > contact and time.monotonic() - opened > STEADY_S:
                backoff = 0.1  # it replicated for a while: a new failure starts over
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _follow(self, channel: grpc.aio.Channel, master: str) -> None:
        self.metadata_version = 0  # a master's versions mean something on its stream only

        def request(position: int | None = None) -> pb.ReplicateRequest:
            end = self.replica.end
            return pb.ReplicateRequest(
                position=end if position is None else position,
                unapplied=0 if position is None else position - end,
                max_bytes=MAX_REPLY_BYTES,
                wait_ms=1000,
                replica_address=self.address,
                chunk_capacity=self.replica.capacity,
                replica_id=self.instance_id,  # the in-sync set's name for it
                metadata_version=self.metadata_version,
                # Fencing and divergence (docs/replication.md, "Epochs in the log").
                epoch=self.role.view.epoch,
                last_epoch=self.store.epochs.last_epoch,
            )

        # Requests are written on the call itself (no request iterator, no queue
        # and task between): the master's sync-mode acks wait for each one.
        # Replies decoded by replication.wire: their log bytes are not copied.
        call: Any = channel.stream_stream(
            REPLICATE_METHOD,
            request_serializer=pb.ReplicateRequest.SerializeToString,
            response_deserializer=decode_reply,
        )()  # type: ignore[call-arg]  # aio: no iterator, write() instead
        await call.write(request())
        name = self.broker_name
        while True:
            received = await call.read()
            if received is grpc.aio.EOF:  # type: ignore[attr-defined]  # (missing from the stubs)
                return
            reply, data = received
            check_reply_epoch(self.role, reply.epoch)
            if self.failures.count:
                self.failures.resumed()
            self.last_contact = time.monotonic()
            self.watch.contact(master, self.role.view.epoch)
            self.master_end = reply.master_end
            if reply.metadata:
                meta = decode_metadata(reply.metadata)
                if name and meta.broker_name != name:
                    raise InvalidArgument(
                        f"the master is broker {meta.broker_name!r}, this replica is {name!r}: "
                        "a replica must have its master's --broker-name (message ids name it)"
                    )
                await self.runner.call(self.replica.apply_metadata, meta)
            if reply.schemas:  # after the topics (a recreated topic's schemas are new)
                await self.runner.call(self.replica.apply_schemas, reply.schemas)
            # Reads here stop at the master's high watermark (set before the bytes
            # it may not cover): below it, every record is on every in-sync
            # member, so a failover cannot lose it.
            self.store.set_hw_limit(reply.high_watermark)
            self.metadata_version = reply.metadata_version  # its metadata is applied
            end = self.replica.end
            # Catching up (the master has more): ask for the next bytes before
            # writing these, so that the master reads and sends while this
            # replica writes. The request says how much is not applied yet.
            after = reply.position + len(data)
            pipelined = bool(data) and after < reply.master_end
            if pipelined:
                await call.write(request(after))
            if data:  # durable here (in sync flush mode fsynced) when it returns
                await self._append(reply.position, data)
            elif reply.position < end:
                await self.runner.call(self.replica.truncate, reply.position)
            if not pipelined:
                await call.write(request())  # at once: in sync replication acks wait for this

    async def _append(self, position: int, data: memoryview) -> None:
        """``ReplicaLog.append``: on the event loop in async flush mode, where it
        never waits for the disk (as that mode's produce on a master), since the
        master's sync-mode acks wait for it and a thread-pool hop costs a
        wake-up; in sync flush mode it fsyncs: on the thread pool."""
        if self.sync_flush:
            await self.runner.call(self.replica.append, position, data)
        else:
            self.runner.inline(self.replica.append, position, data)

    def lag_bytes(self) -> int:
        return max(0, self.master_end - self.replica.end)


class StaleReply(Exception):
    """A reply from a master of an older epoch than this replica has seen."""


def check_reply_epoch(role: BrokerRole, epoch: int) -> None:
    """Refuse (``StaleReply``: nothing applied, reconnect) a reply stamped with an
    epoch older than the newest seen: its master was deposed. A newer one is
    remembered."""
    seen = role.view.epoch
    if epoch < seen:
        raise StaleReply(
            f"the master's reply is from epoch {epoch}, older than epoch {seen}: "
            "it was deposed; not applied"
        )
    role.see_epoch(epoch)
