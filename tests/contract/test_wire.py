"""Pull replies encoded by the broker (broker/equeue_broker/server/wire.py) and decoded by the
client (equeue_spark/client/wire.py) without protobuf, and replication replies
(broker/equeue_broker/replication/wire.py), each held to protobuf."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from equeue_broker.replication.wire import ReplyDecodeError, decode_reply, encode_reply
from equeue_broker.server.errors import (
    BadRequest,
    NotEnoughReplicas,
    ReplicaReadOnly,
    StaleEpoch,
    status_for,
    trailers_for,
)
from equeue_broker.server.service_data import _PULL_STATUS
from equeue_broker.server.wire import (
    _split_py,
    _varints_py,
    produce_reply,
    pull_reply_framer,
)
from equeue_broker.storage import ReadStatus, RecordsResult
from equeue_broker.storage.index.queue_index import ENTRY
from equeue_proto import accel, wire
from equeue_proto.protocol import ERROR_KIND_KEY, NOT_ENOUGH_REPLICAS, NOT_MASTER, STALE_EPOCH
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.wire import WireError, varint
from equeue_spark.client.errors import DataLossError, NotMasterError, from_rpc_error
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


Reply = tuple[ReadStatus, bytes, int, int, int, int, str]


def proto_reply(reply: Reply) -> pb.PullReply:
    status, records, count, next_offset, earliest, end, broker_id = reply
    return pb.PullReply(
        status=_PULL_STATUS[status],
        records=records,
        count=count,
        next_offset=next_offset,
        earliest_offset=earliest,
        end_offset=end,
        broker_id=broker_id,
    )


@given(replies)
def test_framed_reply_is_byte_identical_to_protobuf(
    reply: tuple[ReadStatus, bytes, int, int, int, int, str],
) -> None:
    status, records, count, next_offset, earliest, end, broker_id = reply
    result = RecordsResult(status, b"", count, next_offset, earliest, end, len(records))
    prefix, suffix = pull_reply_framer(broker_id, _PULL_STATUS)(result)
    wire = prefix + records + suffix
    expected = proto_reply(reply)
    assert wire == expected.SerializeToString()
    assert pb.PullReply.FromString(wire) == expected


def test_varint_edges() -> None:
    assert varint(0) == b"\x00"
    assert varint(127) == b"\x7f"
    assert varint(128) == b"\x80\x01"
    assert varint(-1) == b"\xff" * 9 + b"\x01"  # int64 -1: ten bytes


@given(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.binary(max_size=300),
    st.lists(st.integers(min_value=0, max_value=2**62), max_size=20),
)
def test_field_reader_walks_what_protobuf_writes(
    offset: int, count: int, records: bytes, positions: list[int]
) -> None:
    """equeue_proto.wire.fields: every field protobuf wrote, back to back, with
    its value (int64 read back signed) and its payload's bytes."""
    message = pb.PullReply(next_offset=offset, count=count, records=records, broker_id="b")
    head = message.SerializeToString()
    data = head + pb.ProduceReply(positions=positions).SerializeToString()  # two, back to back
    found = list(wire.fields(data, "PullReply"))
    assert [f.start for f in found[1:]] == [f.end for f in found[:-1]]
    assert (found[0].start if found else 0, found[-1].end if found else 0) == (0, len(data))
    by_number = {f.number: f for f in found if f.end <= len(head)}
    if offset:
        assert wire.int64(by_number[pb.PullReply.NEXT_OFFSET_FIELD_NUMBER].value) == offset
    if records:
        f = by_number[pb.PullReply.RECORDS_FIELD_NUMBER]
        assert (f.wire_type, data[f.payload : f.end]) == (wire.LENGTH, records)
    assert wire.key(7, wire.LENGTH) == varint(7 << 3 | 2)
    assert wire.int_field(b"k", 0) == wire.bytes_field(b"k", b"") == b""


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (varint(1 << 3 | 2) + varint(10) + b"abc", "field 1 runs past the end"),
        (b"\xff" * 11, "malformed varint"),
        (varint(2 << 3 | 4), "unsupported wire type 4"),
        (varint(3 << 3 | 1) + bytes(3), "truncated field at the end"),
    ],
    ids=["past the end", "varint too long", "group", "truncated fixed64"],
)
def test_field_reader_refuses_what_is_not_a_message(data: bytes, words: str) -> None:
    with pytest.raises(WireError, match=f"^Msg: .*{words}"):
        list(wire.fields(data, "Msg"))


@given(replies)
def test_client_decoder_reads_what_protobuf_writes(
    reply: tuple[ReadStatus, bytes, int, int, int, int, str],
) -> None:
    status, records, count, next_offset, earliest, end, broker_id = reply
    message = proto_reply(reply)
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


@given(
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=0, max_value=2**62),
    st.lists(st.integers(min_value=0, max_value=2**62), max_size=50),
    st.text(max_size=10),
)
def test_produce_reply_is_byte_identical_to_protobuf(
    queue_id: int, first_offset: int, positions: list[int], broker_id: str
) -> None:
    entries = b"".join(ENTRY.pack(p + 1, 100, 0, 0) for p in positions)
    count = len(positions)
    expected = pb.ProduceReply(
        broker_id=broker_id,
        queue_ids=[queue_id] * count,
        offsets=range(first_offset, first_offset + count),
        positions=positions,
    )
    assert produce_reply(broker_id, queue_id, first_offset, entries) == (
        expected.SerializeToString()
    )


