"""Queries by key and by time (``Admin.QueryMessages``) against real broker processes.

1 M keyed messages (keys ``order-<i % 100000>``, 10 each) plus keys chosen so
that their hashes share one slot with ``order-0`` in a broker started with
``--key-index-slots 65536``: a query by key returns exactly that key's
messages, the colliding ones included; again after a SIGKILL and restart (the
index past the checkpoint is derived again) and after the ``keys/`` directory
is deleted (rebuilt from the log). The CLI's ``message query``, the request's
checks, and a two-group cluster whose answers are merged, too.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest

from equeue_broker.storage.keys.keyhash import hash64_joined
from equeue_broker.testing import BrokerProcess, local_cluster
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.cli import main
from equeue_spark.client import Admin, Producer
from equeue_spark.client.errors import NotFoundError, PreconditionError
from tests.support.raw_client import RawClient
from tests.support.waits import wait_for

SLOTS = 65_536
TOTAL = 200_000 if os.environ.get("EQUEUE_PURE_PYTHON") else 1_000_000
"""With ``EQUEUE_PURE_PYTHON=1`` (by hand: make test's pure-Python rerun leaves the
key index to tests/storage/test_key_index.py) the broker indexes in Python, about
30 times slower: it checks the same on a fifth (the C run covers the million)."""
DISTINCT = TOTAL // 10
BATCH = 50_000
TOPIC = "orders"
SAMPLE = 300
COLLIDING = 12


def colliding_keys(topic: str, target: bytes, count: int) -> list[bytes]:
    """``count`` keys whose hash falls in ``target``'s slot (about 65,536 tries each)."""
    prefix = topic.encode() + b"\x00"
    slot = hash64_joined(prefix + target) % SLOTS
    found: list[bytes] = []
    i = 0
    while len(found) < count:
        key = b"c-%d" % i
        if hash64_joined(prefix + key) % SLOTS == slot:
            found.append(key)
        i += 1
    return found


@dataclass
class Sent:
    """What was produced: key -> the values, in send order."""

    by_key: dict[bytes, list[bytes]]

    def expected(self, key: bytes) -> set[bytes]:
        return set(self.by_key.get(key, []))


def produce_million(address: str) -> Sent:
    by_key: dict[bytes, list[bytes]] = {}
    with Producer(address) as producer:
        for start in range(0, TOTAL, BATCH):
            values = [b"%d" % i for i in range(start, start + BATCH)]
            keys = [b"order-%d" % (i % DISTINCT) for i in range(start, start + BATCH)]
            producer.send_batch(TOPIC, values, keys=keys)
        colliding = colliding_keys(TOPIC, b"order-0", COLLIDING)
        values = [b"c%d-%d" % (k, n) for k in range(COLLIDING) for n in range(3)]
        keys = [colliding[k] for k in range(COLLIDING) for _ in range(3)]
        producer.send_batch(TOPIC, values, keys=keys)
    for i, key in enumerate(keys):
        by_key.setdefault(key, []).append(values[i])
    return Sent(by_key)


