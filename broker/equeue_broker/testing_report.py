"""The markdown tables the benchmark and hardening runs print (``equeue_broker.testing_report``).

Shared by ``bench/`` and ``hardening/``, neither of which imports the other.
Nothing in the broker imports this module.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table; columns whose every cell is a number are right-aligned."""
    body = [[_cell(v) for v in row] for row in rows]
    align = ["---:" if _numeric_column(body, i) else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def _numeric_column(body: list[list[str]], i: int) -> bool:
    return bool(body) and all(re.fullmatch(r"-?[\d,]+(\.\d+)?( ms| s| MiB)?|-", r[i]) for r in body)


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)
