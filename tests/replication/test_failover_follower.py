"""A replica whose master ends its stream under it keeps following, and
changes role (real broker process, real gRPC).

A master's replication stream can end between the follower's read of a reply
and its next request: then ``call.write`` raises grpc's ``InvalidStateError``
("RPC already finished."). That happens when the master dies while the replica
is stopped with a reply in its socket (tests/replication/test_failover.py's SIGSTOP,
write, SIGKILL, SIGCONT). The follower used to end with that error, and the
promotion that stopped the dead follower re-raised it: the elected replica
never became master, ZooKeeper named it master, and with its znode alive no
other election could follow (seen in test_zookeeper_failover under load:
"becoming master of 2 failed: RPC already finished."). Now the follower
reconnects (follower.py), and a role change never fails on a follower's own
error (failover.py).

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

from equeue_broker.replication.replica_log import Metadata, encode_metadata
from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from tests.replication.test_failover import GROUP, Client, role, values
from tests.support.waits import wait_for


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
def test_a_follower_outlives_a_finished_stream_and_the_replica_is_promoted(tmp_path: Path) -> None:
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
        # Each stream is a chance for the write to find the RPC finished; the
        # follower reconnects after it (with its back-off: at most every 2 s).
        finished = "the stream ended (RPC already finished.)"
        wait_for("a write on a finished stream",
                 lambda: finished in replica.log_since_start(), 60)  # fmt: skip
        seen = master.streams
        wait_for("the follower to reconnect after it", lambda: master.streams > seen, 10)
        assert role(replica) == ("replica", f"127.0.0.1:{port}", 0)
        client = Client(replica.address)
        client.admin.SetRole(pb.SetRoleRequest(role="master", epoch=1), timeout=10)
        assert role(replica) == ("master", "", 1)
        client.admin.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
        client.produce("t", values("promoted", 5))
        client.close()
        assert "becoming master" not in replica.log_since_start()
    finally:
        replica.kill()
        server.stop(None)
