"""The console's HTTP side (aiohttp): the JSON API under ``/api/v1/``, live
updates as server-sent events, admin actions, probes, its own ``/metrics``,
and the pages' HTML shell. The shapes are documented in docs/console.md.

Reads come from the current ``Snapshot`` (no RPC per request) except the
message browser and the dead-letter list, which ask the brokers in a thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from html import escape
from pathlib import Path
from typing import Any

from aiohttp import web

from equeue_spark.client.admin import Admin
from equeue_spark.client.connection import ClientConfig
from equeue_spark.client.errors import (
    AuthenticationError,
    BrokerUnavailable,
    DeadlineExceeded,
    EqueueError,
    InvalidRequest,
    LimitError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionError,
)
from equeue_spark.console import actions, browser
from equeue_spark.console.access import SESSION_COOKIE, Sessions, Tokens, User, bearer
from equeue_spark.console.alarms.service import Alarms
from equeue_spark.console.history import KINDS, History, Points, SeriesKey
from equeue_spark.console.poller import describe
from equeue_spark.console.prom import QUERIES, PromError, Prometheus
from equeue_spark.console.snapshot import EMPTY, Snapshot

log = logging.getLogger("equeue.console.web")

STATIC = Path(__file__).parent / "static"
PAGES = ("", "topics", "groups", "messages", "transactions", "alarms", "login")
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; object-src 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
SSE_KEEPALIVE_S = 15.0
MAX_READERS = 64
"""Per-user message-reading clients kept (the oldest is closed past it)."""
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/api/v1/login", "/api/v1/whoami"})
"""What answers without a token on a console with users (``--tokens-file``)."""
TOPIC_KEYED = {"topic_in": 0, "topic_out": 0, "group_lag": 1, "group_lag_seconds": 1}
"""Series kinds whose key names a topic, and where."""
STALE_ROUNDS = 3
"""/readyz fails when the last round is older than this many intervals."""
SHELL = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>equeue console</title>
<link rel="stylesheet" href="/static/console.css"></head>
<body data-page="{page}" data-arg="{arg}">
<h1>equeue console</h1>
<p>The pages' script is not installed: the JSON API is served under
<a href="/api/v1/cluster">/api/v1/</a> (docs/console.md).</p>
<script src="/static/console.js"></script>
</body></html>
"""
"""The page shell served when static/page.html is absent (the front end is
another package's); it names the same assets, so it works once they exist."""


class Console:
    """The state the handlers share: the current snapshot, the history, the
    SSE subscribers, who may act, and how to reach the cluster."""

    def __init__(
        self, config: ClientConfig, history: History, interval_s: float,
        tokens: Tokens | None = None,
    ) -> None:  # fmt: skip
        self.config = config
        self.history = history
        self.interval_s = interval_s
        self.tokens = tokens
        self.snapshot: Snapshot = EMPTY
        self.subscribers: set[asyncio.Queue[Snapshot]] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="equeue-console-call")
        self.reader = Admin(config=config)
        """The poller's token's Admin, for the message browser and dead letters."""
        self.sessions = Sessions()
        self._readers: dict[str, Admin] = {}
        self.poll_rounds = 0
        self.poll_seconds_sum = 0.0
        self.poll_errors = 0
        self.poll_overruns: Callable[[], int] = lambda: 0
        """The poller's overrun count (app.py points it at the poller)."""

    # -- rounds from the poller thread -------------------------------------------------

    def publish(self, snapshot: Snapshot, points: dict[SeriesKey, float]) -> None:
        """Called from the poller thread: hand the round to the loop."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._publish, snapshot, points)

    def _publish(self, snapshot: Snapshot, points: dict[SeriesKey, float]) -> None:
        self.snapshot = snapshot
        self.history.append(snapshot.at_ms, points)
        self.poll_rounds += 1
        self.poll_seconds_sum += snapshot.poll_seconds
        self.poll_errors += len(snapshot.errors)
        for queue in self.subscribers:
            if queue.full():  # a slow browser skips rounds rather than buffering them
                queue.get_nowait()
            queue.put_nowait(snapshot)

    def ready(self) -> tuple[bool, str]:
        snap = self.snapshot
        if snap.round < 0:
            return False, "no poll round completed yet"
        age_s = time.time() - snap.at_ms / 1000
        if age_s > STALE_ROUNDS * self.interval_s + 10:
            return False, f"the last poll round is {age_s:.0f} s old"
        if "members" in snap.stale:
            return False, "the cluster could not be asked in the last round"
        if not any(m["stats"] is not None for m in snap.members):
            return False, "no broker answered in the last round"
        return True, "ok"

    def user(self, request: web.Request) -> User | None:
        """Who the request speaks for: its bearer token, else its session."""
        if self.tokens is None:
            return None
        secret = bearer(request.headers.get("Authorization"))
        if secret is not None:
            return self.tokens.lookup(secret)
        return self.sessions.lookup(request.cookies.get(SESSION_COOKIE), time.monotonic())

    def reader_for(self, user: User | None) -> Admin:
        """The Admin that reads messages: the user's own token when the
        console has users (the brokers decide what it may read), else the poller's."""
        if user is None:
            return self.reader
        admin = self._readers.get(user.secret)
        if admin is None:
            if len(self._readers) >= MAX_READERS:
                oldest = next(iter(self._readers))
                self._readers.pop(oldest).close()
            admin = Admin(config=dataclasses.replace(self.config, token=user.secret))
            self._readers[user.secret] = admin
        return admin

    async def call(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.reader.close()
        for admin in self._readers.values():
            admin.close()


CONSOLE = web.AppKey("console", Console)
ALARMS = web.AppKey("alarms", Alarms)
"""Set by app.py when alarms are configured (absent: ``available: false``)."""
PROMETHEUS = web.AppKey("prometheus", Prometheus)
"""Set by app.py with ``--prometheus``: plots read from there."""


def reply(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, allow_nan=False))


