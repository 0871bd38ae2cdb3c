"""Group election and epoch fencing against a real ZooKeeper (equeue_broker.replication.election).

Members run in this process (a ``GroupElection`` each, its own ZooKeeper session)
or, where a test must freeze one, in a child process. Every wait is on an event
(a callback recorded under a condition, a line from a child) or a bounded poll.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

from equeue_broker.replication.election import (
    BASE_PATH,
    Candidate,
    ElectionError,
    Epoch,
    GroupElection,
    Layout,
    NotMaster,
    Role,
    StaleEpoch,
    claim,
    decide,
    read_view,
)
from equeue_broker.replication.zk_hosts import parse_hosts
from equeue_broker.testing_zk import ZooKeeperProcess, free_port, java_available
from tests.support.waits import wait_for

ROOT = Path(__file__).resolve().parents[2]
SESSION_S = 2.0
"""Session timeout of the test members: how long a frozen member stays master."""
WAIT_S = 30.0

Event = tuple[str, Epoch | None]


class Member:
    """A ``GroupElection`` whose callbacks are recorded, with waits on them."""

    def __init__(
        self, hosts: str, group: str, broker_id: str, session_timeout_s: float = SESSION_S
    ) -> None:
        self.broker_id = broker_id
        self.position = 0
        self.events: list[Event] = []
        self.cond = threading.Condition()
        self.election = GroupElection(
            hosts,
            group,
            broker_id,
            f"{broker_id}.example:9000",
            lambda: self.position,
            on_master=lambda epoch: self._record("master", epoch),
            on_replica=lambda epoch: self._record("replica", epoch),
            session_timeout_s=session_timeout_s,
            recheck_s=1.0,
        )

    def _record(self, kind: str, epoch: Epoch | None) -> None:
        with self.cond:
            self.events.append((kind, epoch))
            self.cond.notify_all()

    def wait(self, what: str, predicate: Callable[[list[Event]], bool]) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: predicate(self.events), WAIT_S):
                raise AssertionError(f"{self.broker_id}: no {what} in {WAIT_S}s: {self.events}")

    def wait_master(self, epoch: int) -> Epoch:
        self.wait(
            f"mastership of epoch {epoch}",
            lambda ev: bool(ev) and ev[-1][0] == "master" and _number(ev[-1][1]) == epoch,
        )
        found = self.events[-1][1]
        assert found is not None
        return found

    def wait_following(self, master_id: str | None, epoch: int | None = None) -> None:
        def following(ev: list[Event]) -> bool:
            if not ev or ev[-1][0] != "replica":
                return False
            last = ev[-1][1]
            if master_id is None:
                return last is None
            return last is not None and last.master_id == master_id and last.epoch == epoch

        self.wait(f"replica of {master_id} (epoch {epoch})", following)


def _number(epoch: Epoch | None) -> int | None:
    return epoch.epoch if epoch else None


@pytest.fixture
def members() -> Iterator[Callable[..., Member]]:
    """``members(hosts, group, broker_id)``: started members, closed at teardown."""
    made: list[Member] = []

    def make(hosts: str, group: str, broker_id: str, **kwargs: float) -> Member:
        member = Member(hosts, group, broker_id, **kwargs)
        made.append(member)
        member.election.start()
        return member

    yield make
    for member in made:
        member.election.close()


def expire_session(hosts: str, member: Member) -> None:
    """Expire ``member``'s session as ZooKeeper would after a long silence: a
    second client attaches to the same session and closes it."""
    client_id = member.election.client.client_id
    assert client_id is not None
    other = KazooClient(parse_hosts(hosts)[0], client_id=client_id)
    other.start(timeout=WAIT_S)
    other.stop()
    other.close()


def in_state(member: Member, state: str) -> Callable[[], bool]:
    return lambda: member.election.client.state == state


# -- rules and records without ZooKeeper ---------------------------------------


def cand(node_seq: int, broker_id: str) -> Candidate:
    return Candidate(f"c-{node_seq:010d}", broker_id, f"{broker_id}:1", 0)


def test_rules_without_zookeeper() -> None:
    a, b, c = cand(1, "a"), cand(2, "b"), cand(3, "c")
    first = decide("g", (b, a), epoch=None, epoch_version=-1, isr=(), isr_version=-1)
    assert first.master is None and first.electable == (b, a)  # read_view sorts by sequence
    epoch = Epoch(1, "a", "a:1", a.node, 0, ((1, 0),))
    live = decide("g", (a, b, c), epoch=epoch, epoch_version=0, isr=("a", "b"), isr_version=0)
    assert live.master == a and live.reason == "" and live.electable == ()
    gone = decide("g", (b, c), epoch=epoch, epoch_version=0, isr=("a", "b"), isr_version=0)
    assert gone.master is None and gone.electable == (b,)
    unclean = decide("g", (b, c), epoch=epoch, epoch_version=0, isr=("a",), isr_version=0)
    assert unclean.electable == () and "no unclean election" in unclean.reason
    # The dead master's new incarnation claims last, but may claim as the last in-sync member.
    back = cand(4, "a")
    assert decide("g", (back, b), epoch=epoch, epoch_version=0, isr=("a", "b"),
                  isr_version=0).electable == (b, back)  # fmt: skip
    assert decide("g", (back, c), epoch=epoch, epoch_version=0, isr=("a",),
                  isr_version=0).electable == (back,)  # fmt: skip


def test_epoch_history_and_hosts() -> None:
    epoch = Epoch(3, "c", "c:1", "c-3", 900, ((1, 0), (2, 500), (3, 900)))
    assert epoch.previous() == (2, 500)
    assert (epoch.end_of(1), epoch.end_of(2), epoch.end_of(3), epoch.end_of(0)) == (
        500,
        900,
        None,
        None,
    )
    assert Epoch.decode(epoch.encode()) == epoch
    assert parse_hosts("h1:2181,h2:2181/equeue/prod/") == ("h1:2181,h2:2181", "/equeue/prod")
    assert parse_hosts("127.0.0.1:2181") == ("127.0.0.1:2181", "")
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_hosts("h1")
    with pytest.raises(StaleEpoch):
        raise StaleEpoch(1, 2)


# -- the harness -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_zookeeper_process_restarts_on_its_port_with_its_data(
    zookeeper_factory: Callable[[], ZooKeeperProcess],
) -> None:
    zk = zookeeper_factory()
    assert "Mode: standalone" in zk.srvr()
    client = KazooClient(zk.hosts)
    client.start(timeout=WAIT_S)
    client.create("/kept", b"1")
    client.stop()
    client.close()
    port, pid = zk.port, zk.pid
    zk.stop()
    assert not zk.alive() and zk.srvr() == ""
    zk.start()
    assert (zk.port, zk.pid != pid) == (port, True)
    client = KazooClient(zk.hosts)
    client.start(timeout=WAIT_S)
    assert client.get("/kept")[0] == b"1"
    zk.pause()
    assert zk.srvr() == ""  # hung: connects, never answers
    zk.resume()
    assert "Mode: standalone" in wait_for("srvr after SIGCONT", zk.srvr, WAIT_S)
    client.stop()
    client.close()


# -- elections -----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_one_master_among_three(zk_hosts: str, members: Callable[..., Member]) -> None:
    group = [members(zk_hosts, "broker-a", name) for name in "abc"]  # registering concurrently
    for member in group:
        member.wait("a master", lambda ev: bool(ev) and ev[-1][1] is not None)
    masters = [m for m in group if m.election.is_master()]
    assert len(masters) == 1
    master = masters[0]
    first = master.wait_master(1)
    assert (first.master_id, first.master_address, first.previous()) == (
        master.broker_id,
        f"{master.broker_id}.example:9000",
        None,
    )
    for member in group:
        if member is not master:
            member.wait_following(master.broker_id, 1)
            assert member.election.role is Role.REPLICA
            with pytest.raises(NotMaster):
                member.election.publish_isr([member.broker_id])
    view = group[2].election.current()
    assert view.master is not None and view.master.broker_id == master.broker_id
    # The first candidate to register won; the in-sync set starts as the master alone.
    assert view.candidates[0].broker_id == master.broker_id
    assert sorted(c.broker_id for c in view.candidates) == ["a", "b", "c"]
    assert view.isr == (master.broker_id,) and view.reason == ""
    assert [kind for kind, _ in master.events] == ["master"]  # no flapping


@pytest.mark.timeout(60)
def test_master_gone_in_sync_replica_takes_over(
    zk_hosts: str, members: Callable[..., Member]
) -> None:
    a = members(zk_hosts, "g", "a")
    a.wait_master(1)
    b, c = members(zk_hosts, "g", "b"), members(zk_hosts, "g", "c")
    b.wait_following("a", 1)
    c.wait_following("a", 1)
    a.election.publish_isr(["b", "c"])
    assert c.election.current().isr == ("a", "b", "c")
    b.position = 4096  # b's log end when it takes over: the boundary of epoch 1
    a.election.close()  # the session ends: a's candidate znode goes at once
    second = b.wait_master(2)
    assert (second.start_position, second.previous(), second.end_of(1)) == (4096, (1, 0), 4096)
    c.wait_following("b", 2)
    assert c.election.current().isr == ("b", "c")  # the dead master left the in-sync set
    # Fencing: whoever has seen epoch 2 refuses epoch 1.
    with pytest.raises(StaleEpoch):
        c.election.fence(1)
    c.election.fence(2)
    assert c.election.epoch == 2


@pytest.mark.timeout(60)
def test_a_master_that_resigns_hands_the_group_to_an_in_sync_member(
    zk_hosts: str, members: Callable[..., Member]
) -> None:
    """A broker that could not become the master it was elected resigns
    (failover.py): its znode goes, another in-sync member is elected at once,
    and it stands for nothing until its hold ends, then only as a replica."""
    a = members(zk_hosts, "g", "a")
    a.wait_master(1)
    b = members(zk_hosts, "g", "b")
    b.wait_following("a", 1)
    a.election.publish_isr(["b"])
    a.election.resign(hold_s=2.0)
    b.wait_master(2)
    a.wait_following("b", 2)
    assert [c.broker_id for c in b.election.current().candidates] == ["b"]
    # The hold over, it stands again: behind b, which stays master. (Once seen to
    # time out under load, not reproduced since: the failure says where each stood.)
    try:
        wait_for("a to stand again",
                 lambda: len(b.election.current().candidates) == 2, WAIT_S)  # fmt: skip
    except AssertionError as e:
        states = [(m.broker_id, m.election.client.state, m.events) for m in (a, b)]
        raise AssertionError(f"{e}: {states}; view {b.election.current()}") from None
    assert b.election.is_master() and not a.election.is_master()


@pytest.mark.timeout(60)
def test_expired_master_stops_being_master_and_rejoins_as_replica(
    zk_hosts: str, members: Callable[..., Member]
) -> None:
    a = members(zk_hosts, "g", "a")
    first = a.wait_master(1)
    b = members(zk_hosts, "g", "b")
    b.wait_following("a", 1)
    a.election.publish_isr(["b"])
    expire_session(zk_hosts, a)
    # a learns its session expired: no longer master, before anything else.
    a.wait("demotion", lambda ev: ("replica", None) in ev)
    assert a.events[: a.events.index(("replica", None)) + 1] == [
        ("master", first),
        ("replica", None),
    ]
    b.wait_master(2)
    a.wait_following("b", 2)  # a new session, a new candidate znode, out of the ISR
    assert not a.election.is_master() and a.election.master_epoch is None
    with pytest.raises(NotMaster):
        a.election.publish_isr(["a"])
    view = b.election.current()
    assert view.isr == ("b",) and sorted(c.broker_id for c in view.candidates) == ["a", "b"]


@pytest.mark.timeout(60)
def test_no_unclean_election(zk_hosts: str, members: Callable[..., Member]) -> None:
    a = members(zk_hosts, "g", "a")
    a.wait_master(1)
    b, c = members(zk_hosts, "g", "b"), members(zk_hosts, "g", "c")
    b.wait_following("a", 1)
    c.wait_following("a", 1)  # the in-sync set is a alone
    a.election.close()
    b.wait_following(None)
    c.wait_following(None)
    view = b.election.current()
    assert view.master is None and view.electable == ()
    assert "no unclean election" in view.reason and "in sync: a" in view.reason
    assert view.epoch is not None and view.epoch.epoch == 1  # nobody claimed
    # b's and c's periodic re-checks (every second) change nothing either.
    with b.cond:
        assert not b.cond.wait_for(lambda: b.events[-1][0] == "master", 2.5)
    assert b.election.current().epoch == view.epoch
    # The last in-sync member returns: it is elected (its log is the group's).
    a2 = members(zk_hosts, "g", "a")
    a2.wait_master(2)
    b.wait_following("a", 2)
    c.wait_following("a", 2)


@pytest.mark.timeout(60)
def test_two_contenders_one_epoch_bump(zk_hosts: str) -> None:
    hosts, chroot = parse_hosts(zk_hosts)
    layout = Layout("g", chroot + BASE_PATH)
    clients = [KazooClient(hosts) for _ in range(3)]
    try:
        contenders = []
        for client, name in zip(clients, "xyz", strict=True):
            client.start(timeout=WAIT_S)
            path = client.create(
                f"{layout.candidates}/c-",
                Candidate("c-0", name, f"{name}:1", 0).encode(),
                ephemeral=True,
                sequence=True,
                makepath=True,
            )
            contenders.append(Candidate(path.rpartition("/")[2], name, f"{name}:1", 0))

        def race(pairs: list[tuple[KazooClient, Candidate]]) -> list[Epoch | None]:
            view = read_view(clients[0], layout)  # both contend on the same read
            barrier = threading.Barrier(len(pairs))
            results: list[Epoch | None] = [None] * len(pairs)

            def contend(i: int) -> None:
                barrier.wait()
                results[i] = claim(pairs[i][0], layout, view, pairs[i][1])

            threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(pairs))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(WAIT_S)
            return results

        # The group's first election: both create the epoch znode; one create wins.
        first = race([(clients[1], contenders[1]), (clients[2], contenders[2])])
        assert sum(r is not None for r in first) == 1
        winner = next(r for r in first if r is not None)
        assert winner.epoch == 1
        # Both in sync; the master goes; both claim epoch 2 on the same version.
        clients[0].set(layout.isr, b'{"epoch": 1, "members": ["x", "y", "z"]}')
        loser_index = 2 if winner.master_id == "y" else 1
        clients[3 - loser_index].stop()  # the master's session ends
        remaining = [(clients[0], contenders[0]), (clients[loser_index], contenders[loser_index])]
        second = race(remaining)
        assert sum(r is not None for r in second) == 1
        data, stat = clients[0].get(layout.epoch)
        assert (Epoch.decode(data).epoch, stat.version) == (2, 1)  # bumped exactly once
    finally:
        for client in clients:
            client.stop()
            client.close()


SESSION_DOWN_S = 8.0
"""Session timeout of the ZooKeeper-outage test's members."""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_zookeeper_down_master_stays_elections_resume_when_it_returns(
    zookeeper_factory: Callable[[], ZooKeeperProcess], members: Callable[..., Member]
) -> None:
    zk = zookeeper_factory()
    hosts = f"{zk.hosts}/down"
    # Sessions of 8 s: ZooKeeper restarts their timers when it comes back, so
    # a member must reconnect within 8 s of that (a loaded CI machine has
    # taken over 4 s to); the outage below still lasts longer than them.
    a = members(hosts, "g", "a", session_timeout_s=SESSION_DOWN_S)
    a.wait_master(1)
    b = members(hosts, "g", "b", session_timeout_s=SESSION_DOWN_S)
    b.wait_following("a", 1)
    a.election.publish_isr(["b"])
    seen = (list(a.events), list(b.events))
    zk.stop()
    for member in (a, b):
        wait_for(
            f"{member.broker_id} suspended",
            in_state(member, KazooState.SUSPENDED),
            WAIT_S,
        )
    # Down longer than the session timeout: the master keeps its role, nothing is decided.
    with a.cond:
        assert not a.cond.wait_for(lambda: len(a.events) > len(seen[0]), SESSION_DOWN_S + 0.5)
    assert a.election.is_master() and a.election.master_epoch is not None
    assert not b.election.is_master()
    assert (a.events, b.events) == seen
    zk.start()
    for member in (a, b):
        wait_for(
            f"{member.broker_id} reconnected",
            in_state(member, KazooState.CONNECTED),
            WAIT_S,
        )
    # The master's session came back: same master, same epoch, no callback.
    view = b.election.current()
    assert view.master is not None and view.master.broker_id == "a"
    assert view.epoch is not None and view.epoch.epoch == 1
    assert a.events == seen[0]
    # The replica's too, or (reconnecting later than its session allows) it
    # joined again as a replica of the same master and epoch: never anything else.
    again = b.events[len(seen[1]) :]
    assert b.events[: len(seen[1])] == seen[1]
    assert again in ([], [("replica", None), seen[1][-1]]), again
    # Elections work again.
    a.election.close()
    b.wait_master(2)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_frozen_master_is_replaced_after_its_session_times_out(
    zk_hosts: str, members: Callable[..., Member]
) -> None:
    """A master process SIGSTOPped (hung) keeps its znode for the session timeout;
    then an in-sync replica takes over; resumed, the old master learns it lost."""
    out: list[dict[str, object]] = []
    cond = threading.Condition()
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.election_member", zk_hosts, "g", "a", "2.0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            with cond:
                out.append(json.loads(line))
                cond.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def wait_line(what: str, line: dict[str, object]) -> None:
        with cond:
            if not cond.wait_for(lambda: line in out, WAIT_S):
                raise AssertionError(f"child: no {what} in {WAIT_S}s: {out}")

    try:
        wait_line("mastership", {"role": "master", "epoch": 1})
        b = members(zk_hosts, "g", "b")
        b.wait_following("a", 1)
        # The test plays the master's replication layer: b is recorded in sync.
        chroot = parse_hosts(zk_hosts)[1]
        b.election.client.set(
            f"{chroot}{BASE_PATH}/groups/g/isr", b'{"epoch": 1, "members": ["a", "b"]}'
        )
        os.kill(child.pid, signal.SIGSTOP)
        b.wait_master(2)  # after a's session timed out (2 s)
        os.kill(child.pid, signal.SIGCONT)
        wait_line("demotion", {"role": "replica", "master": None, "epoch": None})
        wait_line("following b", {"role": "replica", "master": "b", "epoch": 2})
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait(WAIT_S)
        reader.join(WAIT_S)
        if child.stdout is not None:
            child.stdout.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_master_dying_while_zookeeper_is_down_is_replaced_after_it_returns(
    zookeeper_factory: Callable[[], ZooKeeperProcess], members: Callable[..., Member]
) -> None:
    zk = zookeeper_factory()
    hosts = f"{zk.hosts}/died-down"
    a = members(hosts, "g", "a")
    a.wait_master(1)
    b = members(hosts, "g", "b")
    b.wait_following("a", 1)
    a.election.publish_isr(["b"])
    zk.stop()
    wait_for("b suspended", in_state(b, KazooState.SUSPENDED), WAIT_S)
    a.election.close()  # dies: its session cannot be closed, it will expire
    before = list(b.events)
    zk.start()
    b.wait_master(2)  # one session timeout after ZooKeeper is back
    after = b.events[len(before) :]
    assert b.events[: len(before)] == before and after[-1:] == [("master", b.election.master_epoch)]
    # Under load b's own session may expire before it reconnects (ZooKeeper
    # restarts sessions' timers when it comes back): b is then a replica of
    # nobody until it wins. It never follows anyone in between.
    assert all(event == ("replica", None) for event in after[:-1]), after


