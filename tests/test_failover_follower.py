"""A replica whose follower died must still change role (real broker process,
real gRPC).

A master's replication stream can end between the follower's read of a reply
and its next request: then ``call.write`` raises grpc's ``InvalidStateError``
("RPC already finished."), which the follower does not catch, and its task ends
with it. That happens when the master dies while the replica is stopped with a
reply in its socket (tests/test_failover.py's SIGSTOP, write, SIGKILL, SIGCONT).
The promotion that stops the dead follower used to re-raise its error: the
elected replica never became master, ZooKeeper named it master, and with its
znode alive no other election could follow (seen in test_zookeeper_failover
under load: "becoming master of 2 failed: RPC already finished.").

Here a stand-in master (a gRPC Replication service in this process) ends every
stream right after one reply carrying metadata, so that the follower's next write
finds the RPC finished; the replica is then promoted through Admin ``SetRole``,
which stops the follower the same way an election's promotion does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from equeue_broker.storage.replicated import Metadata, encode_metadata
from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from tests.test_failover import GROUP, Client, role, values

SILENT_S = 5.0
"""No new stream for this long: the follower is gone (it retries within 2 s)."""


class OneReplyMaster(pb_grpc.ReplicationServicer):
    """Answers a stream's first request with one reply, then ends the stream."""

    def __init__(self) -> None:
        self.streams = 0
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def Replicate(  # noqa: N802 - the gRPC method's name
        self, request_iterator: Iterator[pb.ReplicateRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.ReplicateReply]:
        request = next(request_iterator)
        with self.lock:
            self.streams += 1
            self.last = time.monotonic()
        # The metadata makes the follower apply it on a thread (an await) before
        # its next write: by then the stream has ended.
        yield pb.ReplicateReply(
            position=request.position, master_end=request.position,
            chunk_capacity=request.chunk_capacity, high_watermark=request.position,
            epoch=request.epoch, metadata=encode_metadata(Metadata(GROUP, (), {})),
        )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_promotion_stops_a_follower_that_died_of_a_finished_rpc(tmp_path: Path) -> None:
    master = OneReplyMaster()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_ReplicationServicer_to_server(master, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    replica = BrokerProcess(
        tmp_path / "r", "--broker-name", GROUP, "--role", "replica", "--master", f"127.0.0.1:{port}"
    )
    try:
        replica.start()
        # Each stream is a chance for the write to find the RPC finished (most
        # are taken); a follower that read the end first reconnects.
        deadline = time.monotonic() + 60
        while time.monotonic() - master.last < SILENT_S or master.streams == 0:
            assert time.monotonic() < deadline, f"the follower survived {master.streams} streams"
            time.sleep(0.2)
        assert role(replica) == ("replica", f"127.0.0.1:{port}", 0)
        client = Client(replica.address)
        client.admin.SetRole(pb.SetRoleRequest(role="master", epoch=1), timeout=10)
        assert role(replica) == ("master", "", 1)
        client.admin.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
        client.produce("t", values("promoted", 5))
        client.close()
        log = replica.log_since_start()
        assert "the follower failed: InvalidStateError('RPC already finished.')" in log, log
    finally:
        replica.kill()
        server.stop(None)
