"""A real ``equeue-broker`` process on an ephemeral port, for tests.

``start`` launches ``python -m broker --port 0`` and reads its one ready line
(bounded wait) to learn the port; ``stop`` sends SIGTERM and returns the exit
code; ``kill`` sends SIGKILL, as a crash would.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

READY_PREFIX = "equeue broker listening on "


class BrokerProcess:
    def __init__(self, data_dir: Path, *args: str) -> None:
        self.data_dir = data_dir
        self.args = list(args)
        self.process: subprocess.Popen[str] | None = None
        self.address = ""

    def start(self, timeout_s: float = 30.0) -> str:
        """Start the broker; return ``host:port`` once it is listening."""
        command = [
            sys.executable,
            "-m",
            "equeue_broker",
            "--data-dir",
            str(self.data_dir),
            "--port",
            "0",
        ]
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        with open(self.log_path, "a") as log:  # the child keeps its own copy of the fd
            self.process = subprocess.Popen(
                [*command, *self.args],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        assert self.process.stdout is not None
        line = read_ready_line(self.process, timeout_s)
        if not line.startswith(READY_PREFIX):
            self.kill()
            raise RuntimeError(f"broker did not start: {line!r}")
        self.address = line[len(READY_PREFIX) :].strip()
        return self.address

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM; return the exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self._wait(timeout_s)

    def kill(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
        self._wait(30.0)

    def _wait(self, timeout_s: float) -> int:
        assert self.process is not None
        code = self.process.wait(timeout_s)
        if self.process.stdout is not None and not self.process.stdout.closed:
            self.process.stdout.close()
        return code


def read_ready_line(
    process: subprocess.Popen[str] | subprocess.Popen[bytes], timeout_s: float
) -> str:
    """The broker's first stdout line (text or binary pipe), waiting at most
    ``timeout_s``; a placeholder saying why if there is none."""
    stdout = process.stdout
    assert stdout is not None
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(timeout=min(0.5, max(0.0, deadline - time.monotonic()))):
                line = stdout.readline()
                return line.decode(errors="replace") if isinstance(line, bytes) else line
            if process.poll() is not None:
                return f"<exited with {process.returncode}>"
    return "<no ready line in time>"


def stop_process(process: subprocess.Popen[Any], timeout_s: float) -> int:
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
