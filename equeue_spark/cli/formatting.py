"""How the ``equeue`` CLI prints: aligned tables and label/value pairs for
people, JSON documents and JSON lines for machines (``--json``), and the text
forms of bytes, times, sizes and durations they share.

Every command writes through an ``Output``; nothing here talks to a broker.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import IO, Any

from google.protobuf.message import Message as ProtoMessage

from equeue_spark.client.records import Message


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns padded to their widest cell, two spaces apart; numbers right-aligned.

    ``None`` prints as ``-``; a column is numeric when all its other cells are
    ints or floats (bools are not numbers here).
    """
    raw = [list(row) for row in rows]
    numeric = []
    for i in range(len(headers)):
        present = [row[i] for row in raw if row[i] is not None]
        numeric.append(bool(present) and all(_is_number(v) for v in present))
    cells = [[_cell(value) for value in row] for row in raw]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    lines = []
    for row in [list(headers), *cells]:
        parts = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def format_pairs(pairs: Iterable[tuple[str, object]]) -> str:
    """``label  value`` lines with the values aligned."""
    items = [(label, _cell(value)) for label, value in pairs]
    width = max((len(label) for label, _ in items), default=0)
    return "\n".join(f"{label.ljust(width)}  {value}".rstrip() for label, value in items)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def format_partial(unreachable: Sequence[str], why: dict[str, str], what: str) -> str:
    """The line a cluster view that misses broker groups ends with:
    ``partial: broker group b unreachable (down: not heard from for 40 s); WHAT``."""
    names = sorted(set(unreachable))
    said = "; ".join(f"{n}: {why.get(n, 'not answering')}" for n in names)
    if len(names) == 1:
        head = f"broker group {names[0]} unreachable ({why.get(names[0], 'not answering')})"
    else:
        head = f"broker groups {', '.join(names)} unreachable ({said})"
    return f"partial: {head}; {what}"


def text_of(data: bytes) -> str:
    """Bytes as text: UTF-8, with undecodable bytes escaped as ``\\xNN``."""
    return data.decode("utf-8", errors="backslashreplace")


def json_bytes(data: bytes) -> str | dict[str, str]:
    """Bytes in a JSON document, unambiguously: the text itself when they are
    valid UTF-8, else ``{"base64": "..."}`` (escaping would make the bytes
    ``\xff`` and the text ``\xff`` print alike)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def one_line(data: bytes) -> str:
    """``text_of`` with line breaks escaped, so a message prints on one line."""
    return text_of(data).replace("\r", "\\r").replace("\n", "\\n")


def format_time(ms: int) -> str:
    """Milliseconds since the epoch as ISO 8601 UTC (``-`` for 0)."""
    if ms <= 0:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def format_duration(seconds: float) -> str:
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days}d"] if days else []
    if days or hours:
        parts.append(f"{hours}h")
    if days or hours or minutes:
        parts.append(f"{minutes}m")
    parts.append(f"{secs}s")
    return " ".join(parts)


def proto_dict(message: ProtoMessage) -> dict[str, Any]:
    """A reply as a JSON-ready dict keyed by the ``.proto`` field names
    (int64 stays a number, unlike ``json_format``; unset sub-messages are null)."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            out[field.name] = {k: _json_value(v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_json_value(v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _json_value(value)
    return out


def _json_value(value: object) -> object:
    if isinstance(value, ProtoMessage):
        return proto_dict(value)
    if isinstance(value, bytes):
        return json_bytes(value)
    return value


def message_dict(m: Message, broker: str | None = None) -> dict[str, Any]:
    """A message as JSON: key, value and header values as text, or as
    ``{"base64": ...}`` where they are not UTF-8 (``json_bytes``); with
    ``broker`` (``Routes.shown_group``) also the broker name."""
    return {
        **({"broker": broker} if broker is not None else {}),
        "message_id": m.message_id,
        "topic": m.topic,
        "queue_id": m.queue_id,
        "offset": m.offset,
        "key": None if m.key is None else json_bytes(m.key),
        "tag": m.tag,
        "headers": [[name, json_bytes(value)] for name, value in m.headers],
        "timestamp_ms": m.timestamp_ms,
        "store_timestamp_ms": m.store_timestamp_ms,
        "value": json_bytes(m.value),
    }


def message_line(m: Message, broker: str | None = None) -> str:
    """One message on one line: ``[broker=B] queue=Q offset=O [key=K] [tag=T] value=V``."""
    parts = [
        *([f"broker={broker}"] if broker is not None else []),
        f"queue={m.queue_id}",
        f"offset={m.offset}",
    ]
    if m.key is not None:
        parts.append(f"key={one_line(m.key)}")
    if m.tag:
        parts.append(f"tag={m.tag}")
    parts.append(f"value={one_line(m.value)}")
    return " ".join(parts)


class Output:
    """Where a command writes: a table/pairs/text for people, one document with ``--json``."""

    def __init__(self, as_json: bool) -> None:
        self.json = as_json

    @property
    def out(self) -> IO[str]:
        return sys.stdout  # looked up per call, so redirection (and capsys) works

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")

    def document(self, doc: object) -> None:
        self.out.write(json.dumps(doc, indent=2) + "\n")

    def json_line(self, doc: object) -> None:
        self.out.write(json.dumps(doc, separators=(",", ":")) + "\n")
