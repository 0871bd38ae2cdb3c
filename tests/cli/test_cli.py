"""The ``equeue`` command-line tool against a real broker process.

One broker (``equeue_broker.testing.BrokerProcess``) serves the module; commands run
in-process through ``main([...])`` with capsys, and a few through the installed
``equeue`` console script and ``python -m equeue_spark.cli``. Every test uses
its own topic and group names, so the order of the tests does not matter.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_spark.cli import format_table, main
from equeue_spark.client import Admin, Consumer, Producer
from tests.support.cli import Cli, Result, in_process_cli

EQUEUE_SCRIPT = Path(sys.executable).parent / "equeue"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``HOST:PORT`` of a broker process shared by the module's tests; it must
    shut down cleanly (exit 0) at the end."""
    process = BrokerProcess(tmp_path_factory.mktemp("cli-broker") / "data")
    process.start()
    try:
        yield process.address
    finally:
        code = process.stop()
    assert code == 0, process.log_tail()


@pytest.fixture
def cli(broker: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run ``equeue --broker <broker> ARGS`` in-process; its exit code and output."""
    return in_process_cli(broker, capsys)


def _script(broker: str, *args: str, stdin: bytes | None = None) -> Result:
    """Run the installed ``equeue`` console script."""
    done = subprocess.run(
        [str(EQUEUE_SCRIPT), "--broker", broker, *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return Result(done.returncode, done.stdout.decode(), done.stderr.decode())


def _pairs(out: str) -> dict[str, str]:
    """``label  value`` lines (labels may contain single spaces) as a dict."""
    return dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


# ---------------------------------------------------------------------------------
# topics
# ---------------------------------------------------------------------------------


def test_topics_lifecycle(cli: Cli) -> None:
    created = cli("topics", "create", "cli-topics", "--queues", "2")
    assert created.code == 0, created.err
    assert "created topic cli-topics with 2 queues" in created.out
    assert "QUEUE  EARLIEST  END  MIN COMMITTED  BACKLOG  PRODUCER  CONSUMER" in created.out

    listed = cli("topics", "list", "--json").json()["topics"]
    mine = [t for t in listed if t["name"] == "cli-topics"]
    assert len(mine) == 1 and len(mine[0]["queues"]) == 2
    table = cli("topics", "list")
    assert table.out.splitlines()[0].split() == [
        "TOPIC",
        "QUEUES",
        "MESSAGES",
        "BACKLOG",
        "CREATED",
    ]
    assert any(line.split()[:4] == ["cli-topics", "2", "0", "0"] for line in table.out.splitlines())

    described = cli("topics", "describe", "cli-topics")
    assert described.code == 0
    rows = [line.split() for line in described.out.splitlines()[2:]]
    assert rows == [
        ["0", "0", "0", "-", "0", "yes", "yes"],
        ["1", "0", "0", "-", "0", "yes", "yes"],
    ]

    incarnation = cli("topics", "describe", "cli-topics", "--json").json()["incarnation"]
    assert isinstance(incarnation, int) and incarnation > 0
    assert described.out.splitlines()[0].endswith(f"  incarnation {incarnation}")

    info = cli("topics", "add-queue", "cli-topics", "--count", "2", "--json").json()
    assert [q["queue_id"] for q in info["queues"]] == [0, 1, 2, 3]

    hidden = cli("topics", "set-visibility", "cli-topics", "3", "--producer", "off", "--json")
    queue3 = hidden.json()["queues"][3]
    assert (queue3["producer_visible"], queue3["consumer_visible"]) == (False, True)
    # A queue consumers still see cannot be deleted.
    refused = cli("topics", "delete-queue", "cli-topics", "3")
    assert refused.code == 1 and refused.err.startswith("equeue: ")
    assert "FAILED_PRECONDITION" in refused.err
    cli("topics", "set-visibility", "cli-topics", "3", "--consumer", "off")
    after = cli("topics", "delete-queue", "cli-topics", "3", "--json").json()
    assert [q["queue_id"] for q in after["queues"]] == [0, 1, 2]

    deleted = cli("topics", "delete", "cli-topics")
    assert (deleted.code, deleted.out) == (0, "deleted topic cli-topics\n")
    assert "cli-topics" not in [t["name"] for t in cli("topics", "list", "--json").json()["topics"]]
    gone = cli("topics", "describe", "cli-topics")
    assert gone.code == 1 and "NOT_FOUND" in gone.err


# ---------------------------------------------------------------------------------
# produce and consume
# ---------------------------------------------------------------------------------


def test_produce_stdin_through_console_script(broker: str, cli: Cli) -> None:
    assert EQUEUE_SCRIPT.exists(), "pip install -e . installs the equeue console script"
    cli("topics", "create", "cli-stdin", "--queues", "2")
    sent = _script(
        broker, "produce", "cli-stdin", "--queue", "1", "--json", stdin=b"one\ntwo\r\n\nfour"
    )
    assert sent.code == 0, sent.err
    summary = json.loads(sent.out)
    assert summary["messages"] == 4
    assert summary["queues"] == [{"queue_id": 1, "messages": 4}]
    assert summary["first_message_id"] != summary["last_message_id"]

    consumed = cli("consume", "cli-stdin", "--max", "4", "--json").json_lines()
    assert [m["value"] for m in consumed] == ["one", "two", "", "four"]
    assert [(m["queue_id"], m["offset"]) for m in consumed] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert consumed[0]["message_id"] == summary["first_message_id"]
    assert consumed[-1]["message_id"] == summary["last_message_id"]

    # The script's human output, and the common options after the command.
    table = _script(broker, "topics", "describe", "cli-stdin", "--timeout-s", "5")
    assert table.code == 0, table.err
    assert [line.split()[:3] for line in table.out.splitlines()[2:]] == [
        ["0", "0", "0"],
        ["1", "0", "4"],
    ]


def test_produce_file_with_key_tag_and_progress(cli: Cli, tmp_path: Path) -> None:
    count = 2500  # three batches of at most 1000
    path = _write_lines(tmp_path / "in.txt", [f"line-{i}" for i in range(count)])
    cli("topics", "create", "cli-file", "--queues", "4")
    sent = cli(
        "produce", "cli-file", "--file", str(path), "--key", "user-7", "--tag", "red",
        "--progress", "--json",
    )  # fmt: skip
    summary = sent.json()
    assert summary["messages"] == count
    assert len(summary["queues"]) == 1  # one key: one queue
    queue_id = summary["queues"][0]["queue_id"]
    assert "\r[" in sent.err and "100.0%" in sent.err and f"{count:,} messages" in sent.err

    consumed = cli("consume", "cli-file", "--max", str(count), "--json").json_lines()
    assert [m["value"] for m in consumed] == [f"line-{i}" for i in range(count)]
    assert [m["offset"] for m in consumed] == list(range(count))
    assert {(m["queue_id"], m["key"], m["tag"]) for m in consumed} == {(queue_id, "user-7", "red")}

    human = cli("consume", "cli-file", "--max", "2")
    assert human.out.splitlines() == [
        f"queue={queue_id} offset=0 key=user-7 tag=red value=line-0",
        f"queue={queue_id} offset=1 key=user-7 tag=red value=line-1",
    ]
    assert human.err == "consumed 2 message(s)\n"
    # Tag filters: nothing is tagged blue.
    none = cli("consume", "cli-file", "--tags", "blue|green", "--timeout", "0")
    assert (none.code, none.out) == (0, "")

    text = cli("produce", "cli-file", "--file", str(path), "--queue", "0", "--no-progress")
    assert text.err == ""
    pairs = _pairs(text.out)
    assert pairs["messages"] == str(count) and pairs["queues"] == f"0 ({count})"


def test_consume_escapes_undecodable_bytes(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "bytes.txt"
    path.write_bytes(b"caf\xc3\xa9\n\xff\xfeok\n")
    cli("produce", "cli-bytes", "--file", str(path), "--queue", "0")  # auto-created topic
    human = cli("consume", "cli-bytes", "--max", "2")
    assert human.out.splitlines() == [
        "queue=0 offset=0 value=café",
        "queue=0 offset=1 value=\\xff\\xfeok",
    ]
    lines = cli("consume", "cli-bytes", "--max", "2", "--json").json_lines()
    assert [m["value"] for m in lines] == ["café", {"base64": "//5vaw=="}]  # b"\xff\xfeok"


def test_json_bytes_are_text_or_marked_base64(cli: Cli, broker: str) -> None:
    """``--json`` keeps bytes unambiguous: the text b"\\xff" (4 characters)
    and the byte b"\xff" used to print alike; now only valid UTF-8 is a string."""
    with Producer(broker) as producer:
        results = producer.send_batch(
            "cli-json-bytes",
            [b"\\xff", b"\xff", b'{"base64": "x"}'],
            keys=[b"k\x00\xfe", b"plain", None],
            headers=[[("h", b"\x80")], [("h", b"text")], []],
            queue_ids=[0, 0, 0],
        )
    lines = cli("consume", "cli-json-bytes", "--max", "3", "--json").json_lines()
    assert [m["value"] for m in lines] == ["\\xff", {"base64": "/w=="}, '{"base64": "x"}']
    assert [m["key"] for m in lines] == [{"base64": "awD+"}, "plain", None]
    assert [m["headers"] for m in lines] == [[["h", {"base64": "gA=="}]], [["h", "text"]], []]
    got = cli("message", "get", results[1].message_id, "--json").json()
    assert (got["value"], got["key"]) == ({"base64": "/w=="}, "plain")


def test_consume_with_group_commits_and_reset(cli: Cli, tmp_path: Path) -> None:
    count = 10
    path = _write_lines(tmp_path / "g.txt", [f"m{i}" for i in range(count)])
    cli("topics", "create", "cli-group", "--queues", "2")
    assert cli("produce", "cli-group", "--file", str(path)).code == 0
    member = ["--group", "cli-g", "--consumer-id", "cli-test-member"]

    first = cli("consume", "cli-group", *member, "--max", "3", "--json").json_lines()
    assert len(first) == 3
    partial = cli("groups", "describe", "cli-g", "--json").json()
    assert partial["total_lag"] == count - 3  # only the printed messages were committed

    rest = cli("consume", "cli-group", *member, "--max", str(count - 3), "--json").json_lines()
    seen = sorted(m["value"] for m in first + rest)
    assert seen == sorted(f"m{i}" for i in range(count))

    info = cli("groups", "describe", "cli-g", "--json").json()
    assert info["total_lag"] == 0
    assert {(q["topic"], q["lag"]) for q in info["queues"]} == {("cli-group", 0)}
    assert info["consumer_ids"] == []  # each consume run leaves the group when it ends
    human = cli("groups", "describe", "cli-g")
    assert human.out.splitlines()[1].split() == [
        "TOPIC",
        "QUEUE",
        "COMMITTED",
        "END",
        "LAG",
        "LAG_S",
        "CONSUMER",
    ]
    assert "total lag       0" in human.out
    assert "max lag (s)     0.0" in human.out
    listed = cli("groups", "list", "--json").json()["groups"]
    assert {"group": "cli-g", "topics": ["cli-group"], "total_lag": 0, "consumers": 0} in listed

    reset = cli("groups", "reset", "cli-g", "--topic", "cli-group", "--to-earliest", "--json")
    assert reset.json()["total_lag"] == count
    again = cli("consume", "cli-group", *member, "--max", str(count), "--json").json_lines()
    assert len(again) == count

    offsets = cli("groups", "reset", "cli-g", "--topic", "cli-group", "--to-offset", "0=0", "1=0")
    assert offsets.code == 0 and "total lag       10" in offsets.out
    latest = cli("groups", "reset", "cli-g", "--topic", "cli-group", "--to-latest", "--json")
    assert latest.json()["total_lag"] == 0

    deleted = cli("groups", "delete", "cli-g")
    assert (deleted.code, deleted.out) == (0, "deleted group cli-g\n")
    gone = cli("groups", "describe", "cli-g")
    assert gone.code == 1 and "NOT_FOUND" in gone.err


def test_groups_reset_and_delete_refuse_live_members_without_force(cli: Cli, broker: str) -> None:
    with Producer(broker) as producer:
        producer.send_batch("cli-live", [b"a", b"b"], queue_ids=[0, 0])
    with Admin(broker) as admin:  # committed progress, so the group exists to delete
        admin.commit_offsets("cli-live-g", {("cli-live", 0): 1})
    with Consumer(broker, group="cli-live-g", topics=["cli-live"], consumer_id="member-1"):
        reset = ("groups", "reset", "cli-live-g", "--topic", "cli-live", "--to-earliest")
        refused = cli(*reset)
        assert refused.code == 1 and refused.out == ""
        assert "group cli-live-g has 1 live member (member-1)" in refused.err
        assert "--force" in refused.err and "Traceback" not in refused.err
        forced = cli(*reset, "--force")
        # --force skips the CLI's check; a broker that fences queues its live
        # members hold may still refuse, with its own FAILED_PRECONDITION.
        assert forced.code == 0 or "FAILED_PRECONDITION" in forced.err, forced.err
        assert "--force" not in forced.err
        refused = cli("groups", "delete", "cli-live-g")
        assert refused.code == 1 and "1 live member" in refused.err and "--force" in refused.err
        forced = cli("groups", "delete", "cli-live-g", "--force")
        assert (forced.code, forced.out) == (0, "deleted group cli-live-g\n")
    # No members: no --force needed (a group never seen by the broker either)
    assert cli("groups", "reset", "never-seen", "--topic", "cli-live", "--to-latest").code == 0


def test_consume_timeout_and_start_positions(cli: Cli, tmp_path: Path) -> None:
    cli("topics", "create", "cli-empty", "--queues", "3")
    began = time.monotonic()
    empty = cli("consume", "cli-empty", "--timeout", "0")
    assert (empty.code, empty.out, empty.err) == (0, "", "consumed 0 message(s)\n")
    idle = cli("consume", "cli-empty", "--max", "1", "--timeout", "0.3")
    assert (idle.code, idle.out) == (0, "")
    assert time.monotonic() - began < 10

    cli("produce", "cli-empty", "--file", str(_write_lines(tmp_path / "e.txt", ["a", "b"])))
    assert cli("consume", "cli-empty", "--from", "latest", "--timeout", "0").out == ""
    assert (
        len(cli("consume", "cli-empty", "--from", "earliest", "--timeout", "0").out.splitlines())
        == 2
    )


# ---------------------------------------------------------------------------------
# message, stats
# ---------------------------------------------------------------------------------


def test_message_get_by_id_and_address(cli: Cli, tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "msg.txt", ["alpha", "beta"])
    summary = cli(
        "produce", "cli-msg", "--file", str(path), "--queue", "0", "--key", "k1", "--json"
    ).json()
    by_id = cli("message", "get", summary["last_message_id"], "--json").json()
    assert (by_id["value"], by_id["key"], by_id["offset"], by_id["queue_id"]) == (
        "beta",
        "k1",
        1,
        0,
    )
    assert by_id["message_id"] == summary["last_message_id"]

    by_address = cli("message", "get", "--topic", "cli-msg", "--queue", "0", "--offset", "0")
    assert by_address.code == 0
    fields = _pairs(by_address.out)
    assert fields["message id"] == summary["first_message_id"]
    assert (fields["value"], fields["key"], fields["tag"]) == ("alpha", "k1", "-")

    raw = cli("message", "get", summary["first_message_id"], "--raw")
    assert raw.out == "alpha"

    missing = cli("message", "get", "--topic", "cli-msg", "--queue", "0", "--offset", "99")
    assert missing.code == 1 and "NOT_FOUND" in missing.err
    malformed = cli("message", "get", "not-an-id")
    assert malformed.code == 1 and "not-an-id" in malformed.err
    both = cli("message", "get", summary["first_message_id"], "--topic", "cli-msg")
    assert both.code == 2


def test_stats(cli: Cli) -> None:
    cli("topics", "create", "cli-stats")
    stats = cli("stats", "--json").json()
    assert set(stats) >= {"broker_id", "topics", "queues", "groups", "total_backlog", "chunk_count",
                          "bytes_on_disk", "produce_rate", "consume_rate", "produced_total",
                          "consumed_total", "flush_mode", "uptime_s"}  # fmt: skip
    assert isinstance(stats["broker_id"], str) and stats["broker_id"]
    assert stats["topics"] >= 1 and stats["queues"] >= stats["topics"]
    assert isinstance(stats["bytes_on_disk"], int) and stats["bytes_on_disk"] > 0
    assert stats["flush_mode"] == "async" and stats["uptime_s"] > 0
    human = cli("stats")
    assert human.out.startswith(f"broker id       {stats['broker_id']}\n")
    assert "flush mode      async" in human.out


def test_produce_is_idempotent_unless_told_not_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--no-idempotence`` asks the broker for no producer id; the default does
    (``stats``: idempotent producers remembered)."""
    with BrokerProcess(tmp_path / "data") as own:
        address = own.address
        path = _write_lines(tmp_path / "in.txt", ["a", "b", "c"])

        def run(*args: str) -> str:
            assert main(["--broker", address, *args]) == 0
            return capsys.readouterr().out

        run("topics", "create", "idem", "--queues", "2")
        run("produce", "idem", "--file", str(path), "--no-idempotence")
        assert json.loads(run("stats", "--json"))["idempotent_producers"] == 0
        run("produce", "idem", "--file", str(path))
        assert json.loads(run("stats", "--json"))["idempotent_producers"] == 1
        assert "producer ids    1\n" in run("stats")


def test_transactions_list_and_abort(cli: Cli, broker: str) -> None:
    with Producer(broker) as producer:
        producer.send_batch("cli-tx", [b"a", b"b"], queue_ids=[0, 1], transaction_id="cli:job:0")
        producer.send_batch("cli-tx", [b"c"], queue_ids=[0], transaction_id="cli:job:1")
    listing = cli("transactions", "list", "--prefix", "cli:", "--json").json()
    assert [(t["transaction_id"], t["messages"]) for t in listing["transactions"]] == [
        ("cli:job:0", 2),
        ("cli:job:1", 1),
    ]
    human = cli("transactions", "list", "--prefix", "cli:").out
    assert "cli:job:0" in human and "cli-tx/0, cli-tx/1" in human
    assert cli("stats").out.count("2 open") == 1
    assert cli("transactions", "abort", "cli:job:0").out == "aborted 1 transaction\n"
    assert cli("transactions", "abort", "--prefix", "cli:", "--json").json() == {"aborted": 1}
    assert cli("transactions", "list", "--prefix", "cli:").out == "no open transactions\n"
    assert cli("transactions", "abort").code == 2


# ---------------------------------------------------------------------------------
# Errors, entry points, formatting
# ---------------------------------------------------------------------------------


def test_broker_errors_exit_1_without_traceback(cli: Cli) -> None:
    bad = cli("topics", "create", "../x")
    assert bad.code == 1
    assert bad.err.startswith("equeue: ") and "'../x'" in bad.err and "INVALID_ARGUMENT" in bad.err
    assert "Traceback" not in bad.err and bad.out == ""

    unknown = cli("topics", "describe", "cli-no-such-topic")
    assert unknown.code == 1
    assert unknown.err == "equeue: topic 'cli-no-such-topic' does not exist (NOT_FOUND)\n"
    assert cli("consume", "cli-no-such-topic").code == 1

    cli("topics", "create", "cli-hidden", "--queues", "2")
    cli("topics", "set-visibility", "cli-hidden", "1", "--producer", "off")
    refused = cli("produce", "cli-hidden", "--queue", "1", "--file", __file__)
    assert refused.code == 1 and "0 message(s) were sent before the error" in refused.err


def test_unreachable_broker_fails_fast(capsys: pytest.CaptureFixture[str]) -> None:
    began = time.monotonic()
    code = main(["topics", "list", "--broker", "127.0.0.1:1", "--timeout-s", "1"])
    elapsed = time.monotonic() - began
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.startswith("equeue: ") and "UNAVAILABLE" in err
    assert elapsed < 5


def test_usage_errors_exit_2(cli: Cli) -> None:
    assert cli("consume", "t", "--from", "group").code == 2  # needs --group
    assert cli("groups", "reset", "g", "--topic", "t").code == 2  # needs a target
    assert cli("topics", "set-visibility", "t", "0").code == 2  # needs a side
    assert cli("topics", "set-visibility", "t", "0", "--producer", "maybe").code == 2
    assert cli("groups", "reset", "g", "--topic", "t", "--to-offset", "0:5").code == 2
    assert cli("topics", "create", "t", "--queues", "0").code == 2
    assert cli("frobnicate").code == 2
    helped = cli("consume", "--help")
    assert helped.code == 0 and "--timeout SECONDS" in helped.out


def test_broker_from_environment(
    broker: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EQUEUE_BROKER", broker)
    assert main(["stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["broker_id"]


def test_module_entry_point_without_pyspark() -> None:
    code = (
        "import runpy, sys\n"
        "sys.argv = ['equeue', '--version']\n"
        "try:\n"
        "    runpy.run_module('equeue_spark.cli', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "assert 'pyspark' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().startswith("equeue ")


def test_format_table_aligns_columns() -> None:
    table = format_table(
        ("NAME", "N", "FLAG"), [("a", 1, True), ("long-name", 100, False), ("b", None, None)]
    )
    assert table.splitlines() == [
        "NAME         N  FLAG",
        "a            1  yes",
        "long-name  100  no",
        "b            -  -",
    ]
