"""A record's keys, read from its frame: the key field and the ``keys`` header.

Used where records are indexed (``KeyIndex.add_frames``: the bytes of one
write, a replica's copy or a recovery scan) and where a query checks a
candidate record (query.py): one definition of "the keys of a record".
"""

from __future__ import annotations

import struct

from equeue_proto.message_keys import KEYS_HEADER, split_keys
from equeue_proto.record import BODY_TO_FRAME, FLAG_CONTROL, FLAG_HAS_KEY, HEADER, Buffer

_KEYS_NAME = KEYS_HEADER.encode()
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_unpack_header = HEADER.unpack_from
_HEADER_SIZE = HEADER.size


def header_keys(buf: Buffer, pos: int, end: int, limit: int) -> list[bytes]:
    """The extra keys of the headers section ``buf[pos:end]`` (its ``keys``
    header, at most ``limit``); [] when absent or malformed."""
    try:
        (count,) = _U16.unpack_from(buf, pos)
        pos += 2
        for _ in range(count):
            (name_len,) = _U16.unpack_from(buf, pos)
            name = buf[pos + 2 : pos + 2 + name_len]
            pos += 2 + name_len
            (value_len,) = _U32.unpack_from(buf, pos)
            pos += 4
            if pos + value_len > end:
                return []
            if name == _KEYS_NAME:
                return split_keys(bytes(buf[pos : pos + value_len]), limit)
            pos += value_len
    except struct.error:
        return []
    return []


def frame_keys(buf: Buffer, pos: int, limit: int) -> tuple[int, int, bytes, int, list[bytes]]:
    """(frame size, flags, topic, store ms, keys) of the frame at ``pos``: its
    key (when it has one) then at most ``limit`` keys of its ``keys`` header.
    A CONTROL record has no keys. Frame size 0: no frame (zeros)."""
    (body, _v, flags, _q, _o, _p, _pm, store_ms, topic_len, tag_len, key_len, headers_len,
     _vl) = _unpack_header(buf, pos)  # fmt: skip
    if body == 0:
        return 0, 0, b"", 0, []
    p = pos + _HEADER_SIZE
    topic = bytes(buf[p : p + topic_len])
    if flags & FLAG_CONTROL:
        return body + BODY_TO_FRAME, flags, topic, store_ms, []
    p += topic_len + tag_len
    keys = [bytes(buf[p : p + key_len])] if flags & FLAG_HAS_KEY else []
    if headers_len:
        p += key_len
        keys += header_keys(buf, p, p + headers_len, limit)
    return body + BODY_TO_FRAME, flags, topic, store_ms, keys