@given(
    st.lists(st.integers(min_value=-(2**62), max_value=2**62), min_size=1, max_size=20),
    st.integers(min_value=0, max_value=3),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.integers(min_value=-3, max_value=3),
)
def test_c_varints_match_python_reference(
    values: list[int], stride: int, add: int, step: int
) -> None:
    if accel.IMPLEMENTATION != "c":
        pytest.skip("C accelerator not built (EQUEUE_PURE_PYTHON set)")
    from equeue_proto._codec import varints

    data = array("q", values).tobytes()
    count = len(values) if stride == 1 else (len(values) - 1) // max(stride, 1) + 1
    assert varints(data, count, stride, add, step) == _varints_py(data, count, stride, add, step)
    with pytest.raises(ValueError, match="do not fit"):
        varints(data, len(values) + 1, 1, 0, 0)


def test_split_blob_errors_name_the_numbers() -> None:
    splitters = [_split_py] + ([_codec_split()] if accel.IMPLEMENTATION == "c" else [])
    for split in splitters:
        assert [bytes(p) for p in split(b"abcdef", [1, 0, 5])] == [b"a", b"", b"bcdef"]
        with pytest.raises(ValueError, match="length 1 is -2"):
            split(b"abc", [5, -2])
        with pytest.raises(ValueError, match="lengths sum to 4 but the blob has 3 bytes"):
            split(b"abc", [1, 3])


def _codec_split() -> Callable[[bytes, list[int]], list[bytes]]:
    from equeue_proto._codec import split_blob

    return split_blob


# -- ReplicateReply (equeue_broker/replication/wire.py) ----------------------------------

replicate_heads = st.builds(
    pb.ReplicateReply,
    position=st.integers(min_value=0, max_value=2**64 - 1),
    master_end=st.integers(min_value=0, max_value=2**64 - 1),
    master_start=st.integers(min_value=0, max_value=2**64 - 1),
    metadata=st.binary(max_size=200),
    chunk_capacity=st.integers(min_value=0, max_value=2**64 - 1),
    epoch=st.integers(min_value=0, max_value=2**64 - 1),
    high_watermark=st.integers(min_value=0, max_value=2**64 - 1),
    metadata_version=st.integers(min_value=0, max_value=2**64 - 1),
)


@given(replicate_heads, st.binary(max_size=3000))
def test_replicate_reply_round_trips_and_protobuf_agrees(
    head: pb.ReplicateReply, data: bytes
) -> None:
    whole = pb.ReplicateReply()
    whole.CopyFrom(head)
    whole.data = data
    encoded = encode_reply(head, data)
    assert pb.ReplicateReply.FromString(encoded) == whole  # any gRPC client reads it
    if not data:
        assert encoded == whole.SerializeToString()
    for encoding in (encoded, whole.SerializeToString()):  # ours, and protobuf's field order
        got, view = decode_reply(encoding)
        assert bytes(view) == data
        assert got == head


@pytest.mark.parametrize(
    "wire",
    [b"\x08", b"\x12\x05abc", b"\x0b", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"],
    ids=["truncated varint", "data past the end", "group wire type", "varint too long"],
)
def test_a_replicate_reply_that_does_not_parse_says_so(wire: bytes) -> None:
    with pytest.raises(ReplyDecodeError, match="ReplicateReply"):
        decode_reply(wire)


# -- error kinds (equeue_broker/server/errors.py, client/errors.py) ----------------------


class _Failed(grpc.RpcError):
    """What a failed call raises: an RpcError with code, details and trailers."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, str], ...]):
        self._code, self._details, self._trailers = code, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:  # grpc-stubs: a tuple of _Metadatum
        return self._trailers


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ReplicaReadOnly("broker g is a replica of master a:1"), NOT_MASTER),
        (StaleEpoch("epoch 1 is older than 2"), STALE_EPOCH),
        (NotEnoughReplicas("group g: 1 in-sync member"), NOT_ENOUGH_REPLICAS),
        (BadRequest("bad"), None),
    ],
)
def test_the_errors_clients_act_on_carry_their_kind(error: Exception, kind: str | None) -> None:
    trailers = trailers_for(error)
    assert trailers == (((ERROR_KIND_KEY, kind),) if kind else ())
    code, details = status_for(error)
    client_error = from_rpc_error(_Failed(code, details, trailers))
    assert isinstance(client_error, NotMasterError) == (kind == NOT_MASTER)


def test_a_refusal_is_told_by_its_kind_not_its_words() -> None:
    code = grpc.StatusCode.FAILED_PRECONDITION
    assert isinstance(
        from_rpc_error(_Failed(code, "reworded", ((ERROR_KIND_KEY, NOT_MASTER),))), NotMasterError
    )
    stale = from_rpc_error(_Failed(code, "serves reads only", ((ERROR_KIND_KEY, STALE_EPOCH),)))
    assert not isinstance(stale, NotMasterError)
    # An older broker sends no kind: its words still say it.
    assert isinstance(from_rpc_error(_Failed(code, "it serves reads only", ())), NotMasterError)
