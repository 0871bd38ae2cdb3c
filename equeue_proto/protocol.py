"""Rules both ends of the contract must agree on, beyond the message shapes.

Lives beside the generated code so that the broker and the client share one
copy without either importing the other.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence

from equeue_proto.accel import CODEC

MESSAGE_ID_HEX_DIGITS = 16
MAX_CONSUMER_ID = 128
_CONSUMER_ID = re.compile(r"[A-Za-z0-9._:@/-]+")
_NOT_CONSUMER_ID = re.compile(r"[^A-Za-z0-9._:@/-]")


def consumer_id_problem(consumer_id: str) -> str | None:
    """Why the broker refuses a consumer id, or None. Consumer ids are shown by
    DescribeGroup, the CLI and logs, so they are short and printable as they are:
    1-128 ASCII letters, digits and ``. _ : @ / -``."""
    if 0 < len(consumer_id) <= MAX_CONSUMER_ID and _CONSUMER_ID.fullmatch(consumer_id):
        return None
    shown = repr(consumer_id[:64]) + ("..." if len(consumer_id) > 64 else "")
    return (
        f"consumer_id {shown} ({len(consumer_id)} characters) is invalid: give 1 to "
        f"{MAX_CONSUMER_ID} ASCII letters, digits, '.', '_', ':', '@', '/' or '-'"
    )


def default_consumer_id(hostname: str, pid: int, suffix: str) -> str:
    """``<host>-<pid>-<suffix>``, made valid whatever the host name holds."""
    host = _NOT_CONSUMER_ID.sub("_", hostname)[:64] or "host"
    return f"{host}-{pid}-{suffix}"[:MAX_CONSUMER_ID]


BROKER_TIME = -1
"""A message timestamp of -1 in a produce request: "none given", stamp the
message with the broker's store time (as an empty ``timestamps_ms`` column
does for a whole batch). Lets one batch mix given and missing timestamps."""


ERROR_KIND_KEY = "equeue-error"
"""Trailing-metadata key of a failed call whose kind a client acts on (the
status code alone is too coarse, the message is for people). Its values:"""
NOT_MASTER = "not-master"
"""FAILED_PRECONDITION: a replica refused a write; send it to the group's master."""
STALE_EPOCH = "stale-epoch"
"""FAILED_PRECONDITION: the request came from a deposed master's epoch."""
NOT_ENOUGH_REPLICAS = "not-enough-replicas"
"""UNAVAILABLE: sync replication has too few in-sync members (Kafka's
NOT_ENOUGH_REPLICAS); retry later, not on another broker."""
OUT_OF_ORDER_SEQUENCE = "out-of-order-sequence"
"""FAILED_PRECONDITION: an idempotent batch's sequence is not the next of its
queue (a gap, or a batch older than the broker's window)."""
PRODUCER_FENCED = "producer-fenced"
"""FAILED_PRECONDITION: an idempotent batch from an older epoch of its producer id."""
UNKNOWN_PRODUCER = "unknown-producer"
"""FAILED_PRECONDITION: a producer id the broker group does not know (expired,
or never given out) sent a sequence other than 0: ask for a new epoch."""

DAMAGED_RECORD_KEY = "equeue-damaged-record"
"""Trailing-metadata key of a DATA_LOSS naming a stored record that fails its
checksum: JSON (ASCII) ``{"topic", "queue_id", "offset", "position"}``, each
null when unknown (``position`` is the record's log position), so a client
need not parse the message to log the record or seek past it."""


def format_message_id(broker_id: str, position: int) -> str:
    """``<broker_id>-<log position as 16 hex digits>``: a message id names the
    broker and the record's place in its log, so it is looked up directly."""
    return f"{broker_id}-{position:0{MESSAGE_ID_HEX_DIGITS}x}"


def parse_message_id(message_id: str) -> tuple[str, int]:
    """(broker_id, position) of a message id; ``ValueError`` naming it if malformed."""
    broker_id, sep, digits = message_id.rpartition("-")
    if not sep or not broker_id or len(digits) != MESSAGE_ID_HEX_DIGITS:
        raise ValueError(f"malformed message id {message_id!r}")
    try:
        return broker_id, int(digits, 16)
    except ValueError:
        raise ValueError(f"malformed message id {message_id!r}") from None


