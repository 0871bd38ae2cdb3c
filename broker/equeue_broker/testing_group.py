"""A replicated broker group on 127.0.0.1 (``equeue_broker.testing_group``).

The shipped harness beside ``equeue_broker.testing``, for the tests, the cluster
benchmark (``bench/cluster_bench.py``) and the cluster crash loop
(``hardening/crash_loop_cluster.py``).

- ``broker_flags``: which command-line flags this checkout's broker takes
  (``--replication`` arrives with sync replication, ``--zookeeper`` with
  automatic failover): a scenario that needs a missing one says so and fails,
  rather than measuring something else.
- ``Member``: one broker process of the group and a gRPC channel to it.
- ``Group``: a ZooKeeper (``equeue_broker.testing_zk``), optionally a name
  server, and N brokers of one broker name started with ``--zookeeper``; it
  finds the master by asking each member's ``GetStats`` (role, epoch), kills
  it with SIGKILL and restarts it over its data directory.

Every wait has a deadline; every process is stopped by its PID. Nothing in
the broker imports this module, and it imports no client.
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from equeue_broker.replication.election import Layout
from equeue_broker.testing import BrokerProcess, NameServerProcess
from equeue_broker.testing_zk import ZooKeeperProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

GROUP_NAME = "g"
STATS_TIMEOUT_S = 2.0
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]


class MissingFeature(RuntimeError):
    """The broker of this checkout lacks a flag the scenario needs."""


@functools.cache
def broker_flags() -> frozenset[str]:
    """The ``--flags`` in ``python -m equeue_broker --help`` (bounded run)."""
    out = subprocess.run(
        [sys.executable, "-m", "equeue_broker", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return frozenset(
        word.strip("[],")
        for word in out.stdout.split()
        if word.startswith(("--", "[--")) and len(word.strip("[],")) > 2
    )


def require_flags(what: str, *flags: str) -> None:
    """``MissingFeature`` naming the flags this checkout's broker lacks."""
    missing = [f for f in flags if f not in broker_flags()]
    if missing:
        raise MissingFeature(
            f"{what} needs broker flag(s) {', '.join(missing)}, which this checkout's broker "
            "does not have (the feature's branch is not merged): NOT MEASURED"
        )


def wait_for(what: str, ready: Callable[[], bool], timeout_s: float, poll_s: float = 0.02) -> float:
    """Call ``ready`` until True (exceptions count as not yet); the seconds it took.
    ``TimeoutError`` after ``timeout_s``."""
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        with contextlib.suppress(grpc.RpcError, OSError):
            if ready():
                return time.monotonic() - started
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout_s:.0f} s")
        time.sleep(poll_s)


class Member:
    """One broker of a group, and a channel to its current address."""

    def __init__(self, name: str, process: BrokerProcess) -> None:
        self.name = name
        self.process = process
        self._channel: grpc.Channel | None = None
        self._channel_address = ""

    @property
    def address(self) -> str:
        return self.process.address

    def channel(self) -> grpc.Channel:
        if self._channel is None or self._channel_address != self.address:
            self.close()
            self._channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            self._channel_address = self.address
        return self._channel

    def broker(self) -> pb_grpc.BrokerStub:
        return pb_grpc.BrokerStub(self.channel())

    def admin(self) -> pb_grpc.AdminStub:
        return pb_grpc.AdminStub(self.channel())

    def stats(self, timeout_s: float = STATS_TIMEOUT_S) -> pb.BrokerStats:
        reply: pb.BrokerStats = self.admin().GetStats(pb.GetStatsRequest(), timeout=timeout_s)
        return reply

    def alive(self) -> bool:
        return self.process.alive()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


@dataclass
class GroupConfig:
    members: int = 3
    replication: str = "sync"
    """``--replication`` (sync or async); "" leaves the flag out."""
    session_timeout_ms: int | None = 2000
    """``--zk-session-timeout-ms``: the lower bound of a failover after a crash the
    replicas cannot see (a lost machine, a hang); None: the broker's default."""
    namesrv: bool = False
    flush: str = "async"
    extra_flags: tuple[str, ...] = ()
    start_timeout_s: float = 60.0
    zk_hosts: str = ""
    """An existing ZooKeeper (``HOST:PORT[/chroot]``, e.g. a test's fixture); "" starts one."""


