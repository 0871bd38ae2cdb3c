"""``python -m equeue_broker.testing_zk``: a single-node ZooKeeper for development
(issue 26, item 14; docs/replication.md, "A single-node ZooKeeper for
development"), run as the doc says: ready line, the doc's check without
``nc``, a znode written, Ctrl-C stops it (exit 0, port free), started again on
its data directory the znode is back. Also the recipe's config as the doc
shows it. A real JVM; without java the test is skipped, saying so."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from equeue_broker.testing import read_ready_line
from equeue_broker.testing_zk import READY_PREFIX, four_letter, free_port, java_available

DOC = Path(__file__).resolve().parents[2] / "docs" / "replication.md"
SECTION = "## A single-node ZooKeeper for development"
START_S = 90  # a JVM on a loaded 2-core machine; 1-2 s idle

pytestmark = pytest.mark.skipif(
    not java_available(), reason="java is not installed: ZooKeeper needs a JRE (CI has Java 17)"
)


def _section() -> str:
    text = DOC.read_text()
    start = text.index(SECTION)
    return text[start : text.index("\n## ", start + len(SECTION))]


def _doc_check(port: int) -> str:
    """The section's check line (bash's /dev/tcp, no nc), run against ``port``."""
    (line,) = [ln for ln in _section().splitlines() if "/dev/tcp/" in ln]
    command = line.split("#")[0].strip().replace("/2181;", f"/{port};")
    assert command.startswith("bash -c "), command
    done = subprocess.run(
        command, shell=True, capture_output=True, text=True, timeout=30, check=False
    )
    return done.stdout


def _start(tmp_path: Path, port: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "equeue_broker.testing_zk", "--port", str(port),
               "--data-dir", "zk"]  # fmt: skip
    return subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _stop_with_ctrl_c(process: subprocess.Popen[str]) -> int:
    process.send_signal(signal.SIGINT)
    try:
        return process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def _close(process: subprocess.Popen[str]) -> None:
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


@pytest.mark.timeout(300)
def test_the_development_zookeeper_runs_until_ctrl_c_and_keeps_its_data(tmp_path: Path) -> None:
    port = free_port()
    hosts = f"127.0.0.1:{port}"
    zk = _start(tmp_path, port)
    try:
        assert read_ready_line(zk, START_S) == f"{READY_PREFIX}{hosts}\n"
        assert "Mode: standalone" in _doc_check(port)
        client = KazooClient(hosts, timeout=30)
        client.start(timeout=30)
        try:
            client.create("/dev-check", b"kept", makepath=True)
        finally:
            client.stop()
            client.close()
    finally:
        code = _stop_with_ctrl_c(zk)
    assert code == 0, zk.stderr.read() if zk.stderr else ""
    assert four_letter(port, "srvr") == ""  # the server is gone with it
    _close(zk)

    again = _start(tmp_path, port)  # the same data directory
    try:
        assert read_ready_line(again, START_S) == f"{READY_PREFIX}{hosts}\n"
        client = KazooClient(hosts, timeout=30)
        client.start(timeout=30)
        try:
            assert client.get("/dev-check")[0] == b"kept"
        finally:
            client.stop()
            client.close()
    finally:
        assert _stop_with_ctrl_c(again) == 0
        _close(again)


def test_a_bad_port_is_refused_in_one_line(tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "equeue_broker.testing_zk", "--port", "70000"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as bad:  # fmt: skip
        _, err = bad.communicate(timeout=60)
    assert bad.returncode == 2
    assert "--port 70000 is not a port" in err


def test_the_recipe_listens_on_loopback_and_answers_srvr() -> None:
    """The by-hand config: 127.0.0.1 only, ``srvr`` allowed (the check uses it),
    an absolute dataDir; and the start command names that file."""
    section = _section()
    (config,) = re.findall(r"```properties\n(.*?)```", section, re.DOTALL)
    settings = dict(line.split("=", 1) for line in config.splitlines())
    assert settings["clientPortAddress"] == "127.0.0.1"
    assert "srvr" in settings["4lw.commands.whitelist"].split(",")
    assert settings["dataDir"].startswith("/")
    assert "QuorumPeerMain ~/equeue-zk/zoo.cfg" in section
    assert "python -m equeue_broker.testing_zk --port 2181 --data-dir ~/equeue-zk" in section
