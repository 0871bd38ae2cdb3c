"""A master's in-sync set (ISR) and the waits of sync replication.

Members are named by their data directory's id (``BrokerState.instance_id``:
a group's brokers share their broker name, not this). The master is always a
member, listed first. A replica

- **joins** when its log end (the position its replication request asks
  from) has reached the master's log end, either now or as the master's
  previous reply to it left it, with the metadata that reply carried; in sync
  mode also the high watermark, so that the HW never goes back;
- **leaves** when it has not been caught up for ``--replica-lag-max-ms``
  (Kafka's ``replica.lag.time.max.ms``: checked every ``check_s`` and by
  waiting writes), or at once when its stream ends.

Positions count only where the master agreed they are record boundaries of
its own log (``progress``). ``on_isr_change(members)`` is called with the new
set, the master's own id first, whenever it changes (on the event loop: it
must be quick; the ZooKeeper wiring hands it to its own thread).

Sync mode (``--replication sync``): ``replicated(write)`` runs a write (a
produce, a transaction commit, an offset commit) and returns once it is
durable on every in-sync replica: the replica's next request asks from at or
beyond the log end after the write (positions are sent only once durable on
the master, and a replica asks again only once it applied, and in sync flush
mode fsynced, what it got), or, for an offset commit, reports a
``metadata_version`` at or beyond the one the commit made. Fewer members than
``--min-insync-replicas`` refuse the write before it starts; a set that falls
below it while the write waits fails it after the fact (``NotEnoughReplicas``,
UNAVAILABLE, Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND). Waits are futures on
the event loop, at most ``max_replication_waits`` at once (a slot is taken
before writing), each bounded by the lag limit.

The replicated **high watermark**: the lowest log end of the in-sync replicas
is the store's visibility limit (``Store.set_hw_limit``; None when no replica
is in sync), so readers on the master see a record only once it is durable
here and on every in-sync member. The HW (``Store.high_watermark``) is sent in
every replication reply; replicas serve reads only below it. Async mode sets
no limit: the HW is the log end and nothing waits. While this broker is a
replica the limit is its follower's (the master's HW); failover calls
``reset`` when it becomes master (no replica in sync yet, no limit).

Everything here runs on the event loop; nothing takes a lock.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from equeue_broker.replication.errors import NotEnoughReplicas
from equeue_broker.replication.role import BrokerRole
from equeue_broker.storage import Store

log = logging.getLogger("equeue.replication")

T = TypeVar("T")

CHECK_MIN_S = 0.01
CHECK_MAX_S = 0.25
"""The lag check runs every tenth of the lag limit, within these bounds."""
WAIT_SLACK_S = 1.0
"""A wait ends at the lag limit plus this even if no check removed anybody (a bug guard)."""


@dataclass
class Member:
    """A replica as the in-sync set sees it."""

    member_id: str
    stream: int
    """The replication stream it reports on (a reconnect opens a new one)."""
    position: int = 0
    """Its log end: everything below is on it (durable in its flush mode's meaning)."""
    metadata_version: int = 0
    caught_up_at: float = -math.inf
    """The last time it had everything the master had (log and metadata)."""
    offered_end: int = -1
    """The master's log end when it built its last reply to it (-1: none yet)."""
    offered_version: int = 0
    offered_at: float = 0.0
    in_sync: bool = False


@dataclass(frozen=True)
class _Target:
    position: int
    metadata_version: int


class Slots(Protocol):
    """A budget of waiting writes: ``acquire`` waits for room (raising
    ``LimitExceeded`` when none comes in time) and returns what it took."""

    async def acquire(self, nbytes: int, wait_s: float | None = None) -> int: ...

    def release(self, taken: int) -> None: ...


class InSyncSet:
    """The master's in-sync set; ``sync`` makes writes wait for it."""

    def __init__(
        self,
        store: Store,
        own_id: str,
        group: str,
        *,
        sync: bool,
        min_insync: int,
        lag_max_s: float,
        slots: Slots,
        role: BrokerRole | None = None,
    ) -> None:
        """``slots``: the budget of writes waiting at once (``max_replication_waits``;
        the server's ``ByteBudget``, counting slots)."""
        self.store = store
        self.role = role
        """This broker's role: a replica's visibility limit is its follower's to set."""
        self.own_id = own_id
        self.group = group
        self.sync = sync
        self.min_insync = min_insync
        self.lag_max_s = lag_max_s
        self.check_s = min(CHECK_MAX_S, max(CHECK_MIN_S, lag_max_s / 10))
        self.on_isr_change: Callable[[list[str]], None] | None = None
        """Called with the new members (own id first) when the set changes."""
        self.wake_streams: Callable[[], None] = lambda: None
        """Wakes replication streams parked at the log end (replication.LogGrowth)."""
        self.metadata_version = 0
        """Bumped by each sync-mode offset commit (streams send it with the metadata)."""
        self._members: dict[str, Member] = {}
        self._isr: list[str] = [own_id]
        self._waiters: list[tuple[_Target, asyncio.Future[None]]] = []
        self._slots = slots
        self._limit: int | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- what GetStats shows -------------------------------------------------------

    @property
    def members(self) -> list[str]:
        """The in-sync set: this master's id first, then its in-sync replicas."""
        return list(self._isr)

    def high_watermark(self, log_end: int) -> int:
        """The HW sent to replicas: in async mode the log end they may copy."""
        return self.store.high_watermark if self.sync else log_end

    # -- the lag check -----------------------------------------------------------------

    def start(self) -> None:
        """Check lags every ``check_s`` from now on (on the running loop)."""
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.expire()
            self._timer = loop.call_later(self.check_s, tick)

        self._timer = loop.call_later(self.check_s, tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def expire(self) -> None:
        """Members caught up now are marked so; those not caught up within the lag
        limit leave."""
        if not self._members:
            return  # nothing to check (and no store lock taken on the event loop)
        now = time.monotonic()
        end = self.store.durable_end
        for m in self._members.values():
            if self._caught_up(m.position, m.metadata_version, end):
                m.caught_up_at = now
            elif m.in_sync and now - m.caught_up_at > self.lag_max_s:
                m.in_sync = False
                log.warning(
                    "replica %s leaves the in-sync set of group %s: not caught up for "
                    "%.0f ms (at %d, the master at %d; metadata %d of %d)",
                    m.member_id, self.group, (now - m.caught_up_at) * 1000, m.position, end,
                    m.metadata_version, self.metadata_version,
                )  # fmt: skip
        self._update()

    def _caught_up(self, position: int, version: int, end: int) -> bool:
        return position >= end and version >= self.metadata_version

    # -- what replication streams report (replication.py) ----------------------------

    def progress(self, member_id: str, stream: int, position: int, version: int) -> None:
        """A replica asks from ``position`` (a record boundary of this log, at or
        below its end) having applied metadata ``version``."""
        now = time.monotonic()
        m = self._members.get(member_id)
        if m is None:
            m = self._members[member_id] = Member(member_id, stream)
        elif m.stream != stream:  # reconnected: the new stream speaks for it
            m.stream, m.offered_end = stream, -1
        m.position, m.metadata_version = position, version
        end = self.store.durable_end
        had_last_reply = 0 <= m.offered_end <= position and m.offered_version <= version
        caught_up = self._caught_up(position, version, end)
        if caught_up:
            m.caught_up_at = now
        elif had_last_reply:  # caught up as of the master's last reply (Kafka's rule)
            m.caught_up_at = max(m.caught_up_at, m.offered_at)
        # Sync mode: a replica joins only at or past the HW, which must never go back.
        joins = caught_up or had_last_reply
        if not m.in_sync and joins and (not self.sync or position >= self.store.high_watermark):
            m.in_sync = True
            log.info(
                "replica %s joins the in-sync set of group %s at %d",
                member_id, self.group, position,
            )  # fmt: skip
        self._update()

    def offered(self, member_id: str, stream: int, log_end: int, version: int) -> None:
        """The master built a reply to the replica, with ``log_end`` its log end then."""
        m = self._members.get(member_id)
        if m is not None and m.stream == stream:
            m.offered_end, m.offered_version, m.offered_at = log_end, version, time.monotonic()

    def disconnected(self, member_id: str, stream: int) -> None:
        m = self._members.get(member_id)
        if m is not None and m.stream == stream:
            del self._members[member_id]
            if m.in_sync:
                log.warning(
                    "replica %s leaves the in-sync set of group %s: its stream ended",
                    member_id, self.group,
                )  # fmt: skip
            self._update()

    def reset(self) -> None:
        """This broker became master (failover): no replica is in sync yet, and
        nothing holds reads back until one is."""
        self._members.clear()
        self._limit = None
        self.store.set_hw_limit(None)
        self._update()

    def changed_since(self, high_watermark: int, version: int) -> bool:
        """Sync mode: a parked stream has news for its replica (a new HW or metadata)."""
        if not self.sync:
            return False
        return version != self.metadata_version or high_watermark != self.store.high_watermark

    def metadata_changed_since(self, version: int) -> bool:
        """Sync mode: a parked stream's replica must learn a newer metadata version
        (an offset commit waits for its confirmation)."""
        return self.sync and version != self.metadata_version

    # -- the set, the visibility limit, the waiters ------------------------------------

    def _update(self) -> None:
        replicas = sorted(m.member_id for m in self._members.values() if m.in_sync)
        isr = [self.own_id, *replicas]
        if isr != self._isr:
            self._isr = isr
            log.info("in-sync set of group %s: %s", self.group, ", ".join(isr))
            if self.on_isr_change is not None:
                try:
                    self.on_isr_change(list(isr))
                except Exception:  # a listener's failure must not stop replication
                    log.exception("on_isr_change failed")
        if not self.sync or (self.role is not None and not self.role.is_master):
            return
        positions = [self._members[r].position for r in replicas]
        limit = min(positions) if positions else None
        if limit != self._limit:
            self._limit = limit
            self.store.set_hw_limit(limit)
            self.wake_streams()  # replicas learn the new HW
        self._settle()

    def _settle(self) -> None:
        """Resolve the waiters the in-sync replicas now cover (or fail them all,
        if the set fell below the minimum)."""
        if not self._waiters:
            return
        members = [self._members[r] for r in self._isr[1:]]
        position = min((m.position for m in members), default=math.inf)
        version = min((m.metadata_version for m in members), default=math.inf)
        enough = len(self._isr) >= self.min_insync
        for target, future in self._waiters:
            if future.done():
                continue
            if not enough:
                future.set_exception(self._fell_below())
            elif target.position <= position and target.metadata_version <= version:
                future.set_result(None)

    def check_enough(self) -> None:
        """Before a sync write: refuse it (nothing written) with too few members."""
        if len(self._isr) < self.min_insync:
            raise NotEnoughReplicas(
                f"group {self.group}: {len(self._isr)} in-sync member(s) "
                f"({', '.join(self._isr)}), fewer than min_insync_replicas "
                f"{self.min_insync}: nothing was written; retry once a replica has "
                "caught up (equeue stats shows them), or lower --min-insync-replicas"
            )

    def _fell_below(self) -> NotEnoughReplicas:
        return NotEnoughReplicas(
            f"group {self.group}: the in-sync set fell to {len(self._isr)} "
            f"({', '.join(self._isr)}) while the write waited for its replicas, below "
            f"min_insync_replicas {self.min_insync}: it may be in the log but is NOT "
            "acknowledged; retry once a replica has caught up (a produce may then be "
            "stored twice)"
        )

    async def replicated(self, write: Callable[[], Awaitable[T]], metadata: bool = False) -> T:
        """Sync mode: ``write()``'s result once it is on every in-sync member.
        ``metadata``: the write changes metadata (offsets), not the log."""
        taken, result, target = await self._write(write, metadata)
        try:
            await self._wait(target)
            return result
        finally:
            self._slots.release(taken)

    async def begin(
        self, write: Callable[[], Awaitable[T]], metadata: bool = False
    ) -> asyncio.Task[T]:
        """Sync mode: run ``write()`` now; return the task that waits for the
        in-sync members and gives its result. A produce stream writes its next
        batches while earlier ones wait (its writes stay in order, the waits
        overlap). The task holds one of ``max_replication_waits`` until it
        ends: the caller awaits or cancels it."""
        taken, result, target = await self._write(write, metadata)

        async def confirmed() -> T:
            try:
                await self._wait(target)
                return result
            finally:
                self._slots.release(taken)

        return asyncio.ensure_future(confirmed())

    async def _write(
        self, write: Callable[[], Awaitable[T]], metadata: bool
    ) -> tuple[int, T, _Target]:
        """Take a wait slot, check the set, write: (slot taken, result, what
        confirms it). The slot is given back here only if this fails."""
        taken = await self._slots.acquire(1)
        try:
            self.expire()
            self.check_enough()
            result = await write()
            if metadata:
                self.metadata_version += 1
                target = _Target(0, self.metadata_version)
            else:  # the log end now covers the write (durable: it returned)
                target = _Target(self.store.durable_end, 0)
            self.wake_streams()
        except BaseException:
            self._slots.release(taken)
            raise
        return taken, result, target

    async def _wait(self, target: _Target) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (target, future)
        self._waiters.append(entry)
        try:
            self._settle()
            # Bounded: a member that does not confirm leaves within the lag limit
            # (plus a check interval), and then the waiter is settled.
            await asyncio.wait([future], timeout=self.lag_max_s + WAIT_SLACK_S)
            if not future.done():
                self.expire()
            if not future.done():
                raise NotEnoughReplicas(
                    f"group {self.group}: the in-sync replicas did not confirm the write "
                    f"within {self.lag_max_s * 1000:.0f} ms: it may be in the log but is "
                    "not acknowledged; retry"
                )
            future.result()
        finally:
            self._waiters.remove(entry)
            if future.done() and not future.cancelled():
                future.exception()  # retrieved, also when the caller was cancelled
