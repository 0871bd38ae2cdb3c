"""Results of the Spark benchmark and the tables it prints.

Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from bench._measure import progress, size_label

NA = "-"


@dataclass
class Row:
    scenario: str
    size: int
    rows: int
    target: float
    ours: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)

    def ours_rate(self) -> float:
        return statistics.median(self.ours)

    def base_rate(self) -> float:
        return statistics.median(self.base)

    def ratio(self) -> float:
        return self.ours_rate() / self.base_rate()


@dataclass
class Diagnostic:
    what: str
    size: int
    rows: int
    seconds: list[float] = field(default_factory=list)
    note: str = ""
    """Shown beside the rate; ``{}`` in it stands for the median of ``asides``."""
    asides: list[float] = field(default_factory=list)

    def rate(self) -> float:
        return self.rows / statistics.median(self.seconds)

    def note_text(self) -> str:
        return self.note.format(statistics.median(self.asides)) if self.asides else self.note


class Results:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], Row] = {}
        self.diagnostics: dict[tuple[str, int], Diagnostic] = {}
        self.notes: list[str] = []

    def add(self, scenario: str, size: int, rows: int, target: float) -> Row:
        return self.rows.setdefault((scenario, size), Row(scenario, size, rows, target))

    def diag(
        self,
        what: str,
        size: int,
        rows: int,
        seconds: float,
        note: str = "",
        *,
        aside: float | None = None,
    ) -> None:
        d = self.diagnostics.setdefault((what, size), Diagnostic(what, size, rows, note=note))
        d.seconds.append(seconds)
        if aside is not None:
            d.asides.append(aside)
        shown = note.format(aside) if aside is not None else note
        progress(f"  diag {what:48} {size_label(size):6} {rows / seconds:12,.0f} rows/s {shown}")


def main_table(results: Results) -> str:
    lines = [
        "| scenario | size | rows | equeue rows/s | baseline rows/s | ratio | target | met? |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    kinds = ["streaming read", "batch write (at-least-once)", "exactly-once write vs at-least-once"]
    for row in results.rows.values():  # other scenarios after these, as they were added
        if row.scenario not in kinds:
            kinds.append(row.scenario)
    order = sorted(results.rows.values(), key=lambda r: (kinds.index(r.scenario), r.size))
    for row in order:
        if not row.ours or not row.base:
            continue
        ratio = row.ratio()
        cells = [
            row.scenario,
            size_label(row.size),
            f"{row.rows:,}",
            f"{row.ours_rate():,.0f}",
            f"{row.base_rate():,.0f}",
            f"{ratio:.2f}x",
            f">= {row.target:g}x",
            "yes" if ratio >= row.target else "NO",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def diagnostics_table(results: Results) -> str:
    lines = ["| measurement | size | rows | rows/s | note |", "|---|---|---:|---:|---|"]
    for d in sorted(results.diagnostics.values(), key=lambda d: d.size):
        note = d.note_text()
        if len(d.seconds) > 1:
            note = f"{note} median of {len(d.seconds)}".strip()
        cells = [d.what, size_label(d.size), f"{d.rows:,}", f"{d.rate():,.0f}", note or NA]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
