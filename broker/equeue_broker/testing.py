"""Real broker processes for tests, benchmarks and examples (``equeue_broker.testing``).

Like nats.py's ``nats.server``, this starts the real thing rather than a
double: ``python -m equeue_broker --host 127.0.0.1 --port 0 ...`` in a child
process, learns its address from the one line it prints when it is ready, and
stops it by PID. Anything that needs a broker for a while — a pytest fixture, a
benchmark, an example's embedded broker — uses this one implementation of the
ready-line protocol::

    with local_broker("--flush", "sync") as broker:
        producer = Producer(broker.address)
        ...

    broker = BrokerProcess(tmp_path / "data", "--flush", "sync")
    broker.start()          # bounded wait for "equeue broker listening on HOST:PORT"
    broker.kill()           # SIGKILL, as a crash would
    broker.start()          # the same data directory again: recovery runs
    broker.stop()           # SIGTERM, SIGKILL if it does not exit in time

The broker's stdout carries only the ready line; its stderr (the log) goes to
``log_path``, appended across restarts. Nothing in the broker imports this module.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

READY_PREFIX = "equeue broker listening on "
"""The start of the one line the broker prints on stdout once it accepts calls."""
HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
"""Default bound on a start: generous, because a loaded CI machine is slow to
import grpc and recover a data directory; a healthy start takes about a second."""
STOP_TIMEOUT_S = 30.0


class BrokerProcess:
    """One broker process over one data directory; ``start`` may be called
    again after ``kill`` or ``stop`` (a restart over the same data).

    ``flags`` are passed to the broker after ``--data-dir``, ``--host`` and
    ``--port 0``. ``module`` is what ``python -m`` runs (a test may wrap the
    broker, e.g. in a fault-injecting file layer); ``env`` adds environment
    variables; ``cwd`` is the child's working directory.
    """

    def __init__(
        self,
        data_dir: Path,
        *flags: str,
        module: str = "equeue_broker",
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.flags = list(flags)
        self.module = module
        self.env = dict(env or {})
        self.cwd = cwd
        self.log_path = log_path or self.data_dir.parent / f"{self.data_dir.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.address = ""
        """``host:port`` of the last start."""
        self.start_seconds = 0.0
        """Seconds from spawning the process to its ready line (the last start)."""
        self._log_offset = 0

    ready_prefix = READY_PREFIX

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", self.module, "--data-dir", str(self.data_dir),
            "--host", HOST, "--port", "0", *self.flags,
        ]  # fmt: skip

    # -- lifecycle -------------------------------------------------------------

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the process without waiting for it to be ready."""
        if self.alive():
            raise RuntimeError(f"{self.module} over {self.data_dir} is still running")
        command = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the fd
            self.process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                cwd=self.cwd,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )
        return self.process

    def start(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the broker; return ``host:port`` once it prints its ready line.

        ``RuntimeError`` (with the log's tail) if it exits or stays silent
        for ``timeout_s``; the process is killed then.
        """
        started = time.monotonic()
        process = self.spawn()
        line = read_ready_line(process, timeout_s)
        if not line.startswith(self.ready_prefix):
            self.kill()
            raise RuntimeError(f"{self.module} did not start: {line!r}\n{self.log_tail()}")
        self.start_seconds = time.monotonic() - started
        self.address = line[len(self.ready_prefix) :].strip()
        return self.address

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def kill(self) -> None:
        """SIGKILL, as a crash would; returns once the process is reaped."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
        stop_process(self.process, STOP_TIMEOUT_S)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (a clean shutdown), SIGKILL if it has not exited after
        ``timeout_s``; the exit code."""
        assert self.process is not None, "not started"
        return stop_process(self.process, timeout_s)

    def __enter__(self) -> BrokerProcess:
        if not self.alive():
            self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.process is not None:
            stop_process(self.process, STOP_TIMEOUT_S)

    # -- observation -----------------------------------------------------------

    def proc_status(self) -> dict[str, str]:
        """``/proc/<pid>/status`` as a dict (empty once the process is gone)."""
        try:
            text = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return {}
        return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)

    def peak_rss_bytes(self) -> int:
        """VmHWM: the most resident memory the process has had so far."""
        return _kib(self.proc_status().get("VmHWM", "0 kB"))

    def rss_bytes(self) -> int:
        return _kib(self.proc_status().get("VmRSS", "0 kB"))

    def ignores_signal(self, signum: int) -> bool:
        mask = int(self.proc_status().get("SigIgn", "0"), 16)
        return bool(mask & (1 << (signum - 1)))

    def log_since_start(self) -> str:
        """What the broker logged since its last start."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_since_start().splitlines()[-lines:])

    def http_port(self) -> int:
        """The port of ``--http-port`` (0 = any free port), from the log record
        ``http listening on HOST:PORT`` of the last start (logged before the
        ready line); ``RuntimeError`` if there is none."""
        found = re.search(r"http listening on \S+:(\d+)", self.log_since_start())
        if found is None:
            raise RuntimeError(f"no HTTP listener was logged\n{self.log_tail()}")
        return int(found[1])


NAMESRV_READY_PREFIX = "equeue namesrv listening on "


class NameServerProcess(BrokerProcess):
    """One name server process (``python -m equeue_broker.namesrv``); it has no
    data, so ``workdir`` only holds its log. ``flags`` follow ``--host`` and
    ``--port``: the first start picks a free port, and a restart asks for the
    same one (brokers and clients were told that address)."""

    ready_prefix = NAMESRV_READY_PREFIX

    def __init__(self, workdir: Path, *flags: str, env: Mapping[str, str] | None = None) -> None:
        super().__init__(workdir, *flags, module="equeue_broker.namesrv", env=env)

    def command(self) -> list[str]:
        port = str(self.port) if self.address else "0"
        return [sys.executable, "-m", self.module, "--host", HOST, "--port", port, *self.flags]


class LocalCluster:
    """Name servers and brokers on 127.0.0.1 for tests, benchmarks and examples.

    ``start(namesrvs=2, brokers=("a", "b", "c"))`` starts the name servers
    first, then one broker per name (``--broker-name NAME --namesrv ...``,
    plus ``broker_flags``); ``namesrv`` is the comma-separated list clients take.
    ``namesrv_env`` and ``broker_env`` add environment variables, e.g. a
    secured cluster (docs/cluster.md, "Security and trust")::

        LocalCluster(root, namesrv_flags=("--tokens-file", str(tokens)),
                     broker_env={"EQUEUE_NAMESRV_TOKEN": broker_secret})
    """

    def __init__(self, root: Path, *, broker_flags: tuple[str, ...] = (),
                 namesrv_flags: tuple[str, ...] = (),
                 namesrv_env: Mapping[str, str] | None = None,
                 broker_env: Mapping[str, str] | None = None) -> None:  # fmt: skip
        self.root = Path(root)
        self.broker_flags = broker_flags
        self.namesrv_flags = namesrv_flags
        self.namesrv_env = dict(namesrv_env or {})
        self.broker_env = dict(broker_env or {})
        self.namesrvs: list[NameServerProcess] = []
        self.brokers: dict[str, BrokerProcess] = {}

    @property
    def namesrv(self) -> str:
        return ",".join(n.address for n in self.namesrvs)

    def start(self, namesrvs: int = 2, brokers: tuple[str, ...] = ("a", "b", "c")) -> LocalCluster:
        for i in range(namesrvs):
            server = NameServerProcess(
                self.root / f"namesrv{i}", *self.namesrv_flags, env=self.namesrv_env
            )
            self.namesrvs.append(server)
            server.start()
        for name in brokers:
            self.add_broker(name)
        return self

    def add_broker(self, name: str, *flags: str) -> BrokerProcess:
        broker = BrokerProcess(
            self.root / f"broker-{name}", "--broker-name", name, "--namesrv", self.namesrv,
            *self.broker_flags, *flags, env=self.broker_env,
        )  # fmt: skip
        self.brokers[name] = broker
        broker.start()
        return broker

    def stop(self) -> None:
        for process in [*self.brokers.values(), *self.namesrvs]:
            if process.alive():
                process.stop()

    def kill(self) -> None:
        for process in [*self.brokers.values(), *self.namesrvs]:
            process.kill()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def local_cluster(
    namesrvs: int = 2, brokers: tuple[str, ...] = ("a", "b", "c"), *,
    broker_flags: tuple[str, ...] = (), namesrv_flags: tuple[str, ...] = (),
    namesrv_env: Mapping[str, str] | None = None, broker_env: Mapping[str, str] | None = None,
) -> Iterator[LocalCluster]:  # fmt: skip
    """A cluster for the ``with`` block, in a temporary directory, stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="equeue-cluster-") as scratch:
        cluster = LocalCluster(Path(scratch), broker_flags=broker_flags,
                               namesrv_flags=namesrv_flags, namesrv_env=namesrv_env,
                               broker_env=broker_env)  # fmt: skip
        try:
            yield cluster.start(namesrvs, brokers)
        finally:
            cluster.stop()


@contextmanager
def local_broker(
    *flags: str, data_dir: Path | None = None, timeout_s: float = START_TIMEOUT_S
) -> Iterator[BrokerProcess]:
    """A broker for the duration of the ``with`` block, stopped with SIGTERM
    at the end. Without ``data_dir`` its data (and log) live in a temporary
    directory that is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="equeue-broker-") as scratch:
        broker = BrokerProcess(data_dir or Path(scratch) / "data", *flags)
        broker.start(timeout_s)
        try:
            yield broker
        finally:
            broker.stop()


def read_ready_line(process: subprocess.Popen[Any], timeout_s: float) -> str:
    """The process's first stdout line (text or binary pipe), waiting at most
    ``timeout_s``; a placeholder saying why if there is none."""
    stdout = process.stdout
    assert stdout is not None, "start the process with stdout=PIPE"
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(timeout=min(0.5, max(0.0, deadline - time.monotonic()))):
                line = stdout.readline()
                return line.decode(errors="replace") if isinstance(line, bytes) else str(line)
            if process.poll() is not None:
                return f"<exited with {process.returncode}>"
    return "<no ready line in time>"


def stop_process(process: subprocess.Popen[Any], timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM, then SIGKILL if it has not exited after ``timeout_s``; the exit
    code, once the process is reaped and its stdout pipe (if any) closed."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    code = process.wait(timeout_s)
    if process.stdout is not None and not process.stdout.closed:
        process.stdout.close()
    return code


def _kib(value: str) -> int:
    return int(value.split(maxsplit=1)[0]) * 1024
