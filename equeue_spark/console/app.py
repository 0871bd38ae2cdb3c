"""``equeue-console`` (``python -m equeue_spark.console``): flags, startup,
the ready line, shutdown (docs/console.md).

It prints one line on stdout once it serves, ``equeue console listening on
http://HOST:PORT`` (the port chosen when ``--port 0``), and logs to stderr.
SIGTERM and SIGINT stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import math
import os
import signal
import ssl
import sys
from collections.abc import Sequence

from aiohttp import web

from equeue_spark.cli.arguments import duration_s, positive_int
from equeue_spark.cli.common import UsageError, client_config
from equeue_spark.console.access import Tokens, TokensError
from equeue_spark.console.alarms import rules as alarm_rules
from equeue_spark.console.alarms.rules import RuleError
from equeue_spark.console.alarms.service import Alarms
from equeue_spark.console.history import History, SeriesKey
from equeue_spark.console.poller import Poller
from equeue_spark.console.prom import Prometheus
from equeue_spark.console.snapshot import Snapshot
from equeue_spark.console.web import ALARMS, PROMETHEUS, Console, make_app

PROG = "equeue-console"
READY_PREFIX = "equeue console listening on "
MAX_HISTORY_S = 24 * 3600.0
POLL_TIMEOUT_S = 3.0
"""Deadline of each of the poller's calls (no retries): a dead broker costs
one deadline per round, not the CLI's retry schedule."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="equeue's web console (docs/console.md)")
    cluster = p.add_argument_group("the cluster (as the equeue CLI)")
    cluster.add_argument(
        "--broker",
        metavar="HOST:PORT",
        help="one broker (default: $EQUEUE_BROKER, else 127.0.0.1:5000)",
    )
    cluster.add_argument(
        "--namesrv",
        metavar="HOST:PORT[,...]",
        help="a cluster's name servers (default: $EQUEUE_NAMESRV)",
    )
    cluster.add_argument(
        "--token-file",
        metavar="PATH",
        help="the poller's token (a monitor token suffices; default $EQUEUE_TOKEN)",
    )
    cluster.add_argument("--tls", action="store_true", help="connect with TLS (system CAs)")
    for flag, env, what in (
        ("--tls-ca", "EQUEUE_TLS_CA", "PEM CA that signed the brokers' certificates"),
        ("--tls-cert", "EQUEUE_TLS_CERT", "PEM client certificate, for mutual TLS"),
        ("--tls-key", "EQUEUE_TLS_KEY", "PEM key of --tls-cert"),
    ):
        cluster.add_argument(flag, metavar="PATH", help=f"{what} (default: ${env})")
    cluster.add_argument(
        "--timeout-s",
        type=float,
        default=POLL_TIMEOUT_S,
        metavar="S",
        help=f"deadline of each call (default {POLL_TIMEOUT_S:g})",
    )
    http = p.add_argument_group("the console's listener")
    http.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    http.add_argument(
        "--port",
        type=int,
        default=8080,
        help="port (default 8080; 0 = any free port, printed on the ready line)",
    )
    http.add_argument(
        "--tokens-file",
        metavar="PATH",
        help="who may use the console (the brokers' token format); without it "
        "the console is read-only",
    )
    http.add_argument(
        "--http-tls-cert", metavar="PATH", help="PEM certificate (chain): serve HTTPS"
    )
    http.add_argument("--http-tls-key", metavar="PATH", help="PEM key of --http-tls-cert")
    poll = p.add_argument_group("polling and history")
    poll.add_argument(
        "--interval",
        type=duration_s,
        default=5.0,
        metavar="DURATION",
        help="poll period (default 5s)",
    )
    poll.add_argument(
        "--history",
        type=duration_s,
        default=3600.0,
        metavar="DURATION",
        help="how long plots reach back (default 1h, at most 24h)",
    )
    poll.add_argument(
        "--max-groups",
        type=positive_int,
        default=1000,
        help="consumer groups polled (default 1000)",
    )
    poll.add_argument(
        "--max-series", type=positive_int, default=2000, help="plotted series kept (default 2000)"
    )
    prom = p.add_argument_group("plots from Prometheus")
    prom.add_argument(
        "--prometheus",
        metavar="URL",
        help="read topic rates and group lag plots from this Prometheus "
        "(else, and when it fails, from the console's memory)",
    )
    prom.add_argument("--prometheus-token-file", metavar="PATH", help="bearer token for it")
    prom.add_argument("--prometheus-ca", metavar="PATH", help="PEM CA of its certificate")
    prom.add_argument(
        "--prometheus-step",
        type=duration_s,
        default=15.0,
        metavar="DURATION",
        help="smallest step between plotted points (default 15s: a usual scrape interval)",
    )
    alarm_rules.add_arguments(p)
    p.add_argument(
        "--check-alarms",
        metavar="FILE",
        help="read an alarm rule file, print its rules and exit (2 if it is bad)",
    )
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.check_alarms:
        return check_alarms(args.check_alarms)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(serve(args))
    except (UsageError, TokensError, RuleError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def check_alarms(path: str) -> int:
    """``--check-alarms FILE``: the rules as the console would run them."""
    try:
        config = alarm_rules.load_file(path)
    except RuleError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    for rule in config.rules:
        notify = ", ".join(n.name for n in config.notifiers_for(rule)) or "no notifier"
        print(f"rule {rule.describe()}; notify {notify}")
    for notifier in config.notifiers:
        print(f"notifier {notifier.name} ({notifier.type})")
    return 0


def check(args: argparse.Namespace) -> None:
    if args.interval <= 0:
        raise UsageError("--interval must be more than 0")
    if not 0 < args.history <= MAX_HISTORY_S:
        raise UsageError("--history must be more than 0 and at most 24h")
    if args.history < 2 * args.interval:
        raise UsageError("--history must cover at least two --interval rounds")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a port (0 to 65535)")


async def serve(args: argparse.Namespace) -> int:
    check(args)
    alarm_config = alarm_rules.from_args(args)  # a bad rule stops the start (exit 2)
    args.retries = 0
    args.json = False
    config = dataclasses.replace(client_config(args), retries=0)
    tokens = Tokens.load(args.tokens_file) if args.tokens_file else None
    capacity = max(2, math.ceil(args.history / args.interval))
    console = Console(config, History(capacity, args.max_series), args.interval, tokens)
    console.loop = asyncio.get_running_loop()
    alarms = Alarms(alarm_config, "") if alarm_config.rules else None
    loop = console.loop

    def publish(snapshot: Snapshot, points: dict[SeriesKey, float]) -> None:
        """From the poller thread: the round to the pages, then to the alarms
        (both queued on the loop in this order)."""
        console.publish(snapshot, points)
        if alarms is not None and not loop.is_closed():
            loop.call_soon_threadsafe(alarms.feed, snapshot)

    poller = Poller(
        config,
        publish,
        interval_s=args.interval,
        max_groups=args.max_groups,
        probe_timeout_s=min(2.0, args.timeout_s),
    )
    ssl_context = server_tls(args)
    console.poll_overruns = lambda: poller.overruns
    app = make_app(console)
    if alarms is not None:
        app[ALARMS] = alarms
    prometheus = prometheus_client(args)
    if prometheus is not None:
        app[PROMETHEUS] = prometheus
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, args.host, args.port, ssl_context=ssl_context)
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    host, port = _bound(site)
    scheme = "https" if ssl_context else "http"
    if alarms is not None:
        start_alarms(alarms, f"{scheme}://{host}:{port}")
    poller.start()
    stopped = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        console.loop.add_signal_handler(signum, stopped.set)
    print(f"{READY_PREFIX}{scheme}://{host}:{port}", flush=True)
    logging.getLogger("equeue.console").info(
        "console listening on %s:%s, polling %s every %gs",
        host,
        port,
        ",".join(config.namesrv) or config.target,
        args.interval,
    )
    try:
        await stopped.wait()
    finally:
        await runner.cleanup()
        await asyncio.get_running_loop().run_in_executor(None, poller.stop)
        if alarms is not None:
            await alarms.stop()
        if prometheus is not None:
            await prometheus.close()
        console.close()
    return 0


