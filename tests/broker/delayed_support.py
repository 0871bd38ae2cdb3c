"""Raw gRPC helpers for the delayed-delivery and retry tests (the broker's wire
behaviour, without the client's Producer delay or Consumer.nack)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc

from equeue_proto.record import encode_headers
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.records import Message, decode_records
from tests.support.raw_client import RawClient

Headers = Sequence[tuple[str, bytes]]


def now_ms() -> int:
    return int(time.time() * 1000)


def produce(
    client: RawClient,
    topic: str,
    values: list[bytes],
    *,
    deliver_at_ms: Sequence[int] = (),
    headers: Headers = (),
    key: bytes | None = None,
    tag: str = "",
    txn: str = "",
) -> pb.ProduceReply:
    count = len(values)
    columns = pb.MessageColumns(
        count=count, values=b"".join(values), value_lengths=[len(v) for v in values]
    )
    if key is not None:
        columns.keys = key * count
        columns.key_lengths.extend([len(key)] * count)
    if tag:
        columns.tags.extend([tag] * count)
    if headers:
        encoded = encode_headers(tuple(headers))
        columns.headers = encoded * count
        columns.header_lengths.extend([len(encoded)] * count)
    request = pb.ProduceRequest(
        topic=topic, messages=columns, deliver_at_ms=list(deliver_at_ms), transaction_id=txn
    )
    reply: pb.ProduceReply = client.broker.Produce(request, timeout=30)
    return reply


def pull(
    client: RawClient, topic: str, offset: int, queue_id: int = 0, wait_ms: int = 0
) -> tuple[list[Message], pb.PullReply]:
    request = pb.PullRequest(topic=topic, queue_id=queue_id, offset=offset, max_wait_ms=wait_ms)
    reply: pb.PullReply = client.broker.Pull(request, timeout=30 + wait_ms / 1000)
    return decode_records(reply.records, reply.broker_id), reply


def pull_until(
    client: RawClient, topic: str, offset: int, count: int, timeout_s: float = 30.0
) -> list[Message]:
    """``count`` messages from ``offset`` on, waiting for them with long polls
    (the broker answers as soon as they are appended); fails after ``timeout_s``."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        left_ms = int((deadline - time.monotonic()) * 1000)
        assert left_ms > 0, f"{topic}: {len(got)} of {count} messages after {timeout_s} s"
        messages, reply = pull(client, topic, offset, wait_ms=min(left_ms, 5_000))
        got += messages
        offset = reply.next_offset
    return got


def error_of(call: object) -> grpc.RpcError:
    """The RpcError a zero-argument call raises (fails if it does not)."""
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("the call succeeded")


def header(message: Message, key: str) -> bytes | None:
    return dict(message.headers).get(key)


def nack(
    client: RawClient,
    topic: str,
    offset: int,
    *,
    group: str = "billing",
    delay_ms: int = 100,
    error: str = "",
    max_: int = 0,
) -> pb.NackOutcome:
    """Nack the record at ``offset`` of ``topic``'s queue 0 for ``group``: its outcome."""
    entry = pb.NackEntry(topic=topic, queue_id=0, offset=offset, delay_ms=delay_ms, error=error)
    request = pb.NackRequest(group=group, entries=[entry], max_reconsume_times=max_)
    reply: pb.NackReply = client.broker.Nack(request, timeout=30)
    (outcome,) = reply.outcomes
    return outcome
