"""Why the broker cannot start, and the exit code that says so.

Every start-up failure ends in one line on stderr and a documented exit code
(docs/operations.md, "Exit codes"), never a traceback:

- 2, usage: a bad flag, a config file that is missing, not TOML, or holds a
  wrong key, type or value (argparse's own code for usage errors), and a
  tokens document that is not valid (``BadConfig``);
- 3, cannot bind: the address is in use (another broker?) or not this host's;
- 1, cannot start: anything else found while starting (the data directory is
  locked or damaged, TLS or token files unreadable).
"""

from __future__ import annotations

import enum
import errno
import socket
from typing import Any


class ExitCode(enum.IntEnum):
    OK = 0
    CANNOT_START = 1
    USAGE = 2
    CANNOT_BIND = 3


class BadConfig(ValueError):
    """A configuration document read at start (the tokens file) holds a bad value."""


class CannotBind(OSError):
    """The gRPC server cannot listen on the configured address."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"cannot listen on {host}:{port}: {reason}")


_HINTS = {
    errno.EADDRINUSE: "another process (another broker?) listens there; "
    "stop it or give another --port",
    errno.EADDRNOTAVAIL: "no network interface of this host has that address; "
    "give --host 127.0.0.1, 0.0.0.0 or one of this host's addresses",
    errno.EACCES: "ports below 1024 need privileges; give a --port of 1024 or above",
}


def check_bindable(host: str, port: int) -> None:
    """``CannotBind`` saying why, as the OS does, if gRPC could not listen on
    ``host:port``. gRPC's own error ("Failed to bind") does not tell an address
    in use from one that is not this host's, and gRPC's C core logs it on
    stderr besides, so the broker checks first: it binds a plain socket the way
    gRPC does (SO_REUSEADDR, no SO_REUSEPORT) to each address the host resolves
    to. Like gRPC, it tolerates addresses of a family this host lacks (a
    "localhost" that includes ::1 without IPv6) as long as one binds, but an
    address in use is always refused: half a broker on it would be a split brain."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        addresses = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        reason = f"cannot resolve {host!r} ({exc.strerror}); give an IP address or a known name"
        raise CannotBind(host, port, reason) from None
    failures = [error for error in map(_bind_error, addresses) if error is not None]
    in_use = [e for e in failures if e.errno == errno.EADDRINUSE]
    if in_use or len(failures) == len(addresses):
        raise CannotBind(host, port, _reason((in_use or failures)[0]))


def _bind_error(address: tuple[Any, ...]) -> OSError | None:
    family, kind, proto, _name, sockaddr = address
    try:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(sockaddr)
    except OSError as exc:
        return exc
    return None


def _reason(error: OSError) -> str:
    reason = error.strerror or str(error)
    hint = _HINTS.get(error.errno or 0)
    return f"{reason}; {hint}" if hint else reason
