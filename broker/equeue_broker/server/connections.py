"""Connections: how many, from whom, how many calls each (issue 25).

gRPC's C-core bounds connections with one global count
(``grpc.max_allowed_incoming_connections``) that includes connections still
in their handshake, closes those that do not finish it in time
(``grpc.server_handshake_timeout_ms``), and resets HTTP/2 streams over its
``grpc.max_concurrent_streams`` with RST_STREAM (ENHANCE_YOUR_CALM), which a
client sees as UNAVAILABLE. It has no per-address limit, no separate budget
for connections in handshake, and no way for Python to take over an accepted
socket. So this module adds, around it and without touching the bytes:

- ``auto_max_connections``: the default connection limit, from the
  open-files limit instead of a fixed 1,024;
- ``defer_silent_connections``: ``TCP_DEFER_ACCEPT`` on gRPC's listening
  socket, so a connection that sends nothing stays in the kernel (no
  descriptor, no connection slot) until it speaks or the deferral runs out;
  every gRPC client, plaintext or TLS, speaks first;
- ``CallsPerConnection``: the per-connection call limit enforced by the
  broker (RESOURCE_EXHAUSTED naming ``max_streams_per_connection``), with
  HTTP/2's own limit set higher as a backstop (app.py);
- ``AddressLimit``: ``max_connections_per_address``, enforced after the
  fact: about once a second the broker counts its established connections
  per client address (``/proc/net/tcp``) and shuts down the newest over the
  limit (gRPC then closes them as if the client had).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from equeue_broker.server.errors import abort
from equeue_broker.server.handlers import MethodHandler, rebuild, replies
from equeue_broker.storage.errors import LimitExceeded

log = logging.getLogger("equeue.broker")

MIN_AUTO_CONNECTIONS = 64
MAX_AUTO_CONNECTIONS = 16_384
"""The automatic connection limit's bounds: an idle connection costs gRPC some
tens of KiB, so even a huge open-files limit should not admit millions."""
DESCRIPTORS_KEPT = 1_024
"""Descriptors the automatic limit leaves to everything but connections and
index files: log chunks, the data directory, name-server and replication links."""
STREAMS_BACKSTOP = 4
"""HTTP/2's ``max_concurrent_streams`` is this times ``max_streams_per_connection``:
a client within HTTP/2's limit gets the broker's RESOURCE_EXHAUSTED, and only one
ignoring the server's SETTINGS has streams reset."""


def auto_max_connections(open_files: int, max_open_index_files: int) -> int:
    """The connection limit for ``max_connections = 0``: the open-files limit less
    the index files and ``DESCRIPTORS_KEPT``, within the ``*_AUTO_CONNECTIONS`` bounds."""
    spare = open_files - max_open_index_files - DESCRIPTORS_KEPT
    return max(MIN_AUTO_CONNECTIONS, min(MAX_AUTO_CONNECTIONS, spare))


def _listening_sockets(port: int) -> list[int]:
    """This process's TCP sockets listening on ``port`` (gRPC's, found by scanning
    the descriptor table once at start: gRPC does not hand them out)."""
    found = []
    for entry in Path("/proc/self/fd").iterdir():
        try:
            if not os.readlink(entry).startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(entry.name)))
        except (OSError, ValueError):
            continue
        with sock:
            try:
                if (
                    sock.family in (socket.AF_INET, socket.AF_INET6)
                    and sock.type == socket.SOCK_STREAM
                    and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                    and sock.getsockname()[1] == port
                ):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def defer_silent_connections(port: int, seconds: int) -> int:
    """``TCP_DEFER_ACCEPT`` for ``seconds`` on the listening sockets of ``port``;
    how many were set (0 where the platform lacks it: nothing else changes)."""
    option = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if option is None or not Path("/proc/self/fd").is_dir():
        return 0
    count = 0
    for fd in _listening_sockets(port):
        with socket.socket(fileno=os.dup(fd)) as sock:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, option, max(1, seconds))
                count += 1
            except OSError as exc:
                log.warning("cannot defer silent connections on port %d: %s", port, exc)
    return count


