"""Durations as operators write them: ``500ms``, ``30s``, ``15m``, ``2h``, ``7d``.

The settings that take one (``--max-delay``, ``retry-backoff``) hold
milliseconds; ``format_ms`` writes a value back in the largest unit that
divides it, which is how ``--help`` and docs/equeue-broker.toml show defaults.
"""

from __future__ import annotations

import re

from equeue_broker.storage.errors import InvalidArgument

UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"\s*(\d{1,12})\s*(ms|s|m|h|d)\s*")
EXAMPLE = "a duration like 500ms, 30s, 15m, 2h or 7d"


def parse_ms(text: object, name: str) -> int:
    """``text`` (``"30s"``) in milliseconds; ``InvalidArgument`` naming
    ``name`` (the setting as given) and the value if it is not a duration."""
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidArgument(f"{name} {text!r} is not {EXAMPLE}")
    return int(match.group(1)) * UNIT_MS[match.group(2)]


def format_ms(ms: int) -> str:
    """``ms`` in the largest unit that divides it (``604800000`` -> ``7d``)."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % UNIT_MS[unit] == 0:
            return f"{ms // UNIT_MS[unit]}{unit}"
    return f"{ms}ms"
