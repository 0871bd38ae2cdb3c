"""Starting the broker: every start-up failure is one line on stderr and a
documented exit code (docs/operations.md, "Exit codes"), a second broker never
shares a live broker's port, and the log is readable (text lines name what
they are about; DEBUG is the broker's, not gRPC's). Real broker processes."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from equeue_broker.testing import HOST, BrokerProcess
from equeue_spark.client import Admin, Consumer, Producer

START_TIMEOUT_S = 60


def run_broker(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """A broker that is expected to fail to start: its exit code and output."""
    command = [sys.executable, "-m", "equeue_broker", "--data-dir", str(tmp_path / "data")]
    return subprocess.run(
        [*command, *flags],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed start writes on stderr (nothing on stdout)."""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert done.stdout == ""  # no ready line
    return lines[0]


@pytest.fixture
def listening() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as other:
        other.bind((HOST, 0))
        other.listen()
        yield other.getsockname()[1]


def test_a_second_broker_on_a_live_brokers_port_refuses_to_start(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    with Admin(broker.address) as admin:
        first_id = admin.stats().broker_id
        admin.create_topic("only-on-the-first")
    done = run_broker(tmp_path, "--host", HOST, "--port", str(broker.port))
    assert done.returncode == 3
    line = one_line(done)
    assert f"cannot listen on {broker.address}: Address already in use" in line
    # The first still serves, and is the only one there: every new connection
    # reaches it (with a second broker sharing the port some would not).
    assert broker.alive()
    for _ in range(10):
        with Admin(broker.address) as admin:
            assert admin.stats().broker_id == first_id
            assert [t.name for t in admin.list_topics()] == ["only-on-the-first"]


def test_grpc_itself_does_not_join_a_shareable_port(tmp_path: Path) -> None:
    """The backstop behind the address check (which may race): the gRPC server
    is told not to set SO_REUSEPORT, so it cannot join even a listener that
    allows sharing. In-process: only ``create_server`` binds without the check."""
    from equeue_broker.server.app import create_server
    from equeue_broker.server.config import BrokerConfig
    from equeue_broker.server.startup import CannotBind
    from equeue_broker.storage import Store

    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind((HOST, 0))
        holder.listen()
        port = holder.getsockname()[1]
        settings = {"data_dir": str(tmp_path / "data"), "host": HOST, "port": port}
        config = BrokerConfig.from_settings(settings)
        store = Store(config.storage)
        try:
            expected = f"cannot listen on {HOST}:{port}: Address already in use"
            with pytest.raises(CannotBind, match=expected):
                asyncio.run(create_server(config, store))
        finally:
            store.close()


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (None, r"cannot read config file \S*broker\.toml: No such file or directory"),
        ("flush = 'sync'\nport = \n", r"config file \S*broker\.toml is not valid TOML: .*line 2"),
        ('port = "abc"\n', r'config file \S*broker\.toml: port = "abc": expected an integer'),
        ('log-level = "LOUD"\n', r'log_level = "LOUD": expected one of "DEBUG", "INFO"'),
        ("port = 70000\n", r"port must be in \[0, 65535\], got 70000"),
    ],
    ids=["missing file", "toml syntax", "wrong type", "wrong choice", "wrong value"],
)
def test_config_errors_are_one_line_and_exit_2(
    tmp_path: Path, config: str | None, expected: str
) -> None:
    path = tmp_path / "broker.toml"
    if config is not None:
        path.write_text(config)
    done = run_broker(tmp_path, "--config", str(path))
    assert done.returncode == 2, done.stderr
    line = one_line(done)
    assert line.startswith("equeue-broker: error: ")
    assert re.search(expected, line), line


def test_a_port_in_use_is_one_line_and_exit_3(tmp_path: Path, listening: int) -> None:
    done = run_broker(tmp_path, "--host", HOST, "--port", str(listening))
    assert done.returncode == 3, done.stderr
    line = one_line(done)
    assert f"cannot listen on {HOST}:{listening}: Address already in use" in line
    assert not (tmp_path / "data").exists()  # refused before touching the data directory


def test_an_address_not_of_this_host_is_one_line_and_exit_3(tmp_path: Path) -> None:
    done = run_broker(tmp_path, "--host", "192.0.2.1", "--port", "0")  # TEST-NET-1
    assert done.returncode == 3, done.stderr
    line = one_line(done)
    assert "cannot listen on 192.0.2.1:0: Cannot assign requested address" in line
    assert "--host" in line  # says what to do


def _start_fails(tmp_path: Path, *flags: str) -> str:
    """The one line of a broker that cannot start for a reason other than usage."""
    command = [sys.executable, "-m", "equeue_broker", "--port", "0", *flags]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=START_TIMEOUT_S, cwd=tmp_path,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    line = one_line(done)
    assert "cannot start: " in line and "Errno" not in line, line
    return line.split("cannot start: ", 1)[1]


