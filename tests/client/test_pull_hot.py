"""The pull reply's fast reader agrees with the full one (issue 31).

``wire.parse_pull_reply`` reads a reply of only the known fields without a
``Field`` per field, and hands anything else to the field-by-field reader:
both must give the same reply, and bytes that do not parse the same error.
"""

from __future__ import annotations

import pytest

from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.wire import varint
from equeue_spark.client.errors import DataLossError
from equeue_spark.client.wire import _parse_fields, _parse_known, parse_pull_reply

REPLIES = {
    "empty": pb.PullReply(),
    "small": pb.PullReply(records=b"abc", count=1, next_offset=7, broker_id="b"),
    "every field, large numbers": pb.PullReply(
        status=pb.PULL_STATUS_OFFSET_TOO_BIG,
        records=b"r" * 70_000,
        count=4_000_000_000,
        next_offset=2**62,
        earliest_offset=2**40,
        end_offset=2**62 + 5,
        broker_id="brö-1",
    ),
    "negative offsets": pb.PullReply(next_offset=-1, earliest_offset=-5, end_offset=-(2**63)),
}


@pytest.mark.parametrize("reply", REPLIES.values(), ids=REPLIES.keys())
def test_the_fast_reader_reads_what_the_full_one_does(reply: pb.PullReply) -> None:
    data = reply.SerializeToString()
    fast = _parse_known(data)
    assert fast is not None
    assert fast == _parse_fields(data) == parse_pull_reply(data)
    assert fast.records.obj is data or not fast.records  # a view, not a copy


def test_an_unknown_field_goes_to_the_full_reader() -> None:
    data = pb.PullReply(records=b"abc", count=2).SerializeToString()
    unknown = varint(99 << 3 | 0) + varint(1)
    assert _parse_known(data + unknown) is None
    assert parse_pull_reply(data + unknown).count == 2


@pytest.mark.parametrize("cut", [1, 3, 6])
def test_truncated_replies_are_refused_as_before(cut: int) -> None:
    data = pb.PullReply(records=b"abcdef", count=1, broker_id="b").SerializeToString()
    assert _parse_known(data[:cut]) is None
    with pytest.raises(DataLossError, match="PullReply"):
        parse_pull_reply(data[:cut])