def prometheus_client(args: argparse.Namespace) -> Prometheus | None:
    if not args.prometheus:
        return None
    if not args.prometheus.startswith(("http://", "https://")):
        raise UsageError(f"--prometheus {args.prometheus!r}: give an http:// or https:// URL")
    if args.prometheus_step <= 0:
        raise UsageError("--prometheus-step must be more than 0")
    token = None
    if args.prometheus_token_file:
        try:
            with open(args.prometheus_token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise UsageError(
                f"cannot read --prometheus-token-file {args.prometheus_token_file}: {exc.strerror}"
            ) from None
    if args.prometheus_ca and not os.path.isfile(args.prometheus_ca):
        raise UsageError(f"--prometheus-ca {args.prometheus_ca}: no such file")
    return Prometheus(
        args.prometheus,
        token=token,
        ca_file=args.prometheus_ca,
        min_step_s=args.prometheus_step,
    )


def start_alarms(alarms: Alarms, external_url: str) -> None:
    """The alarms' sender task; links in notifications point at ``external_url``."""
    alarms.dispatcher.external_url = external_url
    alarms.start()
    config = alarms.config
    log = logging.getLogger("equeue.console")
    if not config.notifiers:
        log.warning("alarm rules without a notifier: alarms show on /alarms and /metrics only")
    log.info(
        "alarms: %d rules, notifiers %s",
        len(config.rules),
        ", ".join(n.name for n in config.notifiers) or "none",
    )


def server_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The listener's TLS context (``--http-tls-cert`` and ``--http-tls-key``), or None."""
    if not args.http_tls_cert and not args.http_tls_key:
        return None
    if not (args.http_tls_cert and args.http_tls_key):
        raise UsageError("give --http-tls-cert and --http-tls-key together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(args.http_tls_cert, args.http_tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot load --http-tls-cert/--http-tls-key: {exc}") from None
    return context


def _bound(site: web.TCPSite) -> tuple[str, int]:
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    if not sockets:
        raise RuntimeError("the console's listener has no socket")
    host, port = sockets[0].getsockname()[:2]
    return str(host), int(port)
