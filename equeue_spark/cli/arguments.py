"""The argparse building blocks of the ``equeue`` parsers: value types (which
raise ``ArgumentTypeError``, so bad values are usage errors, exit 2), the
common options every command takes, and ``Commands``, which adds subcommands
that all take those options."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TypeAlias

from equeue_spark.cli.common import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, Handler
from equeue_spark.client.delays import parse_duration_s, parse_time_ms

# A string: argparse's _SubParsersAction cannot be subscripted at run time.
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be positive, got 0")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def duration_s(text: str) -> float:
    """``30s``, ``500ms``, ``1.5m``, ``2h``, ``7d`` or seconds (``--delay``)."""
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def iso_time_ms(text: str) -> int:
    """An ISO 8601 time as ms since the epoch (``--deliver-at``)."""
    try:
        return parse_time_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def on_off(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("on", "true", "yes", "1"):
        return True
    if lowered in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


def queue_offset(text: str) -> tuple[int, int]:
    queue, sep, offset = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected QUEUE=OFFSET, got {text!r}")
    return non_negative_int(queue), non_negative_int(offset)


def add_common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every command takes. On the subcommands they default to
    SUPPRESS, so a value given before the command is not overwritten."""

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "--broker",
        metavar="HOST:PORT",
        default=default(None),
        help="broker address (default: $EQUEUE_BROKER, else 127.0.0.1:5000)",
    )
    parser.add_argument(
        "--namesrv",
        metavar="HOST:PORT[,...]",
        default=default(None),
        help="a cluster's name servers, instead of one --broker (default: $EQUEUE_NAMESRV)",
    )
    parser.add_argument(
        "--timeout-s",
        type=positive_float,
        metavar="S",
        default=default(None),
        help=f"deadline of each call to the broker, seconds, and with --namesrv how long a "
        f"write waits for a group's new master (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--retries",
        type=non_negative_int,
        metavar="N",
        default=default(None),
        help=f"extra attempts when the broker is unavailable (default {DEFAULT_RETRIES})",
    )
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        default=default(None),
        help="file holding the access token (default: $EQUEUE_TOKEN; never on the command line)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        default=default(False),
        help="connect with TLS, trusting the system's CAs (implied by --tls-ca)",
    )
    for flag, env, what in (
        ("--tls-ca", "EQUEUE_TLS_CA", "PEM CA that signed the broker's certificate"),
        ("--tls-cert", "EQUEUE_TLS_CERT", "PEM client certificate, for mutual TLS"),
        ("--tls-key", "EQUEUE_TLS_KEY", "PEM key of --tls-cert"),
    ):
        parser.add_argument(
            flag, metavar="PATH", default=default(None), help=f"{what} (default: ${env})"
        )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="machine-readable output: one JSON document (JSON lines for consume)",
    )


@dataclass(frozen=True)
class Commands:
    """One level of subcommands (``equeue COMMAND`` or ``equeue GROUP ACTION``).

    Every command added takes the common options (from ``common``, a parent
    parser made by ``add_common(..., top=False)``) and records its handler and
    its own parser, which ``main`` uses to report usage errors.
    """

    subparsers: SubParsers
    common: argparse.ArgumentParser

    def command(
        self, name: str, help_: str, handler: Handler, description: str | None = None
    ) -> argparse.ArgumentParser:
        """A command that runs ``handler``; add its own arguments to the parser returned."""
        sub = self.subparsers.add_parser(
            name,
            help=help_,
            description=description or help_,
            parents=[self.common],
            allow_abbrev=False,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(handler=handler, leaf=sub)
        return sub

    def group(self, name: str, help_: str) -> Commands:
        """A command group (``equeue NAME ACTION``); its actions are added to the result."""
        sub = self.subparsers.add_parser(name, help=help_, description=help_, allow_abbrev=False)
        actions = sub.add_subparsers(dest="action", metavar="ACTION", required=True)
        return Commands(actions, self.common)