def test_a_data_dir_that_is_a_file_is_said_in_words(tmp_path: Path) -> None:
    """Issue 26, item 10: not ``[Errno 17] File exists: 'afile'``."""
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "afile").write_text("")
    line = _start_fails(tmp_path, "--data-dir", "bad/afile")
    assert line.startswith("--data-dir bad/afile is a file, not a directory; "), line
    line = _start_fails(tmp_path, "--data-dir", "bad/afile/data")
    assert line.startswith(
        "--data-dir bad/afile/data cannot be created: bad/afile is a file, not a directory; "
    ), line
    config = tmp_path / "broker.toml"
    config.write_text('data_dir = "bad/afile"\n')
    line = _start_fails(tmp_path, "--config", str(config))
    assert line.startswith(f"bad/afile (data_dir in {config}) is a file, not a directory"), line


def test_unreadable_files_are_named_by_their_setting(tmp_path: Path) -> None:
    line = _start_fails(
        tmp_path, "--data-dir", "data", "--tls-cert", "missing.pem", "--tls-key", "missing.key"
    )
    assert line == (
        "cannot read --tls-cert missing.pem: no such file or directory;"
        " give --tls-cert an existing file"
    )
    assert not (tmp_path / "data").exists()  # refused before touching the data directory
    line = _start_fails(tmp_path, "--tokens-file", "missing.toml")
    assert line.startswith("cannot read --tokens-file missing.toml: no such file or directory")


OBJECT_DUMP = re.compile(r"\b[A-Z]\w*\(\w+=")
"""A dataclass's repr (``RecoveryReport(tail_records_scanned=0, ...``)."""


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_start_up_log_has_fields_not_object_dumps(tmp_path: Path, log_format: str) -> None:
    """Issue 26, item 11: ``store opened: RecoveryReport(...)`` was a repr in
    both formats; its figures are fields now (numbers in JSON)."""
    with BrokerProcess(tmp_path / "data", "--log-format", log_format) as broker:
        log = broker.log_since_start()
    assert "store opened" in log
    assert OBJECT_DUMP.findall(log) == [], log
    if log_format == "text":
        (opened,) = [line for line in log.splitlines() if "store opened" in line]
        assert re.search(r": store opened in \d+\.\d{3} s recovery_s=\d+\.\d+ bytes_scanned=0 ",
                         opened), opened  # fmt: skip
        return
    records = [json.loads(line) for line in log.splitlines()]
    (opened,) = [r for r in records if r["msg"].startswith("store opened")]
    for name in ("recovery_s", "bytes_scanned", "tail_records_scanned", "tail_bytes_discarded",
                 "index_entries_rebuilt", "records_of_deleted_topics"):  # fmt: skip
        assert isinstance(opened[name], int | float), (name, opened)
    (started,) = [r for r in records if r["msg"].startswith("broker ")]
    assert started["recovery_s"] == round(started["recovery_s"], 3)


def test_text_log_lines_name_their_topic_and_group(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("orders", queues=1)
        producer.send_batch("orders", [b"o"], queue_ids=[0])
        admin.reset_offsets("billing", "orders", to="latest")
        admin.delete_group("billing")
        admin.delete_topic("orders")
    log = broker.log_since_start()
    assert re.search(r"INFO equeue.broker: topic created topic=orders queues=1$", log, re.M)
    assert re.search(r": offsets reset group=billing topic=orders to=latest$", log, re.M)
    assert re.search(r": group deleted group=billing$", log, re.M)
    assert re.search(r": topic deleted topic=orders$", log, re.M)


def test_text_formatter_quotes_values_that_need_it() -> None:
    from equeue_broker.server.logs import TextFormatter  # here: the proof runs it on old code

    record = logging.makeLogRecord({"name": "equeue.broker", "levelname": "INFO", "msg": "hi"})
    record.topic = "orders"
    record.group = "a b"
    line = TextFormatter().format(record)
    assert line.endswith(': hi topic=orders group="a b"')


LIBRARY_LINE = re.compile(r"^\S+ \S+ \w+ (grpc|asyncio)\b", re.M)


def _debug_log(tmp_path: Path, name: str, *flags: str) -> str:
    """The log of a DEBUG broker that served a produce and a pull."""
    broker = BrokerProcess(tmp_path / name, "--log-level", "DEBUG", *flags)
    with broker, Producer(broker.address) as producer:
        producer.send_batch("dbg", [b"x"], queue_ids=[0])
        with Consumer(broker.address, group="g") as consumer:
            consumer.assign("dbg", [0])
            for _ in range(25):  # bounded: 25 polls of at most 0.2 s
                if consumer.poll(0.2):
                    break
    return broker.log_since_start()


def test_debug_log_level_is_not_flooded_by_grpc(tmp_path: Path) -> None:
    log = _debug_log(tmp_path, "quiet")
    assert "equeue.broker: broker" in log  # the broker's own lines are there
    assert LIBRARY_LINE.findall(log) == []
    # Asked for explicitly, gRPC's and asyncio's debug lines come back.
    loud = _debug_log(tmp_path, "loud", "--library-log-level", "DEBUG")
    assert {"grpc", "asyncio"} <= set(LIBRARY_LINE.findall(loud))
