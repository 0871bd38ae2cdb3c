"""Known messages in a ``Store``: append them, read them back, compare them exactly.

For the recovery tests (``tests/storage/test_recovery*.py``): every message appended
through ``append`` is remembered as a ``Sent`` (where the store put it, its
index entry, every field), so a test can assert exactly which messages survive
a fault, at which offsets, with which bytes. The byte surgery on the files is
in ``tests/support/faults.py``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from equeue_broker.storage import MessageBatch, ReadStatus, Store, StoredMessage
from equeue_broker.storage.index.queue_index import ENTRY, ENTRY_SIZE

OpenStore = Callable[..., Store]
"""The ``open_store`` fixture of tests/conftest.py."""

TOPIC = "faults"

Shape = tuple[str, int, int, int, bytes | None, str, bytes, tuple[tuple[str, bytes], ...]]
"""Everything a reader can observe of one message, for exact comparisons."""


# -- what was sent ---------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """One acknowledged message: what was appended and where the store put it."""

    queue_id: int
    offset: int
    position: int
    frame_size: int
    entry: bytes
    """The 32-byte index entry the append returned."""
    key: bytes | None
    tag: str
    value: bytes
    headers: tuple[tuple[str, bytes], ...]

    def shape(self) -> Shape:
        return (
            TOPIC,
            self.queue_id,
            self.offset,
            self.position,
            self.key,
            self.tag,
            self.value,
            self.headers,
        )


def shape(message: StoredMessage) -> Shape:
    return (
        message.topic,
        message.queue_id,
        message.queue_offset,
        message.position,
        message.key,
        message.tag,
        message.value,
        message.headers,
    )


def payload(label: str, index: int, size: int) -> bytes:
    """Deterministic bytes with no zero byte, so a cut inside a value is exact."""
    return random.Random(f"{label}/{index}").randbytes(size).replace(b"\x00", b"\x01")


def append(store: Store, queue_id: int, label: str, count: int = 1, size: int = 100) -> list[Sent]:
    """Append ``count`` messages (keys, tags and headers on some) as one batch."""
    values = [payload(label, i, size) for i in range(count)]
    keys = [f"{label}-k{i}".encode() if i % 2 == 0 else None for i in range(count)]
    tags = ["even" if i % 2 == 0 else "" for i in range(count)]
    headers = [(("label", label.encode()), ("i", str(i).encode())) for i in range(count)]
    result = store.append(
        TOPIC, queue_id, MessageBatch(values, keys=keys, tags=tags, headers=headers)
    )
    assert result.count == count
    sent = []
    for i in range(count):
        entry = result.entries[i * ENTRY_SIZE : (i + 1) * ENTRY_SIZE]
        position_plus_one, frame_size, _tag_hash, _store_ms = ENTRY.unpack(entry)
        sent.append(
            Sent(
                queue_id,
                result.first_offset + i,
                position_plus_one - 1,
                frame_size,
                bytes(entry),
                keys[i],
                tags[i],
                values[i],
                headers[i],
            )
        )
    return sent


# -- what can be read -------------------------------------------------------------


def read_queue(store: Store, queue_id: int = 0, start: int = 0) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    offset = start
    for _ in range(10_000):
        result = store.read(TOPIC, queue_id, offset, max_messages=1000)
        assert result.status is ReadStatus.OK, result
        if not result.messages:
            assert result.next_offset == result.end
            return out
        out += result.messages
        offset = result.next_offset
    raise AssertionError("read loop did not reach the end")


def assert_queue_holds(store: Store, queue_id: int, sent: list[Sent]) -> None:
    """The queue holds exactly ``sent``, at offsets 0..n-1, byte for byte."""
    assert [s.offset for s in sent] == list(range(len(sent)))
    info = store.queue_info(TOPIC, queue_id)
    assert (info.earliest, info.end) == (0, len(sent))
    assert [shape(m) for m in read_queue(store, queue_id)] == [s.shape() for s in sent]


def reopen(open_store: OpenStore, store: Store) -> Store:
    store.close()
    return open_store(store.config)
