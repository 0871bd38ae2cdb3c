"""Reads filtered by an expression (``Reads.read_records(selector=...)``):
exactly the records for which it is TRUE, within the read's limits, never
stalling, across chunks, with transactions' records as a reply carries them."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from equeue_broker.storage import Store
from equeue_broker.storage.log.record import MessageBatch
from equeue_broker.storage.read_filters import FREE_COST, SELECT_RUN_BYTES, scan_limit
from equeue_proto.record import StoredMessage
from equeue_proto.selection import select_frames
from equeue_proto.selector import Selector, parse
from equeue_spark.client.records import Message, decode_records

OpenStore = Callable[..., Store]
T = "t"


class _Stored:
    """A decoded message as an expression reads it (the brute-force side)."""

    def __init__(self, m: Message | StoredMessage) -> None:
        self.m = m

    def tag(self) -> bytes | None:
        return self.m.tag.encode() or None

    def key(self) -> bytes | None:
        return self.m.key

    def header(self, name: str) -> bytes | None:
        found = None
        for k, v in self.m.headers:
            if k == name:
                found = v
        return found

    def producer_ms(self) -> int:
        return (
            self.m.producer_timestamp_ms
            if isinstance(self.m, StoredMessage)
            else self.m.timestamp_ms
        )

    def store_ms(self) -> int:
        return self.m.store_timestamp_ms


def _fill(store: Store, count: int, seed: int = 3) -> None:
    rnd = random.Random(seed)
    store.create_topic(T, 1)
    for start in range(0, count, 250):
        n = min(250, count - start)
        values = [b"v" * rnd.randint(1, 300) for _ in range(n)]
        tags = [rnd.choice(["a", "b", ""]) for _ in range(n)]
        keys = [rnd.choice([None, b"k1", b"k2"]) for _ in range(n)]
        headers = [
            [("region", rnd.choice([b"eu", b"us"])), ("amount", str(rnd.randint(0, 200)).encode())]
            for _ in range(n)
        ]
        store.append(T, 0, MessageBatch(values, keys, tags, headers))


def _read_all(store: Store, selector: Selector, max_messages: int, max_bytes: int) -> list[Message]:
    got: list[Message] = []
    offset, end = 0, store.queue_info(T, 0).end
    while offset < end:
        result = store.reads.read_records(
            T, 0, offset, max_messages=max_messages, max_bytes=max_bytes, selector=selector
        )
        batch = decode_records(result.records, "b")
        assert len(batch) == result.count <= max_messages
        assert result.count <= 1 or result.nbytes <= max_bytes
        assert result.next_offset > offset  # never stalls
        if batch:
            assert result.next_offset > batch[-1].offset
        got += batch
        offset = result.next_offset
    return got


@pytest.mark.parametrize(
    "expression",
    [
        "region = 'eu' AND amount > 100",
        "tag = 'a' AND amount < 20",  # the tag prefilter path
        "tag IN ('a', 'b') AND key = 'k1'",
        "amount BETWEEN 10 AND 12 OR key IS NULL AND region <> 'eu'",
        "TRUE",
        "FALSE",
    ],
)
@pytest.mark.parametrize(("max_messages", "max_bytes"), [(1000, 1 << 20), (7, 1 << 20), (50, 900)])
def test_filtered_reads_return_exactly_the_passing_records(
    open_store: OpenStore, expression: str, max_messages: int, max_bytes: int
) -> None:
    store = open_store()
    _fill(store, 3000)  # many 64 KiB chunks (tests/conftest.py)
    selector = parse(expression)
    everything = store.read(T, 0, 0, max_messages=10_000).messages
    want = [m.queue_offset for m in everything if selector.matches(_Stored(m))]
    got = _read_all(store, selector, max_messages, max_bytes)
    assert [m.offset for m in got] == want
    assert all(selector.matches(_Stored(m)) for m in got)


def test_a_filtered_read_inspects_at_most_max_filter_scan(
    open_store: OpenStore, make_config: Callable[..., object]
) -> None:
    store = open_store(make_config(max_filter_scan=500))
    _fill(store, 2000)
    result = store.reads.read_records(T, 0, 0, selector=parse("region = 'nowhere'"))
    assert (result.count, result.next_offset) == (0, 500)
    prefiltered = store.reads.read_records(T, 0, 0, selector=parse("tag = 'none' AND x = 1"))
    assert (prefiltered.count, prefiltered.next_offset) == (0, 500)


def test_until_bounds_a_filtered_read(open_store: OpenStore) -> None:
    store = open_store()
    _fill(store, 1000)
    result = store.reads.read_records(T, 0, 100, selector=parse("TRUE"), until=130)
    assert [m.offset for m in decode_records(result.records, "b")] == list(range(100, 130))
    assert result.next_offset == 130
    tagged = store.reads.read_records(T, 0, 0, tags=["a"], until=40)
    assert all(m.offset < 40 for m in decode_records(tagged.records, "b"))
    assert tagged.next_offset <= 40


def test_transactions_records_are_filtered_as_served(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic(T, 1)
    staged = MessageBatch([b"s0", b"s1"], tags=["x", "y"], headers=[[("n", b"0")], [("n", b"1")]])
    store.transactions.stage("tx", T, [(0, staged)])
    staged_ms = int(time.time() * 1000)
    while int(time.time() * 1000) <= staged_ms + 1:  # bounded: the clock moves on
        time.sleep(0.001)
    store.append(T, 0, MessageBatch([b"p0"], tags=["x"], headers=[[("n", b"2")]]))
    store.transactions.commit([("tx", 2)])
    served = {m.value: m for m in store.read(T, 0, 0).messages}
    committed_ms = served[b"s0"].store_timestamp_ms
    assert committed_ms > staged_ms
    for text in (
        f"storeTimestamp = {committed_ms}",
        f"tag = 'x' AND storeTimestamp = {committed_ms}",
    ):
        result = store.reads.read_records(T, 0, 0, selector=parse(text))
        got = decode_records(result.records, "b")
        assert b"s0" in [m.value for m in got], text
        assert all(m.store_timestamp_ms == committed_ms for m in got)
    result = store.reads.read_records(T, 0, 0, selector=parse("n IN (0, 1)"))
    assert [(m.offset, m.value) for m in decode_records(result.records, "b")] == [
        (1, b"s0"),
        (2, b"s1"),
    ]


# -- regressions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression", ["n >= 0", "n = 39", "tag = 'a' AND n >= 0", "tag IN ('a', 'b') AND n < 5"]
)
@pytest.mark.parametrize("max_messages", [1000, 5])
def test_a_filtered_read_across_sealed_chunks_with_one_mapped_chunk(
    open_store: OpenStore, make_config: Callable[..., object], expression: str, max_messages: int
) -> None:
    """No view of one chunk outlives its run while the next chunk is mapped (the
    only mapped chunk is unmapped then: a lingering view raised BufferError)."""
    store = open_store(make_config(max_mapped_chunks=1))
    store.create_topic(T, 1)
    for i in range(40):  # 400 records of ~1 KiB: several sealed 64 KiB chunks
        store.append(T, 0, MessageBatch([b"x" * 1000] * 10, [None] * 10, ["a"] * 10,
                                        [[("n", str(i).encode())]] * 10))  # fmt: skip
    selector = parse(expression)
    want = [
        m.queue_offset
        for m in store.read(T, 0, 0, max_messages=1000).messages
        if selector.matches(_Stored(m))
    ]
    got = _read_all(store, selector, max_messages, 64 << 20)
    assert [m.offset for m in got] == want


def test_a_tag_conjunct_is_checked_in_c_run_by_run(
    open_store: OpenStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tag = ...`` in an expression no longer sends each record through
    ``select_frames`` alone (a Python step per record under the engine lock)."""
    from equeue_broker.storage import reads

    calls: list[int] = []

    def counted(selector: Selector, view: object, max_frames: int) -> object:
        calls.append(max_frames)
        return select_frames(selector, view, max_frames)  # type: ignore[arg-type]

    monkeypatch.setattr(reads, "select_frames", counted)
    store = open_store()
    _fill(store, 1000)
    selector = parse("tag = 'a' AND amount < 100")
    result = store.reads.read_records(T, 0, 0, max_messages=10_000, selector=selector)
    assert result.next_offset == 1000
    want = [m.queue_offset for m in store.read(T, 0, 0, max_messages=10_000).messages
            if selector.matches(_Stored(m))]  # fmt: skip
    assert [m.offset for m in decode_records(result.records, "b")] == want
    assert len(calls) < 100  # a call per run of adjacent records, not one per record


