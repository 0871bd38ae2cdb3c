"""Shared by the examples: a broker to talk to, embedded or given on the command line.

``embedded_broker()`` starts a real broker process on a free port with a
temporary data directory (the shipped harness ``equeue_broker.testing``: a
bounded wait for its ready line, SIGTERM at the end); the data directory is
removed. ``example_broker()`` does the same unless the example was run with
``--broker HOST:PORT``, in which case it uses that broker and leaves it running.
"""

from __future__ import annotations

import argparse
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from equeue_broker.testing import local_broker


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


@contextmanager
def embedded_broker(*flags: str) -> Iterator[str]:
    """A broker for the duration of the ``with`` block; yields ``host:port``."""
    with local_broker(*flags) as broker:
        print(f"started a local broker at {broker.address} (data in {broker.data_dir})")
        yield broker.address
    code = broker.process.returncode if broker.process is not None else None
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
    with embedded_broker(*flags) as started:
        yield BrokerHandle(started, embedded=True)
