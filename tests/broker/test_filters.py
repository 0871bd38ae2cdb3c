"""Filter expressions applied by a real broker process: Pull, PullStream, the
Consumer, the counters that prove what was sent, and the CLI."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from equeue_broker.testing import BrokerProcess
from equeue_proto.message_keys import KEYS_HEADER, encode_keys
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client import Admin, Consumer, InvalidRequest, Message, Producer
from equeue_spark.client.connection import ClientConfig, Connection
from equeue_spark.client.errors import PermissionDeniedError
from equeue_spark.client.filters import UnsupportedFilter
from equeue_spark.client.reader import stream_replies
from equeue_spark.client.records import decode_records

EXPRESSION = "region = 'eu' AND amount > 100"


@pytest.fixture
def stub(broker: BrokerProcess) -> Iterator[pb_grpc.BrokerStub]:
    with grpc.insecure_channel(broker.address) as channel:
        yield pb_grpc.BrokerStub(channel)


def _mixed(
    count: int, seed: int = 7
) -> tuple[list[bytes], list[str], list[list[tuple[str, bytes]]]]:
    """Values, tags and headers of ``count`` messages: regions eu/us/ap (or none),
    amounts 0..200 (some not numbers)."""
    rnd = random.Random(seed)
    values, tags, headers = [], [], []
    for i in range(count):
        row: list[tuple[str, bytes]] = []
        region = rnd.choice(["eu", "us", "ap", None])
        if region is not None:
            row.append(("region", region.encode()))
        amount = rnd.choice([str(rnd.randint(0, 200)), str(rnd.randint(0, 200)), "n/a"])
        row.append(("amount", amount.encode()))
        values.append(f"m{i}".encode())
        tags.append(rnd.choice(["a", "b", ""]))
        headers.append(row)
    return values, tags, headers


def _passes(headers: list[tuple[str, bytes]]) -> bool:
    h = dict(headers)
    amount = h.get("amount", b"").decode()
    return h.get("region") == b"eu" and amount.isdigit() and int(amount) > 100


def _produce(
    address: str, topic: str, count: int, queues: int = 2
) -> list[tuple[str, list[tuple[str, bytes]]]]:
    """Send ``count`` mixed messages round the queues; (tag, headers) by value."""
    values, tags, headers = _mixed(count)
    with Admin(address) as admin, Producer(address) as producer:
        admin.create_topic(topic, queues=queues)
        for start in range(0, count, 1000):
            stop = min(count, start + 1000)
            producer.send_batch(
                topic, values[start:stop], tags=tags[start:stop], headers=headers[start:stop],
                queue_ids=[i % queues for i in range(start, stop)],
            )  # fmt: skip
    return list(zip(tags, headers, strict=True))


def _poll_to_end(
    consumer: Consumer, ends: dict[tuple[str, int], int], budget_s: float
) -> list[Message]:
    """Poll until every queue's position reaches its end (the readiness signal)."""
    got: list[Message] = []
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        got += consumer.poll(timeout_s=0.2)
        positions = consumer.positions()
        if all(positions.get(k, -1) >= end for k, end in ends.items()):
            return got
    raise AssertionError(f"positions {consumer.positions()} did not reach {ends}")


@pytest.mark.timeout(120)
def test_consumer_filter_gets_exactly_the_matching_messages(broker: BrokerProcess) -> None:
    # One queue: a poll over several cancels the pulls still running when one
    # brings messages, and a reply cancelled in flight would count as served.
    sent = _produce(broker.address, "orders", 10_000, queues=1)
    wanted = {f"m{i}".encode() for i, (_tag, headers) in enumerate(sent) if _passes(headers)}
    assert 300 < len(wanted) < 3000  # the mix is mixed
    with Consumer(broker.address, filter=EXPRESSION, max_wait_ms=100) as consumer:
        consumer.assign("orders", [0])
        consumer.seek("orders", 0, 0)
        got = _poll_to_end(consumer, {("orders", 0): 10_000}, 90)
    assert sorted(m.value for m in got) == sorted(wanted)
    assert all(m.header("region") == b"eu" for m in got)
    with Admin(broker.address) as admin:
        stats = admin.stats()
    assert "filter" in stats.features
    assert stats.records_served == len(wanted)
    assert stats.records_filtered == 10_000 - len(wanted)
    filtered = {(q.topic, q.queue_id): q.filtered for q in stats.queue_counters}
    assert sum(filtered.values()) == 10_000 - len(wanted)


