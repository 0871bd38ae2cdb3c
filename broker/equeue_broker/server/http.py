"""The HTTP listener of ``--http-port``: ``/metrics``, ``/healthz``, ``/readyz``.

aiohttp on the process's own asyncio loop, beside gRPC aio: a slow or idle
HTTP client is one coroutine, not a thread. The broker and the name server
both use it (``HttpListener``); what differs is given to it: the token table,
who may read metrics, the renderer and ``Readiness``.

- ``/metrics``: with tokens, ``Authorization: Bearer <secret>`` of a token
  that may read metrics (401 with ``WWW-Authenticate: Bearer`` when missing or
  unknown, 403 when the token has no such role). The body is rendered by
  ``render(principal)`` in one dedicated thread (never on the loop, never in
  the store pool), single flight per scope and served again for ``CACHE_S``
  after it started: scrapers that come together cost one render.
- ``/healthz``: ``200 ok`` (the loop answered); no token (probes carry none).
- ``/readyz``: ``200 ready``, else ``503 not ready: <why>`` (``Readiness``);
  ``?writes=1`` also needs writes accepted here (503 on a replica).
- Anything else 404, methods but GET/HEAD 405; at most ``MAX_IN_FLIGHT``
  requests at once (the next get 503), request bodies of at most 4 KiB.

With TLS (``ssl_context``) it serves HTTPS with the gRPC port's certificate,
and requires client certificates when gRPC does: one rule for operators.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from aiohttp import web

from equeue_broker.server.tokens import Principal

log = logging.getLogger("equeue.http")

CACHE_S = 0.5
"""A rendering started less than this ago is served again (per scope): two
Prometheus servers scraping together share one rendering, while one scraping
every second still gets a fresh one each time (a 1 s cache stamped at the
end of the rendering served every other scrape of a 1 s interval again)."""
MAX_IN_FLIGHT = 32
"""HTTP requests handled at once; more get 503 (the port never takes gRPC's budgets)."""
MAX_REQUEST_BYTES = 4096
"""Requests have no body: anything bigger is refused by aiohttp (413)."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text exposition format (what ``generate_latest`` writes)."""


class Tokens(Protocol):
    def lookup(self, secret: str) -> Principal | None: ...


Render = Callable[[Principal | None], bytes]
"""Renders the exposition for a principal (None: no tokens configured); runs
on the metrics thread."""


class Readiness:
    """Whether the process is ready, said at the points its start and
    shutdown reach (``serve``); ``writes`` says why writes are not accepted
    here ("" when they are), for ``/readyz?writes=1``."""

    def __init__(self, writes: Callable[[], str] | None = None) -> None:
        self.why = "starting"
        self._writes = writes

    def ready(self) -> None:
        self.why = ""

    def stopping(self) -> None:
        self.why = "shutting down"

    def check(self, writes: bool) -> str:
        """ "" when ready (and, with ``writes``, accepting writes); else why not."""
        if self.why or not writes or self._writes is None:
            return self.why
        return self._writes()


class MetricsCache:
    """Single-flight rendering with a short cache, per scope (the topic
    patterns of a scoped token; None for unscoped tokens and no tokens)."""

    def __init__(self, render: Render, pool: ThreadPoolExecutor, ttl_s: float = CACHE_S) -> None:
        self._render = render
        self._pool = pool
        self._ttl_s = ttl_s
        self._done: dict[object, tuple[float, bytes]] = {}
        self._running: dict[object, asyncio.Future[bytes]] = {}

    async def get(self, principal: Principal | None) -> bytes:
        scope = None if principal is None or principal.topics is None else principal.topics
        found = self._done.get(scope)
        if found is not None and time.monotonic() - found[0] < self._ttl_s:
            return found[1]
        running = self._running.get(scope)
        if running is not None:  # someone is rendering this scope: share it
            return await asyncio.shield(running)
        loop = asyncio.get_running_loop()
        started = time.monotonic()  # the figures are as of now, not of the render's end
        future = loop.run_in_executor(self._pool, self._render, principal)
        self._running[scope] = future
        try:
            body = await asyncio.shield(future)
        finally:
            self._running.pop(scope, None)
        self._done[scope] = (started, body)
        if len(self._done) > MAX_IN_FLIGHT * 4:  # scoped tokens each have an entry: bounded
            self._done.clear()
        return body


def ssl_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    """The HTTPS context for the gRPC port's certificate files (client
    certificates required when ``client_ca`` is given)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key))
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(str(client_ca))
    return context


class HttpListener:
    """The aiohttp application, its site and its metrics thread."""

    def __init__(  # noqa: PLR0917 (what the broker and the name server differ in)
        self,
        host: str,
        port: int,
        render: Render,
        readiness: Readiness,
        tokens: Tokens | None,
        may_read: Callable[[Principal], bool],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.readiness = readiness
        self._tokens = tokens
        self._may_read = may_read
        self._tls = tls
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="equeue-metrics")
        self._cache = MetricsCache(render, self._pool)
        self._in_flight = 0
        self._runner: web.AppRunner | None = None

    @property
    def scheme(self) -> str:
        return "http" if self._tls is None else "https"

    async def start(self) -> int:
        """Listen; the port bound (``port`` 0: any free one)."""
        app = web.Application(middlewares=[self._limit], client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/metrics", self._get(self._metrics))
        app.router.add_route("*", "/healthz", self._get(self._healthz))
        app.router.add_route("*", "/readyz", self._get(self._readyz))
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.host, self.port, ssl_context=self._tls, backlog=16,
            reuse_port=False,
        )  # fmt: skip
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    @web.middleware
    async def _limit(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self._in_flight >= MAX_IN_FLIGHT:
            return web.Response(status=503, text=f"busy: {MAX_IN_FLIGHT} requests at once\n")
        self._in_flight += 1
        try:
            return await handler(request)
        finally:
            self._in_flight -= 1

    @staticmethod
    def _get(
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def only_get(request: web.Request) -> web.StreamResponse:
            if request.method not in ("GET", "HEAD"):
                return web.Response(
                    status=405, text="only GET and HEAD\n", headers={"Allow": "GET, HEAD"}
                )
            return await handler(request)

        return only_get

    async def _healthz(self, _request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.StreamResponse:
        writes = request.query.get("writes", "") not in ("", "0", "false")
        why = self.readiness.check(writes)
        if why:
            return web.Response(status=503, text=f"not ready: {why}\n")
        return web.Response(text="ready\n")

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        principal = None
        if self._tokens is not None:
            header = request.headers.get("Authorization", "")
            secret = header[len("Bearer ") :] if header.startswith("Bearer ") else ""
            principal = self._tokens.lookup(secret) if secret else None
            if principal is None:
                why = "unknown token" if secret else "a bearer token is needed"
                return web.Response(
                    status=401, text=f"{why}: send Authorization: Bearer <token>\n",
                    headers={"WWW-Authenticate": "Bearer"},
                )  # fmt: skip
            if not self._may_read(principal):
                return web.Response(
                    status=403,
                    text=f"token {principal.name!r} may not read metrics: it needs the "
                    "monitor or admin role\n",
                )
        try:
            body = await self._cache.get(principal)
        except (
            Exception
        ) as exc:  # a bug or a race in a collector: said, and the next scrape retries
            log.exception("rendering /metrics failed")
            return web.Response(status=500, text=f"rendering the metrics failed: {exc}\n")
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