def allocate_average(queue_ids: Sequence[int], consumer_ids: Sequence[str]) -> dict[str, list[int]]:
    """EQueue's average allocation: consumers (sorted) get contiguous ranges of
    the queues (sorted); the first ``len(queues) % len(consumers)`` get one more.

    The broker computes it over a topic's live subscribers at each heartbeat
    and grants the queues as locks (broker/equeue_broker/server/groups.py); DescribeGroup
    reports it as each queue's owner.
    """
    queues = sorted(queue_ids)
    consumers = sorted(consumer_ids)
    if not consumers:
        return {}
    base, extra = divmod(len(queues), len(consumers))
    out: dict[str, list[int]] = {}
    start = 0
    for i, consumer in enumerate(consumers):
        size = base + (1 if i < extra else 0)
        out[consumer] = queues[start : start + size]
        start += size
    return out


# -- key routing -------------------------------------------------------------------

_MURMUR_SEED = 0x9747B28C
_MURMUR_M = 0x5BD1E995
_U32 = 0xFFFFFFFF


def murmur2_py(data: bytes | memoryview) -> int:
    """Kafka's ``Utils.murmur2`` of ``data`` (seed 0x9747b28c), a signed 32-bit
    int as Java returns it; the reference for the C ``_codec.murmur2``.

    Java's int arithmetic wraps at 32 bits: here every product is masked.
    """
    length = len(data)
    h = (_MURMUR_SEED ^ length) & _U32
    tail = length & ~3
    for (word,) in struct.iter_unpack("<I", data[:tail]):
        k = (word * _MURMUR_M) & _U32
        k ^= k >> 24
        k = (k * _MURMUR_M) & _U32
        h = ((h * _MURMUR_M) & _U32) ^ k
    rest = length & 3
    if rest:  # Java's switch falls through: 3 takes bytes 2, 1 and 0
        if rest == 3:
            h ^= data[tail + 2] << 16
        if rest >= 2:
            h ^= data[tail + 1] << 8
        h = ((h ^ data[tail]) * _MURMUR_M) & _U32
    h ^= h >> 13
    h = (h * _MURMUR_M) & _U32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


murmur2: Callable[[bytes | memoryview], int] = murmur2_py if CODEC is None else CODEC.murmur2
"""Kafka's ``Utils.murmur2`` (in C when the accelerator is built)."""


def key_queue(key: bytes | memoryview, queue_count: int) -> int:
    """The queue index a key routes to among ``queue_count`` queues: Kafka's
    default partitioner (``toPositive(murmur2(key)) % count``), so a key lands
    on the queue number a Kafka partition of the same count would have."""
    return (murmur2(key) & 0x7FFFFFFF) % queue_count


# -- clusters ------------------------------------------------------------------------

MAX_BROKER_NAME = 64
_BROKER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def broker_name_problem(name: str, kind: str = "broker name") -> str | None:
    """Why a broker (or cluster) name is refused, or None: 1-64 ASCII letters,
    digits, ``.``, ``_`` and ``-``, starting with a letter or digit. The name
    becomes the broker id in message ids (``<name>-<position>``), Spark
    offsets and CLI tables, so it is printable as it is."""
    if 0 < len(name) <= MAX_BROKER_NAME and _BROKER_NAME.fullmatch(name):
        return None
    shown = repr(name[:64]) + ("..." if len(name) > 64 else "")
    return (
        f"{kind} {shown} is invalid: give 1 to {MAX_BROKER_NAME} ASCII letters, digits, "
        "'.', '_' or '-', starting with a letter or digit"
    )


def route_queues(brokers: Sequence[tuple[str, Sequence[int]]]) -> list[tuple[str, int]]:
    """A topic's queues as one ordered list of (broker name, queue id): brokers
    by name, queues by id within each (RocketMQ's message-queue order). The
    producer routes a key over this list with ``key_queue``, so a key's queue
    depends only on the list, not on which client computes it."""
    return [(name, q) for name, ids in sorted(brokers) for q in sorted(ids)]