@pytest.mark.timeout(300)
def test_selective_filter_advances_without_stalling(
    broker: BrokerProcess, stub: pb_grpc.BrokerStub
) -> None:
    total = 300_000
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("wide", queues=1)
        batch = [b"x"] * 10_000
        noise = [[("kind", b"noise")]] * 10_000
        for _ in range(total // 10_000 - 1):
            producer.send_batch("wide", batch, headers=noise, queue_ids=[0] * 10_000)
        last = [[("kind", b"noise")]] * 9_999 + [[("kind", b"signal")]]
        producer.send_batch("wide", batch, headers=last, queue_ids=[0] * 10_000)
    offset, replies, found = 0, 0, []
    while offset < total:
        reply = stub.Pull(
            pb.PullRequest(topic="wide", queue_id=0, offset=offset, filter="kind = 'signal'"),
            timeout=30,
        )
        replies += 1
        assert reply.next_offset > offset  # never stuck: every reply moves on
        found += [m.offset for m in decode_records(reply.records, reply.broker_id)]
        offset = reply.next_offset
    assert found == [total - 1]
    assert replies >= 3  # bounded by max_filter_scan (100,000) entries a pull


def test_bad_expression_is_invalid_argument_naming_the_position(
    broker: BrokerProcess, stub: pb_grpc.BrokerStub
) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("t", queues=1)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Pull(pb.PullRequest(topic="t", queue_id=0, filter="region = 'eu' AND amount >"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "position 26" in str(caught.value.details())
    with pytest.raises(grpc.RpcError) as streamed:
        list(stub.PullStream(pb.PullStreamRequest(topic="t", queue_id=0, filter="a IN ()")))
    assert streamed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "position 6" in str(streamed.value.details())
    with pytest.raises(InvalidRequest, match="position 14"):
        Consumer(broker.address, filter="amount > 1 AND")


def test_tags_and_filter_together(broker: BrokerProcess, stub: pb_grpc.BrokerStub) -> None:
    sent = _produce(broker.address, "both", 2_000, queues=1)
    expression = "tag = 'a' OR amount < 50"  # no tag prefilter: an OR
    reply = stub.Pull(
        pb.PullRequest(topic="both", queue_id=0, tags=["b"], filter=expression, max_messages=5000),
        timeout=10,
    )
    got = [m.offset for m in decode_records(reply.records, reply.broker_id)]

    def amount(h: list[tuple[str, bytes]]) -> int | None:
        raw = dict(h)["amount"].decode()
        return int(raw) if raw.isdigit() else None

    want = [
        i for i, (tag, h) in enumerate(sent)
        if tag == "b" and (a := amount(h)) is not None and a < 50
    ]  # fmt: skip
    assert got == want and reply.next_offset == 2_000
    # A tag prefilter (tag = 'a' is a top-level conjunct) with a header condition.
    reply = stub.Pull(
        pb.PullRequest(topic="both", queue_id=0, filter="tag = 'a' AND region IS NULL",
                       max_messages=5000),
        timeout=10,
    )  # fmt: skip
    got = [m.offset for m in decode_records(reply.records, reply.broker_id)]
    want = [i for i, (tag, h) in enumerate(sent) if tag == "a" and "region" not in dict(h)]
    assert got == want


def test_pull_stream_with_filter_stops_at_its_end(broker: BrokerProcess) -> None:
    sent = _produce(broker.address, "ranged", 3_000, queues=1)
    with Connection(ClientConfig(broker=broker.address)) as conn:
        replies = list(
            stream_replies(conn, "ranged", 0, 500, 2_500, batch_messages=100, filter=EXPRESSION)
        )
    got = [m.value for r in replies for m in decode_records(r.records, r.broker_id)]
    want = [f"m{i}".encode() for i in range(500, 2_500) if _passes(sent[i][1])]
    assert got == want  # nothing before 500 nor at or past 2,500
    assert replies[-1].next_offset == 2_500


def test_keys_and_timestamps_in_filters(broker: BrokerProcess, stub: pb_grpc.BrokerStub) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("keyed", queues=1)
        producer.send_batch(
            "keyed", [b"0", b"1", b"2", b"3"],
            keys=[b"k0", None, b"\xff", b"k3"],
            headers=[[(KEYS_HEADER, encode_keys(["x", "y"]))], [(KEYS_HEADER, b"y")], [], []],
            timestamps_ms=[1000, 2000, 3000, 4000], queue_ids=[0] * 4,
        )  # fmt: skip

    def values(expression: str) -> list[bytes]:
        reply = stub.Pull(pb.PullRequest(topic="keyed", queue_id=0, filter=expression), timeout=10)
        return [m.value for m in decode_records(reply.records, reply.broker_id)]

    assert values("keys = 'y'") == [b"0", b"1"]
    assert values("KEYS IN ('k3', 'x')") == [b"0", b"3"]
    assert values("key = X'FF'") == [b"2"]
    assert values("key IS NULL") == [b"1"]
    assert values("timestamp BETWEEN 2000 AND 3000") == [b"1", b"2"]
    assert values("storeTimestamp > 0 AND timestamp <> 1000") == [b"1", b"2", b"3"]


@pytest.mark.timeout(60)
def test_cli_consume_filter(broker: BrokerProcess) -> None:
    sent = _produce(broker.address, "cli", 500, queues=1)
    want = [f"m{i}" for i in range(500) if _passes(sent[i][1])]
    base = [sys.executable, "-m", "equeue_spark.cli", "--broker", broker.address]
    done = subprocess.run(
        [*base, "--json", "consume", "cli", "--filter", EXPRESSION, "--max", str(len(want))],
        capture_output=True, text=True, timeout=50, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = [json.loads(line)["value"] for line in done.stdout.splitlines()]
    assert got == want
    bad = subprocess.run(
        [*base, "consume", "cli", "--filter", "amount >"],
        capture_output=True, text=True, timeout=50, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "position 8" in bad.stderr


@pytest.mark.timeout(60)
def test_cli_produce_headers_and_extra_keys(broker: BrokerProcess) -> None:
    base = [sys.executable, "-m", "equeue_spark.cli", "--broker", broker.address]
    with Admin(broker.address) as admin:
        admin.create_topic("cli-keys", queues=1)
    done = subprocess.run(
        [*base, "produce", "cli-keys", "--key", "order-7", "--header", "region=eu",
         "--header", "note=a=b", "--extra-key", "cust-3", "--extra-key", "ref-9"],
        input=b"one\ntwo\n", capture_output=True, timeout=50, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Consumer(broker.address, filter="keys = 'ref-9' AND region = 'eu'") as consumer:
        consumer.assign("cli-keys", [0])
        got = _poll_to_end(consumer, {("cli-keys", 0): 2}, 30)
    assert [m.value for m in got] == [b"one", b"two"]
    assert got[0].headers == (("region", b"eu"), ("note", b"a=b"), (KEYS_HEADER, b"cust-3 ref-9"))
    both = subprocess.run(
        [*base, "produce", "cli-keys", "--header", "keys=x", "--extra-key", "y"],
        input=b"z\n", capture_output=True, timeout=50, check=False,
    )  # fmt: skip
    assert both.returncode == 2 and b"--extra-key" in both.stderr
    spaced = subprocess.run(
        [*base, "produce", "cli-keys", "--extra-key", "a b"],
        input=b"z\n", capture_output=True, timeout=50, check=False,
    )  # fmt: skip
    assert spaced.returncode == 2 and b"holds a space" in spaced.stderr


@pytest.mark.timeout(60)
def test_a_parked_filtered_pull_wakes_for_a_match(
    broker: BrokerProcess, stub: pb_grpc.BrokerStub
) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("parked", queues=1)
        producer.send_batch("parked", [b"old"], headers=[[("kind", b"noise")]], queue_ids=[0])
        request = pb.PullRequest(
            topic="parked", queue_id=0, offset=0, filter="kind = 'signal'", max_wait_ms=50_000
        )
        # It skipped the noise: answered at once with where it got to, not parked
        # (a parked pull that a consumer cancels would lose that progress).
        skipped = stub.Pull(request, timeout=40)
        assert (skipped.records, skipped.next_offset) == (b"", 1)
        request.offset = 1  # nothing to skip: parked until a record comes
        call = stub.Pull.future(request, timeout=60)
        producer.send_batch("parked", [b"new"], headers=[[("kind", b"signal")]], queue_ids=[0])
        reply = call.result(timeout=50)
        stats = admin.stats()
    assert [m.value for m in decode_records(reply.records, reply.broker_id)] == [b"new"]
    assert reply.next_offset == 2
    assert (stats.records_served, stats.records_filtered) == (1, 1)


@pytest.mark.timeout(120)
def test_a_filtered_consumer_passes_a_queue_of_non_matching_records(
    broker: BrokerProcess,
) -> None:
    """Queue 0 holds only records the filter leaves out, queue 1 plenty that
    pass: queue 0's position still reaches its end long before queue 1 is read
    (its pull answered with the offset it scanned to, and a poll that returns
    with queue 1's messages keeps that pull for the next poll, not cancel it)."""
    noise, signal = 20_000, 30_000
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("starve", queues=2)
        for queue, count, n in ((0, noise, b"0"), (1, signal, b"1")):
            for _ in range(count // 10_000):
                producer.send_batch("starve", [b"v"] * 10_000, headers=[[("n", n)]] * 10_000,
                                    queue_ids=[queue] * 10_000)  # fmt: skip
    got = 0
    with Consumer(broker.address, filter="n = 1", max_wait_ms=100, max_messages=10) as consumer:
        consumer.assign("starve", [0, 1])
        consumer.seek("starve", 0, 0)
        consumer.seek("starve", 1, 0)
        deadline = time.monotonic() + 90
        while consumer.positions()[("starve", 0)] < noise:
            assert time.monotonic() < deadline, f"queue 0 stuck at {consumer.positions()}"
            got += len(consumer.poll(timeout_s=0.5))
    assert got < signal  # queue 1 still had messages all along


TOKENS = """
[[tokens]]
name = "ops"
secret = "admin-secret-0123456789"
roles = ["admin", "produce"]

[[tokens]]
name = "reader"
secret = "reader-secret-012345678"
roles = ["consume"]
topics = ["scoped*"]
"""


@pytest.mark.timeout(60)
def test_a_consume_only_token_checks_filters_by_a_probe(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    broker = broker_factory("--tokens-file", str(tokens))
    admin_config = ClientConfig(broker=broker.address, token="admin-secret-0123456789")
    with Admin(config=admin_config) as admin, Producer(config=admin_config) as producer:
        admin.create_topic("scoped-t", queues=1)
        producer.send_batch(
            "scoped-t", [b"a", b"b"], headers=[[("n", b"1")], [("n", b"2")]], queue_ids=[0, 0]
        )
    reader = ClientConfig(broker=broker.address, token="reader-secret-012345678")
    # GetStats needs the admin role: the client asks by a pull with a bad filter instead.
    with Consumer(config=reader, filter="n = 2") as consumer:
        consumer.assign("scoped-t", [0])
        got = _poll_to_end(consumer, {("scoped-t", 0): 2}, 30)
    assert [m.value for m in got] == [b"b"]
    with Admin(config=admin_config) as admin:
        admin.create_topic("other-t", queues=1)
    # The probe pull of a topic the token may not read: that refusal is the error
    # (not "the broker does not apply filters").
    with Consumer(config=reader, filter="n = 2") as consumer, pytest.raises(PermissionDeniedError):
        consumer.assign("other-t", [0])
        consumer.poll(timeout_s=1)


def _old_stats(request: pb.GetStatsRequest, context: object) -> pb.BrokerStats:
    """GetStats as a broker from before filters answers it: no features."""
    return pb.BrokerStats(broker_id="old")


def test_a_broker_without_the_filter_feature_is_refused_before_reading() -> None:
    # No older broker release can run here: a server answering GetStats as one does.
    server = grpc.server(ThreadPoolExecutor(2))
    handler = grpc.unary_unary_rpc_method_handler(
        _old_stats,
        request_deserializer=pb.GetStatsRequest.FromString,
        response_serializer=pb.BrokerStats.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("equeue.v1.Admin", {"GetStats": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with Connection(ClientConfig(broker=f"127.0.0.1:{port}")) as conn:
            with pytest.raises(UnsupportedFilter, match="does not apply filter expressions"):
                next(stream_replies(conn, "t", 0, 0, filter="a = 1"))
            with pytest.raises(InvalidRequest, match="position 3"):
                next(stream_replies(conn, "t", 0, 0, filter="a ="))
    finally:
        server.stop(None)


@pytest.mark.timeout(90)
def test_cli_arguments_that_are_not_utf8(broker: BrokerProcess) -> None:
    """Bytes that are not UTF-8 on the command line: a key or a header value is
    sent as the bytes given (surrogateescape); a header name, a tag or a filter
    is text, so refused with exit 2 and a message, never a traceback."""
    base: list[str | bytes] = [sys.executable, "-m", "equeue_spark.cli", "--broker", broker.address]
    with Admin(broker.address) as admin:
        admin.create_topic("cli-raw", queues=1)
    done = subprocess.run(
        [*base, "produce", "cli-raw", "--key", b"k\xfe", "--header", b"raw=\xff\x01",
         "--extra-key", b"x\xfd"],
        input=b"one\n", capture_output=True, timeout=50, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Consumer(broker.address, filter="raw = X'ff01' AND keys = X'78fd'") as consumer:
        consumer.assign("cli-raw", [0])
        got = _poll_to_end(consumer, {("cli-raw", 0): 1}, 30)
    assert [(m.value, m.key, m.header("raw")) for m in got] == [(b"one", b"k\xfe", b"\xff\x01")]
    refused: list[tuple[list[str | bytes], bytes]] = [
        (["produce", "cli-raw", "--header", b"\xff=1"], b"not valid UTF-8"),
        (["produce", "cli-raw", "--tag", b"t\xff"], b"not valid UTF-8"),
        (["consume", "cli-raw", "--filter", b"a = '\xff'"], b"position 5"),
    ]
    for args, what in refused:
        bad = subprocess.run(
            [*base, *args], input=b"z\n", capture_output=True, timeout=50, check=False
        )
        assert bad.returncode == 2, bad.stderr
        assert what in bad.stderr and b"Traceback" not in bad.stderr


def test_a_filter_not_compiled_yet_is_parsed_off_the_event_loop() -> None:
    """A new expression is parsed on the thread pool (milliseconds for a long
    one); a known one comes from the cache without leaving the event loop."""
    from equeue_broker.server.filters import Selectors

    selectors = Selectors()
    threads: list[str] = []

    async def offload(fn: Callable[..., object], *args: object) -> object:
        def run() -> object:
            threads.append(threading.current_thread().name)
            return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(None, run)

    async def twice() -> tuple[object, object, object]:
        first = await selectors.compiled(EXPRESSION, offload)  # type: ignore[arg-type]
        again = await selectors.compiled(EXPRESSION, offload)  # type: ignore[arg-type]
        return first, again, await selectors.compiled("", offload)  # type: ignore[arg-type]

    first, again, none = asyncio.run(twice())
    assert first is again and none is None
    assert len(threads) == 1 and threads[0] != threading.main_thread().name
