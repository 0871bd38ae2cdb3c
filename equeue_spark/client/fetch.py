"""Range reads over a broker's fetch port: ``PullStream``'s replies without gRPC.

A broker with a fetch port (``--fetch-port``, docs/operations.md) serves the
same ``PullReply`` messages ``PullStream`` streams over a plain TCP
connection (format: ``equeue_proto/fetch.py``), which costs the broker and
this process about a third less CPU per GB (docs/benchmarks.md). ``fetch_replies``
yields the same ``PullReply`` tuples as ``reader.stream_replies``, so a
caller can use either. Connections are kept per address in this process
(``POOL``) and reused for the next range; there is no TLS, so a client that
talks TLS to the broker uses ``PullStream``.

Failures: an ERROR frame raises the exception the same gRPC status would
(``errors.from_rpc_error``); a connection that cannot be made, breaks, times
out or sends a frame that does not parse raises ``FetchUnavailable`` (then
``PullStream`` may take over from the offset reached). A pooled connection
that fails before its first frame (the broker closed it when idle, or
restarted) is retried once on a new connection. With ``broker_id`` given, a
reply from another broker (the port now held by another process) raises
``FetchWrongBroker`` before any of its records is returned.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from equeue_proto import fetch
from equeue_spark.client.errors import BrokerUnavailable, from_rpc_error
from equeue_spark.client.wire import PullReply, parse_pull_reply

MAX_IDLE_PER_ADDRESS = 8
"""Idle connections kept per broker address (a Python worker runs one task at a time)."""
CONNECT_TIMEOUT_S = 2.0
"""A fetch port that does not accept within this is given up (PullStream serves)."""
MAX_RECORD_SLACK = 64 << 20
"""A reply frame may exceed ``batch_bytes`` by this much (its first record may be
bigger than the batch); anything larger is no reply of ours (FetchUnavailable)."""


class FetchUnavailable(BrokerUnavailable):
    """The fetch port could not be reached, or the connection broke or timed out."""


class FetchWrongBroker(FetchUnavailable):
    """The fetch port answered for another broker than the one expected."""


class _Status(grpc.RpcError):
    """An ERROR frame dressed as the failed call ``from_rpc_error`` maps."""

    def __init__(self, code: int, message: str, trailers: tuple[tuple[str, str], ...]) -> None:
        super().__init__(message)
        self._code = next((c for c in grpc.StatusCode if c.value[0] == code), None)
        self._message = message
        self._trailers = trailers

    def code(self) -> grpc.StatusCode:
        return self._code or grpc.StatusCode.UNKNOWN

    def details(self) -> str:
        return self._message

    def trailing_metadata(self) -> Any:
        return self._trailers


class Pool:
    """Open fetch connections by address, reused across ranges (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[socket.socket]] = {}

    def take_idle(self, address: str, timeout_s: float) -> socket.socket | None:
        """An idle connection to ``address``, or None."""
        with self._lock:
            idle = self._idle.get(address)
            if not idle:
                return None
            sock = idle.pop()
        sock.settimeout(timeout_s)
        return sock

    def take(self, address: str, timeout_s: float) -> socket.socket:
        """An idle connection to ``address``, else a new one."""
        return self.take_idle(address, timeout_s) or self.connect(address, timeout_s)

    def connect(self, address: str, timeout_s: float) -> socket.socket:
        """A new connection (a connect taking over ``CONNECT_TIMEOUT_S`` falls back)."""
        host, _, port = address.rpartition(":")
        try:
            sock = socket.create_connection(
                (host.strip("[]"), int(port)), timeout=min(timeout_s, CONNECT_TIMEOUT_S)
            )
            sock.settimeout(timeout_s)
        except (OSError, ValueError) as exc:
            raise FetchUnavailable(f"fetch port {address}: cannot connect: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def give_back(self, address: str, sock: socket.socket) -> None:
        with self._lock:
            idle = self._idle.setdefault(address, [])
            if len(idle) < MAX_IDLE_PER_ADDRESS:
                idle.append(sock)
                return
        sock.close()

    def close(self) -> None:
        with self._lock:
            socks = [s for idle in self._idle.values() for s in idle]
            self._idle.clear()
        for sock in socks:
            sock.close()


POOL = Pool()


def fetch_replies(
    address: str,
    topic: str,
    queue_id: int,
    start: int,
    end: int = 0,
    *,
    token: str = "",
    batch_messages: int = 1000,
    batch_bytes: int = 1 << 20,
    timeout_s: float = 30.0,
    pool: Pool = POOL,
    broker_id: str = "",
) -> Iterator[PullReply]:
    """The replies of ``[start, end)`` (``end`` 0: the queue's end now) from the
    fetch port at ``address``; ``timeout_s`` bounds each wait for the broker.
    The connection goes back to ``pool`` once the range is read."""
    request = fetch.FetchRequest(topic, queue_id, start, end, batch_messages, batch_bytes, token)
    data = fetch.encode_request(request)
    most = max(batch_bytes, 1 << 20) + MAX_RECORD_SLACK  # before allocating a peer's length
    sock = pool.take_idle(address, timeout_s)
    reused = sock is not None
    sock = sock or pool.connect(address, timeout_s)
    reusable = False
    try:
        try:
            _send(sock, address, data)
            first = _frame(sock, address, most)
        except FetchUnavailable:
            if not reused:
                raise
            sock.close()  # an idle connection the broker closed (idle, restart): once more
            sock = pool.connect(address, timeout_s)
            _send(sock, address, data)
            first = _frame(sock, address, most)
        kind, payload = first
        while True:
            if kind == fetch.END:
                reusable = True
                return
            if kind == fetch.ERROR:  # the broker closes the connection after it
                raise from_rpc_error(_Status(*fetch.decode_error(payload))) from None
            yield _reply(address, payload, broker_id)
            kind, payload = _frame(sock, address, most)
    finally:
        if reusable:
            pool.give_back(address, sock)
        else:  # mid-range (the caller stopped, or a failure): not at a frame boundary
            sock.close()


def _reply(address: str, payload: Any, broker_id: str) -> PullReply:
    try:
        reply = parse_pull_reply(payload)
    except Exception as exc:  # a frame that is no PullReply: not a broker's fetch port
        raise FetchUnavailable(f"fetch port {address}: a bad reply: {exc}") from None
    if broker_id and reply.broker_id != broker_id:
        raise FetchWrongBroker(
            f"fetch port {address}: answered by broker {reply.broker_id!r}, not {broker_id!r}"
        )
    return reply


def _send(sock: socket.socket, address: str, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError as exc:
        raise FetchUnavailable(f"fetch port {address}: {exc}") from None


def _frame(sock: socket.socket, address: str, most: int) -> tuple[int, Any]:
    """(kind, payload) of the next frame; the payload in a buffer of its own
    (replies' records stay views of it)."""
    head = _receive(sock, address, fetch.FRAME_HEAD.size)
    try:
        kind, length = fetch.read_frame_head(bytes(head))
    except fetch.FetchFormatError as exc:
        raise FetchUnavailable(f"fetch port {address}: {exc}") from None
    if length > most:
        raise FetchUnavailable(f"fetch port {address}: a frame of {length} bytes")
    return kind, _receive(sock, address, length)


def _receive(sock: socket.socket, address: str, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        try:
            # MSG_WAITALL: one system call for the whole frame in the usual case.
            n = sock.recv_into(view[got:], size - got, socket.MSG_WAITALL)
        except OSError as exc:  # timeouts included
            raise FetchUnavailable(f"fetch port {address}: {exc}") from None
        if n == 0:
            raise FetchUnavailable(f"fetch port {address}: the broker closed the connection")
        got += n
    return buf
