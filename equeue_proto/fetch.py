"""The fetch port's wire format: bulk range reads over a plain TCP connection.

A broker started with ``--fetch-port`` serves what ``PullStream`` serves
(replies of one queue range) on a second, plain-TCP listener, without gRPC's
HTTP/2 framing and message copies on either side (docs/benchmarks.md: about
a third less CPU per GB, broker and client together). The replies are the very
``PullReply`` messages ``PullStream`` sends, so a client parses them with the
same code. All integers are little-endian::

    request := MAGIC "EQF1" | u32 body_len | body          (client -> broker)
    body    := u16 token_len | token (UTF-8, "" = none)
               u16 topic_len | topic (UTF-8)
               u32 queue_id | i64 offset | i64 end_offset
               u32 batch_messages | u32 batch_bytes
    frame   := u8 kind | u32 payload_len | payload           (broker -> client)
       kind REPLY: payload = one serialized PullReply (what PullStream streams)
       kind END:   payload empty: the range is done (the last REPLY said how far)
       kind ERROR: payload = u8 grpc status code | u16 len | message (UTF-8)
                   | u16 count | count x (u16 len | key | u16 len | value)
                   (the status, message and trailing metadata a gRPC call
                   would have ended with); the broker closes the connection

A connection carries one request at a time; after END the client may send
the next request on it. The token is checked (role ``consume``, the topic's
patterns) before any record is read. There is no TLS: a client that talks
TLS to the broker uses ``PullStream``.

This module imports nothing of ours and nothing outside the standard library.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"EQF1"
REPLY = 1
END = 2
ERROR = 3
KINDS = (REPLY, END, ERROR)

REQUEST_HEAD = struct.Struct("<4sI")
"""MAGIC and the body's length."""
FRAME_HEAD = struct.Struct("<BI")
"""A frame's kind and its payload's length."""
MAX_REQUEST_BODY = 64 << 10
"""Longest request body a broker reads (a token and a topic name fit many times)."""
_RANGE = struct.Struct("<IqqII")
_U16 = struct.Struct("<H")
_ERROR_HEAD = struct.Struct("<BH")


class FetchFormatError(ValueError):
    """Bytes that are not a well-formed request or frame; the message says which part."""


@dataclass(frozen=True)
class FetchRequest:
    """One range read: ``[offset, end_offset)`` of a queue (``end_offset`` 0:
    the queue's end when the request arrives), in replies of at most
    ``batch_messages`` records and about ``batch_bytes`` bytes."""

    topic: str
    queue_id: int
    offset: int
    end_offset: int
    batch_messages: int
    batch_bytes: int
    token: str = ""


def encode_request(request: FetchRequest) -> bytes:
    """MAGIC, length and body of ``request``."""
    token = request.token.encode()
    topic = request.topic.encode()
    if len(token) > 0xFFFF or len(topic) > 0xFFFF:
        raise FetchFormatError("token or topic longer than 65535 bytes")
    body = b"".join((
        _U16.pack(len(token)), token, _U16.pack(len(topic)), topic,
        _RANGE.pack(request.queue_id, request.offset, request.end_offset,
                    request.batch_messages, request.batch_bytes),
    ))  # fmt: skip
    return REQUEST_HEAD.pack(MAGIC, len(body)) + body


def request_length(head: bytes) -> int:
    """The body length a request head (``REQUEST_HEAD.size`` bytes) announces."""
    magic, length = REQUEST_HEAD.unpack(head)
    if magic != MAGIC:
        raise FetchFormatError(f"not a fetch request: starts with {magic!r}, not {MAGIC!r}")
    if length > MAX_REQUEST_BODY:
        raise FetchFormatError(f"request body of {length} bytes; the limit is {MAX_REQUEST_BODY}")
    return int(length)


def decode_request(body: bytes) -> FetchRequest:
    """The request in ``body`` (after the head)."""
    at = 0
    texts = []
    for what in ("token", "topic"):
        if at + 2 > len(body):
            raise FetchFormatError(f"request body ends before the {what}")
        (n,) = _U16.unpack_from(body, at)
        at += 2
        if at + n > len(body):
            raise FetchFormatError(f"request body ends inside the {what}")
        try:
            texts.append(body[at : at + n].decode())
        except UnicodeDecodeError:
            raise FetchFormatError(f"the {what} is not UTF-8") from None
        at += n
    if len(body) - at != _RANGE.size:
        raise FetchFormatError(
            f"request body has {len(body) - at} bytes after the topic; expected {_RANGE.size}"
        )
    queue_id, offset, end, messages, nbytes = _RANGE.unpack_from(body, at)
    return FetchRequest(texts[1], queue_id, offset, end, messages, nbytes, texts[0])


def frame_head(kind: int, length: int) -> bytes:
    return FRAME_HEAD.pack(kind, length)


def read_frame_head(head: bytes) -> tuple[int, int]:
    """(kind, payload length) of a frame head."""
    kind, length = FRAME_HEAD.unpack(head)
    if kind not in KINDS:
        raise FetchFormatError(f"unknown frame kind {kind}")
    return int(kind), int(length)


def encode_error(code: int, message: str, trailers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A whole ERROR frame (head and payload)."""
    text = message.encode()[:0xFFFF]
    parts = [_ERROR_HEAD.pack(code, len(text)), text, _U16.pack(len(trailers))]
    for key, value in trailers:
        k, v = key.encode()[:0xFFFF], value.encode()[:0xFFFF]
        parts += [_U16.pack(len(k)), k, _U16.pack(len(v)), v]
    payload = b"".join(parts)
    return frame_head(ERROR, len(payload)) + payload


def decode_error(payload: bytes) -> tuple[int, str, tuple[tuple[str, str], ...]]:
    """(grpc status code number, message, trailers) of an ERROR payload."""
    try:
        code, n = _ERROR_HEAD.unpack_from(payload)
        at = _ERROR_HEAD.size
        message = payload[at : at + n].decode("utf-8", "replace")
        at += n
        (count,) = _U16.unpack_from(payload, at)
        at += 2
        trailers = []
        for _ in range(count):
            pair = []
            for _side in range(2):
                (m,) = _U16.unpack_from(payload, at)
                at += 2
                pair.append(payload[at : at + m].decode("utf-8", "replace"))
                at += m
            trailers.append((pair[0], pair[1]))
    except struct.error:
        raise FetchFormatError("malformed error frame") from None
    return int(code), message, tuple(trailers)
