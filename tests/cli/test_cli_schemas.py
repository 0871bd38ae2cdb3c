"""``equeue schema`` against a real broker: set, get, check, compatibility,
delete; an incompatible schema exits 1 listing the problems; ``--json``;
``topics describe`` names the schema."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from equeue_broker.testing import BrokerProcess
from tests.support.cli import Cli, in_process_cli

V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}
V2: dict[str, Any] = {
    **V1,
    "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
}
V3_BAD: dict[str, Any] = {**V2, "fields": [*V2["fields"], {"name": "qty", "type": "int"}]}
JSON_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {"id": {"type": "integer"}},
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process = BrokerProcess(tmp_path_factory.mktemp("cli-schema-broker") / "data")
    process.start()
    try:
        yield process.address
    finally:
        process.stop()


@pytest.fixture
def cli(broker: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return in_process_cli(broker, capsys)


def write(tmp_path: Path, name: str, doc: object) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=2))
    return str(path)


def test_set_get_check_and_refusal(cli: Cli, tmp_path: Path) -> None:
    assert cli("topics", "create", "orders", "--queues", "1").code == 0
    done = cli("schema", "set", "orders", write(tmp_path, "v1.avsc", V1))
    assert done.code == 0, done.err
    assert done.out.strip() == "orders: value schema version 1 registered (AVRO, BACKWARD)"
    v2 = write(tmp_path, "v2.avsc", V2)
    assert (
        cli("schema", "set", "orders", v2)
        .out.strip()
        .endswith("version 2 registered (AVRO, BACKWARD)")
    )
    assert (
        cli("schema", "set", "orders", v2).out.strip() == "orders: value schema already version 2"
    )
    bad = write(tmp_path, "v3.avsc", V3_BAD)
    refused = cli("schema", "set", "orders", bad)
    assert refused.code == 1 and refused.out == ""
    lines = refused.err.strip().splitlines()
    assert lines[0] == "equeue: orders: value schema refused as incompatible:"
    assert any("qty" in line and "version 2" in line for line in lines[1:]), refused.err
    checked = cli("schema", "check", "orders", bad)
    assert checked.code == 1 and "qty" in checked.err
    # --json: the problems as a document for set too (exit 1); a dry run's
    # latest_version is the one that exists (review findings 15, 20).
    as_json = cli("--json", "schema", "set", "orders", bad)
    assert as_json.code == 1 and any("qty" in p for p in json.loads(as_json.out)["problems"])
    dry = cli("--json", "schema", "check", "orders", bad)
    report = json.loads(dry.out)
    assert dry.code == 1 and report["latest_version"] == 2
    assert report["versions"][0]["version"] == 3 and report["compatibility"] == "BACKWARD"
    assert cli("schema", "check", "orders", v2).out.strip() == (
        "orders: value schema is compatible (BACKWARD)"
    )
    got = cli("schema", "get", "orders")
    assert got.code == 0 and json.loads(got.out) == V2
    assert json.loads(cli("schema", "get", "orders", "--version", "1").out) == V1
    history = cli("--json", "schema", "get", "orders", "--history").json()
    assert [v["version"] for v in history["versions"]] == [1, 2]
    table = cli("schema", "get", "orders", "--history").out
    assert "compatibility BACKWARD" in table and "VERSION" in table and "version 2:" in table
    missing = cli("schema", "get", "orders", "--key")
    assert missing.code == 1 and "no key schema" in missing.err
    described = cli("topics", "describe", "orders").out
    assert "value schema: v2 AVRO BACKWARD" in described
    assert (
        cli("--json", "topics", "describe", "orders").json()["value_schema"]["latest_version"] == 2
    )


def test_json_stdin_compatibility_and_delete(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli("topics", "create", "events", "--queues", "1").code == 0
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(JSON_SCHEMA)))
    done = cli("--json", "schema", "set", "events", "-", "--key", "--compatibility", "full")
    info = done.json()
    assert info["key"] is True and info["created"] is True
    assert info["compatibility"] == "FULL" and info["versions"][0]["type"] == "JSON"
    assert cli("schema", "compatibility", "events", "none", "--key").out.strip() == (
        "events: key compatibility NONE"
    )
    bad_rule = cli("schema", "compatibility", "events", "sideways", "--key")
    assert bad_rule.code == 1 and "FULL_TRANSITIVE" in bad_rule.err
    unreadable = cli("schema", "set", "events", str(tmp_path / "nope.json"))
    assert unreadable.code == 2 and "cannot read schema file" in unreadable.err
    assert cli("schema", "delete", "events", "--key").out.strip() == "events: key schema deleted"
    gone = cli("schema", "get", "events", "--key")
    assert gone.code == 1
    assert cli("schema", "sync", "events").out.strip() == (
        "events: every broker group has every schema version"
    )


def test_bad_schema_files_give_one_line(cli: Cli, tmp_path: Path) -> None:
    """Review findings 7 and 20: a deeply nested, empty, non-JSON or endless schema
    is one line on stderr, exit 1, never a traceback; a type hint only where a type
    would help; after a delete the numbering goes on (finding 2)."""
    assert cli("topics", "create", "files", "--queues", "1").code == 0
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for extra in ((), ("--type", "avro"), ("--type", "json")):
        result = cli("schema", "set", "files", str(deep), *extra)
        assert result.code == 1 and "nested too deeply" in result.err, result.err
        assert "Traceback" not in result.err and len(result.err.strip().splitlines()) == 1
    empty = tmp_path / "empty.avsc"
    empty.write_text("")
    result = cli("schema", "set", "files", str(empty))
    assert (
        result.code == 1 and result.err.strip() == f"equeue: {empty} is empty: give the schema text"
    )
    broken = tmp_path / "broken.json"
    broken.write_text("{bad")
    result = cli("schema", "set", "files", str(broken))
    assert result.code == 1 and "not JSON" in result.err and "give the type" not in result.err
    endless = {"type": "record", "name": "N", "fields": [{"name": "n", "type": "N"}]}
    result = cli("schema", "set", "files", write(tmp_path, "n.avsc", endless))
    assert result.code == 1 and "record N can never end" in result.err
    assert cli("schema", "set", "files", write(tmp_path, "v1.avsc", V1)).code == 0
    assert cli("schema", "delete", "files").code == 0
    again = cli("schema", "set", "files", write(tmp_path, "v2.avsc", V2))
    assert again.out.strip() == "files: value schema version 2 registered (AVRO, BACKWARD)"
