"""Plots from Prometheus when the console is given ``--prometheus URL``
(design 30, 2.5): ``GET {URL}/api/v1/query_range`` over the asked range,
so a plot reaches back as far as Prometheus keeps data, not only the
console's ``--history``. Only the series whose key is a topic or group name
are read there (the brokers' ``broker`` label is a broker id, not the broker
group the console's other keys name); the others, and every series when
Prometheus fails, come from the console's own ring buffers.
"""

from __future__ import annotations

import math
import ssl
from typing import Any

import aiohttp

from equeue_spark.console.history import Points

QUERIES: dict[str, tuple[str, tuple[str, ...]]] = {
    # kind -> (PromQL with {sel} for the key's label matchers, the key's labels)
    "topic_in": ("sum by (topic) (rate(equeue_messages_in_total{{{sel}}}[1m]))", ("topic",)),
    "topic_out": ("sum by (topic) (rate(equeue_messages_out_total{{{sel}}}[1m]))", ("topic",)),
    "group_lag": (
        "sum by (group, topic) (equeue_group_topic_lag_messages{{{sel}}})",
        ("group", "topic"),
    ),
    "group_lag_seconds": (
        "max by (group, topic) (equeue_group_topic_lag_seconds{{{sel}}})",
        ("group", "topic"),
    ),
}
MAX_POINTS = 600
"""Points per series at most: the step grows with the range."""
MAX_RANGE_S = 7 * 86400.0
TIMEOUT_S = 5.0


class PromError(Exception):
    """Prometheus did not answer, or not with a matrix (the caller falls back)."""


def escape(value: str) -> str:
    """A PromQL double-quoted string literal's content."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def promql(kind: str, key: tuple[str, ...] | None) -> str:
    """The query of ``kind``; with ``key``, of that one series."""
    template, labels = QUERIES[kind]
    pairs = zip(labels, key or (), strict=False)
    return template.format(sel=",".join(f'{label}="{escape(v)}"' for label, v in pairs))


def step_s(start_s: float, end_s: float, min_step_s: float) -> float:
    return max(min_step_s, (end_s - start_s) / MAX_POINTS)


class Prometheus:
    """A Prometheus HTTP API client for the console's plots (aiohttp, on the
    console's loop); bearer token and CA file optional."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        min_step_s: float = 15.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.min_step_s = min_step_s
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._ssl: ssl.SSLContext | None = (
            ssl.create_default_context(cafile=ca_file) if ca_file else None
        )
        self._session: aiohttp.ClientSession | None = None

    async def series(
        self, kind: str, key: tuple[str, ...] | None, start_s: float, end_s: float
    ) -> list[Points]:
        """The series of ``kind`` (one with ``key``) between the two times."""
        start_s = max(start_s, end_s - MAX_RANGE_S)
        params = {
            "query": promql(kind, key),
            "start": f"{start_s:.3f}",
            "end": f"{end_s:.3f}",
            "step": f"{step_s(start_s, end_s, self.min_step_s):g}",
        }
        data = await self._get("/api/v1/query_range", params)
        if data.get("resultType") != "matrix":
            raise PromError(f"Prometheus answered a {data.get('resultType')!r}, not a matrix")
        labels = QUERIES[kind][1]
        return [_points(kind, labels, result) for result in data.get("result", [])]

    async def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S), headers=self._headers
            )
        try:
            async with self._session.get(
                self.url + path, params=params, ssl=self._ssl if self._ssl else True
            ) as response:
                body = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise PromError(f"Prometheus at {self.url}: {exc or type(exc).__name__}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            why = body.get("error") if isinstance(body, dict) else body
            raise PromError(f"Prometheus at {self.url} refused the query: {why}")
        data = body.get("data")
        return data if isinstance(data, dict) else {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _points(kind: str, labels: tuple[str, ...], result: dict[str, Any]) -> Points:
    metric = result.get("metric", {})
    times: list[int] = []
    values: list[float] = []
    for at, text in result.get("values", []):
        value = float(text)
        if math.isfinite(value):  # JSON has no NaN; a gap is a missing point
            times.append(round(float(at) * 1000))
            values.append(value)
    return Points(kind, tuple(metric.get(label, "") for label in labels), times, values)