def test_unreachable_zookeeper_fails_start_in_bounded_time() -> None:
    election = GroupElection(f"127.0.0.1:{free_port()}", "g", "x", "x:1", lambda: 0)
    with pytest.raises(ElectionError, match="not reachable"):
        election.start(wait_s=1.0)
    assert election.role is Role.REPLICA and election.master_epoch is None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_start_without_waiting_joins_when_zookeeper_comes_up(tmp_path: Path) -> None:
    if not java_available():
        pytest.skip("java is not installed: ZooKeeper needs a JRE (CI has Java 17)")
    zk = ZooKeeperProcess(tmp_path / "zk")  # its port chosen, the server not started yet
    elected = threading.Event()
    election = GroupElection(
        f"{zk.hosts}/late", "g", "a", "a:1", lambda: 0, on_master=lambda _: elected.set()
    )
    try:
        election.start(wait_s=None)  # returns at once: ZooKeeper is not there
        assert not election.is_master()
        assert "not connected" in election.current().reason
        zk.start()
        assert elected.wait(WAIT_S), "not elected after ZooKeeper came up"
        assert election.master_epoch is not None and election.master_epoch.epoch == 1
    finally:
        election.close()
        zk.stop()


@pytest.mark.timeout(90)
def test_a_session_lost_in_mid_step_is_not_lost_twice(
    zk_hosts: str, members: Callable[..., Member]
) -> None:
    """The election thread learns of a lost session from a queued LOST event; kazoo
    may have a new session before the thread reads it. Here b's step is held (in
    its position read, claiming) while its session expires and kazoo opens a new
    one; the step goes on in the new session (registers anew, wins epoch 2). The
    LOST event read afterwards must not discard that registration: it would demote
    b and leave its winning znode, alive in b's session, the master forever."""
    a = members(zk_hosts, "g", "a")
    a.wait_master(1)
    b = members(zk_hosts, "g", "b")
    b.wait_following("a", 1)
    a.election.publish_isr(["b"])
    entered, release = threading.Event(), threading.Event()

    def held_position() -> int:
        entered.set()
        release.wait(WAIT_S)
        return 4096

    b.election.position_fn = held_position
    a.election.close()  # b claims epoch 2: its step waits in held_position
    assert entered.wait(WAIT_S), "b did not try to claim"
    old = b.election.client.client_id
    expire_session(zk_hosts, b)
    wait_for(
        "b's new session",
        lambda: (
            b.election.client.state == KazooState.CONNECTED
            and b.election.client.client_id not in (None, old)
        ),
        WAIT_S,
    )
    b.election.position_fn = lambda: 4096
    release.set()
    second = b.wait_master(2)
    assert second.master_id == "b"
    # Settled: b stays master, ZooKeeper agrees, b has one candidate znode.
    with b.cond:
        assert not b.cond.wait_for(lambda: b.events[-1][0] != "master", 3.0), b.events
    view = b.election.current()
    assert view.master is not None and view.master.broker_id == "b"
    assert b.election.is_master()
    assert [c.broker_id for c in view.candidates] == ["b"], view.candidates
