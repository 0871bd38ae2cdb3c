"""RPC durations, counted on the hot path without locks or a metrics library.

``rpc`` / ``rpc_stream`` (service_base.py) time every handler (``rpc``
inline, ``rpc_stream`` and the name server with ``timed``) and count the
duration into ``RPC_TIMES`` (unary calls) or ``STREAM_TIMES``
(a stream's whole life, so long-lived streams do not swamp the unary
latencies) under ``(method, code)``: ``code`` is the gRPC status name the
call ended with (``OK``, ``CANCELLED`` for a cancelled call, else the one
``errors.status_for`` picked). The handlers' wrappers run on the event loop
thread only, so an observation is one dict lookup, a ``bisect`` and two
increments with no lock (~0.5 us per RPC here, never per message). A scrape (the HTTP listener's
collector, in its own thread) takes ``snapshot()``: copies of the lists,
atomic under the GIL, so a snapshot may lag an observation in progress by
one count, never tear a list. The figures are per process: a process that
runs several brokers (tests) sums them.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence

BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Upper bounds (seconds) of the unary duration buckets (a parked long-poll
Pull counts its wait); a last bucket counts the rest."""

STREAM_BUCKETS: tuple[float, ...] = (1.0, 10.0, 60.0, 600.0, 3600.0)
"""Upper bounds (seconds) of the stream duration buckets."""

Key = tuple[str, str]
"""(method, code), e.g. ("Produce", "OK")."""


class RpcTimes:
    """Durations per (method, code): counts per bucket (not cumulative, the
    last above every bound) and their sum in seconds."""

    def __init__(self, buckets: Sequence[float] = BUCKETS) -> None:
        self.buckets = tuple(buckets)
        self._slots = len(self.buckets) + 1
        self._keys: dict[Key, list[float]] = {}
        """Per key one list: the bucket counts, then the sum (one lookup per call)."""

    def observe(self, method: str, code: str, seconds: float) -> None:
        """Count one call (event loop thread only: no lock)."""
        row = self._keys.get((method, code))
        if row is None:  # at most methods x status codes keys, made once each
            row = self._keys[(method, code)] = [0] * self._slots + [0.0]
        row[bisect.bisect_left(self.buckets, seconds)] += 1
        row[-1] += seconds

    def snapshot(self) -> dict[Key, tuple[list[int], float]]:
        """{(method, code): (counts per bucket, sum of seconds)}, copied."""
        out: dict[Key, tuple[list[int], float]] = {}
        for key in list(self._keys):  # a key added meanwhile is taken next time
            row = list(self._keys[key])  # one copy: its counts and sum agree
            out[key] = ([int(n) for n in row[:-1]], row[-1])
        return out


RPC_TIMES = RpcTimes(BUCKETS)
"""Unary handlers of this process (``rpc``)."""

STREAM_TIMES = RpcTimes(STREAM_BUCKETS)
"""Streaming handlers of this process (``rpc_stream``), each stream's whole life."""


class timed:  # noqa: N801 (used like a function: ``with timed(...) as call``)
    """Times a block into ``times`` under ``method`` and the code it sets:
    ``OK`` unless the block sets ``call.code`` (a failure's status name) or
    is cancelled (``CANCELLED``). The name server's handlers use it too."""

    __slots__ = ("_started", "_times", "code", "method")

    def __init__(self, times: RpcTimes, method: str) -> None:
        self._times = times
        self.method = method
        self.code = "OK"
        self._started = 0.0

    def __enter__(self) -> timed:
        self._started = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        code = self.code
        if kind is not None and code == "OK":  # an error the block did not name
            code = "UNKNOWN" if issubclass(kind, Exception) else "CANCELLED"
        self._times.observe(self.method, code, time.perf_counter() - self._started)
