"""Server processes for the broker benchmark: equeue, Redis and NATS on 127.0.0.1.

Each server runs in a temporary directory the caller owns, listens on loopback
only, is waited for with a bounded loop (ready line or connect attempts) and is
stopped with SIGTERM (SIGKILL if it does not exit in time). Nothing here is
imported by the broker or the client.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Union

from equeue_broker.testing import BrokerProcess, stop_process

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(ready: Callable[[], bool], what: str, timeout_s: float = START_TIMEOUT_S) -> None:
    """Call ``ready`` until it returns True; at most ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # not listening yet: try again
            if ready():
                return
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    raise RuntimeError(f"{what} was not ready after {timeout_s:.0f} s")


def tcp_accepts(port: int) -> bool:
    with socket.create_connection((HOST, port), timeout=1.0):
        return True


Server = Union["ServerProcess", BrokerProcess]
"""Anything the benchmark started and must stop."""


class ServerProcess:
    """A child process with its stderr (and stdout, unless piped) in a log file."""

    def __init__(
        self,
        name: str,
        command: list[str],
        log_path: Path,
        *,
        pipe_stdout: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        with open(log_path, "ab") as log:  # the child keeps its own copy of the fd
            self.process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE if pipe_stdout else log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                cwd=log_path.parent,
                env={**os.environ, **(env or {})},
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; the exit code."""
        return stop_process(self.process, timeout_s)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def start_equeue(data_dir: Path, flush: str) -> tuple[BrokerProcess, str]:
    """An equeue broker (``--flush FLUSH``, a fetch port on any free port) over
    ``data_dir``; (process, host:port)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    broker = BrokerProcess(
        data_dir, "--flush", flush, "--log-level", "WARNING", "--fetch-port", "auto",
        log_path=data_dir.parent / f"equeue-{flush}.log",
    )  # fmt: skip
    return broker, broker.start(START_TIMEOUT_S)


def start_redis(work_dir: Path, appendfsync: str) -> tuple[ServerProcess, int] | None:
    """``redis-server`` with an append-only file fsynced per ``appendfsync``
    (``everysec`` or ``always``), no RDB snapshots and no AOF rewrites; None if
    redis-server is not installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    import redis

    work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [
        binary, "--bind", HOST, "--port", str(port), "--dir", str(work_dir),
        "--save", "", "--appendonly", "yes", "--appendfsync", appendfsync,
        "--auto-aof-rewrite-percentage", "0", "--protected-mode", "yes",
        "--daemonize", "no", "--logfile", "",
    ]  # fmt: skip
    server = ServerProcess(
        f"redis-{appendfsync}", command, work_dir.parent / f"redis-{appendfsync}.log"
    )

    def ready() -> bool:
        if not server.alive():
            raise RuntimeError(f"redis-server exited:\n{server.log_tail()}")
        with redis.Redis(host=HOST, port=port, socket_timeout=1.0) as client:
            return bool(client.ping())

    _wait_or_stop(server, ready)
    return server, port


def start_nats(work_dir: Path) -> tuple[ServerProcess, int] | None:
    """``nats-server -js`` with file storage in ``work_dir``; None if not installed."""
    binary = shutil.which("nats-server")
    if binary is None:
        return None
    work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [binary, "-js", "-sd", str(work_dir), "-a", HOST, "-p", str(port)]
    server = ServerProcess("nats", command, work_dir.parent / "nats.log")

    def ready() -> bool:
        if not server.alive():
            raise RuntimeError(f"nats-server exited:\n{server.log_tail()}")
        return tcp_accepts(port)

    _wait_or_stop(server, ready)
    return server, port


def _wait_or_stop(server: ServerProcess, ready: Callable[[], bool]) -> None:
    try:
        wait_until(ready, server.name)
    except BaseException:
        server.stop()
        raise


NOT_INSTALLED = "not installed"


def server_version(binary: str) -> str:
    """The first line of ``BINARY --version`` (bounded), "?", or ``NOT_INSTALLED``."""
    path = shutil.which(binary)
    if path is None:
        return NOT_INSTALLED
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "?"
