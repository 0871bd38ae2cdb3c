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


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """The client's own lines (a write waiting for a group's new master, and
    when it has one) on stderr as ``equeue: ...``, looked up per line so
    redirection works."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.setStream(sys.stderr)
        super().emit(record)


def _client_logs() -> None:
    """Say what the client's routing says (INFO and up), once per process."""
    logger = logging.getLogger("equeue_spark.client.routing")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        logger.addHandler(_Stderr())
        logger.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Run one command; return the exit code (0 ok, 1 failed, 2 usage, 130 interrupted)."""
    _client_logs()
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
