"""Key routing: Kafka's default partitioner (murmur2), in C and in Python, and on a broker."""

from __future__ import annotations

import random
import string

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_proto import protocol
from equeue_proto.accel import CODEC
from equeue_spark.client import Admin, Producer

# Kafka's UtilsTest.testMurmur2 (clients/src/test/java/org/apache/kafka/common/utils),
# also checked against the Java method compiled and run under javac.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def java_murmur2(data: bytes) -> int:
    """A second, independent port: Java's code line by line, every int
    operation wrapped to signed 32 bits and ``>>>`` done on the unsigned value."""

    def i32(x: int) -> int:
        x &= 0xFFFFFFFF
        return x - (1 << 32) if x >= 1 << 31 else x

    def ushr(x: int, n: int) -> int:
        return (x & 0xFFFFFFFF) >> n

    length, m, r = len(data), i32(0x5BD1E995), 24
    h = i32(i32(0x9747B28C) ^ length)
    for i in range(length // 4):
        i4 = i * 4
        k = i32(data[i4] + (data[i4 + 1] << 8) + (data[i4 + 2] << 16) + (data[i4 + 3] << 24))
        k = i32(k * m)
        k = i32(k ^ ushr(k, r))
        k = i32(k * m)
        h = i32(h * m)
        h = i32(h ^ k)
    rest = length % 4
    if rest >= 3:
        h = i32(h ^ (data[(length & ~3) + 2] << 16))
    if rest >= 2:
        h = i32(h ^ (data[(length & ~3) + 1] << 8))
    if rest >= 1:
        h = i32(h ^ data[length & ~3])
        h = i32(h * m)
    h = i32(h ^ ushr(h, 13))
    h = i32(h * m)
    return i32(h ^ ushr(h, 15))


IMPLEMENTATIONS = [protocol.murmur2_py, java_murmur2] + ([CODEC.murmur2] if CODEC else [])


@pytest.mark.parametrize("murmur2", IMPLEMENTATIONS, ids=lambda f: f.__module__ + "." + f.__name__)
def test_murmur2_matches_kafkas_vectors(murmur2: object) -> None:
    assert {data: murmur2(data) for data in KAFKA_VECTORS} == KAFKA_VECTORS  # type: ignore[operator]


def test_implementations_agree_on_random_keys() -> None:
    rng = random.Random(14)
    for _ in range(2000):
        data = rng.randbytes(rng.randrange(0, 40))
        expected = java_murmur2(data)
        assert all(f(data) == expected for f in IMPLEMENTATIONS), data
    assert protocol.murmur2(memoryview(b"foobar")) == KAFKA_VECTORS[b"foobar"]


def test_key_queue_is_kafkas_partition() -> None:
    """``toPositive(murmur2(key)) % count``: negative hashes fold by masking, not abs()."""
    assert protocol.key_queue(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
    assert [protocol.key_queue(b"abc", n) for n in (1, 2, 3, 4)] == [
        479470107 % n for n in (1, 2, 3, 4)
    ]


def test_single_letter_keys_spread_over_the_queues(broker: BrokerProcess) -> None:
    """Keys a..z used to land in 2 of 4 queues (CRC32C mod 4); each key still
    keeps its queue, which is Kafka's partition for it."""
    keys = [c.encode() for c in string.ascii_lowercase]
    with Admin(broker.address) as admin:
        admin.create_topic("letters", queues=4)
    with Producer(broker.address) as producer:
        first = producer.send_batch("letters", [b"x"] * 26, keys=keys)
        again = producer.send_batch("letters", [b"y"] * 26, keys=keys)
    assert first.queue_ids == again.queue_ids
    assert list(first.queue_ids) == [protocol.key_queue(k, 4) for k in keys]
    assert len(set(first.queue_ids)) >= 3
