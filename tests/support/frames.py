"""Stored frames (the record format of ``equeue_proto/record.py``) built in
Python for contract tests of code that reads them in place."""

from __future__ import annotations

from collections.abc import Sequence

from crc32c import crc32c

from equeue_proto.record import (
    AT_BODY,
    FLAG_BATCH_END,
    FLAG_HAS_KEY,
    HEADER,
    RECORD_VERSION,
    TRAILER,
    encode_headers,
)

Row = tuple[str, bytes | None, Sequence[tuple[str, bytes]], int]
"""(tag, key or None, headers, producer ms) of one record."""


def encode_frames(rows: Sequence[Row], topic: str = "t", value: bytes = b"v") -> bytes:
    """The frames of ``rows``, back to back (offsets 0.., positions from 0)."""
    out = bytearray()
    for offset, (tag, key, headers, producer_ms) in enumerate(rows):
        raw_topic, raw_tag = topic.encode(), tag.encode()
        raw_key = key or b""
        raw_headers = encode_headers(list(headers))
        flags = FLAG_BATCH_END | (FLAG_HAS_KEY if key is not None else 0)
        fixed = HEADER.pack(
            0, RECORD_VERSION, flags, 0, offset, len(out), producer_ms, producer_ms + 1,
            len(raw_topic), len(raw_tag), len(raw_key), len(raw_headers), len(value),
        )  # fmt: skip
        body = fixed[AT_BODY:] + raw_topic + raw_tag + raw_key + raw_headers + value
        out += len(body).to_bytes(4, "little") + body + TRAILER.pack(crc32c(body), len(body))
    return bytes(out)
