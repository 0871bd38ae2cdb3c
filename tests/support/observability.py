"""Real observability tools for tests: a Prometheus server (``PrometheusProcess``),
an SMTP server with STARTTLS and AUTH (``SmtpSink``) and a webhook receiver
(``WebhookSink``) for the console's alarms; and readers of the shipped
Prometheus rules and Grafana dashboard (``rule_exprs``, ``dashboard_panels``,
``promql_metric_names``, ``exposed_names``, ``live_expr``).

Prometheus is Debian's ``prometheus`` package (``apt-get install -y
prometheus``; ``/usr/bin/prometheus``); tests that need it skip with the
install command when it is absent (``require_prometheus``). The process is
started on a free port with its own config and data directory, ready when
``/-/ready`` answers, and stopped by its pid.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from equeue_broker.testing import HOST, BrokerProcess
from tests.support.waits import wait_for

PROMETHEUS = "/usr/bin/prometheus"
INSTALL = "apt-get install -y --no-install-recommends prometheus"
READY_TIMEOUT_S = 30.0

Sample = dict[str, Any]
"""One result of an instant query: ``{"metric": {labels}, "value": [ts, "v"]}``."""


def require_prometheus() -> str:
    """The Prometheus binary; skips the test (naming the install command) if absent."""
    found = shutil.which("prometheus") or (PROMETHEUS if Path(PROMETHEUS).exists() else None)
    if found is None:
        pytest.skip(f"prometheus is not installed: {INSTALL} (as root)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusProcess:
    """A Prometheus server scraping ``targets`` (``HOST:PORT``) every
    ``scrape_s`` under job ``job`` (or, with ``jobs``, each job's targets
    under its own name, as docs/prometheus/prometheus.yml does, and
    ``targets`` empty); ``scheme``,
    ``ca_file`` and ``token_file`` for HTTPS targets with bearer tokens;
    ``rules``: rule files to load."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        *,
        scrape_s: float = 1.0,
        job: str = "equeue",
        scheme: str = "http",
        ca_file: Path | None = None,
        token_file: Path | None = None,
        rules: Sequence[Path] = (),
        jobs: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.jobs = {name: list(t) for name, t in (jobs or {job: targets}).items()}
        self.targets = [t for listed in self.jobs.values() for t in listed]
        self.scrape_s = scrape_s
        self.job = job
        self.scheme = scheme
        self.ca_file = ca_file
        self.token_file = token_file
        self.rules = list(rules)
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _interval(self) -> str:
        return f"{round(self.scrape_s * 1000)}ms"  # Prometheus durations take no fractions

    def _scrape(self, job: str, targets: list[str]) -> dict[str, Any]:
        scrape: dict[str, Any] = {
            "job_name": job,
            "scheme": self.scheme,
            "scrape_interval": self._interval(),
            "scrape_timeout": self._interval(),
            "static_configs": [{"targets": targets, "labels": {"env": "test"}}],
        }
        if self.ca_file is not None:
            scrape["tls_config"] = {"ca_file": str(self.ca_file)}
        if self.token_file is not None:
            scrape["authorization"] = {"credentials_file": str(self.token_file)}
        return scrape

    def config(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "global": {"scrape_interval": self._interval(),
                       "evaluation_interval": self._interval()},
            "scrape_configs": [self._scrape(job, t) for job, t in self.jobs.items()],
        }  # fmt: skip
        if self.rules:
            document["rule_files"] = [str(r) for r in self.rules]
        return document

    def start(self) -> PrometheusProcess:
        binary = require_prometheus()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(json.dumps(self.config(), indent=2))  # JSON is YAML
        self.port = free_port()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not get ready:\n{self.log_tail()}")
            time.sleep(0.1)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, ConnectionError):
            return False

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``'s ``data`` (``AssertionError`` unless success)."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as reply:
            document = json.load(reply)
        assert document["status"] == "success", document
        return document["data"]

    def query(self, promql: str) -> list[Sample]:
        """An instant query's vector."""
        data = self.api("query", query=promql)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def wait_for(
        self, promql: str, predicate: Callable[[list[Sample]], bool], timeout_s: float = 30.0
    ) -> list[Sample]:
        """Query until ``predicate`` holds for the result (bounded by ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"after {timeout_s:.0f}s, {promql} = {result}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> PrometheusProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def values(samples: list[Sample]) -> list[float]:
    return [float(s["value"][1]) for s in samples]


class SmtpSink:
    """aiosmtpd on a free port of 127.0.0.1, requiring STARTTLS and AUTH
    (``user``/``password``); delivered messages land in ``messages``.

    Two traps of aiosmtpd 1.4 handled here: ``Controller(port=0)`` does not
    work (its readiness check connects to port 0), so a free port is picked
    first; and every successful AUTH warns ``Session.login_data is
    deprecated`` from inside the library, which the suite's
    ``filterwarnings = error`` would turn into an error in the server: tests
    using it carry ``@pytest.mark.filterwarnings("ignore:Session.login_data
    is deprecated:DeprecationWarning")``.
    """

    def __init__(
        self, workdir: Path, user: str = "alarm", password: str = "alarm-password"
    ) -> None:
        import trustme

        self.user, self.password = user, password
        workdir.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        self.ca_file = workdir / "smtp-ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_file))
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(self._context)
        self.messages: list[Any] = []
        """``email.message.EmailMessage`` objects, in arrival order."""
        self.authenticated: list[bool] = []
        self.port = 0
        self._controller: Any = None

    def start(self) -> SmtpSink:
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult, LoginPassword

        sink = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
                from email import message_from_bytes, policy

                sink.messages.append(message_from_bytes(envelope.content, policy=policy.default))
                sink.authenticated.append(bool(session.authenticated))
                return "250 OK"

        def check(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
            ok = isinstance(data, LoginPassword) and (
                data.login.decode(),
                data.password.decode(),
            ) == (sink.user, sink.password)
            return AuthResult(success=ok, handled=False)

        self.port = free_port()
        self._controller = Controller(
            Handler(), hostname="127.0.0.1", port=self.port, tls_context=self._context,
            require_starttls=True, authenticator=check, auth_required=True,
        )  # fmt: skip
        self._controller.start()
        return self

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def __enter__(self) -> SmtpSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class WebhookSink:
    """An aiohttp server on a free port of 127.0.0.1 (its own thread and
    loop) collecting the JSON documents POSTed to ``url`` in ``received``."""

    def __init__(self, path: str = "/hook") -> None:
        self.path = path
        self.port = 0
        self.received: list[Any] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def start(self) -> WebhookSink:
        from aiohttp import web

        async def hook(request: web.Request) -> web.Response:
            self.received.append(await request.json())
            return web.Response(text="ok")

        async def serve() -> Any:
            app = web.Application()
            app.router.add_post(self.path, hook)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            return runner

        self._thread.start()
        self._runner = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(10)
        self.port = int(self._runner.addresses[0][1])
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> WebhookSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# The shipped Prometheus rules and Grafana dashboard, read as the tests need
# them (PyYAML is not a dependency: the rules file keeps each ``expr`` on one
# line, which ``rule_exprs`` enforces).
ROOT = Path(__file__).resolve().parents[2]
RULES_FILE = ROOT / "docs" / "prometheus" / "equeue-alerts.yml"
RULES_TEST_FILE = ROOT / "docs" / "prometheus" / "equeue-alerts.test.yml"
SCRAPE_CONFIG = ROOT / "docs" / "prometheus" / "prometheus.yml"
DASHBOARD_FILE = ROOT / "docs" / "grafana" / "equeue-dashboard.json"

_ALERT_LINE = re.compile(r"^\s*- alert:\s*(\S+)\s*$")
_EXPR_LINE = re.compile(r"^\s*expr:\s*(.*?)\s*$")


def rule_exprs(path: Path = RULES_FILE) -> dict[str, str]:
    """``{alert name: expr}`` of a rules file, in file order."""
    found: dict[str, str] = {}
    alert = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if m := _ALERT_LINE.match(line):
            alert = m[1]
            assert alert not in found, f"{path.name}:{number}: alert {alert} twice"
        elif (m := _EXPR_LINE.match(line)) and alert is not None:
            expr = m[1]
            assert expr[:1] not in ("|", ">", ""), f"{path.name}:{number}: keep expr on one line"
            if expr[0] == expr[-1] and expr[0] in "'\"":
                expr = expr[1:-1]
            found[alert] = expr
            alert = None
    return found


def dashboard_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows and the panels of collapsed rows included."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_TOKEN = re.compile(
    r"\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?"  # numbers and durations
    r"|[A-Za-z_:][A-Za-z0-9_:]*"
)
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset", "atan2", "inf", "nan"}  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels,
    keywords or numbers). A lexer, not a parser: enough for the expressions
    we ship, and ``promtool``/Prometheus check the syntax itself."""
    bare = _STRING.sub('""', expr)
    bare = _MATCHERS.sub("", bare)
    bare = _RANGE.sub("", bare)
    bare = _GROUPING.sub("", bare)
    names = set()
    for m in _TOKEN.finditer(bare):
        word = m[0]
        if word[0].isdigit() or word.lower() in _KEYWORDS:
            continue
        if bare[m.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        names.add(word)
    return names


def exposed_names(specs: Iterable[Any]) -> set[str]:
    """The series names the exposition writes for ``Spec``s: counters as
    listed (``_total``), histograms as ``_bucket``, ``_count`` and ``_sum``."""
    out: set[str] = set()
    for spec in specs:
        if spec.type == "histogram":
            out.update(spec.name + suffix for suffix in ("_bucket", "_count", "_sum"))
        else:
            out.add(spec.name)
    return out


def live_expr(expr: str) -> str:
    """A dashboard expression as Grafana would send it with every variable
    on "All": ``$__rate_interval`` -> ``1m``, ``$var`` -> ``.*``."""
    expr = expr.replace("$__rate_interval", "1m")
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)


class ConsoleProcess(BrokerProcess):
    """The console (``python -m equeue_spark.console``) as a real process: the
    broker's ready-line protocol, another command; JSON requests with a token."""

    ready_prefix = "equeue console listening on "

    def __init__(self, workdir: Path, *flags: str, reader: str | None = None) -> None:
        super().__init__(workdir, *flags, module="equeue_spark.console")
        self.reader = reader
        """The token GETs send when they name none (a console with users)."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", self.module, "--host", HOST, "--port", "0", *self.flags]

    def get(self, path: str, token: str | None = None) -> tuple[int, Any, dict[str, str]]:
        return self.request("GET", path, token=token or self.reader)

    def request(
        self, method: str, path: str, body: object = None, token: str | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any, dict[str, str]]:  # fmt: skip
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.address + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", content_type)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, raw, headers = response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as exc:
            status, raw, headers = exc.code, exc.read(), dict(exc.headers)
        if headers.get("Content-Type", "").startswith("application/json"):
            return status, json.loads(raw), headers
        return status, raw.decode(errors="replace"), headers

    def round_after(self, round_: int, timeout_s: float = 30.0) -> dict[str, Any]:
        """The cluster reply of the first poll round after ``round_``."""

        def fresh() -> dict[str, Any] | None:
            status, body, _ = self.get("/api/v1/cluster")
            return body if status == 200 and body["round"] > round_ else None

        return wait_for(f"a console round after {round_}", fresh, timeout_s)
