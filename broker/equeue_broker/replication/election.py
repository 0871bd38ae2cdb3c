"""Master election and epoch fencing for one broker group, through ZooKeeper.

A broker group (one broker name) has one master and replicas. Every member
runs a :class:`GroupElection`; ZooKeeper holds, under ``<chroot>/equeue/groups/<group>/``:

``candidates/c-<seq>``
    one ephemeral sequential znode per live member (its ZooKeeper session):
    JSON ``{"broker_id", "address", "position"}`` (log position at registration).
``epoch``
    the current epoch: JSON ``{"epoch", "master_id", "master_address",
    "master_node", "start_position", "history": [[epoch, start_position], ...]}``.
    Changed only by an election, with a write conditional on the znode's version,
    so of two contenders that read the same epoch exactly one wins.
``isr``
    the in-sync replica set: JSON ``{"epoch", "members": [broker_id, ...]}``,
    written by the master (conditional on the epoch znode's version, so a deposed
    master cannot write it) and by the election that replaces a master.

Rules (docs/replication.md says why):

- The master is live while its candidate znode (``master_node``) exists.
- With no live master, only a live candidate whose broker id is in the ISR may
  become master: no unclean election. If none is live, nobody is elected and
  :meth:`GroupElection.current` says why (``GroupView.reason``).
- Of the eligible candidates the one with the lowest sequence (the oldest
  session) claims, the dead master's own new incarnation last. Its broker claims,
  through the znode it knows (a create whose reply was lost leaves an orphan in
  the live session, ahead of the znode registered next). The claim bumps the
  epoch, records the new master's log end as the epoch's start position (the
  boundary where the previous epoch ended: :meth:`Epoch.end_of`), and removes the
  dead master from the ISR unless it is the claimer (the last in-sync member
  returning) -- one ZooKeeper transaction.
- The very first election of a group (no ``epoch`` znode) is won by the first
  candidate; the ISR starts as the master alone.
- A member told that the master refuses connections (``master_gone``: its
  replication stream found the process gone, liveness.py) removes the master's
  candidate znode, conditional on the epoch znode's version: what the expiry of
  the master's session does, sooner. The rules above then apply unchanged.
- A member whose session expires is no longer master (``on_replica(None)``) and
  re-registers as a new candidate when kazoo has a new session.
- ZooKeeper unreachable (kazoo SUSPENDED): every member keeps its role; nothing is
  decided until the connection returns. Epoch fencing (:meth:`GroupElection.fence`)
  protects replicas from a master that was deposed while cut off.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import Enum

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState, WatchedEvent
from kazoo.retry import KazooRetry

from equeue_broker.replication.zk_hosts import parse_hosts

log = logging.getLogger(__name__)

BASE_PATH = "/equeue"
HISTORY_LIMIT = 64
"""Epochs kept in the epoch znode's history (a replica further behind copies the log anew)."""


RESIGN_HOLD_S = 10.0
"""How long a member that resigned stands for no election (``GroupElection.resign``)."""


class ElectionError(Exception):
    """ZooKeeper could not be reached, or the group's znodes are not what we wrote."""


class NotMaster(ElectionError):
    """A master-only operation by a member that is not (or no longer) the master."""


class StaleEpoch(ElectionError):
    """A request carries an epoch older than the newest this member has seen."""

    def __init__(self, request_epoch: int, current_epoch: int) -> None:
        super().__init__(
            f"stale epoch {request_epoch}: the group is at epoch {current_epoch} (fenced)"
        )
        self.request_epoch = request_epoch
        self.current_epoch = current_epoch


class Role(Enum):
    MASTER = "master"
    REPLICA = "replica"


@dataclass(frozen=True)
class Layout:
    """The znode paths of one group."""

    group: str
    root: str = BASE_PATH
    """``<chroot>/equeue``."""

    def __post_init__(self) -> None:
        if not self.group or "/" in self.group:
            raise ValueError(f"bad group name {self.group!r}")

    @property
    def group_path(self) -> str:
        return f"{self.root}/groups/{self.group}"

    @property
    def candidates(self) -> str:
        return f"{self.group_path}/candidates"

    @property
    def epoch(self) -> str:
        return f"{self.group_path}/epoch"

    @property
    def isr(self) -> str:
        return f"{self.group_path}/isr"


