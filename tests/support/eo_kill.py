"""The exactly-once kill tests' driver harness (tests/spark/test_exactly_once_kill*.py):
start a copy driver (``tests.support.eo_driver``) in a process group of its own,
wait for its query to start, SIGKILL the whole group. Two files use it so that
``--dist loadfile`` runs the single-broker and the two-broker test side by side."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

BATCH = 2_000
"""Messages per produced batch."""
START_S = 180.0
"""Budget for a driver to start its query (a JVM start on a loaded machine)."""
STOP_S = 60.0
FINAL_RUN_S = 600.0
"""Budget of the final AvailableNow run that copies the rest."""


def start_driver(broker: str, checkpoint: Path, log: Path, *args: str) -> subprocess.Popen[str]:
    with open(log, "a") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.eo_driver",
                broker,
                str(checkpoint),
                "A",
                "B",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,  # its own process group: JVM and workers die with it
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )


def wait_started(driver: subprocess.Popen[str], timeout_s: float = START_S) -> None:
    assert driver.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(driver.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if selector.select(timeout=1.0):
                line = driver.stdout.readline()
                if line.startswith("query started"):
                    return
                if not line:
                    break
            elif driver.poll() is not None:
                break
    raise AssertionError(f"driver did not start its query (exit code {driver.poll()})")


def kill_group(driver: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(driver.pid, signal.SIGKILL)
    driver.wait(timeout=STOP_S)
    if driver.stdout is not None:
        driver.stdout.close()