def test_a_costly_expression_scans_proportionally_fewer_entries(
    open_store: OpenStore, make_config: Callable[..., object]
) -> None:
    """``keys IN`` a long list compares each of a record's keys: its scan is cut so
    one read's work under the engine lock stays bounded."""
    store = open_store(make_config(max_filter_scan=10_000))
    _fill(store, 3000)
    cheap = parse("region = 'nowhere'")
    costly = parse("keys IN (" + ", ".join(f"'id{i}'" for i in range(450)) + ")")
    assert cheap.cost <= FREE_COST < costly.cost
    assert store.reads.read_records(T, 0, 0, selector=cheap).next_offset == 3000
    limit = scan_limit(10_000, costly)
    assert limit == 10_000 * FREE_COST // costly.cost < 3000
    result = store.reads.read_records(T, 0, 0, selector=costly)
    assert (result.count, result.next_offset) == (0, limit)


def test_a_filtered_read_patches_transactions_records_a_bounded_run_at_a_time(
    open_store: OpenStore, make_config: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction's records are copied to be patched with their commit offsets
    before the expression sees them: at most SELECT_RUN_BYTES at a time, not a
    whole chunk's run whatever the read's max_bytes."""
    from equeue_broker.storage import reads

    sizes: list[int] = []
    real = reads._served

    def measured(piece: object, entries: bytes, first_offset: int) -> object:
        sizes.append(len(piece))  # type: ignore[arg-type]
        return real(piece, entries, first_offset)  # type: ignore[arg-type]

    store = open_store(make_config(chunk_capacity_bytes=64 << 20))
    store.create_topic(T, 1)
    value = b"z" * 10_000
    for i in range(3):  # 3 transactions of 200 x 10 KB: one 6 MB run in one chunk
        staged = MessageBatch([value] * 200, headers=[[("n", b"1")]] * 200)
        store.transactions.stage(f"tx{i}", T, [(0, staged)])
        store.transactions.commit([(f"tx{i}", 200)])
    monkeypatch.setattr(reads, "_served", measured)
    result = store.reads.read_records(T, 0, 0, selector=parse("n = 'never'"), max_bytes=1000)
    assert (result.count, result.next_offset) == (0, 600)
    assert sizes and max(sizes) <= SELECT_RUN_BYTES + 11_000
    passing = store.reads.read_records(T, 0, 0, selector=parse("n = 1"), max_messages=1000,
                                       max_bytes=64 << 20)  # fmt: skip
    assert [m.offset for m in decode_records(passing.records, "b")] == list(range(600))


@pytest.mark.parametrize("tags", [["a"], ["a", "b"], [""], ["", "a"], ["none"]])
@pytest.mark.parametrize("expression", [None, "amount < 100", "tag = 'a' OR region = 'eu'"])
def test_tags_alone_or_with_an_expression_read_exactly_their_records(
    open_store: OpenStore, tags: list[str], expression: str | None
) -> None:
    """``tags`` runs through C as ``tag IN (...)`` (with the expression, if any);
    the empty tag, which an untagged record has, by the index's tag hashes."""
    store = open_store()
    _fill(store, 2000)
    selector = None if expression is None else parse(expression)
    want = [
        m.queue_offset
        for m in store.read(T, 0, 0, max_messages=10_000).messages
        if m.tag in tags and (selector is None or selector.matches(_Stored(m)))
    ]
    got: list[int] = []
    offset = 0
    while offset < 2000:
        result = store.reads.read_records(
            T, 0, offset, max_messages=7, max_bytes=900, tags=tags, selector=selector
        )
        assert result.next_offset > offset
        got += [m.offset for m in decode_records(result.records, "b")]
        offset = result.next_offset
    assert got == want
