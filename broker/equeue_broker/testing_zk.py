"""A private ZooKeeper for tests, benchmarks and examples (``equeue_broker.testing_zk``).

Like ``equeue_broker.testing`` for brokers, this starts the real thing: Debian's
``zookeeper`` package (``make zookeeper`` installs it; the jars land in
``/usr/share/java``), one standalone server on 127.0.0.1 on a free port, its
data in a directory of its own::

    with local_zookeeper() as zk:
        client = KazooClient(zk.hosts)
        ...

    zk = ZooKeeperProcess(tmp_path / "zk")
    zk.start()      # bounded wait until ``srvr`` answers "Mode: standalone"
    zk.stop()       # SIGTERM, SIGKILL if it does not exit in time
    zk.start()      # the same port and data again: sessions and znodes survive
    zk.pause()      # SIGSTOP: a hung server (clients see timeouts, not refusals)
    zk.resume()     # SIGCONT

Readiness is ZooKeeper's own ``srvr`` four-letter command (the only one enabled):
``ruok`` answers "imok" before the server accepts sessions, ``srvr`` says
"not currently serving requests" until it does. Nothing here imports kazoo.

As a command, a ZooKeeper for development (docs/replication.md, "A
single-node ZooKeeper for development")::

    python -m equeue_broker.testing_zk --port 2181 --data-dir ~/equeue-zk

prints ``zookeeper listening on 127.0.0.1:2181`` once it serves sessions and
runs until Ctrl-C (or SIGTERM), then stops the server and exits 0; started
again on the same ``--data-dir`` it has its znodes back. Without
``--data-dir`` its data go to a temporary directory, removed at exit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from types import TracebackType

HOST = "127.0.0.1"
CLASSPATH = os.environ.get("EQUEUE_ZOOKEEPER_CLASSPATH", "/usr/share/java/*")
"""Where the ZooKeeper jars are (Debian's package: ``/usr/share/java``)."""
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
START_TIMEOUT_S = 60.0
"""Bound on a start; a healthy one takes 1-2 s (a JVM on a busy 2-core machine)."""
STOP_TIMEOUT_S = 20.0
TICK_MS = 200
"""ZooKeeper's time unit; the shortest session is 2 ticks, so 200 ms allows
sessions from 0.4 s: short enough for tests to watch sessions expire."""
JVM_FLAGS = ("-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
"""A small heap and the quick JIT tier: a test server stores a few hundred znodes."""


def java_available() -> bool:
    return shutil.which("java") is not None


def zookeeper_installed() -> bool:
    """The server's jar is on the classpath directory (``make zookeeper`` puts it there)."""
    folder = Path(CLASSPATH.removesuffix("*"))
    return any(folder.glob("zookeeper-*.jar")) or (folder / "zookeeper.jar").exists()


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def four_letter(port: int, command: str, timeout_s: float = 2.0) -> str:
    """Send a four-letter command (``srvr``) and return the answer ('' on any error)."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s) as s:
            s.sendall(command.encode())
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


class ZooKeeperProcess:
    """One standalone ZooKeeper over one data directory, on one port for its
    whole life: ``start`` again after ``stop`` (or ``kill``) brings back the same
    server, with its znodes and its sessions (ZooKeeper restores sessions from
    its snapshot and gives each a full timeout to reconnect)."""

    def __init__(self, base_dir: Path, port: int = 0, tick_ms: int = TICK_MS) -> None:
        self.base_dir = Path(base_dir).absolute()  # the JVM runs in it: dataDir absolute
        self.data_dir = self.base_dir / "data"
        self.config_path = self.base_dir / "zoo.cfg"
        self.log_path = self.base_dir / "zookeeper.log"
        self.port = port or free_port()
        self.tick_ms = tick_ms
        self.process: subprocess.Popen[bytes] | None = None
        self.start_seconds = 0.0
        """Seconds from spawning the JVM to serving (the last start)."""

    @property
    def hosts(self) -> str:
        """The connect string for clients: ``127.0.0.1:PORT``."""
        return f"{HOST}:{self.port}"

    def write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            "\n".join(
                [
                    f"tickTime={self.tick_ms}",
                    f"dataDir={self.data_dir}",
                    f"clientPort={self.port}",
                    f"clientPortAddress={HOST}",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=srvr",
                    "maxClientCnxns=0",
                    # Sessions from 2 ticks up to a minute (the default cap is 20 ticks).
                    "maxSessionTimeout=60000",
                    # Snapshots and purging are irrelevant for a test's few znodes.
                    "autopurge.purgeInterval=0",
                    "",
                ]
            )
        )

    def start(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the server; return its connect string once it serves sessions.
        ``RuntimeError`` with the log's tail if it exits or is not serving in time."""
        if self.alive():
            raise RuntimeError(f"ZooKeeper on port {self.port} is still running")
        if not java_available():
            raise RuntimeError("java is not installed (ZooKeeper needs a JRE)")
        if not zookeeper_installed():
            raise RuntimeError(f"no ZooKeeper jars in {CLASSPATH} (run `make zookeeper`)")
        self.write_config()
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                ["java", *JVM_FLAGS, "-cp", CLASSPATH, MAIN_CLASS, str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.base_dir,
            )
        deadline = started + timeout_s
        while "Mode: standalone" not in four_letter(self.port, "srvr"):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"ZooKeeper exited with {self.process.returncode}\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"ZooKeeper not serving after {timeout_s:.0f}s\n{self.log_tail()}"
                )
            time.sleep(0.05)
        self.start_seconds = time.monotonic() - started
        return self.hosts

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, SIGKILL if it has not exited after ``timeout_s``; returns once
        the process is reaped (its port is free for the next ``start``)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.resume()  # a stopped process does not act on SIGTERM
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)

    def pause(self) -> None:
        """SIGSTOP: the server hangs; connections stay open, nothing is answered.

        Returns once every thread of the JVM is stopped: the signal stops each
        thread only when it next enters the kernel, and a thread already
        running could answer one more request (seen on a loaded machine)."""
        if self.alive():
            os.kill(self.pid, signal.SIGSTOP)
            _wait_stopped(self.pid, timeout_s=10.0)

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)

    def srvr(self) -> str:
        """The server's ``srvr`` answer ('' when it does not answer)."""
        return four_letter(self.port, "srvr")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> ZooKeeperProcess:
        if not self.alive():
            self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@contextmanager
