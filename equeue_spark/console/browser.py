"""The message browser: messages by offset, by id, by key and time range, or
by time range alone, as JSON rows with headers and values shown as text when
they are UTF-8, else hex, and schema'd values decoded (issue 29's
``equeue.schema`` header, ``equeue_spark.client.schemas.Serializer``).

Calls are the client's (``Admin.get_message_at``, ``get_message``,
``query_messages``): blocking, so web.py runs them in a thread.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import decimal
import json
import uuid
from collections.abc import Mapping
from typing import Any

from equeue_proto.schema_rules import KEY_SCHEMA_HEADER, SCHEMA_HEADER, parse_version
from equeue_spark.client.admin import Admin
from equeue_spark.client.errors import EqueueError, NotFoundError
from equeue_spark.client.records import Message
from equeue_spark.client.schemas import Serializer

MAX_COUNT = 100
"""Messages per page at most."""
SHOWN_BYTES = 64 * 1024
"""A value longer than this is cut in the reply (the raw endpoint has it all)."""


class BadQuery(ValueError):
    """A browser query that cannot be run: the message says which parameter."""


def _int(query: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = query.get(name)
    if text is None or text == "":
        if default is None:
            raise BadQuery(f"give {name}=")
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadQuery(f"{name}={text!r} is not an integer") from None
    if value < 0:
        raise BadQuery(f"{name}={value} is negative")
    return value


def browse(admin: Admin, query: Mapping[str, str]) -> dict[str, Any]:
    """Run the query ``?id=`` | ``?topic=&queue=&offset=[&count=][&broker=]`` |
    ``?topic=[&key=][&start_ms=][&end_ms=][&limit=]`` (docs/console.md)."""
    if query.get("id"):
        return {"mode": "id", "messages": [message_json(admin, admin.get_message(query["id"]))]}
    topic = query.get("topic", "")
    if not topic:
        raise BadQuery("give id=, or topic= with queue= and offset=, or topic= with a key or times")
    if "offset" in query or "queue" in query:
        return _by_offset(admin, topic, query)
    limit = min(_int(query, "limit", MAX_COUNT), MAX_COUNT) or MAX_COUNT
    key = query.get("key") or None
    start = _int(query, "start_ms", 0) or None
    end = _int(query, "end_ms", 0) or None
    found = admin.query_messages(topic, key, start, end, limit)
    return {
        "mode": "key" if key else "time",
        "truncated": found.truncated,
        "messages": [message_json(admin, m) for m in found],
    }


def _by_offset(admin: Admin, topic: str, query: Mapping[str, str]) -> dict[str, Any]:
    queue, offset = _int(query, "queue"), _int(query, "offset")
    count = min(_int(query, "count", 20), MAX_COUNT)
    broker = query.get("broker", "")
    messages = []
    next_offset = offset
    for position in range(offset, offset + count):
        try:
            message = admin.get_message_at(topic, queue, position, broker)
        except NotFoundError:
            break  # the queue's end (or a gap retention left): the page stops there
        messages.append(message_json(admin, message))
        next_offset = position + 1
    return {"mode": "offset", "next_offset": next_offset, "messages": messages}


def shown(data: bytes | None) -> dict[str, Any] | None:
    """Bytes as ``{"text": ...}`` when valid UTF-8 (``"json"`` too when it
    parses), else ``{"hex": ...}``; with ``size`` and ``truncated``."""
    if data is None:
        return None
    cut = bytes(data[:SHOWN_BYTES])
    out: dict[str, Any] = {"size": len(data), "truncated": len(data) > SHOWN_BYTES}
    try:
        text = cut.decode("utf-8")
    except UnicodeDecodeError:
        out["hex"] = cut.hex()
        return out
    if not all(c.isprintable() or c in "\n\r\t" for c in text):
        out["hex"] = cut.hex()
        return out
    out["text"] = text
    with contextlib.suppress(ValueError):
        out["json"] = json.loads(text)
    return out


def message_json(admin: Admin, message: Message) -> dict[str, Any]:
    headers = [{"name": name, **(shown(value) or {})} for name, value in message.headers]
    out: dict[str, Any] = {
        "id": message.message_id,
        "broker_id": message.broker_id,
        "topic": message.topic,
        "queue_id": message.queue_id,
        "offset": message.offset,
        "timestamp_ms": message.timestamp_ms,
        "store_timestamp_ms": message.store_timestamp_ms,
        "tag": message.tag,
        "key": shown(message.key),
        "headers": headers,
        "value": shown(message.value),
    }
    for field, header, data, key in (
        ("decoded", SCHEMA_HEADER, message.value, False),
        ("decoded_key", KEY_SCHEMA_HEADER, message.key, True),
    ):
        version = parse_version(message.header(header))
        if version is not None and data is not None:
            out[field] = decoded(admin, message.topic, data, version, key)
    return out


def decoded(admin: Admin, topic: str, data: bytes, version: int, key: bool) -> dict[str, Any]:
    """The value read with the schema version it names, or why it could not be."""
    out: dict[str, Any] = {"version": version}
    if version < 1:
        out["error"] = "malformed schema version header"
        return out
    try:
        serializer = Serializer(admin.routes, topic, key=key, version=version)
        out["type"] = serializer.schema().type
        out["value"] = json_safe(serializer.decode(data, version))
    except (EqueueError, ValueError, TypeError, EOFError) as exc:
        out["error"] = f"schema v{version}: not decoded: {exc}"
    return out


def json_safe(value: object) -> object:
    """A decoded value with only JSON types: bytes base64, decimals and UUIDs
    as strings, times ISO 8601."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    return value