@dataclass
class Group:
    """ZooKeeper, optionally a name server, and ``members`` brokers of one group."""

    root: Path
    config: GroupConfig = field(default_factory=GroupConfig)
    zk: ZooKeeperProcess | None = None
    namesrv: NameServerProcess | None = None
    members: list[Member] = field(default_factory=list)
    _kazoo: KazooClient | None = None

    def required_flags(self) -> list[str]:
        flags = ["--zookeeper"]
        if self.config.session_timeout_ms is not None:
            flags.append("--zk-session-timeout-ms")
        if self.config.replication:
            flags.append("--replication")
        flags += [f for f in self.config.extra_flags if f.startswith("--")]
        return flags

    def start(self) -> Group:
        require_flags("a ZooKeeper-managed group", *self.required_flags())
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.config.zk_hosts:
            self.zk = ZooKeeperProcess(self.root / "zookeeper")
            self.zk.start()
        if self.config.namesrv:
            self.namesrv = NameServerProcess(self.root / "namesrv")
            self.namesrv.start()
        for i in range(self.config.members):
            self.members.append(Member(f"m{i}", BrokerProcess(
                self.root / f"m{i}", *self.flags(), log_path=self.root / f"m{i}.log",
            )))  # fmt: skip
        for member in self.members:
            member.process.start(self.config.start_timeout_s)
        return self

    @property
    def zk_hosts(self) -> str:
        if self.config.zk_hosts:
            return self.config.zk_hosts
        assert self.zk is not None, "not started"
        return f"{self.zk.hosts}/equeue-bench"

    def flags(self) -> list[str]:
        c = self.config
        flags = [
            "--broker-name", GROUP_NAME, "--zookeeper", self.zk_hosts, "--flush", c.flush,
            "--log-level", "INFO",
        ]  # fmt: skip
        if c.session_timeout_ms is not None:
            flags += ["--zk-session-timeout-ms", str(c.session_timeout_ms)]
        if c.replication:
            flags += ["--replication", c.replication]
        if self.namesrv is not None:
            flags += ["--namesrv", self.namesrv.address]
        return [*flags, *c.extra_flags]

    # -- observation ---------------------------------------------------------------------

    def stats(self) -> dict[str, pb.BrokerStats]:
        """GetStats of every live member that answers in time."""
        out: dict[str, pb.BrokerStats] = {}
        for member in self.members:
            if not member.alive():
                continue
            with contextlib.suppress(grpc.RpcError):
                out[member.name] = member.stats()
        return out

    def master(self) -> Member | None:
        """The live member that says it is master, with the newest epoch (None: none yet)."""
        best: tuple[int, Member] | None = None
        for name, stats in self.stats().items():
            if stats.role == "master" and (best is None or stats.epoch > best[0]):
                best = (stats.epoch, self.member(name))
        return None if best is None else best[1]

    def wait_master(self, timeout_s: float = 60.0, exclude: Sequence[Member] = ()) -> Member:
        found: list[Member] = []

        def ready() -> bool:
            master = self.master()
            if master is None or master in exclude:
                return False
            found.append(master)
            return True

        wait_for("a master of the group", ready, timeout_s, poll_s=0.05)
        return found[-1]

    def in_sync(self, timeout_s: float = 60.0) -> Member:
        """Wait until the master counts every live member in sync and all have its log
        end; the master."""
        holder: list[Member] = []

        why: list[str] = ["no master yet"]

        def ready() -> bool:
            master = self.master()
            if master is None:
                return False
            # The master first: under writes the others can only reach, not
            # equal at the same instant, the end it had a moment before.
            master_stats = master.stats()
            end = master_stats.log_end_position
            stats = self.stats()
            live = [m for m in self.members if m.alive()]
            behind = [m.name for m in live
                      if m.name not in stats or stats[m.name].log_end_position < end]  # fmt: skip
            if behind:
                why[0] = f"behind the master's end {end}: {', '.join(behind)}"
                return False
            members = master_stats.in_sync
            if "--replication" in broker_flags() and len(members) < len(live):
                why[0] = f"the master's in-sync set is {list(members)}"
                return False
            # The in-sync set the election reads (ZooKeeper) may lag the master's own.
            if len(self.zk_isr()) < len(live):
                why[0] = f"ZooKeeper's in-sync set is {self.zk_isr()}"
                return False
            holder.append(master)
            return True

        try:
            wait_for("every member in sync", ready, timeout_s, poll_s=0.05)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc} (last: {why[0]})") from None
        return holder[-1]

    def zk_isr(self) -> tuple[str, ...]:
        """The group's in-sync set as ZooKeeper holds it (what an election reads)."""
        if self._kazoo is None:
            self._kazoo = KazooClient(self.zk_hosts, timeout=10.0)
            self._kazoo.start(timeout=15)
        try:
            data, _stat = self._kazoo.get(Layout(GROUP_NAME).isr)
        except NoNodeError:  # no election yet: nobody in sync
            return ()
        return tuple(json.loads(data)["members"])

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    # -- lifecycle -----------------------------------------------------------------------

    def kill(self, member: Member) -> float:
        """SIGKILL; the monotonic time of the signal."""
        assert member.process.process is not None
        at = time.monotonic()
        member.process.process.kill()
        member.process.kill()  # reaps it
        return at

    def restart(self, member: Member) -> None:
        member.close()
        member.process.start(self.config.start_timeout_s)

    def stop(self) -> None:
        if self._kazoo is not None:
            self._kazoo.stop()
            self._kazoo.close()
            self._kazoo = None
        for member in self.members:
            member.close()
            if member.process.process is not None:
                member.process.stop()
        if self.namesrv is not None and self.namesrv.process is not None:
            self.namesrv.stop()
        if self.zk is not None:
            self.zk.stop()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
