"""Is the master's process gone? What a replica can tell sooner than ZooKeeper.

A replica's stream to its master breaks the moment the master's process dies:
its kernel closes the process's sockets and resets the connection. Whether the
process is gone or only that connection, a new TCP connection to the master's
address says:

- **refused** (the host answers with a reset: nothing listens on that port):
  no process serves there. The master is dead (or its server closed), and
  waiting for its ZooKeeper session to expire only delays the election;
- **accepted**: a process listens. It may be paused (SIGSTOP, a long GC, an
  overloaded machine): the kernel completes the handshake for a stopped
  process. A pause must not cause an election, so nothing is done: the
  session timeout decides, as before;
- **no answer** (timeout, unreachable host, a name that does not resolve): the
  machine or the network is down, which a replica cannot tell from a
  partition of its own: the session timeout decides.

``MasterWatch`` (one per follower) asks only about a master this replica has
had replies from in the current epoch (an address that never answered proves
nothing), and reports a master as gone once per epoch, after two refused
connections ``CONFIRM_GAP_S`` apart. The election (election.py,
``GroupElection.master_gone``) then removes the dead master's candidate znode,
conditional on the epoch, which starts the election at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable

log = logging.getLogger("equeue.replication")

PROBE_TIMEOUT_S = 1.0
"""A connection not answered this fast says nothing (machine or network down)."""
CONFIRM_GAP_S = 0.1
"""Between the two refused connections that make a master gone."""
STALL_S = 3.0
"""A master answers every replication request within about 1 s (its long poll);
a replica that has had no reply for this long probes it (and says what it found)."""


class Listening(enum.Enum):
    REFUSED = "refused"
    ACCEPTED = "accepted"
    UNKNOWN = "unknown"


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port); ``ValueError`` if malformed."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not HOST:PORT: {address!r}")
    return host.strip("[]"), int(port)


async def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> Listening:
    """Open (and close at once) a TCP connection to ``address``."""
    try:
        host, port = split_address(address)
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except ConnectionRefusedError:
        return Listening.REFUSED
    except (OSError, ValueError, TimeoutError):
        return Listening.UNKNOWN
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return Listening.ACCEPTED


GoneReport = Callable[[str, int], None]
"""``(master address, epoch)``: the master of that epoch refuses connections."""


class MasterWatch:
    """One follower's judgement of its master's liveness (on the event loop)."""

    def __init__(self, on_gone: GoneReport | None, clock: Callable[[], float] = time.monotonic):
        self.on_gone = on_gone
        self.clock = clock
        self.contacted: tuple[str, int] | None = None
        """(master, epoch) of the last reply received."""
        self.reported: tuple[str, int] | None = None
        """(master, epoch) reported gone (once per epoch)."""
        self.stall_said = False
        """The current silence of the master has been probed and logged."""
        self.gone_reports = 0
        """Masters reported gone by this follower (tests and stats)."""

    def contact(self, master: str, epoch: int) -> None:
        """A reply from ``master`` in ``epoch`` arrived."""
        self.contacted = (master, epoch)
        self.stall_said = False

    async def broken(self, master: str, epoch: int) -> bool:
        """The stream to ``master`` ended or failed: report it gone if it refuses
        connections (twice); True if reported."""
        if not self._may_report(master, epoch):
            return False
        if await probe(master) is not Listening.REFUSED:
            return False
        await asyncio.sleep(CONFIRM_GAP_S)
        if await probe(master) is not Listening.REFUSED or not self._may_report(master, epoch):
            return False
        self._report(master, epoch, "its replication stream broke and")
        return True

    async def stalled(self, master: str, epoch: int, silent_s: float) -> None:
        """No reply from ``master`` for ``silent_s``: probe it once per silence."""
        if self.on_gone is None or self.stall_said or self.contacted != (master, epoch):
            return  # (without an election to ask, a silence is the failures' log's)
        self.stall_said = True
        found = await probe(master)
        if found is Listening.REFUSED:
            await self.broken(master, epoch)
        elif found is Listening.ACCEPTED:
            log.warning(
                "master %s has not answered for %.1f s but accepts connections (paused or "
                "overloaded?): no early election; its ZooKeeper session decides",
                master, silent_s,
            )  # fmt: skip
        else:
            log.warning(
                "master %s has not answered for %.1f s and does not answer a connection "
                "(machine or network down?): its ZooKeeper session decides",
                master, silent_s,
            )  # fmt: skip

    def _may_report(self, master: str, epoch: int) -> bool:
        return (
            self.on_gone is not None
            and self.contacted == (master, epoch)
            and self.reported != (master, epoch)
        )

    def _report(self, master: str, epoch: int, how: str) -> None:
        assert self.on_gone is not None
        self.reported = (master, epoch)
        self.gone_reports += 1
        log.warning(
            "MASTER GONE: %s (epoch %d): %s it refuses connections (its process is not "
            "running): asking for an election now, not after its ZooKeeper session",
            master, epoch, how,
        )  # fmt: skip
        self.on_gone(master, epoch)
