"""The key index's hash, entry builder and relink: C (equeue_proto/_keyhash.c) when built,
else the Python reference here (a test holds the two equal).

``key_entries(data, first_position, slots, dirty, count, capacity, begin_ms,
window_ms, max_extra)`` walks the whole frames of ``data`` (at log
``first_position``), makes one 32-byte entry per distinct key of each record
(key_index.py's format), links it into ``slots`` (a writable u32 array,
changed in place; ``dirty[slot >> 10]`` set to 1 for each slot changed) and returns
``(entries, consumed, count, begin_ms, first_position, end_position, end_ms)``:
it stops before a record whose keys do not fit the window (``capacity``
entries, ``window_ms`` of store time from ``begin_ms`` while it holds
entries): ``consumed`` < len(data) says the caller must start the next window.
``first_position`` is the first indexed record's (-1: none), ``end_position``
the last one's + 1 (0: none), ``end_ms`` the latest store time indexed (0: none).

``key_relink(entries, first_number, slots, dirty)`` makes each of the
``entries`` (numbers ``first_number`` on) the head of its slot, in order: the
slot array after those entries, given the one before them (recovery, a cut).

``any_above(memory, count)``: whether a slot array names an entry past ``count``
(recovery's check of the active window's heads), in Python without a step per slot.
"""

from __future__ import annotations

import importlib
import os
import struct
from collections.abc import Callable
from typing import Any

from crc32c import crc32c

from equeue_broker.storage.keys.frames import frame_keys
from equeue_proto.record import FLAG_CONTROL, HEADER

_MAX_DELTA = (1 << 32) - 1
_FIELDS = struct.Struct("<QQIII")
_FRAME_MIN = HEADER.size + 8

KeyEntries = Callable[..., tuple[bytes, int, int, int, int, int, int]]


def murmur2(data: bytes) -> int:
    """32-bit murmur2, seed 0x9747b28c (Kafka's partitioner hash)."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    n4 = length // 4
    for (word,) in struct.iter_unpack("<I", data[: n4 * 4]):
        k = (word * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = data[n4 * 4 :]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def hash64_py(joined: bytes) -> int:
    """hash64 of ``topic + b"\\0" + key``."""
    return (crc32c(joined) << 32) | murmur2(joined)


def key_entries_py(  # noqa: PLR0917 (the C function's signature)
    data: bytes | bytearray | memoryview, first_position: int, slots: memoryview,
    dirty: bytearray | memoryview, count: int, capacity: int, begin_ms: int, window_ms: int,
    max_extra: int,
) -> tuple[bytes, int, int, int, int, int, int]:  # fmt: skip
    """The Python reference of ``_keyhash.key_entries`` (module docstring)."""
    if slots.format != "I":
        slots = slots.cast("B").cast("I")
    slot_count = len(slots)
    out = bytearray()
    first, end_position, end_ms = -1, 0, 0
    pos, size = 0, len(data)
    while pos + _FRAME_MIN <= size:
        body = int.from_bytes(data[pos : pos + 4], "little")
        if body == 0 or body + 12 > size - pos:
            break
        fields = HEADER.unpack_from(data, pos)
        if not fields[2] & FLAG_CONTROL and HEADER.size + sum(fields[8:12]) > body + 12:
            break  # lengths that do not fit the frame: not a record (as the C code)
        frame, _flags, topic, store_ms, keys = frame_keys(data, pos, max_extra)
        if not keys:
            pos += frame
            continue
        keys = list(dict.fromkeys(keys))
        if count + min(len(keys), capacity) > capacity or (
            count and store_ms - begin_ms >= window_ms
        ):
            return bytes(out), pos, count, begin_ms, first, end_position, end_ms
        position = first_position + pos
        if count == 0:
            begin_ms = store_ms
        if first < 0:
            first = position
        end_position = position + 1
        end_ms = max(end_ms, store_ms)
        delta = min(max(store_ms - begin_ms, 0), _MAX_DELTA)
        tid = crc32c(topic)
        for key in keys:
            if count >= capacity:
                break
            key_hash = hash64_py(b"%s\x00%s" % (topic, key))
            slot = key_hash % slot_count
            raw = _FIELDS.pack(key_hash, position, delta, slots[slot], tid)
            out += raw + crc32c(raw).to_bytes(4, "little")
            count += 1
            slots[slot] = count
            dirty[slot >> 10] = 1
        pos += frame
    return bytes(out), size, count, begin_ms, first, end_position, end_ms


def key_relink_py(
    entries: bytes, first_number: int, slots: memoryview, dirty: bytearray | memoryview
) -> None:
    """The Python reference of ``_keyhash.key_relink``: entry i (number
    ``first_number + i``) becomes the head of its slot, in order."""
    if slots.format != "I":
        slots = slots.cast("B").cast("I")
    slot_count = len(slots)
    for i, key_hash in enumerate(memoryview(entries).cast("Q")[::4]):
        slot = key_hash % slot_count
        slots[slot] = first_number + i + 1
        dirty[slot >> 10] = 1


KeyRelink = Callable[[bytes, int, memoryview, bytearray], None]

_GREATER = tuple(bytes(int(b > c) for b in range(256)) for c in range(256))
_EQUAL = tuple(bytes(int(b == c) for b in range(256)) for c in range(256))


def any_above(memory: bytes | bytearray, count: int) -> bool:
    """``max(memory as little-endian u32s) > count``, by byte lanes: ``max`` over a
    4 M slot array takes one Python step per slot (40-300 ms of every store
    open, by load); this compares all the slots' top bytes at once
    (``translate``), then the next bytes of those whose higher bytes equal
    ``count``'s (one bit per slot in a big int), and so on: a few passes in C."""
    if count >= _MAX_DELTA:
        return False
    limit = count.to_bytes(4, "little")
    same: int | None = None
    """Slots whose bytes so far equal count's, a byte per slot (None: all)."""
    for k in (3, 2, 1, 0):
        lane = memory[k::4]
        above = lane.translate(_GREATER[limit[k]])
        if same is None:
            if above.find(1) >= 0:
                return True
        elif int.from_bytes(above, "little") & same:
            return True
        equal = lane.translate(_EQUAL[limit[k]])
        if same is None:
            if equal.find(0) < 0:
                continue  # every slot's byte equals count's: all still tied
            same = int.from_bytes(equal, "little")
        else:
            same &= int.from_bytes(equal, "little")
        if not same:
            return False
    return False


def _load() -> tuple[KeyEntries, KeyRelink, Callable[[bytes], int]]:
    if os.environ.get("EQUEUE_PURE_PYTHON"):
        return key_entries_py, key_relink_py, hash64_py
    try:
        module: Any = importlib.import_module("equeue_proto._keyhash")
    except ImportError:
        return key_entries_py, key_relink_py, hash64_py
    return module.key_entries, module.key_relink, module.hash64


key_entries, key_relink, hash64_joined = _load()
