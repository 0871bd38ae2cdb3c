"""The ``keys`` header: encoded by the client, split by the broker, the same way."""

from __future__ import annotations

import pytest

from equeue_proto.message_keys import MAX_EXTRA_KEYS, encode_keys, split_keys


def test_round_trip() -> None:
    keys: list[bytes | str] = [b"order-1", "客户-7", b"\x00\xff"]
    assert split_keys(encode_keys(keys)) == [b"order-1", "客户-7".encode(), b"\x00\xff"]


@pytest.mark.parametrize(
    ("keys", "problem"),
    [([b"a b"], "holds a space"), ([b""], "is empty"), ([b"k"] * 33, "at most 32")],
)
def test_bad_keys_are_refused(keys: list[bytes], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        encode_keys(keys)


def test_split_skips_empty_parts_and_bounds_the_count() -> None:
    assert split_keys(b"  a  b ") == [b"a", b"b"]
    assert len(split_keys(b" ".join([b"k"] * 100))) == MAX_EXTRA_KEYS
