"""An orphaned candidate znode must not block the election (real ZooKeeper,
real broker processes, a real lost reply).

ZooKeeper creates a sequential znode and replies with its name; if the reply is
lost (the client drops a connection that answers too slowly: with a 2 s session
kazoo gives up after about a second, e.g. on a loaded machine while ZooKeeper
fsyncs its log), the znode exists in the still-live session and the client never
learns its name: it registers again, and the group holds two candidates of one
broker, the orphan first. With the election rules deferring to the first
electable *znode*, nobody claimed: the orphan's broker was waiting for its other
znode's turn, every other member for the orphan's broker -- no master until the
session ends, which for a live broker is never. Here a proxy in front of
ZooKeeper swallows the reply to a replica's first registration.
"""

from __future__ import annotations

import socket
import struct
import threading
import uuid
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from equeue_broker.replication.election import BASE_PATH, Layout, read_view
from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_zk import HOST, ZooKeeperProcess
from equeue_proto.v1 import broker_pb2 as pb
from tests.replication.test_failover import GROUP, SESSION_MS, Client, instance_id, role, values
from tests.support.waits import wait_for

CREATE_TYPES = (1, 15)
"""ZooKeeper's request types create and create2 (kazoo sends create)."""


class ReplyDropper:
    """A TCP proxy to ZooKeeper that passes everything both ways, except that once
    ``arm``-ed, the first create of a candidate znode is passed to the server and
    from then on nothing the server sends on that connection reaches the client
    (the reply, and the answers to its pings, are lost): the znode is created, the
    client times the connection out and reconnects (through the proxy, in the same
    session), not knowing it."""

    def __init__(self, zk_port: int) -> None:
        self.zk_port = zk_port
        self.listener = socket.create_server((HOST, 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.swallowed = threading.Event()
        """Set once a create was passed on and its reply is being swallowed."""
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self.armed.set()

    def close(self) -> None:
        for s in [self.listener, *self._sockets]:
            s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection((HOST, self.zk_port))
            self._sockets += [client, server]
            lost = threading.Event()
            for pump, args in (
                (self._requests, (client, server)),
                (self._replies, (server, client)),
            ):
                threading.Thread(target=pump, args=(*args, lost), daemon=True).start()

    def _requests(
        self, client: socket.socket, server: socket.socket, lost: threading.Event
    ) -> None:
        """Client to server, whole frames (int32 length, then the body; every body
        but the first, the connect request, starts with int32 xid, int32 type)."""
        buffer, first = b"", True
        try:
            while chunk := client.recv(65536):
                buffer += chunk
                while len(buffer) >= 4 and len(buffer) >= 4 + struct.unpack(">i", buffer[:4])[0]:
                    size = struct.unpack(">i", buffer[:4])[0]
                    frame, buffer = buffer[: 4 + size], buffer[4 + size :]
                    if not first and self.armed.is_set() and self._creates_candidate(frame):
                        self.armed.clear()
                        lost.set()  # before the server can answer
                        self.swallowed.set()
                    first = False
                    server.sendall(frame)
        except OSError:
            pass
        finally:
            for s in (client, server):
                s.close()

    @staticmethod
    def _creates_candidate(frame: bytes) -> bool:
        _, _, kind = struct.unpack(">iii", frame[:12])
        if kind not in CREATE_TYPES:
            return False
        (length,) = struct.unpack(">i", frame[12:16])
        return b"/candidates/c-" in frame[16 : 16 + length]

    @staticmethod
    def _replies(server: socket.socket, client: socket.socket, lost: threading.Event) -> None:
        try:
            while chunk := server.recv(65536):
                if not lost.is_set():
                    client.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (client, server):
                s.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_orphaned_candidate_znode_does_not_block_the_election(
    tmp_path: Path, zookeeper: ZooKeeperProcess
) -> None:
    chroot = f"/orphan-{uuid.uuid4().hex[:8]}"
    layout = Layout(GROUP, chroot + BASE_PATH)
    flags = ("--broker-name", GROUP, "--zk-session-timeout-ms", str(SESSION_MS))
    proxy = ReplyDropper(zookeeper.port)
    kazoo = KazooClient(zookeeper.hosts)
    kazoo.start(timeout=15)
    a = BrokerProcess(tmp_path / "a", *flags, "--zookeeper", f"{zookeeper.hosts}{chroot}")
    b = BrokerProcess(tmp_path / "b", *flags, "--zookeeper", f"{HOST}:{proxy.port}{chroot}")
    try:
        a.start()
        wait_for("a to be elected", lambda: role(a) == ("master", "", 1), 30)
        proxy.arm()  # b's first registration: created, its reply lost
        b.start()
        assert proxy.swallowed.wait(30), "b never registered"
        b_id = instance_id(b)

        def b_znodes() -> list[str]:
            return [c.node for c in read_view(kazoo, layout).candidates if c.broker_id == b_id]

        # b registered again in the same session: two znodes, the orphan first.
        wait_for("b's second registration", lambda: len(b_znodes()) == 2, 30)
        owners = {kazoo.get(f"{layout.candidates}/{node}")[1].ephemeralOwner for node in b_znodes()}
        assert len(owners) == 1  # one session: an orphan, not an older incarnation's znode
        m = Client(a.address)
        m.admin.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
        m.produce("t", values("first", 100))
        end = m.stats().log_end_position
        m.close()
        ids = {instance_id(a), b_id}
        wait_for(
            "b in sync",
            lambda: (
                set(read_view(kazoo, layout).isr) == ids
                and Client(b.address).stats().log_end_position == end
            ),
            30,
        )
        assert role(b) == ("replica", a.address, 1)

        a.kill()
        try:
            wait_for("b elected", lambda: role(b) == ("master", "", 2), SESSION_MS / 1000 + 10)
        except AssertionError as exc:  # say why
            view, tail = read_view(kazoo, layout), b.log_since_start()[-4000:]
            raise AssertionError(f"{exc}; ZooKeeper: {view}\n--- {b.log_path}:\n{tail}") from None
        Client(b.address).produce("t", values("after", 10))
    finally:
        for x in (a, b):
            x.kill()
        kazoo.stop()
        kazoo.close()
        proxy.close()
