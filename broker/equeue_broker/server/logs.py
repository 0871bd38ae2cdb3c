"""Logging setup: human-readable text, or one JSON object per line (``--log-format json``).

JSON lines carry ``ts``, ``level``, ``logger``, ``msg`` and any ``extra=`` fields
a call passes, so a log shipper can index them without parsing messages. Text
lines end with the same fields as ``key=value`` (``topic deleted topic=orders``):
a message says what happened, its fields say to what.

``--log-level`` sets the threshold of equeue's own loggers. The libraries'
loggers (gRPC, asyncio) log at the higher of it and ``--library-log-level``
(default WARNING): at DEBUG they log every poller and selector step, which
would bury the broker's own lines, so they do that only when asked.
"""

from __future__ import annotations

import json
import logging
import sys
import time

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD:
                document[key] = (
                    value if isinstance(value, int | float | bool | None) else str(value)
                )
        if record.exc_info:
            document["exc"] = self.formatException(record.exc_info)
        return json.dumps(document, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: MESSAGE key=value ...`` (the ``extra=`` fields)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [f"{k}={_text_value(v)}" for k, v in vars(record).items() if k not in _STANDARD]
        if not fields:
            return line
        # A traceback (exc_info) follows the first line; keep the fields on it.
        first, newline, rest = line.partition("\n")
        return f"{first} {' '.join(fields)}{newline}{rest}"


def _text_value(value: object) -> str:
    """The value bare if it reads unambiguously, else JSON-quoted."""
    text = str(value)
    if text and not any(c.isspace() or c in '"=' for c in text):
        return text
    return json.dumps(text)


LIBRARY_LOGGERS = ("grpc", "asyncio")
"""Loggers of libraries the broker runs on; ``library_level`` sets them."""


def configure(level: str, fmt: str, library_level: str = "WARNING") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    threshold = max(logging.getLevelName(level), logging.getLevelName(library_level))
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(threshold)
