"""Shared by the examples: a broker to talk to, embedded or given on the command line.

``local_broker()`` starts a real ``python -m broker`` process on a free port
with a temporary data directory, waits (bounded) for its ready line, and stops
it with SIGTERM at the end; the data directory is removed. ``example_broker()``
does the same unless the example was run with ``--broker HOST:PORT``, in which
case it uses that broker and leaves it running.
"""

from __future__ import annotations

import argparse
import secrets
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

READY = "equeue broker listening on "
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class BrokerHandle:
    """Where the example's broker is, and whether the example started it."""

    address: str
    embedded: bool

    def name(self, base: str) -> str:
        """A topic or group name for this run.

        On the embedded (fresh) broker it is ``base`` itself. On an existing
        broker a random suffix keeps a rerun from mixing with the last run's data.
        """
        return base if self.embedded else f"{base}-{_RUN_ID}"


_RUN_ID = secrets.token_hex(3)


def start_broker(data_dir: str, *flags: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``python -m broker`` on a free port; return the process and ``host:port``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "equeue_broker", "--data-dir", data_dir, "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while not selector.select(timeout=0.2):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
                raise SystemExit(f"the broker did not start within {START_TIMEOUT_S:.0f} s")
    line = process.stdout.readline()
    if not line.startswith(READY):
        process.kill()
        process.wait(STOP_TIMEOUT_S)
        raise SystemExit(f"unexpected broker output: {line!r}")
    return process, line[len(READY) :].strip()


def stop_broker(process: subprocess.Popen[str]) -> int:
    """SIGTERM (a clean shutdown: flush, persist group offsets); the exit code."""
    process.terminate()
    try:
        code = process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        code = process.wait(STOP_TIMEOUT_S)
    if process.stdout is not None:
        process.stdout.close()
    return code


@contextmanager
def local_broker(*flags: str, quiet: bool = False) -> Iterator[str]:
    """An embedded broker for the duration of the ``with`` block; yields ``host:port``."""
    with tempfile.TemporaryDirectory(prefix="equeue-example-") as data_dir:
        process, address = start_broker(data_dir, *flags)
        if not quiet:
            print(f"started a local broker at {address} (data in {data_dir})")
        try:
            yield address
        finally:
            code = stop_broker(process)
            if not quiet:
                print(f"broker stopped cleanly (exit {code})")


def parse_broker_arg(description: str | None) -> str | None:
    """The example's command line: an optional ``--broker HOST:PORT``."""
    parser = argparse.ArgumentParser(
        description=(description or "").strip().splitlines()[0] if description else None
    )
    parser.add_argument(
        "--broker",
        metavar="HOST:PORT",
        help="use this running broker instead of starting a local one",
    )
    address: str | None = parser.parse_args().broker
    return address


@contextmanager
def example_broker(description: str | None, *flags: str) -> Iterator[BrokerHandle]:
    """The broker named by ``--broker``, or an embedded one (started with ``flags``)."""
    address = parse_broker_arg(description)
    if address:
        print(f"using the broker at {address}; names get the suffix -{_RUN_ID}")
        yield BrokerHandle(address, embedded=False)
        return
    with local_broker(*flags) as started:
        yield BrokerHandle(started, embedded=True)
