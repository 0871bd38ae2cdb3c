"""What every ``equeue`` command shares: the defaults, the two failures a
command may raise (``CliError``, exit 1; ``UsageError``, exit 2), the handler
signature, and the client configuration built from the common options.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from equeue_spark.cli.formatting import Output
from equeue_spark.client.admin import Admin
from equeue_spark.client.connection import (
    NAMESRV_ENV,
    ClientConfig,
    check_address,
    parse_namesrv,
    resolve_address,
)
from equeue_spark.client.errors import InvalidAddress, InvalidRequest

PROG = "equeue"
DEFAULT_TIMEOUT_S = 10.0
"""Deadline of each call to the broker (``--timeout-s``); with ``--namesrv`` also
how long a write waits for a broker group's new master."""
DEFAULT_RETRIES = 2
"""Extra attempts on UNAVAILABLE / DEADLINE_EXCEEDED: few, so a dead broker fails fast."""
DEFAULT_BATCH = 1000
"""Messages per produce request (``--batch-size``)."""
DEFAULT_CONSUME_TIMEOUT_S = 10.0
"""``consume --max N`` without ``--timeout`` stops after this long without a message."""

Handler = Callable[[argparse.Namespace, Output], None]
"""A command: its parsed arguments, and where to write."""


class CliError(Exception):
    """A failure to report as ``equeue: <message>`` with exit code 1."""


class UsageError(Exception):
    """Arguments argparse accepted but that do not go together (exit code 2)."""


def client_config(args: argparse.Namespace) -> ClientConfig:
    """The client configuration the common options (and their defaults) describe."""
    token = None  # None: the client falls back to $EQUEUE_TOKEN
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file: {exc.strerror}") from None
    namesrv = namesrv_addresses(args)
    timeout_s = args.timeout_s or DEFAULT_TIMEOUT_S
    config = ClientConfig(
        broker="" if namesrv else broker_address(args),
        namesrv=namesrv,
        timeout_s=timeout_s,
        # A write to a group without a reachable master waits for a new one no
        # longer than a call may take: the library's 30 s failover wait would
        # outlast --timeout-s.
        failover_timeout_s=timeout_s,
        retries=DEFAULT_RETRIES if args.retries is None else args.retries,
        token=token,
        tls=True if args.tls else None,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )
    try:
        config.credentials()  # unreadable TLS files: a usage error, not a traceback
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return config


def namesrv_addresses(args: argparse.Namespace) -> tuple[str, ...]:
    """``--namesrv``, else (without ``--broker``) ``$EQUEUE_NAMESRV``; () for one broker."""
    if args.namesrv and args.broker:
        raise UsageError("give --broker or --namesrv, not both")
    if args.namesrv:
        value, source = args.namesrv, "--namesrv"
    elif not args.broker and os.environ.get(NAMESRV_ENV, "").strip():
        value, source = os.environ[NAMESRV_ENV], f"${NAMESRV_ENV}"
    else:
        return ()
    try:
        return parse_namesrv(value, source)
    except InvalidAddress as exc:
        raise UsageError(str(exc)) from None


def split_names(text: str | None) -> list[str] | None:
    """``a,b`` -> ["a", "b"]; None or empty: None."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    return names or None


def broker_address(args: argparse.Namespace) -> str:
    """``--broker``, else ``$EQUEUE_BROKER``, else the default: checked at
    once, a bad one a usage error naming where it came from."""
    address, source = (args.broker, "--broker") if args.broker else resolve_address()
    try:
        return check_address(address, source)
    except InvalidAddress as exc:
        raise UsageError(str(exc)) from None


def admin_client(args: argparse.Namespace, per_broker: str = "", cluster_view: str = "") -> Admin:
    """An ``Admin`` configured by the common options; ``per_broker`` names a
    command that shows one broker (a usage error with ``--namesrv``),
    ``cluster_view`` one that shows what name servers know (a usage error
    without them). The routes decide; this only words their refusal."""
    admin = Admin(config=client_config(args))
    try:  # the routes name one broker for it, or refuse (name servers)
        if per_broker:
            admin.routes.only_address(per_broker)
        if cluster_view:
            admin.routes.cluster_view(cluster_view)
    except InvalidRequest:
        admin.close()
        if cluster_view:
            raise UsageError("give the cluster's name servers: --namesrv HOST:PORT[,...]") from None
        raise UsageError(
            f"{per_broker} shows one broker: give --broker HOST:PORT instead of --namesrv "
            "(equeue cluster list shows the brokers' addresses)"
        ) from None
    return admin
