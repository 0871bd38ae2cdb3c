"""Pull replies encoded by the broker (broker/server/wire.py) and decoded by the
client (equeue_spark/client/wire.py) without protobuf, each held to protobuf."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.server.service import _PULL_STATUS
from broker.server.wire import pull_reply_framer, varint
from broker.storage import ReadStatus, RecordsResult
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.errors import DataLossError
from equeue_spark.client.wire import PullReply, parse_pull_reply

offsets = st.integers(min_value=-(2**63), max_value=2**63 - 1)


replies = st.tuples(
    st.sampled_from(list(ReadStatus)),
    st.binary(max_size=300),
    st.integers(min_value=0, max_value=2**32 - 1),
    offsets,
    offsets,
    offsets,
    st.text(max_size=20),
)


@given(replies)
def test_framed_reply_is_byte_identical_to_protobuf(
    reply: tuple[ReadStatus, bytes, int, int, int, int, str],
) -> None:
    status, records, count, next_offset, earliest, end, broker_id = reply
    result = RecordsResult(status, b"", count, next_offset, earliest, end, len(records))
    prefix, suffix = pull_reply_framer(broker_id, _PULL_STATUS)(result)
    wire = prefix + records + suffix
    expected = pb.PullReply(
        status=_PULL_STATUS[status],
        records=records,
        count=count,
        next_offset=next_offset,
        earliest_offset=earliest,
        end_offset=end,
        broker_id=broker_id,
    )
    assert wire == expected.SerializeToString()
    assert pb.PullReply.FromString(wire) == expected


def test_varint_edges() -> None:
    assert varint(0) == b"\x00"
    assert varint(127) == b"\x7f"
    assert varint(128) == b"\x80\x01"
    assert varint(-1) == b"\xff" * 9 + b"\x01"  # int64 -1: ten bytes


@given(replies)
def test_client_decoder_reads_what_protobuf_writes(
    reply: tuple[ReadStatus, bytes, int, int, int, int, str],
) -> None:
    status, records, count, next_offset, earliest, end, broker_id = reply
    message = pb.PullReply(
        status=_PULL_STATUS[status],
        records=records,
        count=count,
        next_offset=next_offset,
        earliest_offset=earliest,
        end_offset=end,
        broker_id=broker_id,
    )
    data = message.SerializeToString()
    parsed = parse_pull_reply(data)
    assert parsed == PullReply(
        _PULL_STATUS[status], memoryview(records), count, next_offset, earliest, end, broker_id
    )
    if records:
        assert parsed.records.obj is data  # a view of the message, not a copy


def test_client_decoder_skips_unknown_fields_and_refuses_truncation() -> None:
    data = pb.PullReply(records=b"abc", count=1, next_offset=7, broker_id="b").SerializeToString()
    unknown = (
        varint(99 << 3 | 0) + varint(12345)  # varint
        + varint(98 << 3 | 1) + bytes(8)  # fixed64
        + varint(97 << 3 | 2) + varint(3) + b"xyz"  # length-delimited
        + varint(96 << 3 | 5) + bytes(4)  # fixed32
    )  # fmt: skip
    parsed = parse_pull_reply(unknown + data + unknown)
    assert (bytes(parsed.records), parsed.count, parsed.next_offset, parsed.broker_id) == (
        b"abc", 1, 7, "b",
    )  # fmt: skip
    for cut in (1, 3, len(data) - 1):
        with pytest.raises(DataLossError, match="PullReply"):
            parse_pull_reply(data[:cut] if cut != 1 else data[:-4])
    with pytest.raises(DataLossError, match="wire type 3"):
        parse_pull_reply(varint(5 << 3 | 3))