@dataclass(frozen=True)
class Candidate:
    node: str
    """The znode's name, ``c-<10-digit sequence>``."""
    broker_id: str
    address: str
    position: int

    @property
    def sequence(self) -> int:
        return int(self.node.rpartition("-")[2])

    def encode(self) -> bytes:
        return json.dumps(
            {"broker_id": self.broker_id, "address": self.address, "position": self.position}
        ).encode()

    @classmethod
    def decode(cls, node: str, data: bytes) -> Candidate:
        fields = json.loads(data)
        return cls(node, str(fields["broker_id"]), str(fields["address"]), int(fields["position"]))


@dataclass(frozen=True)
class Epoch:
    """One master's term."""

    epoch: int
    master_id: str
    master_address: str
    master_node: str
    start_position: int
    """The master's log end when it was elected: everything before it is the
    previous epochs' data; a replica's log beyond it from an older epoch diverged."""
    history: tuple[tuple[int, int], ...] = ()
    """``(epoch, start_position)`` of the latest epochs, this one last."""

    def previous(self) -> tuple[int, int] | None:
        """``(epoch, start_position)`` of the epoch before this one, if recorded."""
        return self.history[-2] if len(self.history) >= 2 else None

    def end_of(self, epoch: int) -> int | None:
        """Where ``epoch`` ended: the start of the next recorded epoch (``None``
        for the current epoch, which has not ended, or one older than the history)."""
        later = [start for number, start in self.history if number > epoch]
        known = any(number <= epoch for number, _ in self.history)
        return later[0] if later and known else None

    def encode(self) -> bytes:
        return json.dumps(
            {
                "epoch": self.epoch,
                "master_id": self.master_id,
                "master_address": self.master_address,
                "master_node": self.master_node,
                "start_position": self.start_position,
                "history": [list(item) for item in self.history],
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> Epoch:
        f = json.loads(data)
        return cls(
            int(f["epoch"]),
            str(f["master_id"]),
            str(f["master_address"]),
            str(f["master_node"]),
            int(f["start_position"]),
            tuple((int(e), int(s)) for e, s in f.get("history", ())),
        )


def encode_isr(epoch: int, members: Iterable[str]) -> bytes:
    return json.dumps({"epoch": epoch, "members": sorted(set(members))}).encode()


@dataclass(frozen=True)
class GroupView:
    """One consistent-enough read of a group's znodes."""

    group: str
    candidates: tuple[Candidate, ...] = ()
    epoch: Epoch | None = None
    epoch_version: int = -1
    """The epoch znode's version (-1: no epoch yet): the condition of the next claim."""
    isr: tuple[str, ...] = ()
    isr_version: int = -1
    master: Candidate | None = None
    """The live master's candidate znode (``None``: no live master)."""
    reason: str = ""
    """Why there is no master ('' when there is one)."""
    electable: tuple[Candidate, ...] = field(default=())
    """With no live master: the candidates allowed to claim, in claiming order."""


def read_view(
    client: KazooClient, layout: Layout, watch: Callable[[WatchedEvent], object] | None = None
) -> GroupView:
    """Read the group's znodes (setting ``watch`` on each, if given) and apply the rules."""
    try:
        names = client.get_children(layout.candidates, watch=watch)
    except NoNodeError:
        names = []
        if watch is not None:
            client.exists(layout.candidates, watch=watch)
    candidates = []
    for name in sorted(names, key=lambda n: n.rpartition("-")[2]):
        try:
            data, _ = client.get(f"{layout.candidates}/{name}")
        except NoNodeError:
            continue  # its session ended between the listing and the read
        candidates.append(Candidate.decode(name, data))
    epoch: Epoch | None = None
    epoch_version = isr_version = -1
    isr: tuple[str, ...] = ()
    try:
        data, stat = client.get(layout.epoch, watch=watch)
        epoch, epoch_version = Epoch.decode(data), stat.version
    except NoNodeError:
        if watch is not None:
            client.exists(layout.epoch, watch=watch)
    try:
        data, stat = client.get(layout.isr, watch=watch)
        isr, isr_version = tuple(json.loads(data)["members"]), stat.version
    except NoNodeError:
        if watch is not None:
            client.exists(layout.isr, watch=watch)
    return decide(
        layout.group,
        tuple(candidates),
        epoch=epoch,
        epoch_version=epoch_version,
        isr=isr,
        isr_version=isr_version,
    )


def decide(
    group: str,
    candidates: tuple[Candidate, ...],
    *,
    epoch: Epoch | None,
    epoch_version: int,
    isr: tuple[str, ...],
    isr_version: int,
) -> GroupView:
    """The election rules, on data already read (no I/O)."""
    view = GroupView(group, candidates, epoch, epoch_version, isr, isr_version)
    if epoch is None:  # the group's first election: no data anywhere yet
        if not candidates:
            return replace(view, reason=f"group {group}: no candidate has registered")
        return replace(view, reason=f"group {group}: first election", electable=candidates)
    master = next((c for c in candidates if c.node == epoch.master_node), None)
    if master is not None:
        return replace(view, master=master)
    in_sync = sorted(
        (c for c in candidates if c.broker_id in isr),
        key=lambda c: (c.broker_id == epoch.master_id, c.sequence),
    )
    if in_sync:
        return replace(
            view,
            reason=f"group {group}: master {epoch.master_id} of epoch {epoch.epoch} is gone;"
            f" electing {in_sync[0].broker_id}",
            electable=tuple(in_sync),
        )
    live = sorted({c.broker_id for c in candidates})
    return replace(
        view,
        reason=f"group {group} has no master: master {epoch.master_id} of epoch {epoch.epoch}"
        f" is gone and no in-sync replica is alive (in sync: {', '.join(isr) or 'none'};"
        f" alive but out of sync: {', '.join(live) or 'none'}); no unclean election",
    )


def claim(client: KazooClient, layout: Layout, view: GroupView, me: Candidate) -> Epoch | None:
    """Try to become master of the epoch after ``view.epoch``: one transaction,
    conditional on the epoch and ISR znodes being at the versions ``view`` read
    and on ``me``'s candidate znode existing. The new epoch, or ``None`` when
    another contender won (or the group changed) first."""
    old = view.epoch
    transaction = client.transaction()
    if old is None:
        new = Epoch(1, me.broker_id, me.address, me.node, me.position, ((1, me.position),))
        transaction.create(layout.epoch, new.encode())
        transaction.create(layout.isr, encode_isr(1, [me.broker_id]))
    else:
        number = old.epoch + 1
        history = (*old.history, (number, me.position))[-HISTORY_LIMIT:]
        new = Epoch(number, me.broker_id, me.address, me.node, me.position, history)
        members = [m for m in view.isr if m != old.master_id] + [me.broker_id]
        transaction.set_data(layout.epoch, new.encode(), version=view.epoch_version)
        if view.isr_version < 0:
            transaction.create(layout.isr, encode_isr(number, members))
        else:
            transaction.set_data(layout.isr, encode_isr(number, members), version=view.isr_version)
    transaction.check(f"{layout.candidates}/{me.node}", 0)
    results = transaction.commit()
    if any(isinstance(result, Exception) for result in results):
        return None
    return new


@dataclass
class _Notified:
    role: Role | None = None
    epoch: int | None = None
    master_node: str | None = None


class GroupElection:
    """This broker's membership in its group's election.

    ``position_fn`` returns the broker's log end position (read when it registers
    and when it claims mastership). The callbacks run on the election's own
    thread, one at a time, in order:

    - ``on_master(epoch)``: this broker is now the master of ``epoch``
      (``epoch.previous()`` and ``epoch.start_position`` give the boundary);
    - ``on_replica(epoch)``: this broker is a replica; ``epoch`` names the master
      to follow, or is ``None`` while there is none (between a master's death and
      the next election, with no in-sync candidate alive, or after this broker's
      own session expired -- in which case it must stop acting as master at once).

    ``session_timeout_s`` is ZooKeeper's session timeout: how long after a member
    stops heartbeating (crash, hang, partition) its candidate znode disappears and
    an election can start. While ZooKeeper itself is down no session expires, so
    nothing changes until it returns (sessions get a full timeout after it does).
    """

    def __init__(
        self,
        zk_hosts: str,
        group: str,
        broker_id: str,
        address: str,
        position_fn: Callable[[], int],
        *,
        on_master: Callable[[Epoch], None] | None = None,
        on_replica: Callable[[Epoch | None], None] | None = None,
        session_timeout_s: float = 10.0,
        recheck_s: float = 5.0,
        reconnect_max_delay_s: float = 1.0,
    ) -> None:
        hosts, chroot = parse_hosts(zk_hosts)
        self.hosts = hosts
        self.layout = Layout(group, chroot + BASE_PATH)
        self.broker_id = broker_id
        self.address = address
        self.position_fn = position_fn
        self.on_master = on_master
        self.on_replica = on_replica
        self.recheck_s = recheck_s
        self.client = KazooClient(
            hosts,
            timeout=session_timeout_s,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=reconnect_max_delay_s),
            command_retry=KazooRetry(max_tries=3, delay=0.05, max_delay=reconnect_max_delay_s),
            logger=logging.getLogger(f"{__name__}.kazoo"),  # reconnect noise, tunable apart
        )
        self._events: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._me: Candidate | None = None
        self._me_session: int | None = None
        """The ZooKeeper session ``_me`` was registered in."""
        self._role = Role.REPLICA
        self._master_epoch: Epoch | None = None
        self._master_epoch_version = -1
        self._highest_epoch = 0
        self._resigned_until = 0.0
        """Monotonic time until which this member stands for no election (``resign``)."""
        self._gone: list[tuple[str, int]] = []
        """Masters reported gone (``master_gone``), not yet acted on."""
        self.masters_removed = 0
        """Dead masters' candidate znodes this member removed (``master_gone``)."""
        self.gone_reports_handled = 0
        """``master_gone`` reports acted on (a znode removed or not)."""
        self._view = GroupView(group, reason=f"group {group}: not connected to ZooKeeper yet")
        self._notified = _Notified()
        self._thread = threading.Thread(
            target=self._run, name=f"election-{group}-{broker_id}", daemon=True
        )
        self._closed = False

    # -- lifecycle -------------------------------------------------------------

    def start(self, wait_s: float | None = 15.0) -> None:
        """Connect and join the election. With ``wait_s``, wait that long for the
        first connection (``ElectionError`` if ZooKeeper does not answer); with
        ``None``, return at once and join whenever ZooKeeper answers (a replica
        with no master until then)."""
        self.client.add_listener(self._on_state)
        self._thread.start()
        if wait_s is None:
            self.client.start_async()
            return
        try:
            self.client.start(timeout=wait_s)
        except KazooTimeoutError as e:
            self.close()
            raise ElectionError(f"ZooKeeper {self.hosts} not reachable: {e}") from e
        self._events.put("connected")

    def close(self) -> None:
        """Leave the election: the session is closed, so the candidate znode goes
        at once and (if this was the master) the next election starts now."""
        if self._closed:
            return
        self._closed = True
        self._events.put("stop")
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(30)
        try:
            self.client.stop()
            self.client.close()
        except KazooException:
            log.warning("closing the ZooKeeper client", exc_info=True)
        with self._lock:
            self._role, self._master_epoch = Role.REPLICA, None

    def resign(self, hold_s: float = RESIGN_HOLD_S) -> None:
        """Give up this member's candidacy (and mastership) now and stand again
        after ``hold_s``: the broker could not become the master it was elected
        (a disk error writing its epoch marker), and while its znode lives
        ZooKeeper names it master and no other election can follow. Deleting
        the znode lets another in-sync member be elected at once. Any thread;
        returns at once."""
        with self._lock:
            self._resigned_until = time.monotonic() + hold_s
        self._events.put("resign")

    def master_gone(self, address: str, epoch: int) -> None:
        """The master ``address`` of ``epoch`` refuses connections: its process is
        gone (replication/liveness.py). If it is still the group's live master
        of that epoch, its candidate znode is removed now -- conditional on the
        epoch znode's version, so only the master of the epoch the report is
        about -- which starts the election at once instead of one session
        timeout later. The election's rules are unchanged: only an in-sync
        candidate may win. Any thread; returns at once."""
        with self._lock:
            self._gone.append((address, epoch))
        self._events.put("gone")

    # -- what the broker asks --------------------------------------------------

    @property
    def role(self) -> Role:
        with self._lock:
            return self._role

    def is_master(self) -> bool:
        return self.role is Role.MASTER

    @property
    def master_epoch(self) -> Epoch | None:
        """The epoch this broker is master of, ``None`` when it is not the master."""
        with self._lock:
            return self._master_epoch

    @property
    def epoch(self) -> int:
        """The newest epoch number this member has seen (0: none yet): the fence."""
        with self._lock:
            return self._highest_epoch

    def fence(self, request_epoch: int) -> None:
        """Refuse a request stamped with an epoch older than the newest seen
        (``StaleEpoch``); a newer one is remembered (the fence moves up)."""
        with self._lock:
            if request_epoch < self._highest_epoch:
                raise StaleEpoch(request_epoch, self._highest_epoch)
            self._highest_epoch = request_epoch

    def current(self, refresh: bool = True) -> GroupView:
        """The group as ZooKeeper has it now (``refresh``, when connected), else as
        this member saw it last."""
        if refresh and self.client.connected:
            try:
                view = read_view(self.client, self.layout)
            except KazooException:
                log.debug("reading the group", exc_info=True)
            else:
                self._seen(view)
                return view
        with self._lock:
            return self._view

    def publish_isr(self, members: Iterable[str]) -> None:
        """The master records the in-sync replica set (itself always included).
        ``NotMaster`` if this broker is not the master or its epoch is over."""
        with self._lock:
            epoch, version = self._master_epoch, self._master_epoch_version
        if epoch is None:
            raise NotMaster(f"{self.broker_id} is not the master of group {self.layout.group}")
        transaction = self.client.transaction()
        transaction.check(self.layout.epoch, version)
        transaction.set_data(self.layout.isr, encode_isr(epoch.epoch, [*members, self.broker_id]))
        try:
            results = transaction.commit()
        except KazooException as e:
            raise ElectionError(f"publishing the in-sync set of {self.layout.group}: {e}") from e
        if any(isinstance(result, Exception) for result in results):
            raise NotMaster(
                f"{self.broker_id} is no longer master of group {self.layout.group}"
                f" (epoch {epoch.epoch} is over)"
            )

    # -- the election thread -----------------------------------------------------

    def _on_state(self, state: str) -> None:  # kazoo's thread: no ZooKeeper calls here
        self._events.put(state)

    def _on_watch(self, event: WatchedEvent) -> None:
        self._events.put("watch")

    def _run(self) -> None:
        while True:
            try:
                events = [self._events.get(timeout=self.recheck_s)]
            except queue.Empty:
                events = ["recheck"]
            while True:
                try:
                    events.append(self._events.get_nowait())
                except queue.Empty:
                    break
            if "stop" in events:
                return
            if "resign" in events:
                self._drop_candidacy()
            if KazooState.LOST in events:
                self._session_lost()
            if self.client.state != KazooState.CONNECTED:
                continue  # suspended: keep the role, decide nothing
            try:
                self._remove_gone_masters()
                self._step()
            except KazooException:
                log.info("election step of %s interrupted", self.broker_id, exc_info=True)
            except Exception:
                log.exception("election step of %s failed", self.broker_id)

    def _session_lost(self) -> None:
        """The session expired: our candidate znode is gone, and with it any mastership."""
        session = self._session_id()
        if self._me is not None and session is not None and self._me_session == session:
            # kazoo had the new session before this thread read the LOST event,
            # and a step already registered (and decided, maybe won) in it: the
            # loss is handled. Dropping that registration here would demote a
            # master whose znode stays the master's for as long as its session
            # lives: no master, and no election, until this process exits.
            return
        with self._lock:
            self._me = None
            was_master = self._role is Role.MASTER
            self._role, self._master_epoch = Role.REPLICA, None
        if was_master:
            log.warning("%s: ZooKeeper session expired; no longer master", self.broker_id)
        self._notify(Role.REPLICA, None)

    def _remove_gone_masters(self) -> None:
        """Act on ``master_gone`` reports: remove the reported master's candidate
        znode if it is still the live master of the reported epoch."""
        with self._lock:
            reports, self._gone = self._gone, []
        pending = list(dict.fromkeys(reports))
        while pending:
            try:
                self._remove_gone_master(*pending[0])
            except KazooException:  # tried again at the next step (the reports stand)
                with self._lock:
                    self._gone[:0] = pending
                raise
            pending.pop(0)
            self.gone_reports_handled += 1

    def _remove_gone_master(self, address: str, number: int) -> None:
        view = read_view(self.client, self.layout)
        self._seen(view)
        epoch, master = view.epoch, view.master
        mine = self._me is not None and master is not None and master.node == self._me.node
        if epoch is None or master is None or mine or (epoch.epoch, master.address) != (
            number, address,
        ):  # fmt: skip
            log.info(
                "%s: master %s of epoch %d reported gone, but the group has moved on "
                "(epoch %s, master %s): nothing to remove", self.broker_id, address, number,
                epoch.epoch if epoch else "-", master.address if master else "none",
            )  # fmt: skip
            return
        transaction = self.client.transaction()
        transaction.check(self.layout.epoch, view.epoch_version)
        transaction.delete(f"{self.layout.candidates}/{master.node}")
        if any(isinstance(result, Exception) for result in transaction.commit()):
            log.info("%s: the candidate znode of %s is gone already", self.broker_id, address)
            return
        self.masters_removed += 1
        log.warning(
            "FAST FAILOVER: %s removed candidate znode %s of master %s (%s, epoch %d), "
            "whose process is gone: electing now, not after its session timeout",
            self.broker_id, master.node, master.broker_id, address, number,
        )  # fmt: skip

    def _drop_candidacy(self) -> None:
        me, self._me = self._me, None
        if me is not None:
            try:
                self.client.delete(f"{self.layout.candidates}/{me.node}")
            except NoNodeError:
                pass
            except KazooException:  # the session's end removes it anyway
                log.warning("%s: candidate znode not deleted", self.broker_id, exc_info=True)
        with self._lock:
            self._role, self._master_epoch = Role.REPLICA, None
        log.warning(
            "%s resigns from the election of group %s (stands again in %.0f s)",
            self.broker_id, self.layout.group, self._resigned_until - time.monotonic(),
        )  # fmt: skip
        self._notify(Role.REPLICA, None)

    def _register(self) -> Candidate:
        """Create this member's candidate znode (once per session)."""
        me = self._me
        if me is not None and self.client.exists(f"{self.layout.candidates}/{me.node}"):
            return me
        position = self.position_fn()
        data = Candidate("c-0", self.broker_id, self.address, position).encode()
        try:
            path = self.client.create(
                f"{self.layout.candidates}/c-", data, ephemeral=True, sequence=True, makepath=True
            )
        except NodeExistsError as e:  # pragma: no cover - sequential names are unique
            raise ElectionError(str(e)) from e
        me = Candidate(path.rpartition("/")[2], self.broker_id, self.address, position)
        self._me, self._me_session = me, self._session_id()
        return me

    def _session_id(self) -> int | None:
        """The client's current session (``None`` between a loss and the next one)."""
        client_id = self.client.client_id
        return client_id[0] if client_id else None

    def _step(self) -> None:
        """One evaluation: register, read (re-arming the watches), act."""
        for _ in range(3):  # again at once after a claim, won or lost
            if time.monotonic() < self._resigned_until:  # resigned: follow, never claim
                view = read_view(self.client, self.layout, watch=self._on_watch)
                self._seen(view)
                self._notify(Role.REPLICA, view.epoch if view.master is not None else None)
                return
            me = self._register()
            view = read_view(self.client, self.layout, watch=self._on_watch)
            self._seen(view)
            if view.master is not None and view.master.node == me.node:
                assert view.epoch is not None
                with self._lock:
                    self._role = Role.MASTER
                    self._master_epoch, self._master_epoch_version = view.epoch, view.epoch_version
                self._notify(Role.MASTER, view.epoch)
                return
            with self._lock:
                self._role, self._master_epoch = Role.REPLICA, None
            if view.master is not None:
                self._notify(Role.REPLICA, view.epoch)
                return
            # The first electable candidate claims; one of this broker's own
            # znodes counts as this broker's turn. A create whose reply was lost
            # (a connection dropped while ZooKeeper answered slowly) leaves an
            # orphan in the live session, ahead of the znode registered next:
            # deferring to it, every member waited for it, and nobody claimed.
            if not view.electable or view.electable[0].broker_id != me.broker_id:
                self._notify(Role.REPLICA, None)
                return  # someone else claims, or nobody may
            me = Candidate(me.node, me.broker_id, me.address, self.position_fn())
            won = claim(self.client, self.layout, view, me)
            log.info(
                "%s %s epoch %d of group %s",
                self.broker_id,
                "won" if won else "lost the claim for",
                (view.epoch.epoch if view.epoch else 0) + 1,
                self.layout.group,
            )

    def _seen(self, view: GroupView) -> None:
        with self._lock:
            self._view = view
            if view.epoch is not None:
                self._highest_epoch = max(self._highest_epoch, view.epoch.epoch)

    def _notify(self, role: Role, epoch: Epoch | None) -> None:
        """Call the callback for a change of role or master (once per change)."""
        node = epoch.master_node if epoch else None
        number = epoch.epoch if epoch else None
        last = self._notified
        if (last.role, last.epoch, last.master_node) == (role, number, node):
            return
        self._notified = _Notified(role, number, node)
        callback: Callable[[], None] | None = None
        if role is Role.MASTER and self.on_master is not None and epoch is not None:
            on_master, master_epoch = self.on_master, epoch
            callback = lambda: on_master(master_epoch)  # noqa: E731
        elif role is Role.REPLICA and self.on_replica is not None:
            on_replica = self.on_replica
            callback = lambda: on_replica(epoch)  # noqa: E731
        if callback is not None:
            try:
                callback()
            except Exception:
                log.exception("election callback of %s failed", self.broker_id)
