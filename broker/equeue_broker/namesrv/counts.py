"""What the name server's servicer counts for its metrics (event loop thread only).

Its own module so that the metrics (namesrv/metrics.py, imported only with
``--http-port``) and the servicer (namesrv/app.py) both use it without importing
each other."""

from __future__ import annotations

import collections

from equeue_broker.server.metrics_hot import RpcTimes


class Counts:
    """Registrations, route requests and RPC durations (the metrics read them)."""

    def __init__(self) -> None:
        self.registrations: collections.Counter[str] = collections.Counter()
        """By result: accepted, refused."""
        self.routes: collections.Counter[str] = collections.Counter()
        """By result: ok, not_found, denied."""
        self.times = RpcTimes()