def million_expected(key: bytes) -> set[bytes]:
    k = int(key.rpartition(b"-")[2])
    return {b"%d" % (k + n * DISTINCT) for n in range(TOTAL // DISTINCT)}


def check_answers(address: str, sample: list[bytes], sent: Sent) -> None:
    with Admin(address) as admin:
        for key in sample:
            got = admin.query_messages(TOPIC, key=key, limit=100)
            want = sent.expected(key) if key in sent.by_key else million_expected(key)
            assert {m.value for m in got} == want, key
            assert len(got) == len(want) and all(m.key == key for m in got)
            stamps = [m.store_timestamp_ms for m in got]
            assert stamps == sorted(stamps, reverse=True)


@pytest.mark.slow  # about 40 s: 1 M messages, two restarts (one rebuilding the index)
@pytest.mark.timeout(600)
def test_million_keyed_messages_across_restart_and_rebuild(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory("--key-index-slots", str(SLOTS))
    with Admin(broker.address) as admin:
        admin.create_topic(TOPIC, queues=4)
    sent = produce_million(broker.address)
    rng = random.Random(28)
    sample = [b"order-%d" % rng.randrange(DISTINCT) for _ in range(SAMPLE)]
    sample += [b"order-0", *sent.by_key]  # the colliding keys share order-0's slot
    check_answers(broker.address, sample, sent)
    # A last batch, then SIGKILL at once (before the next checkpoint, 100 ms, most
    # likely): the index past the last checkpoint is derived again at the restart.
    late = [b"late-%d" % (i % 50) for i in range(5_000)]
    with Producer(broker.address) as producer:
        producer.send_batch(TOPIC, [b"late%d" % i for i in range(5_000)], keys=late)
    broker.kill()
    for i, key in enumerate(late):
        sent.by_key.setdefault(key, []).append(b"late%d" % i)
    sample += sorted(set(late))
    broker.start()
    check_answers(broker.address, sample, sent)
    broker.stop()
    shutil.rmtree(broker.data_dir / "keys")
    broker.start()
    assert "KEY INDEX REBUILT" in broker.log_since_start()
    check_answers(broker.address, sample, sent)


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def small(
    broker_factory: Callable[..., BrokerProcess],
) -> Iterator[tuple[BrokerProcess, list[int]]]:
    """A broker with 30 keyed messages in two rounds; the store time between them."""
    broker = broker_factory("--key-index-slots", "8")
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("q", queues=2)
        producer.send_batch(
            "q", [b"a%d" % i for i in range(15)], keys=[b"k%d" % (i % 3) for i in range(15)]
        )
        first = admin.query_messages("q", limit=1)[0].store_timestamp_ms
        while int(time.time() * 1000) <= first:  # the second round is stored later
            time.sleep(0.001)
        producer.send_batch(
            "q", [b"b%d" % i for i in range(15)], keys=[b"k%d" % (i % 3) for i in range(15)]
        )
        second = admin.query_messages("q", limit=1)[0].store_timestamp_ms
    yield broker, [first, second]


def cli(capsys: pytest.CaptureFixture[str], broker: BrokerProcess, *args: str) -> Result:
    code = main(["--broker", broker.address, "--timeout-s", "10", "message", "query", *args])
    out, err = capsys.readouterr()
    return Result(code, out, err)


@pytest.mark.timeout(120)
def test_cli_message_query(
    small: tuple[BrokerProcess, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    broker, (first, second) = small
    out = cli(capsys, broker, "q", "--key", "k1", "--since", "1h", "--limit", "3")
    assert out.code == 0, out.err
    lines = out.out.splitlines()
    assert len(lines) == 3 and all("key=k1" in line for line in lines)
    assert "more may match: narrow the time range or raise --limit" in out.err
    assert all("value=b" in line for line in lines)  # newest first: the second round
    whole = cli(capsys, broker, "q", "--key", "k1", "--json")
    docs = [json.loads(line) for line in whole.out.splitlines()]
    assert len(docs) == 10 and {d["key"] for d in docs} == {"k1"}
    assert "more may match" not in whole.err
    ranged = cli(
        capsys, broker, "q", "--from", str(first), "--to", str(second), "--json", "--limit", "100"
    )
    values = {json.loads(line)["value"] for line in ranged.out.splitlines()}
    assert values == {f"a{i}" for i in range(15)}
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second / 1000 + 1)) + "Z"
    assert len(cli(capsys, broker, "q", "--key", "k2", "--to", iso).out.splitlines()) == 10
    for bad in (("q", "--since", "1h", "--from", "0"), ("q",), ("q", "--key", "k", "--limit", "0"),
                ("q", "--from", str(second), "--to", str(first))):  # fmt: skip
        result = cli(capsys, broker, *bad)
        assert result.code == 2 and "Traceback" not in result.err, bad
    missing = cli(capsys, broker, "nope", "--key", "k1")
    assert missing.code == 1 and "NOT_FOUND" in missing.err


@pytest.mark.timeout(120)
def test_the_client_says_when_more_may_match(small: tuple[BrokerProcess, list[int]]) -> None:
    broker, _ = small
    with Admin(broker.address) as admin:
        cut = admin.query_messages("q", key="k1", limit=3)
        assert isinstance(cut, list) and len(cut) == 3 and cut.truncated
        whole = admin.query_messages("q", key="k1", limit=100)
        assert len(whole) == 10 and not whole.truncated
        assert admin.query_messages("q", limit=5).truncated
        assert not admin.query_messages("q", limit=100).truncated


@pytest.mark.timeout(120)
def test_request_checks(small: tuple[BrokerProcess, list[int]]) -> None:
    broker, _ = small
    raw = RawClient(broker.address)
    try:
        for request, code in (
            (
                pb.QueryMessagesRequest(topic="q", key=b"k", by_key=True, limit=10_001),
                "INVALID_ARGUMENT",
            ),
            (pb.QueryMessagesRequest(topic="q", start_ms=5, end_ms=5), "INVALID_ARGUMENT"),
            (pb.QueryMessagesRequest(topic="q", start_ms=-1), "INVALID_ARGUMENT"),
            (pb.QueryMessagesRequest(topic="q", key=b"k"), "INVALID_ARGUMENT"),  # by_key unset
            (
                pb.QueryMessagesRequest(topic="q", key=b"k" * (64 * 1024 + 1), by_key=True),
                "INVALID_ARGUMENT",
            ),
            (pb.QueryMessagesRequest(topic="gone", by_key=True, key=b"k"), "NOT_FOUND"),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                raw.admin.QueryMessages(request, timeout=10)
            assert caught.value.code().name == code, request
            assert "Traceback" not in (caught.value.details() or "")
        with pytest.raises(grpc.RpcError, match="start_ms -1 is negative"):
            raw.admin.QueryMessages(pb.QueryMessagesRequest(topic="q", start_ms=-1), timeout=10)
        reply = raw.admin.QueryMessages(pb.QueryMessagesRequest(topic="q"), timeout=10)
        assert len(reply.messages) == 30  # limit 0: the default 32
        assert reply.broker_id and not reply.truncated
        assert "query" in raw.stats().features  # what clients check before asking
    finally:
        raw.close()
    with Admin(broker.address) as admin:
        with pytest.raises(NotFoundError):
            admin.query_messages("gone", key=b"k")
        with pytest.raises(ValueError, match="limit"):
            admin.query_messages("q", key=b"k", limit=0)
        assert len(admin.query_messages("q", key="k0", limit=100)) == 10


@pytest.mark.timeout(120)
def test_key_index_off_refuses_by_key(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory("--no-key-index")
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("q", queues=1)
        producer.send_batch("q", [b"x"], keys=[b"k"])
        with pytest.raises(PreconditionError, match="key-index"):
            admin.query_messages("q", key=b"k")
        assert [m.value for m in admin.query_messages("q")] == [b"x"]
    assert not (broker.data_dir / "keys").exists()


@pytest.mark.slow  # a name server and two brokers
@pytest.mark.timeout(180)
def test_cluster_answers_merged_from_every_group() -> None:
    with (
        local_cluster(namesrvs=1, brokers=("a", "b")) as cluster,
        Admin(namesrv=cluster.namesrv) as admin,
    ):
        admin.create_topic("spread", queues=2)
        # The name server routes the topic to both groups once each registered it.
        wait_for(
            "the topic routed to both groups",
            lambda: sorted(admin.route("spread").broker_names()) == ["a", "b"], 30,
        )  # fmt: skip
        with Producer(namesrv=cluster.namesrv) as producer:
            for i in range(40):  # through the keys header, to both groups
                producer.send_batch(
                    "spread", [b"v%d" % i], headers=[[("keys", b"x same")]],
                    brokers=["a" if i % 2 else "b"],
                )  # fmt: skip
        found = admin.query_messages("spread", key=b"same", limit=100)
        assert {m.value for m in found} == {b"v%d" % i for i in range(40)}
        assert {m.broker_id for m in found} == {"a", "b"}
        stamps = [m.store_timestamp_ms for m in found]
        assert stamps == sorted(stamps, reverse=True)
        assert len(admin.query_messages("spread", key=b"same", limit=7)) == 7
        with pytest.raises(ValueError, match="empty range"):
            admin.query_messages("spread", start=10, end=5)
