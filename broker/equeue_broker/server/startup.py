"""Why the broker cannot start, and the exit code that says so.

Every start-up failure ends in one line on stderr and a documented exit code
(docs/operations.md, "Exit codes"), never a traceback:

- 2, usage: a bad flag, a config file that is missing, not TOML, or holds a
  wrong key, type or value (argparse's own code for usage errors), and a
  tokens document that is not valid (``BadConfig``);
- 3, cannot bind: the address is in use (another broker?) or not this host's;
- 1, cannot start: anything else found while starting (the data directory is
  locked, damaged or not a directory, TLS or token files unreadable).

The line says what is wrong in words and names the setting as the operator
gave it (``--data-dir bad/afile is a file, not a directory``), never Python's
``[Errno 17] File exists: 'bad/afile'``.
"""

from __future__ import annotations

import enum
import errno
import os
import socket
from pathlib import Path
from typing import Any


class ExitCode(enum.IntEnum):
    OK = 0
    CANNOT_START = 1
    USAGE = 2
    CANNOT_BIND = 3


class BadConfig(ValueError):
    """A configuration document read at start (the tokens file) holds a bad value."""


class CannotStart(Exception):
    """The broker cannot start, for a reason already put in words (exit code 1)."""


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


def os_reason(error: OSError) -> str:
    """What the OS said, without Python's ``[Errno N]`` and repr quotes."""
    reason = error.strerror or str(error)
    return f"{reason[:1].lower()}{reason[1:]}"


def given(name: str, value: object) -> str:
    """A setting and its value as the operator gave them: ``--data-dir x``,
    or ``x (data_dir in broker.toml)``."""
    return f"{name} {value}" if name.startswith("--") else f"{value} ({name})"


def unreadable(name: str, path: Path, error: OSError) -> CannotStart:
    """A file a setting names cannot be read: say which and why."""
    hint = {
        errno.ENOENT: f"give {name} an existing file",
        errno.EACCES: "make it readable by the broker's user",
        errno.EISDIR: f"give {name} a file",
    }.get(error.errno or 0)
    return CannotStart(
        f"cannot read {given(name, path)}: {os_reason(error)}" + (f"; {hint}" if hint else "")
    )


def data_dir_problem(path: Path, name: str, error: OSError) -> str:
    """Why the data directory ``path`` (the setting shown as ``name``) cannot
    be opened, in words: a file where a directory should be, no permission,
    a read-only or full file system; otherwise the OS's reason and the file."""
    shown = given(name, path)
    blocker = _file_in_the_way(path)
    if blocker == path:
        return f"{shown} is a file, not a directory; give a directory (created if missing)"
    if blocker is not None:
        return (
            f"{shown} cannot be created: {blocker} is a file, not a directory; give another {name}"
        )
    where = error.filename if error.filename is not None else path
    if error.errno in (errno.EACCES, errno.EPERM):
        return (
            f"{shown}: the broker's user may not write {where}; give a {name} it may"
            " write, or change the directory's owner"
        )
    if error.errno == errno.EROFS:
        return f"{shown}: {where} is on a read-only file system; give a {name} on a writable one"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{shown}: no space left for {where}; free some, or give a {name} on another disk"
    return f"{shown}: {'' if Path(where) == path else f'{where}: '}{os_reason(error)}"


def _file_in_the_way(path: Path) -> Path | None:
    """``path`` or the nearest of its parents that exists, if that is not a directory."""
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return None if candidate.is_dir() else candidate
    return None
