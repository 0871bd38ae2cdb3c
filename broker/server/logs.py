"""Logging setup: human-readable text, or one JSON object per line (``--log-format json``).

JSON lines carry ``ts``, ``level``, ``logger``, ``msg`` and any ``extra=`` fields
a call passes, so a log shipper can index them without parsing messages.
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


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