def local_zookeeper(
    base_dir: Path | None = None, timeout_s: float = START_TIMEOUT_S
) -> Iterator[ZooKeeperProcess]:
    """A ZooKeeper for the duration of the ``with`` block; without ``base_dir`` its
    data live in a temporary directory removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="equeue-zk-") as scratch:
        zk = ZooKeeperProcess(base_dir or Path(scratch))
        zk.start(timeout_s)
        try:
            yield zk
        finally:
            zk.stop()


def _wait_stopped(pid: int, timeout_s: float) -> None:
    """Until every thread of ``pid`` is stopped (state T in /proc), or the
    process is gone; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    tasks = Path(f"/proc/{pid}/task")
    while time.monotonic() < deadline:
        try:
            states = [_state(task / "stat") for task in tasks.iterdir()]
        except FileNotFoundError:  # the process is gone
            return
        if all(state in ("T", "t", "X", "Z", "") for state in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"ZooKeeper pid {pid}: its threads did not stop within {timeout_s:g} s")


def _state(stat: Path) -> str:
    """A /proc stat file's state letter ('' when the thread has gone)."""
    try:
        text = stat.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""
    return text.rsplit(")", 1)[-1].split()[0]


READY_PREFIX = "zookeeper listening on "


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m equeue_broker.testing_zk``: one ZooKeeper until Ctrl-C (module doc)."""
    parser = argparse.ArgumentParser(
        prog="python -m equeue_broker.testing_zk",
        description="Run a single-node ZooKeeper on 127.0.0.1 for development and tests"
        " (Debian's zookeeper package: make zookeeper). Ctrl-C or SIGTERM stops it.",
    )
    parser.add_argument("--port", type=int, default=2181, help="client port (0: a free one)")
    parser.add_argument(
        "--data-dir", type=Path, help="its snapshots, logs and zoo.cfg (kept); default: a"
        " temporary directory, removed at exit",
    )  # fmt: skip
    parser.add_argument(
        "--tick-ms", type=int, default=TICK_MS,
        help=f"ZooKeeper's tickTime; sessions may last 2 ticks to 60 s (default {TICK_MS})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port} is not a port; give 0 to 65535 (0: a free one)")
    if args.port and four_letter(args.port, "srvr", timeout_s=1.0):
        parser.error(f"port {args.port} already answers (another ZooKeeper?); give another --port")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with contextlib.ExitStack() as cleanup:
        base = args.data_dir or Path(cleanup.enter_context(tempfile.TemporaryDirectory()))
        if base.exists() and not base.is_dir():
            parser.error(f"--data-dir {base} is a file, not a directory")
        zk = ZooKeeperProcess(base, args.port, args.tick_ms)
        try:
            zk.start()
        except RuntimeError as exc:
            print(f"zookeeper did not start: {exc}", file=sys.stderr)
            return 1
        cleanup.callback(zk.stop)
        print(f"{READY_PREFIX}{zk.hosts}", flush=True)
        print(f"data in {base}, log in {zk.log_path}; Ctrl-C stops it", file=sys.stderr)
        while not stop.wait(1.0):
            if not zk.alive():
                print(f"zookeeper exited\n{zk.log_tail()}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
