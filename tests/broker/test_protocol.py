"""Rules shared by broker and client; broker configuration parsing."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from equeue_broker.server.config import BrokerConfig, parse_args
from equeue_broker.server.logs import JsonFormatter
from equeue_broker.storage import InvalidArgument
from equeue_proto.protocol import allocate_average, format_message_id, parse_message_id


@pytest.mark.parametrize(
    ("queues", "consumers", "expected"),
    [
        (6, ["b", "a", "c"], {"a": [0, 1], "b": [2, 3], "c": [4, 5]}),
        (7, ["a", "b", "c"], {"a": [0, 1, 2], "b": [3, 4], "c": [5, 6]}),
        (2, ["a", "b", "c"], {"a": [0], "b": [1], "c": []}),
        (4, [], {}),
    ],
)
def test_average_allocation(
    queues: int, consumers: list[str], expected: dict[str, list[int]]
) -> None:
    allocation = allocate_average(list(range(queues))[::-1], consumers)
    assert allocation == expected
    assert sorted(q for qs in allocation.values() for q in qs) == (
        list(range(queues)) if consumers else []
    )


def test_message_id_round_trip() -> None:
    message_id = format_message_id("ab12cd34", 2**40 + 7)
    assert message_id == "ab12cd34-0000010000000007"
    assert parse_message_id(message_id) == ("ab12cd34", 2**40 + 7)
    for bad in ["", "nodash", "ab-123", "ab-zzzzzzzzzzzzzzzz", "-0000000000000001"]:
        with pytest.raises(ValueError, match="malformed message id"):
            parse_message_id(bad)


def test_flags_override_the_config_file(tmp_path: Path) -> None:
    config_file = tmp_path / "broker.toml"
    config_file.write_text('flush = "sync"\ndefault-queues = 8\nport = 7000\n')
    config = parse_args(["--config", str(config_file), "--port", "0", "--data-dir", str(tmp_path)])
    assert [config.setting(k) for k in ("flush", "default_queues", "port")] == ["sync", 8, 0]
    assert config.storage.flush_mode.value == "sync"
    assert parse_args(["--retention-max-chunks", "-1"]).storage.retention.max_chunks is None


def test_bad_settings_are_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config_file = tmp_path / "broker.toml"
    config_file.write_text("colour = 'blue'\n")
    with pytest.raises(SystemExit, match=r"^2$"):
        parse_args(["--config", str(config_file)])
    assert re.search(r"unknown settings in \S+: colour", capsys.readouterr().err)
    with pytest.raises(SystemExit):
        parse_args(["--port", "70000"])
    assert "port must be in [0, 65535], got 70000" in capsys.readouterr().err
    with pytest.raises(InvalidArgument, match=r"^chunk_size must be in \[4096, "):
        BrokerConfig.from_settings({"chunk_size": 10})  # the setting's name, not the field's


def test_json_log_lines_carry_extra_fields() -> None:
    record = logging.makeLogRecord(
        {"name": "equeue.broker", "levelname": "INFO", "msg": "topic %s", "args": ("t",)}
    )
    record.topic = "t"
    line = json.loads(JsonFormatter().format(record))
    assert (line["msg"], line["topic"], line["level"]) == ("topic t", "t", "INFO")
