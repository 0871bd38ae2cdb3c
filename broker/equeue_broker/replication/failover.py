"""Changing this broker's role at run time: promotion, following, and elections.

``RoleSwitch`` is the only code that switches the role (``BrokerRole``,
role.py) after start, and owns the replica's ``Follower`` task:

- ``promote(epoch)``: stop following (awaited), append the epoch marker
  (storage/epochs.py) and make it durable, then become master of ``epoch``:
  writes are taken only after the marker, so every record of the epoch lies
  after it in the log;
- ``follow(master, epoch)``: become a replica of ``master`` (writes are
  refused from then on) and (re)start the follower towards it. An old master
  following the new one truncates its divergent tail (master.py, follower.py).

Both come from an operator (Admin ``SetRole``, ``equeue cluster promote``,
with an epoch check) or from the election (``ZkFailover``, ``--zookeeper``):
``GroupElection`` (election.py) calls back on its own thread; the
callbacks are handed to the event loop, where one lock runs them in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from equeue_broker.replication.errors import StaleEpoch
from equeue_broker.replication.follower import Follower, Runner
from equeue_broker.replication.insync import InSyncSet
from equeue_broker.replication.liveness import GoneReport
from equeue_broker.replication.role import MASTER, REPLICA, BrokerRole
from equeue_broker.storage import Store
from equeue_broker.storage.errors import PreconditionFailed

if TYPE_CHECKING:  # kazoo is loaded only by a broker with --zookeeper (ZkFailover)
    from equeue_broker.replication.election import Epoch

log = logging.getLogger("equeue.failover")

ZOOKEEPER, MANUAL = "zookeeper", "manual"


class RoleSwitch:
    """Promotes and demotes this broker; owns the follower (``follower``)."""

    def __init__(
        self,
        store: Store,
        role: BrokerRole,
        insync: InSyncSet,
        runner: Runner,
        *,
        address: str,
        mode: str,
        group: str,
        instance_id: str,
    ) -> None:
        self.store = store
        self.role = role
        """The broker's role: this switch is the only code that changes it."""
        self.insync = insync
        self.runner = runner
        self.group = group
        """The group's name (--broker-name)."""
        self.instance_id = instance_id
        """This broker's data directory id."""
        self.follower: Follower | None = None
        """A replica: its follower (the log it copies); None on a master."""
        self.address = address
        """Where this broker serves (what replicas and the election call it)."""
        self.mode = mode
        """ZOOKEEPER or MANUAL: GetStats ``failover``."""
        self.on_master_gone: GoneReport | None = None
        """Told when the master a follower replicated from refuses connections
        (liveness.py): the election's (``ZkFailover``, unless disabled)."""
        self._lock = asyncio.Lock()
        self._following: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Follow the master the role names at start, if any."""
        view = self.role.view
        if not view.is_master and view.master:
            self._start_follower()

    async def stop(self) -> None:
        await self._stop_follower()

    async def promote(self, epoch: int, *, elected: bool = False, why: str = "") -> None:
        """Become master of ``epoch``. An operator's epoch must be newer than every
        epoch seen (``StaleEpoch``); an election's is ZooKeeper's word."""
        async with self._lock:
            view = self.role.view
            if view.is_master and view.epoch == epoch:
                return  # done already (a retried call)
            if not elected and epoch <= view.epoch:
                raise StaleEpoch(
                    f"cannot promote to epoch {epoch}: this broker has seen epoch "
                    f"{view.epoch}; promote with an epoch above {view.epoch}"
                )
            await self._stop_follower()
            store = self.store
            if store.epochs.last_epoch < epoch:
                position = await self.runner.call(store.write_epoch_marker, epoch)
                log.warning("MASTER of epoch %d from log position %d", epoch, position)
            self.insync.reset()  # no replica is in sync with this master yet
            how = f"elected through ZooKeeper (epoch {epoch})" if elected else f"epoch {epoch}"
            self.role.set(MASTER, "", epoch, why=why or how)

    async def follow(
        self, master: str, epoch: int | None, *, elected: bool = False, why: str = ""
    ) -> None:
        """Become a replica of ``master`` ("": none now) from ``epoch`` on (an
        operator's must not be older than the newest seen: ``StaleEpoch``)."""
        async with self._lock:
            view = self.role.view
            if not elected and epoch is not None and epoch < view.epoch:
                raise StaleEpoch(
                    f"cannot follow {master} in epoch {epoch}: this broker has seen epoch "
                    f"{view.epoch}; give an epoch of at least {view.epoch}"
                )
            if master == self.address:
                raise PreconditionFailed(f"{master} is this broker: a replica follows another")
            if view.is_master:
                log.warning("no longer master (epoch %d): following %s", view.epoch, master or "-")
            if not why and elected:
                why = f"ZooKeeper: {master} elected" if master else "ZooKeeper: no master now"
            why = why or f"follows {master}"
            new = self.role.set(REPLICA, master, epoch, why=why)  # writes refused from here
            await self._stop_follower()
            if new.master:
                self._start_follower()

    def would_learn(self, master: str, epoch: int) -> bool:
        """Whether ``learned(master, epoch)`` would change this broker's role:
        manual failover only (with ZooKeeper the election decides), another
        member, and an epoch newer than any seen (or, for a replica with no
        master, its own)."""
        view = self.role.view
        if self.mode != MANUAL or not master or master == self.address:
            return False
        newer = epoch > view.epoch
        return newer or (not view.is_master and not view.master and epoch == view.epoch)

    async def learned(self, master: str, epoch: int) -> None:
        """A name server routes the group to ``master`` of ``epoch``, and that
        master has confirmed it itself (server/membership.py, ``MasterCheck``:
        the only caller; a name server's word alone moves nothing). An epoch
        newer than any this broker has seen means it missed a promotion while
        down or cut off (an old master restarted with ``--role master``, a
        replica still following the old master): it follows the new master,
        and a deposed master's divergent tail is truncated as it does. A
        replica with no master takes the one of its own epoch."""
        if not self.would_learn(master, epoch):
            return
        view = self.role.view
        group = self.group
        if view.is_master:
            log.error(
                "DEPOSED: the name servers route group %s to %s, master of epoch %d, newer "
                "than this master's epoch %d: no longer taking writes, following it",
                group, master, epoch, view.epoch,
            )  # fmt: skip
        else:
            log.warning(
                "group %s: following %s, master of epoch %d (learned from the name servers)",
                group, master, epoch,
            )  # fmt: skip
        try:
            await self.follow(
                master, epoch, why=f"the name servers route group {group} to {master} "
                f"(epoch {epoch})",
            )  # fmt: skip
        except (StaleEpoch, PreconditionFailed) as exc:  # raced with another change
            log.info("not following %s: %s", master, exc)

    def _start_follower(self) -> None:
        self.follower = Follower(
            self.store, self.role, self.runner, address=self.address,
            instance_id=self.instance_id, broker_name=self.group,
            on_master_gone=self.on_master_gone,
        )  # fmt: skip
        self._following = asyncio.create_task(self.follower.run())
        self._following.add_done_callback(_follower_ended)

    async def _stop_follower(self) -> None:
        task, self._following = self._following, None
        self.follower = None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:
                # The follower had already ended with an error of its own (logged
                # by _follower_ended), e.g. grpc's InvalidStateError "RPC already
                # finished." from a write on the stream of a master that died while
                # this replica was stopped. Stopping it is all that is asked here:
                # its error must not fail the role change. It did: an elected
                # replica's promotion failed, so ZooKeeper had a master that went
                # on refusing writes as a replica, and no election could follow
                # (its znode lives as long as its session).
                pass


def _follower_ended(task: asyncio.Task[None]) -> None:
    """Say so at once when the follower ends with an error (it replicates no more
    until the next role change) rather than when it is next stopped."""
    if not task.cancelled() and task.exception() is not None:
        log.error("replication stopped: the follower failed: %r", task.exception())


class ZkFailover:
    """This broker's membership in its group's election (``--zookeeper``)."""

    def __init__(
        self, switch: RoleSwitch, hosts: str, session_timeout_s: float, *, fast: bool = True
    ) -> None:
        """``hosts``: ZooKeeper's (--zookeeper); the group, this member and its
        store are the switch's. ``fast`` (--zk-fast-failover): a master whose
        replicas find it refusing connections is replaced at once, not one
        session timeout after its death (liveness.py)."""
        self.switch = switch
        self.fast = fast
        self.loop = asyncio.get_running_loop()
        from equeue_broker.replication.election import GroupElection  # kazoo: only with --zookeeper

        store = switch.store
        self.election = GroupElection(
            hosts, switch.group, switch.instance_id, switch.address,
            lambda: store.log_end,
            on_master=self._on_master, on_replica=self._on_replica,
            session_timeout_s=session_timeout_s,
        )  # fmt: skip
        self._publisher = ThreadPoolExecutor(1, thread_name_prefix="equeue-isr")

    def start(self) -> None:
        """Join the election without waiting for ZooKeeper: until it answers (and
        an election is won) this broker is a replica with no master."""
        if self.fast:  # before the first follower starts (election.start may elect)
            self.switch.on_master_gone = self._master_gone
        self.election.start(wait_s=None)
        # While master, the in-sync set (insync.py) reports every change: the
        # election reads it to choose only an in-sync replica.
        self.switch.insync.on_isr_change = self.publish_isr

    async def close(self) -> None:
        """Leave the election at once (the next election starts now)."""
        await asyncio.to_thread(self.election.close)
        # No more in-sync sets to publish: the role change below empties the set,
        # and its report would reach a publisher already shut down.
        self.switch.insync.on_isr_change = None
        self._publisher.shutdown(wait=False, cancel_futures=True)
        # Another member may be elected from now on: take no more writes.
        self.switch.role.set(REPLICA, "", None, why="stopping: left the election")

    def _master_gone(self, master: str, epoch: int) -> None:
        self.election.master_gone(master, epoch)

    # -- the election's thread -------------------------------------------------------

    def _on_master(self, epoch: Epoch) -> None:
        # The new master has no replica in sync yet (insync.reset on promotion):
        # record that before it takes a write, so that a write it acknowledges
        # alone can never be lost to an election of a replica that lacks it.
        self._publish([self.switch.instance_id])
        self._hand_over(
            self.switch.promote(epoch.epoch, elected=True), f"master of {epoch.epoch}",
            on_failure=self.election.resign,  # else ZooKeeper names a master that is none
        )  # fmt: skip

    def _on_replica(self, epoch: Epoch | None) -> None:
        if epoch is None:
            reason = self.election.current(refresh=False).reason
            log.warning("no master to follow: %s", reason or "none elected yet (session lost?)")
            seen = self.election.epoch or None  # the newest ZooKeeper epoch seen
            self._hand_over(self.switch.follow("", seen, elected=True), "replica, no master")
            return
        self._hand_over(
            self.switch.follow(epoch.master_address, epoch.epoch, elected=True),
            f"replica of {epoch.master_address} in epoch {epoch.epoch}",
        )

    def _hand_over(
        self,
        change: Coroutine[Any, Any, None],
        what: str,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        """Run ``change`` on the event loop (in order: the switch's lock); log if
        it fails, and call ``on_failure``."""
        future = asyncio.run_coroutine_threadsafe(change, self.loop)

        def done(f: Future[None]) -> None:
            if not f.cancelled() and f.exception() is not None:
                log.error("becoming %s failed: %s", what, f.exception())
                if on_failure is not None:
                    on_failure()

        future.add_done_callback(done)

    # -- the in-sync set -----------------------------------------------------------------

    def publish_isr(self, members: list[str]) -> None:
        """Record the in-sync set (broker instance ids; this master is added) in
        ZooKeeper; any thread, returns at once (the write runs on its own thread)."""
        self._publisher.submit(self._publish, list(members))

    def _publish(self, members: list[str]) -> None:
        from equeue_broker.replication.election import ElectionError  # kazoo: only with --zookeeper

        try:
            self.election.publish_isr(members)
        except ElectionError as exc:
            log.warning("in-sync set %s not published: %s", members, exc)
