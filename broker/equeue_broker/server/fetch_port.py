"""The fetch port: ``PullStream``'s range reads over a plain TCP connection.

A Spark read task moves gigabytes of records; over gRPC each megabyte is
copied into HTTP/2 frames and slices on both sides, which costs the broker
and the task about as much CPU as decoding the records (docs/benchmarks.md,
issue 29's read). Here a reply is the same pre-encoded ``PullReply`` bytes
``PullStream`` yields (one copy out of the log), written to the socket with a
5-byte frame head: nothing else. The format is ``equeue_proto/fetch.py``'s.

Same rules as ``PullStream``: the streams' half of ``max_reply_bytes`` bounds
the replies being sent, ``stream_send_timeout_ms`` ends a connection whose
client does not take a whole reply in that time, and with tokens the request's token needs the
``consume`` role for the topic (checked before anything is read). Limits of
its own: ``max_connections`` connections at once (more get one ERROR frame
and are closed), ``handshake_timeout_ms`` for the first request's head,
``max_connection_idle_ms`` between requests, ``request_read_timeout_ms`` for a
request's bytes, and at most ``file_runs.MAX_FILE_RUNS`` descriptors per reply.
A failure part way through a reply closes the connection (no ERROR frame
inside a frame). No TLS: a broker serving
TLS starts it only with ``fetch_insecure`` (``config.fetch_port_wanted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import select
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc

from equeue_broker.server.budgets import Held
from equeue_broker.server.config import BrokerConfig
from equeue_broker.server.errors import (
    BadRequest,
    PermissionDenied,
    Unauthenticated,
    status_for,
    trailers_for,
)
from equeue_broker.server.service_base import BrokerState
from equeue_broker.server.wire import pull_reply_framer
from equeue_broker.storage import ReadStatus, RecordsResult
from equeue_broker.storage.errors import LimitExceeded
from equeue_broker.storage.file_runs import FileRun, close_runs
from equeue_proto import fetch
from equeue_proto.v1 import broker_pb2 as pb

log = logging.getLogger("equeue.broker.fetch")

DEFAULT_MESSAGES = 1000
DEFAULT_BYTES = 1 << 20
_STATUS = {
    ReadStatus.OK: pb.PULL_STATUS_OK,
    ReadStatus.OFFSET_TOO_SMALL: pb.PULL_STATUS_OFFSET_TOO_SMALL,
    ReadStatus.OFFSET_TOO_BIG: pb.PULL_STATUS_OFFSET_TOO_BIG,
}


class FetchServer:
    """The listener and its connections (``start_fetch_server`` builds one)."""

    def __init__(self, state: BrokerState, limit: int) -> None:
        self.state = state
        self.limit = limit
        pull_framer = pull_reply_framer(state.broker_id, _STATUS)

        def framer(result: RecordsResult) -> tuple[bytes, bytes]:
            # The frame head goes in front of the PullReply's own prefix, so the
            # one copy out of the log builds the whole frame: one write, no join.
            prefix, suffix = pull_framer(result)
            size = len(prefix) + result.nbytes + len(suffix)
            return fetch.frame_head(fetch.REPLY, size) + prefix, suffix

        self.framer = framer
        self.open = 0
        self.listener: socket.socket | None = None
        self.port = 0
        self._accepting: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.senders = ThreadPoolExecutor(
            max(1, min(limit, state.config.store_threads)), thread_name_prefix="equeue-fetch"
        )

    # Raw non-blocking sockets and the loop's sock_* calls, not asyncio streams: a
    # stream transport copies what the kernel does not take at once into its own
    # buffer; sock_sendall sends the rest from the reply itself.

    async def start(self, host: str, port: int) -> int:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(128)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self.listener = listener
        self.port = int(listener.getsockname()[1])
        self._accepting = asyncio.create_task(self._accept(listener), name="equeue-fetch-accept")
        return self.port

    async def stop(self) -> None:
        tasks = [t for t in (self._accepting, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if self.listener is not None:
            self.listener.close()
        self.senders.shutdown(wait=False, cancel_futures=True)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        pause, logged = 0.1, 0.0
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors, say: a later accept may work
                if time.monotonic() - logged >= 60:  # no log flood while it lasts
                    log.warning("fetch port: accept failed: %s (retrying)", exc)
                    logged = time.monotonic()
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
                continue
            pause = 0.1
            conn.setblocking(False)
            # END frames are small: no waiting for the client's delayed ACK.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = asyncio.create_task(self._connection(conn), name="equeue-fetch")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connection(self, conn: socket.socket) -> None:
        self.open += 1
        try:
            if self.open > self.limit:
                raise LimitExceeded(f"{self.open - 1} fetch connections are open (max_connections)")
            await self._serve(conn)
        except (ConnectionError, EOFError, TimeoutError):
            pass  # the client went away, or stayed silent too long: nothing to tell it
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # every error becomes an ERROR frame, as a status in gRPC
            code, message = status_for(exc)
            frame = fetch.encode_error(grpc_code(code), message, trailers_for(exc))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(conn, frame), 1)
        finally:
            self.open -= 1
            conn.close()

    async def _serve(self, conn: socket.socket) -> None:
        config = self.state.config
        idle_s = config.max_connection_idle_ms / 1000
        read_s = config.request_read_timeout_ms / 1000
        # A connection that says nothing is closed after the handshake timeout
        # (as gRPC's): silent ones must not keep the slots of max_connections.
        wait_s = config.handshake_timeout_ms / 1000
        while True:
            # Once a request starts, all of it within the request read timeout
            # (a client dribbling its head must not hold a slot for the idle one).
            head = await _receive(conn, 1, wait_s)
            head += await _receive(conn, fetch.REQUEST_HEAD.size - 1, read_s)
            wait_s = idle_s
            try:
                length = fetch.request_length(head)
                body = await _receive(conn, length, read_s)
                request = fetch.decode_request(body)
            except fetch.FetchFormatError as exc:
                raise BadRequest(f"fetch port: {exc}") from None
            self._authorize(request)
            await self._send_range(request, conn)
            await self._send(conn, fetch.frame_head(fetch.END, 0), request)

    def _authorize(self, request: fetch.FetchRequest) -> None:
        tokens = self.state.tokens
        if tokens is None:
            return
        principal = tokens.lookup(request.token) if request.token else None
        if principal is None:
            raise Unauthenticated("fetch port: missing or unknown token")
        if not principal.may("consume"):
            raise PermissionDenied(f"token {principal.name!r} lacks role 'consume' for fetch")
        principal.check_topic(request.topic)

    async def _send(
        self, conn: socket.socket, data: bytes | memoryview, request: fetch.FetchRequest
    ) -> None:
        timeout_s = self.state.config.stream_send_timeout_ms / 1000
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.sock_sendall(conn, data), timeout_s)
        except TimeoutError:
            log.warning("fetch port: %s/%d: the client took no data for %.0f s; closing",
                        request.topic, request.queue_id, timeout_s)  # fmt: skip
            raise

    async def _send_range(self, request: fetch.FetchRequest, conn: socket.socket) -> None:
        """PullStream's loop (service_data._stream_replies) without filters."""
        state = self.state
        store = state.store
        budget = state.stream_reply_bytes
        most = store.config.max_read_messages  # the storage's own limit, named as such
        if not 0 <= request.batch_messages <= most:
            raise BadRequest(
                f"fetch port: batch_messages {request.batch_messages} is not in [0, {most}] "
                "(max_read_messages)"
            )
        if request.end_offset < 0:
            raise BadRequest(f"fetch port: end_offset {request.end_offset} is negative")
        batch = request.batch_messages or DEFAULT_MESSAGES
        share = max(DEFAULT_BYTES, budget.limit // 8)
        batch_bytes = min(request.batch_bytes or DEFAULT_BYTES, share)
        topic, queue_id = request.topic, request.queue_id
        read = functools.partial(
            store.reads.file_runs, topic, queue_id, max_bytes=batch_bytes, frame=self.framer
        )
        offset = request.offset
        stop = request.end_offset or store.reads.visible_end(topic, queue_id)
        if stop < 0:  # no such queue: let the read raise the precise error
            close_runs(state.inline(read, offset, max_messages=1)[1])
        read = functools.partial(read, until=stop)
        # One reply in flight per connection; the replies go out from a thread of
        # its own (waiting in select until the reply's deadline): a busy event loop
        # (gRPC shares it) would otherwise be woken for every few hundred KiB a
        # loaded client takes.
        held = await Held.take(budget, batch_bytes)
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(
                self.senders, self._send_blocking, conn, read, offset, stop, batch, request
            )
        finally:
            held.release()

    def _send_blocking(  # noqa: PLR0917 (the range's state, handed to a thread)
        self, conn: socket.socket, read: Callable[..., tuple[RecordsResult, list[bytes | FileRun]]],
        offset: int, stop: int, batch: int, request: fetch.FetchRequest,
    ) -> None:  # fmt: skip
        """The replies of ``[offset, stop)``: frames as bytes with ``send``, file
        runs with ``sendfile`` (the kernel sends the page cache's pages: no copy here)."""
        state = self.state
        timeout_s = state.config.stream_send_timeout_ms / 1000
        try:
            while offset < stop:
                result, pieces = state.calls.inline(
                    read, offset, max_messages=min(batch, stop - offset)
                )
                try:  # the whole reply within the send timeout (StalledStream's rule)
                    _send_reply(conn, pieces, time.monotonic() + timeout_s)
                finally:
                    close_runs(pieces)
                state.counters.pulled(
                    request.topic, request.queue_id, result.count, 0, result.nbytes
                )
                if result.status is not ReadStatus.OK or result.next_offset >= result.end:
                    return
                offset = result.next_offset
        except TimeoutError:
            log.warning("fetch port: %s/%d: the client took a reply in no less than %.0f s; "
                        "closing", request.topic, request.queue_id, timeout_s)  # fmt: skip
            raise


class MidFrame(ConnectionAbortedError):
    """A failure part way through a frame: the connection is closed, no ERROR frame
    (the client would read it as the reply's bytes; a close makes it fall back)."""


def _send_reply(conn: socket.socket, pieces: list[bytes | FileRun], deadline: float) -> None:
    """The pieces of one reply frame on the non-blocking ``conn`` by ``deadline``."""
    try:
        for piece in pieces:
            if isinstance(piece, FileRun):
                _send_file(conn, piece, deadline)
            else:
                _send_bytes(conn, piece, deadline)
    except (ConnectionError, TimeoutError):
        raise
    except Exception as exc:  # a bad disk block, say: the frame can't be finished
        log.error("fetch port: a reply failed part way (%s); closing the connection", exc)
        raise MidFrame(str(exc)) from exc


def _writable(conn: socket.socket, deadline: float) -> None:
    """Wait until ``conn`` takes data again (poll: select fails past fd 1023)."""
    left = deadline - time.monotonic()
    poller = select.poll()
    poller.register(conn, select.POLLOUT)
    if left <= 0 or not poller.poll(left * 1000):
        raise TimeoutError("the client took no data in time")


def _send_bytes(conn: socket.socket, data: bytes, deadline: float) -> None:
    view, sent = memoryview(data), 0
    while sent < len(view):
        try:
            sent += conn.send(view[sent:])
        except BlockingIOError:
            _writable(conn, deadline)


def _send_file(conn: socket.socket, run: FileRun, deadline: float) -> None:
    offset, end = run.offset, run.offset + run.length
    while offset < end:
        try:
            sent = os.sendfile(conn.fileno(), run.fd, offset, end - offset)
        except BlockingIOError:
            _writable(conn, deadline)
            continue
        if sent == 0:  # the file ends before the run: never send a short frame
            raise MidFrame(f"the chunk file ends {end - offset} bytes before its run")
        offset += sent


async def _receive(conn: socket.socket, size: int, timeout_s: float) -> bytes:
    """Exactly ``size`` bytes from ``conn`` within ``timeout_s``; EOFError if it closes."""
    loop = asyncio.get_running_loop()
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    async with asyncio.timeout(timeout_s):
        while got < size:
            n = await loop.sock_recv_into(conn, view[got:])
            if n == 0:
                raise EOFError
            got += n
    return bytes(buf)


_SERVERS: dict[int, FetchServer] = {}
"""The fetch server of each running broker state (by ``id``: the state is not hashable)."""


def fetch_port_number(config: BrokerConfig) -> int | None:
    """The port to listen on (0: any free one), or None: no fetch port.

    The port has neither TLS nor client certificates; its only check is the
    tokens'. So: a broker without TLS serves it when asked (tokens or not: the
    same exposure as its gRPC port); a TLS broker (mutual or not) only with
    ``fetch_insecure`` too (docs/operations.md "Fetch port")."""
    if config.fetch_port == "off":
        return None
    if config.tls_cert is not None and not config.fetch_insecure:
        return None  # never plain text beside TLS unless the operator says so
    return 0 if config.fetch_port == "auto" else int(config.fetch_port)


def fetch_port_refusal(config: BrokerConfig, tokens: bool) -> str | None:
    """Why a fetch port the config asks for is not served, or None.

    A broker whose clients authenticate only by certificate (mutual TLS, no
    tokens) would serve every topic to anyone over the fetch port, which checks
    no certificate: it is not served, whatever ``fetch_insecure`` says."""
    if fetch_port_number(config) is None or config.tls_client_ca is None or tokens:
        return None
    return ("fetch port off: the broker authenticates clients by certificate only "
            "(--tls-client-ca, no tokens) and the fetch port checks no certificate; "
            "give --tokens-file to serve it")  # fmt: skip


def fetch_port_warning(config: BrokerConfig, tokens: bool) -> str | None:
    """What to warn at start about a fetch port served beside TLS, or None."""
    if fetch_port_number(config) is None or config.tls_cert is None:
        return None
    if fetch_port_refusal(config, tokens) is not None:
        return None
    return "fetch port: serving records in plain text beside TLS (fetch_insecure)"


async def start_fetch_server(state: BrokerState, limit: int) -> FetchServer | None:
    """Listen on the fetch port if the config asks, and set ``state.fetch_address``."""
    config = state.config
    port = fetch_port_number(config)
    if port is None:
        if config.tls_cert is not None and config.fetch_port != "off":
            log.info("fetch port off: the broker serves TLS (set fetch_insecure to serve it)")
        return None
    refusal = fetch_port_refusal(config, state.tokens is not None)
    if refusal is not None:
        log.warning("%s", refusal)
        return None
    warning = fetch_port_warning(config, state.tokens is not None)
    if warning is not None:
        log.warning("%s", warning)
    server = FetchServer(state, limit)
    bound = await server.start(config.host, port)
    host = config.host
    if config.advertise_address:
        host = config.advertise_address.rsplit(":", 1)[0]
    elif host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostname()
    state.fetch_address = f"{host}:{bound}"
    _SERVERS[id(state)] = server
    log.info("fetch port listening on %s:%d", config.host, bound)
    return server


def fetch_server(state: BrokerState) -> FetchServer | None:
    """The fetch port's server of ``state`` (None: it does not listen)."""
    return _SERVERS.get(id(state))


async def stop_fetch_server(state: BrokerState) -> None:
    server = _SERVERS.pop(id(state), None)
    if server is not None:
        await server.stop()


def grpc_code(code: grpc.StatusCode) -> int:
    """The number of a status code (what an ERROR frame carries)."""
    return int(code.value[0])
