"""A TCP proxy that loses one acknowledgement on purpose.

Between a client and a broker on 127.0.0.1: bytes go both ways unchanged,
until the client sends bytes containing ``marker`` (a message value, which
gRPC sends as is). From then on that connection's broker-to-client bytes are
held back, so the client's call waits for its reply; the test checks that the
broker appended the batch, then ``cut``s the connection: the client sees the
call fail (UNAVAILABLE) and retries on a new connection, which the proxy
forwards normally. Exactly one connection is cut.
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress

from equeue_broker.testing import HOST

_CHUNK = 1 << 16


class AckDroppingProxy:
    def __init__(self, upstream: str, marker: bytes) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.marker = marker
        self.armed = threading.Event()
        """Set once the marked request went to the broker (its reply is held)."""
        self._cut = threading.Event()
        self._held: tuple[socket.socket, socket.socket] | None = None
        self._lock = threading.Lock()
        self._listener = socket.create_server((HOST, 0))
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._spawn(self._accept)

    @property
    def address(self) -> str:
        return f"{HOST}:{self._listener.getsockname()[1]}"

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            pair = (client, server)
            self._spawn(self._pump, client, server, pair, True)
            self._spawn(self._pump, server, client, pair, False)

    def _pump(
        self, src: socket.socket, dst: socket.socket,
        pair: tuple[socket.socket, socket.socket], upstream: bool,
    ) -> None:  # fmt: skip
        tail = b""
        with suppress(OSError):
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                if upstream and not self.armed.is_set():
                    seen = tail + data
                    if self.marker in seen:
                        with self._lock:
                            self._held = pair
                        dst.sendall(data)
                        self.armed.set()
                        continue
                    tail = seen[-len(self.marker) :]
                if not upstream and self._held is pair:
                    self._cut.wait(60)  # the reply waits for ``cut``, then is lost
                    return
                dst.sendall(data)
        for sock in pair:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Close the connection whose reply is held (the reply is lost)."""
        with self._lock:
            held = self._held
        assert held is not None, "no request was marked"
        for sock in held:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._cut.set()

    def close(self) -> None:
        self._closing.set()
        self._cut.set()
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(timeout=5)