class CallsPerConnection:
    """At most ``limit`` calls in flight per connection (the peer's address and
    port, which gRPC names per connection); more are refused with
    RESOURCE_EXHAUSTED before their request is received. Applied by the
    outermost interceptor, the intake gate (intake.py), before anything else:
    a refused call takes no other budget. One wrapper for both saves a layer
    per call and per streamed reply (issue 31)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.live: dict[str, int] = {}
        """Calls in flight by ``context.peer()``; a peer with none is absent."""

    def enter(self, context: Any) -> str:
        """Count a call in (``LimitExceeded`` over the limit); its peer, for ``leave``."""
        peer: str = context.peer()
        live = self.live.get(peer, 0)
        if live >= self.limit:
            raise LimitExceeded(
                f"max_streams_per_connection: {live} calls are in flight on this connection"
                f" ({self.limit} allowed); wait for some to finish or open another connection"
            )
        self.live[peer] = live + 1
        return peer

    def leave(self, peer: str) -> None:
        live = self.live[peer] - 1
        if live:
            self.live[peer] = live
        else:
            del self.live[peer]

    def counted(self, handler: MethodHandler) -> MethodHandler:
        """``handler`` counted in while it runs (the gate's request-streaming calls)."""
        inner = (
            handler.unary_unary or handler.unary_stream
            or handler.stream_unary or handler.stream_stream
        )  # fmt: skip
        if handler.response_streaming:

            async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
                try:
                    peer = self.enter(context)
                except LimitExceeded as exc:
                    await abort(context, exc)
                try:
                    async for reply in replies(inner, request, context):
                        yield reply
                finally:
                    self.leave(peer)

            return rebuild(handler, None, streaming)

        async def unary(request: Any, context: Any) -> Any:
            try:
                peer = self.enter(context)
            except LimitExceeded as exc:
                await abort(context, exc)
            try:
                return await inner(request, context)
            finally:
                self.leave(peer)

        return rebuild(handler, unary, None)


ESTABLISHED = "01"


def _address(hex_address: str) -> str:
    """An address of /proc/net/tcp{,6} (host-order 32-bit words in hex) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return socket.inet_ntop(socket.AF_INET, words)
    if words[:12] == b"\0" * 10 + b"\xff\xff":  # an IPv4 client of a dual-stack socket
        return socket.inet_ntop(socket.AF_INET, words[12:])
    return socket.inet_ntop(socket.AF_INET6, words)


def connections_by_address(
    port: int, tables: tuple[str, ...] = ("tcp", "tcp6")
) -> dict[str, list[int]]:
    """Established connections to local ``port``: client address -> socket inodes."""
    found: dict[str, list[int]] = {}
    for table in tables:
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != ESTABLISHED:
                continue
            local, remote, inode = fields[1], fields[2], int(fields[9])
            if inode == 0 or int(local.rpartition(":")[2], 16) != port:
                continue
            found.setdefault(_address(remote.rpartition(":")[0]), []).append(inode)
    return found


def _shutdown_inodes(inodes: set[int]) -> int:
    """Shut down this process's sockets with these inodes (gRPC's descriptors
    stay gRPC's: a duplicate is shut down, which ends the connection, and closed);
    how many were found."""
    done = 0
    for entry in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if not target.startswith("socket:[") or int(target[8:-1]) not in inodes:
            continue
        try:
            duplicate = os.dup(int(entry.name))
        except OSError:
            continue
        try:
            if os.fstat(duplicate).st_ino in inodes:  # still that socket, not a reused fd
                with socket.socket(fileno=os.dup(duplicate)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
                done += 1
        except OSError:
            pass
        finally:
            os.close(duplicate)
    return done


def close_connection(peer: str) -> bool:
    """Shut down this process's connection from ``peer`` (gRPC's
    ``context.peer()``: ``ipv4:10.0.0.1:5123``, ``ipv6:[::1]:5123``); whether
    it was found. The only way to free what gRPC buffers for a call the
    client does not read: gRPC's Python server cannot cancel a call."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return False
    host, _, client_port = rest.rpartition(":")
    host = host.strip("[]")
    with contextlib.suppress(OSError, ValueError):
        host = socket.inet_ntop(  # normalised as connections_by_address shows it
            socket.AF_INET6 if ":" in host else socket.AF_INET,
            socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host),
        )
    inodes = set(_connections(host, int(client_port)))
    return bool(inodes) and _shutdown_inodes(inodes) > 0


def _connections(host: str, client_port: int) -> list[int]:
    """Inodes of established sockets whose remote end is ``host:client_port``
    (``_shutdown_inodes`` then acts only on those this process holds)."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != ESTABLISHED:
                continue
            address, _, remote_port = fields[2].rpartition(":")
            if int(remote_port, 16) == client_port and _address(address) == host:
                found.append(int(fields[9]))
    return found


class AddressLimit:
    """``max_connections_per_address``: every ``interval_s``, the newest
    connections of an address over ``limit`` are shut down (module doc)."""

    def __init__(self, port: int, limit: int, interval_s: float = 1.0) -> None:
        self.port = port
        self.limit = limit
        self.interval_s = interval_s
        self.closed = 0
        """Connections shut down so far."""
        self._task: asyncio.Task[None] | None = None

    def check(self) -> int:
        """One pass; how many connections it shut down."""
        over: set[int] = set()
        for address, inodes in connections_by_address(self.port).items():
            if len(inodes) > self.limit:
                newest = sorted(inodes)[self.limit :]  # inode numbers grow with creation
                over.update(newest)
                log.warning(
                    "%d connections from %s; closing the %d newest (max_connections_per_address"
                    " %d)", len(inodes), address, len(newest), self.limit,
                    extra={"client_address": address},
                )  # fmt: skip
        closed = _shutdown_inodes(over) if over else 0
        self.closed += closed
        return closed

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await asyncio.to_thread(self.check)  # /proc/net/tcp may be long
            except Exception:  # a failed pass must not end the limit
                log.exception("checking connections per address failed")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