def error(status: int, message: str) -> web.Response:
    return reply({"error": message}, status)


def status_of(exc: EqueueError) -> int:
    for kind, status in (
        (NotFoundError, 404), (PermissionDeniedError, 403), (AuthenticationError, 401),
        (InvalidRequest, 400), (PreconditionError, 409), (LimitError, 429),
        (BrokerUnavailable, 503), (DeadlineExceeded, 504),
    ):  # fmt: skip
        if isinstance(exc, kind):
            return status
    return 502


@web.middleware
async def headers_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    response: web.StreamResponse
    try:
        if _needs_user(request):
            response = error(401, "log in (POST /api/v1/login) or send Authorization: Bearer")
        else:
            response = await handler(request)
    except EqueueError as exc:
        response = error(status_of(exc), str(exc))
    except (browser.BadQuery, actions.BadAction) as exc:
        response = error(400, str(exc))
    except web.HTTPException as exc:
        if exc.status >= 400 and exc.content_type != "application/json":
            response = error(exc.status, exc.reason)
        else:
            raise
    response.headers.update(SECURITY_HEADERS)
    if request.path.startswith("/api/"):
        response.headers.setdefault("Cache-Control", "no-store")
    return response


def _needs_user(request: web.Request) -> bool:
    """A console with users shows nothing to a request without one (the
    pages' HTML shell and its static files excepted: they hold no figures)."""
    c = request.app[CONSOLE]
    if c.tokens is None or request.path in OPEN_PATHS:
        return False
    if not (request.path.startswith("/api/") or request.path == "/metrics"):
        return False
    return c.user(request) is None


def _console(request: web.Request) -> Console:
    return request.app[CONSOLE]


def _sees(request: web.Request) -> Callable[[str], bool]:
    """Which topics the request may see: a topic-scoped token sees its own
    (as on the brokers), everyone else every topic."""
    user = request.app[CONSOLE].user(request)
    return user.sees if user is not None else lambda _topic: True


def _scoped_group(group: dict[str, Any], sees: Callable[[str], bool]) -> dict[str, Any] | None:
    """The group as a scoped token sees it: only its topics' rows and lag;
    None when it reads none of them."""
    topics = [t for t in group["topics"] if sees(t["topic"])]
    if len(topics) == len(group["topics"]):
        return group
    if not topics:
        return None
    queues = [q for q in group.get("queues", []) if sees(q["topic"])]
    lag = sum(t["lag"] for t in topics)
    return {**group, "topics": topics, "queues": queues, "total_lag": lag,
            "max_lag_ms": max(t["lag_ms"] for t in topics)}  # fmt: skip


