"""In-memory history of the console's plotted figures: one ring of round
timestamps and one ring of float64 values per series (NaN = no value).

A series is ``(kind, key)``: ``("topic_in", ("orders",))``, ``("group_lag",
("billing", "orders"))``... Pure: no I/O, no clock (the caller gives each
round's time), so it is tested alone (tests/console/test_history.py).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SeriesKey = tuple[str, tuple[str, ...]]
"""(kind, key parts)."""

KINDS = (
    "topic_in", "topic_out", "group_lag", "group_lag_seconds", "replica_lag",
    "member_in", "member_out", "unconsumed",
)  # fmt: skip
"""The series the poller records (docs/console.md, "Series")."""


@dataclass(frozen=True)
class Points:
    """One series' points, oldest first, without the slots it has no value in."""

    kind: str
    key: tuple[str, ...]
    times_ms: list[int]
    values: list[float]


class History:
    """``capacity`` rounds of at most ``max_series`` series.

    ``append`` records one round; a series absent from a round gets no point
    there; a series absent for a whole ``capacity`` of rounds is forgotten (a
    deleted topic, a gone group); a new series past ``max_series`` is not kept
    and counted in ``dropped``."""

    def __init__(self, capacity: int, max_series: int = 2000) -> None:
        if capacity < 2:
            raise ValueError(f"history capacity must be at least 2 rounds, got {capacity}")
        if max_series < 1:
            raise ValueError(f"max_series must be at least 1, got {max_series}")
        self.capacity = capacity
        self.max_series = max_series
        self._times = array("d", [math.nan]) * capacity
        self._series: dict[SeriesKey, array[float]] = {}
        self._last_round: dict[SeriesKey, int] = {}
        self.rounds = 0
        """Rounds appended so far (the next one's number)."""
        self.dropped = 0
        """New series refused because ``max_series`` were kept."""

    def append(self, at_ms: int, values: Mapping[SeriesKey, float]) -> None:
        """Record one round taken at ``at_ms`` (non-decreasing)."""
        slot = self.rounds % self.capacity
        self._times[slot] = float(at_ms)
        for ring in self._series.values():
            ring[slot] = math.nan
        for series, value in values.items():
            found = self._series.get(series)
            if found is not None:
                ring = found
            else:
                if len(self._series) >= self.max_series:
                    self.dropped += 1
                    continue
                ring = array("d", [math.nan]) * self.capacity
                self._series[series] = ring
            ring[slot] = float(value)
            self._last_round[series] = self.rounds
        self.rounds += 1
        self._forget_gone()

    def _forget_gone(self) -> None:
        oldest = self.rounds - self.capacity
        for series in [s for s, r in self._last_round.items() if r < oldest]:
            del self._series[series]
            del self._last_round[series]

    def series(self, kind: str | None = None) -> list[SeriesKey]:
        """The series kept (of ``kind``), sorted."""
        return sorted(s for s in self._series if kind is None or s[0] == kind)

    def points(self, kind: str, key: Iterable[str], since_ms: int = 0) -> Points:
        """The series' points taken after ``since_ms``, oldest first; empty
        lists for a series not kept."""
        key = tuple(key)
        ring = self._series.get((kind, key))
        times: list[int] = []
        values: list[float] = []
        if ring is not None:
            for slot in self._slots():
                at, value = self._times[slot], ring[slot]
                if at > since_ms and not math.isnan(value):
                    times.append(int(at))
                    values.append(value)
        return Points(kind, key, times, values)

    def _slots(self) -> list[int]:
        """Slot indexes of the rounds kept, oldest first."""
        count = min(self.rounds, self.capacity)
        first = self.rounds - count
        return [(first + i) % self.capacity for i in range(count)]

    def memory_bytes(self) -> int:
        """The rings' size (8 bytes a slot)."""
        return 8 * self.capacity * (len(self._series) + 1)


class Rates:
    """Per-second rates from monotonically growing counters, between two rounds.

    A counter that went down, or whose source restarted (``epoch`` changed:
    a member's instance id or a smaller uptime), gives no rate for that
    interval: a gap, never a negative value or a spike."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, ...], tuple[str, int, float]] = {}

    def rate(self, counter: tuple[str, ...], epoch: str, value: int, at_s: float) -> float | None:
        """The rate of ``counter`` since its previous value; None for the first
        value, after a restart or a counter that went down."""
        previous = self._last.get(counter)
        self._last[counter] = (epoch, value, at_s)
        if previous is None:
            return None
        last_epoch, last_value, last_at = previous
        if last_epoch != epoch or value < last_value or at_s <= last_at:
            return None
        return (value - last_value) / (at_s - last_at)

    def forget_except(self, counters: Iterable[tuple[str, ...]]) -> None:
        """Drop counters not seen in the latest round (bounded memory)."""
        keep = set(counters)
        for counter in [c for c in self._last if c not in keep]:
            del self._last[counter]
