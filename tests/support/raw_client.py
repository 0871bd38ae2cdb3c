"""A raw gRPC client of one broker for the replication tests: the generated
stubs, a produce of plain values and GetStats, nothing else (the tests check
the broker's wire behaviour, so they do not go through the equeue client)."""

from __future__ import annotations

from typing import Any

import grpc

from equeue_proto.protocol import ERROR_KIND_KEY
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc


class RawClient:
    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(
            address, options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        self.broker = pb_grpc.BrokerStub(self.channel)
        self.admin = pb_grpc.AdminStub(self.channel)

    def produce(self, topic: str, values: list[bytes], txn: str = "") -> pb.ProduceReply:
        columns = pb.MessageColumns(
            count=len(values), values=b"".join(values), value_lengths=[len(v) for v in values]
        )
        request = pb.ProduceRequest(topic=topic, messages=columns, transaction_id=txn)
        reply: pb.ProduceReply = self.broker.Produce(request, timeout=30)
        return reply

    def stats(self) -> pb.BrokerStats:
        reply: pb.BrokerStats = self.admin.GetStats(pb.GetStatsRequest(), timeout=10)
        return reply

    def try_stats(self) -> pb.BrokerStats | None:
        """GetStats, or None when the broker does not answer."""
        try:
            return self.stats()
        except grpc.RpcError:
            return None

    def close(self) -> None:
        self.channel.close()


def error_kind(error: grpc.RpcError) -> str:
    """A failed call's kind (``protocol.ERROR_KIND_KEY`` trailer), or ""."""
    trailers: Any = error.trailing_metadata() or ()
    for key, value in trailers:
        if key == ERROR_KIND_KEY:
            return value if isinstance(value, str) else bytes(value).decode()
    return ""