# -- probes and the console's own metrics ----------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    ok, why = _console(request).ready()
    return web.Response(text=why + "\n", status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    """The console's own figures (Prometheus text format 0.0.4)."""
    c = _console(request)
    lines = [
        "# HELP equeue_console_poll_rounds_total Poll rounds completed.",
        "# TYPE equeue_console_poll_rounds_total counter",
        f"equeue_console_poll_rounds_total {c.poll_rounds}",
        "# HELP equeue_console_poll_seconds_total Time spent in poll rounds.",
        "# TYPE equeue_console_poll_seconds_total counter",
        f"equeue_console_poll_seconds_total {c.poll_seconds_sum:.6f}",
        "# HELP equeue_console_poll_errors_total Steps of poll rounds that failed.",
        "# TYPE equeue_console_poll_errors_total counter",
        f"equeue_console_poll_errors_total {c.poll_errors}",
        "# HELP equeue_console_poll_overruns_total Rounds that took longer than --interval.",
        "# TYPE equeue_console_poll_overruns_total counter",
        f"equeue_console_poll_overruns_total {c.poll_overruns()}",
        "# HELP equeue_console_series Plotted series kept in memory.",
        "# TYPE equeue_console_series gauge",
        f"equeue_console_series {len(c.history.series())}",
        "# HELP equeue_console_series_dropped_total New series refused past --max-series.",
        "# TYPE equeue_console_series_dropped_total counter",
        f"equeue_console_series_dropped_total {c.history.dropped}",
        *_alarm_metrics(request),
    ]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")


# -- the JSON API: figures from the snapshot ----------------------------------------------


async def api_cluster(request: web.Request) -> web.Response:
    snap = _console(request).snapshot
    return reply({**describe(snap), "members": list(snap.members), "namesrvs": list(snap.namesrvs)})


async def api_topics(request: web.Request) -> web.Response:
    snap = _console(request).snapshot
    internal = request.query.get("internal", "1") != "0"
    sees = _sees(request)
    topics = [
        {k: v for k, v in t.items() if k != "queues"}
        for t in snap.topics
        if (internal or not t["internal"]) and sees(t["name"])
    ]
    return reply({**describe(snap), "topics": topics})


async def api_topic(request: web.Request) -> web.Response:
    snap = _console(request).snapshot
    name = request.match_info["topic"]
    topic = snap.topic(name)
    if topic is None or not _sees(request)(name):
        return error(404, f"topic {name!r} is not in the last poll round")
    readers = [
        {"group": g["group"], **t} for g in snap.groups for t in g["topics"] if t["topic"] == name
    ]
    return reply({**describe(snap), "topic": topic, "groups": readers})


async def api_groups(request: web.Request) -> web.Response:
    snap = _console(request).snapshot
    sees = _sees(request)
    scoped = [_scoped_group(g, sees) for g in snap.groups]
    groups = [{k: v for k, v in g.items() if k != "queues"} for g in scoped if g is not None]
    return reply({**describe(snap), "groups": groups})


async def api_group(request: web.Request) -> web.Response:
    snap = _console(request).snapshot
    name = request.match_info["group"]
    found = snap.group(name)
    group = _scoped_group(found, _sees(request)) if found is not None else None
    if group is None:
        return error(404, f"group {name!r} is not in the last poll round")
    return reply({**describe(snap), "group": group})


async def api_group_dlq(request: web.Request) -> web.Response:
    """The group's first dead letters (asked now, with the poller's token)."""
    c = _console(request)
    group = request.match_info["group"]
    text = request.query.get("limit", "") or str(browser.MAX_COUNT)
    if not text.isdigit() or int(text) < 1:
        return error(400, f"limit={text!r}: give a count from 1 to {browser.MAX_COUNT}")
    limit = min(int(text), browser.MAX_COUNT)
    reader = c.reader_for(c.user(request))
    found = await c.call(lambda: reader.dead_letters(group, limit))
    rows = await c.call(lambda: [browser.message_json(reader, m) for m in found])
    return reply({"group": group, "messages": rows})


async def api_transactions(request: web.Request) -> web.Response:
    snap = _console(request).snapshot
    delayed = [
        {
            "topic": t["name"],
            "pending": t["delayed_pending"],
            "next_due_ms": t["delayed_next_due_ms"],
        }
        for t in snap.topics
        if t["delayed_pending"]
    ]
    return reply({**describe(snap), "transactions": list(snap.transactions), "delayed": delayed})


def _alarm_metrics(request: web.Request) -> list[str]:
    alarms = request.app.get(ALARMS)
    return alarms.metrics() if alarms is not None else []


def _sees_alarm(alarm: dict[str, Any], sees: Callable[[str], bool]) -> bool:
    topic = alarm["labels"].get("topic")
    return topic is None or sees(topic)


async def api_alarms(request: web.Request) -> web.Response:
    """The alarms (docs/alarms.md); a scoped token sees those of its topics
    and the alarms that name no topic."""
    alarms = request.app.get(ALARMS)
    if alarms is None:
        return reply({
            "available": False, "evaluated_rounds": 0, "rules": [], "active": [],
            "resolved": [], "notifications": [],
        })  # fmt: skip
    view = alarms.view()
    sees = _sees(request)
    for part in ("active", "resolved"):
        view[part] = [a for a in view[part] if _sees_alarm(a, sees)]
    return reply(view)


async def api_series(request: web.Request) -> web.Response:
    """``?kind=K[&key=P1&key=P2][&since=MS]``: one series, or every series of K."""
    c = _console(request)
    kind = request.query.get("kind", "")
    if kind not in KINDS:
        return error(400, f"kind={kind!r}: give one of {', '.join(KINDS)}")
    try:
        since = int(request.query.get("since", "0") or 0)
    except ValueError:
        return error(400, "since= must be ms since the epoch")
    parts = request.query.getall("key", [])
    head = {"round": c.snapshot.round, "interval_s": c.interval_s}
    from_prometheus = await _prometheus_series(request, kind, tuple(parts), since)
    if isinstance(from_prometheus, list):
        series = [dataclasses.asdict(p) for p in from_prometheus if _sees_series(request, p)]
        return reply({**head, "series": series, "source": "prometheus"})
    keys = [tuple(parts)] if parts else [key for _, key in c.history.series(kind)]
    if kind in TOPIC_KEYED:  # a scoped token sees its topics' series only
        sees, at = _sees(request), TOPIC_KEYED[kind]
        keys = [k for k in keys if len(k) > at and sees(k[at])]
    series = [dataclasses.asdict(c.history.points(kind, key, since)) for key in keys]
    fallback = {"prometheus_error": from_prometheus} if from_prometheus else {}
    return reply({**head, "series": series, "source": "console", **fallback})


async def _prometheus_series(
    request: web.Request, kind: str, key: tuple[str, ...], since_ms: int
) -> list[Points] | str | None:
    """The series from Prometheus (``--prometheus``), else None (not
    configured, or a kind it does not serve) or why it failed (the caller
    falls back to the ring buffers)."""
    prometheus = request.app.get(PROMETHEUS)
    if prometheus is None or kind not in QUERIES:
        return None
    c, now = _console(request), time.time()
    start = since_ms / 1000 if since_ms else now - c.history.capacity * c.interval_s
    try:
        return await prometheus.series(kind, key or None, start, now)
    except PromError as exc:
        log.warning("plots from the console's memory: %s", exc)
        return str(exc)


def _sees_series(request: web.Request, points: Points) -> bool:
    at = TOPIC_KEYED.get(points.kind)
    return at is None or (len(points.key) > at and _sees(request)(points.key[at]))


async def api_whoami(request: web.Request) -> web.Response:
    c = _console(request)
    user = c.user(request)
    return reply({
        "tokens": c.tokens is not None,
        "user": user.name if user else None,
        "roles": sorted(user.roles) if user else [],
        "admin": bool(user and user.may("admin")),
    })  # fmt: skip


async def api_login(request: web.Request) -> web.Response:
    """``{"token": secret}`` -> a session cookie (HttpOnly, SameSite=Strict;
    Secure when the request came over TLS)."""
    c = _console(request)
    if c.tokens is None:
        return error(404, "this console has no --tokens-file: there is nothing to log in to")
    if request.content_type != "application/json":
        return error(415, "send the token as Content-Type: application/json")
    try:
        body = await request.json()
    except ValueError:
        return error(400, "the body is not JSON")
    secret = body.get("token") if isinstance(body, dict) else None
    user = c.tokens.lookup(secret) if isinstance(secret, str) and secret else None
    if user is None:
        return error(401, "unknown token")
    response = reply({"user": user.name, "roles": sorted(user.roles), "admin": user.may("admin")})
    response.set_cookie(
        SESSION_COOKIE, c.sessions.create(user, time.monotonic()), httponly=True,
        samesite="Strict", secure=request.secure, path="/",
    )  # fmt: skip
    log.info("console login: %s", user.name)
    return response


async def api_logout(request: web.Request) -> web.Response:
    c = _console(request)
    c.sessions.drop(request.cookies.get(SESSION_COOKIE))
    response = reply({"ok": True})
    response.del_cookie(SESSION_COOKIE, path="/")
    return response


# -- messages ---------------------------------------------------------------------------


async def api_messages(request: web.Request) -> web.Response:
    c = _console(request)
    query = dict(request.query)
    reader = c.reader_for(c.user(request))
    return reply(await c.call(lambda: browser.browse(reader, query)))


async def api_message_raw(request: web.Request) -> web.Response:
    c = _console(request)
    message_id = request.query.get("id", "")
    if not message_id:
        return error(400, "give id=")
    reader = c.reader_for(c.user(request))
    message = await c.call(lambda: reader.get_message(message_id))
    return web.Response(
        body=message.value,
        content_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{message_id}.bin"'},
    )


# -- live updates -----------------------------------------------------------------------


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: ``event: round`` after each poll round."""
    c = _console(request)
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    queue: asyncio.Queue[Snapshot] = asyncio.Queue(maxsize=1)
    c.subscribers.add(queue)
    try:
        await response.write(b"retry: 3000\n\n")
        if c.snapshot.round >= 0:
            queue.put_nowait(c.snapshot)
        while True:
            try:
                snap = await asyncio.wait_for(queue.get(), SSE_KEEPALIVE_S)
            except TimeoutError:
                await response.write(b": keepalive\n\n")
                continue
            if snap is EMPTY:  # the console is stopping (on_shutdown)
                break
            data = json.dumps(
                {"round": snap.round, "at_ms": snap.at_ms, "errors": len(snap.errors)}
            )
            await response.write(f"event: round\ndata: {data}\n\n".encode())
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        c.subscribers.discard(queue)
    return response


# -- admin actions ----------------------------------------------------------------------


def action_handler(name: str, target: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    act = actions.ACTIONS[name]

    async def handle(request: web.Request) -> web.Response:
        c = _console(request)
        if c.tokens is None:
            return error(403, "this console has no --tokens-file: it is read-only")
        user = c.user(request)
        if user is None:
            return error(401, "send an admin token: Authorization: Bearer <secret>")
        if not user.may("admin"):
            return error(403, f"token {user.name!r} has no admin role")
        if request.content_type != "application/json":
            return error(415, "send the action as Content-Type: application/json")
        origin = request.headers.get("Origin")
        if origin is not None and origin.split("://", 1)[-1] != request.host:
            return error(403, f"cross-origin action refused (Origin {origin})")
        try:
            body = await request.json()
        except ValueError:
            return error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object")
        subject = request.match_info[target]
        config = dataclasses.replace(c.config, token=user.secret)

        def run() -> dict[str, Any]:
            with Admin(config=config) as admin:
                return act(admin, subject, body)

        try:
            result = await c.call(run)
        except (EqueueError, actions.BadAction) as exc:
            log.info("console action %s on %s by %s: %s", name, subject, user.name, exc)
            raise
        log.info("console action %s on %s by %s: done", name, subject, user.name)
        return reply({"ok": True, **result})

    return handle


# -- pages ------------------------------------------------------------------------------


async def page(request: web.Request) -> web.Response:
    name, _, arg = request.path.strip("/").partition("/")
    shell = STATIC / "page.html"
    template = shell.read_text() if shell.is_file() else SHELL
    # Names in the URL go into attributes: escaped, so they cannot add markup.
    html = template.replace("{page}", escape(name or "cluster")).replace("{arg}", escape(arg))
    return web.Response(text=html, content_type="text/html", charset="utf-8")


async def end_streams(app: web.Application) -> None:
    """Stopping: end every event stream now, rather than after the shutdown timeout."""
    for queue in app[CONSOLE].subscribers:
        if queue.full():
            queue.get_nowait()
        queue.put_nowait(EMPTY)


def make_app(console: Console) -> web.Application:
    app = web.Application(middlewares=[headers_middleware])
    app[CONSOLE] = console
    app.on_shutdown.append(end_streams)
    get = app.router.add_get
    get("/healthz", healthz)
    get("/readyz", readyz)
    get("/metrics", metrics)
    get("/api/v1/cluster", api_cluster)
    get("/api/v1/topics", api_topics)
    get("/api/v1/topics/{topic}", api_topic)
    get("/api/v1/groups", api_groups)
    get("/api/v1/groups/{group}", api_group)
    get("/api/v1/groups/{group}/dlq", api_group_dlq)
    get("/api/v1/transactions", api_transactions)
    get("/api/v1/alarms", api_alarms)
    get("/api/v1/series", api_series)
    get("/api/v1/whoami", api_whoami)
    get("/api/v1/messages", api_messages)
    get("/api/v1/messages/raw", api_message_raw)
    get("/api/v1/events", events)
    post = app.router.add_post
    post("/api/v1/login", api_login)
    post("/api/v1/logout", api_logout)
    post("/api/v1/groups/{group}/reset", action_handler("reset", "group"))
    post("/api/v1/groups/{group}/dlq/resend", action_handler("dlq_resend", "group"))
    post("/api/v1/groups/{group}/dlq/purge", action_handler("dlq_purge", "group"))
    post("/api/v1/topics/{topic}/queues", action_handler("add_queues", "topic"))
    if STATIC.is_dir():
        app.router.add_static("/static/", STATIC)
    get("/", page)
    for name in PAGES[1:]:
        get(f"/{name}", page)
        get(f"/{name}/{{arg:.+}}", page)
    return app
