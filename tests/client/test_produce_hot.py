"""The produce hot path's hand-written request bytes equal protobuf's own (issue 31).

``batches.encoded_request`` writes a ProduceRequest's columns as wire bytes
instead of through protobuf's setters; ``fill_columns`` is the setters' version.
Every shape of values and keys must give the same message, and a value that is
not bytes the same error as before.
"""

from __future__ import annotations

import pytest

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.batches import BatchColumns, encoded_request, fill_columns

CASES = {
    "empty batch": ([], None),
    "one empty value": ([b""], None),
    "small values": ([b"a", b"bc", b"def"], None),
    "lengths of one, two and three varint bytes": ([b"x" * 127, b"y" * 128, b"z" * 20_000], None),
    "every key": ([b"a", b"b"], [b"k1", b""]),
    "some keys": ([b"a", b"b", b"c"], [None, b"key", None]),
    "long keys": ([b"a", b"b"], [b"k" * 200, None]),
}


@pytest.mark.parametrize("values, keys", CASES.values(), ids=CASES.keys())
def test_hand_written_bytes_equal_protobufs(
    values: list[bytes], keys: list[bytes | None] | None
) -> None:
    ours = encoded_request("orders-é", values, keys)
    reference = fill_columns("orders-é", values, keys)
    assert ours == reference
    assert ours.SerializeToString() == reference.SerializeToString()
    assert list(ours.messages.value_lengths) == [len(v) for v in values]


def test_optional_columns_still_ride_along() -> None:
    request = BatchColumns(
        [b"a", b"b"],
        keys=[None, None],  # no key at all: no key columns
        tags=["t", ""],
        headers=[(("h", b"1"),), ()],
        queue_ids=[None, 2],
        timestamps_ms=[5, None],
        deliver_at_ms=[7],
    ).request("orders")
    assert not request.messages.key_lengths and not request.messages.keys
    assert list(request.messages.tags) == ["t", ""]
    assert list(request.messages.header_lengths)[1] == 0
    assert list(request.queue_ids) == [-1, 2]
    assert request.messages.timestamps_ms[0] == 5
    assert list(request.deliver_at_ms) == [7]
    assert request.messages.count == 2


@pytest.mark.parametrize("bad", [["text"], [None], [b"ok", 3]], ids=["str", "None", "int"])
def test_a_value_that_is_not_bytes_raises_protobufs_type_error(bad: list[object]) -> None:
    with pytest.raises(TypeError) as ours:
        encoded_request("orders", bad, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError) as reference:
        fill_columns("orders", bad, None)  # type: ignore[arg-type]
    assert str(ours.value) == str(reference.value)


def test_a_request_parses_as_the_contract_says() -> None:
    data = encoded_request("t", [b"v1", b"v22"], [b"k", None]).SerializeToString()
    parsed = pb.ProduceRequest.FromString(data)
    assert parsed.topic == "t"
    assert parsed.messages.values == b"v1v22"
    assert list(parsed.messages.key_lengths) == [1, -1]
