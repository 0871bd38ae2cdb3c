"""``main``: parse the arguments, run the command, and turn its outcome into an
exit code (0 ok, 1 failed, 2 usage, 130 interrupted) with a one-line message
on stderr instead of a traceback."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from equeue_spark.cli.common import PROG, CliError, UsageError
from equeue_spark.cli.formatting import Output
from equeue_spark.cli.parser import build_parser
from equeue_spark.client.errors import EqueueError


class _Stderr(logging.Handler):
    """The client's own lines (a write waiting for a group's new master, and
    when it has one) on stderr as ``equeue: ...``, looked up per line so
    redirection works (never a stream captured once and closed since)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # a closed or broken stderr must not break the client
            self.handleError(record)


_ROUTING_LOG = "equeue_spark.client.routing"


def _client_logs() -> _Stderr:
    """Say what the client's routing says (INFO and up) while a command runs."""
    logger = logging.getLogger(_ROUTING_LOG)
    handler = _Stderr()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return handler


def main(argv: list[str] | None = None) -> int:
    """Run one command; return the exit code (0 ok, 1 failed, 2 usage, 130 interrupted)."""
    handler = _client_logs()
    try:
        return _main(argv)
    finally:
        logging.getLogger(_ROUTING_LOG).removeHandler(handler)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    ui = Output(as_json=args.json)
    try:
        args.handler(args, ui)
    except UsageError as exc:
        leaf: argparse.ArgumentParser = args.leaf
        leaf.print_usage(sys.stderr)
        sys.stderr.write(f"{leaf.prog}: error: {exc}\n")
        return 2
    except (EqueueError, CliError) as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 1
    except BrokenPipeError:  # e.g. `equeue consume T | head`
        _silence_stdout()
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130
    return 0


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # not a real file (e.g. captured in tests)
        pass
