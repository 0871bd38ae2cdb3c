"""Filter expressions over stored frames: which records of a run pass a selector.

``select_frames(selector, view, max_frames)`` walks the frames (the record
format of ``record.py``) of ``view`` and answers the spans of consecutive
frames for which the selector is TRUE. The C accelerator (``_codec.select_frames``)
runs the selector's compiled program over the frames in place; the pure-Python
path (``select_frames_py``, the reference and the ``EQUEUE_PURE_PYTHON=1``
path) evaluates its tree (``selector.evaluate``) over ``FrameRecord``s.
"""

from __future__ import annotations

import struct

from equeue_proto.accel import CODEC
from equeue_proto.record import AT_BODY, BODY_TO_FRAME, FLAG_HAS_KEY, HEADER, TRAILER, Buffer
from equeue_proto.selector import Selector

Span = tuple[int, int, int, int]
"""(first byte, end byte, first frame index, frame count) of passing frames."""

_KEY_LEN = struct.Struct("<H")
_VALUE_LEN = struct.Struct("<I")


class FrameRecord:
    """The fields an expression reads of the (valid) frame at ``pos`` of ``buf``."""

    __slots__ = ("_buf", "_fields", "_headers_at", "_headers_end", "_key_at", "_tag_at")

    def __init__(self, buf: Buffer, pos: int) -> None:
        fields = HEADER.unpack_from(buf, pos)
        self._buf = buf
        self._fields = fields
        topic_len, tag_len, key_len, headers_len = fields[8], fields[9], fields[10], fields[11]
        self._tag_at = pos + HEADER.size + topic_len
        self._key_at = self._tag_at + tag_len
        self._headers_at = self._key_at + key_len
        self._headers_end = self._headers_at + headers_len

    def frame_size(self) -> int:
        return int(self._fields[0]) + BODY_TO_FRAME

    def fits(self, room: int) -> bool:
        """True if the frame lies within ``room`` bytes and its fields within its body."""
        body, fields = int(self._fields[0]), self._fields
        variable = fields[8] + fields[9] + fields[10] + fields[11] + fields[12]
        return body + BODY_TO_FRAME <= room and HEADER.size + variable <= body + AT_BODY

    def tag(self) -> bytes | None:
        tag_len = self._fields[9]
        return bytes(self._buf[self._tag_at : self._tag_at + tag_len]) if tag_len else None

    def key(self) -> bytes | None:
        if not self._fields[2] & FLAG_HAS_KEY:
            return None
        return bytes(self._buf[self._key_at : self._headers_at])

    def header(self, name: str) -> bytes | None:
        """The last header called ``name``, as ``Message.header`` reads it (None if
        absent; the headers before a malformed one count)."""
        buf, pos, end = self._buf, self._headers_at, self._headers_end
        if end - pos < 2:
            return None
        wanted = name.encode()
        found = None
        (count,) = _KEY_LEN.unpack_from(buf, pos)
        pos += 2
        for _ in range(count):
            if pos + 2 > end:
                return found
            (key_len,) = _KEY_LEN.unpack_from(buf, pos)
            pos += 2
            key_end = pos + key_len
            if key_end + 4 > end:
                return found
            (value_len,) = _VALUE_LEN.unpack_from(buf, key_end)
            value_at = key_end + 4
            if value_at + value_len > end:
                return found
            if bytes(buf[pos:key_end]) == wanted:
                found = bytes(buf[value_at : value_at + value_len])
            pos = value_at + value_len
        return found

    def producer_ms(self) -> int:
        return int(self._fields[6])

    def store_ms(self) -> int:
        return int(self._fields[7])


def select_frames_py(selector: Selector, view: Buffer, max_frames: int) -> tuple[list[Span], int]:
    """(spans of passing frames, frames inspected): the first ``max_frames`` frames
    of ``view`` (valid frames back to back) through ``selector`` (the reference)."""
    spans: list[Span] = []
    pos, index, end = 0, 0, len(view)
    while pos < end and index < max_frames:
        if end - pos < HEADER.size + TRAILER.size:
            raise ValueError(f"select_frames: the frame at byte {pos} runs past the buffer")
        record = FrameRecord(view, pos)
        size = record.frame_size()
        if not record.fits(end - pos):
            raise ValueError(f"select_frames: the frame at byte {pos} runs past the buffer")
        if selector.matches(record):
            if spans and spans[-1][1] == pos:
                start, _, first, count = spans[-1]
                spans[-1] = (start, pos + size, first, count + 1)
            else:
                spans.append((pos, pos + size, index, 1))
        pos += size
        index += 1
    return spans, index


def select_frames(selector: Selector, view: Buffer, max_frames: int) -> tuple[list[Span], int]:
    """``select_frames_py`` in C when the accelerator is built."""
    if CODEC is not None:
        spans, scanned = CODEC.select_frames(selector.program, view, max_frames)
        return spans, scanned
    return select_frames_py(selector, view, max_frames)
