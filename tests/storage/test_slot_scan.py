"""``keyhash.any_above``: the key index's check of its slot heads at open, by byte
lanes, must say exactly what ``max(slots) > count`` says."""

from __future__ import annotations

import array
import random

import pytest

from equeue_broker.storage.keys.keyhash import any_above


def slots_of(values: list[int]) -> bytearray:
    return bytearray(array.array("I", values).tobytes())


def test_any_above_agrees_with_max_on_random_arrays() -> None:
    rng = random.Random(31)
    for _ in range(300):
        top = rng.choice([1, 255, 256, 70_000, 1 << 24, (1 << 32) - 1])
        size = rng.randrange(1, 64)
        values = [rng.randrange(top) if rng.random() < 0.8 else 0 for _ in range(size)]
        biggest = max(values)
        for count in {0, biggest, max(biggest - 1, 0), biggest + 1, rng.randrange(top)}:
            assert any_above(slots_of(values), count) == (biggest > count), (values, count)


@pytest.mark.parametrize(
    ("values", "count", "expected"),
    [
        ([0, 0, 0], 0, False),
        ([5, 0x0100_0000], 0x00FF_FFFF, True),  # only the top byte says so
        ([0x0102_0304, 0x0102_0303], 0x0102_0304, False),  # ties down to the last byte
        ([0x0102_0305, 0x0001_0000], 0x0102_0304, True),  # the last byte decides
        ([0x0102_0400, 0x0103_0000], 0x0103_0000, False),  # a lower top, a higher next byte
        ([0xFFFF_FFFF], 0xFFFF_FFFF, False),
        ([0xFFFF_FFFF], 0xFFFF_FFFE, True),
    ],
)
def test_any_above_edges(values: list[int], count: int, expected: bool) -> None:
    assert any_above(slots_of(values), count) is expected
    assert any_above(bytes(slots_of(values)), count) is expected


def test_any_above_a_full_slot_array() -> None:
    values = [0] * (1 << 22)
    values[123_456] = 9_000_001
    assert any_above(slots_of(values), 9_000_000)
    assert not any_above(slots_of(values), 9_000_001)
