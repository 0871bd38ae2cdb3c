"""The key index (storage/keys/): real stores over real files.

Slots are forced tiny (``slot_count`` 1 to 8) so that nearly every key shares
its hash slot with others: a query must still return exactly its own key's
messages. Visibility (staged, aborted, delayed), window rolls, retention, a
replica's truncation, recovery past the checkpoint, rebuilds from the log,
the file format's checks and the C entry builder against its Python
reference are covered here; tests/broker/test_query_keys.py runs the same
through a broker process.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from equeue_broker.storage import MessageBatch, RetentionConfig, Store
from equeue_broker.storage.config import KeyIndexConfig, StorageConfig
from equeue_broker.storage.errors import NotFound, PreconditionFailed
from equeue_broker.storage.keys import key_index, keyhash, query
from equeue_broker.storage.keys.key_index import (
    ENTRY_SIZE,
    HEADER_SIZE,
    KeyIndexDamaged,
    WindowHeader,
    decode_entry,
    decode_header,
    encode_entry,
    encode_header,
)
from equeue_broker.storage.keys.query import KeyQuery
from equeue_broker.storage.txn.txn_recovery import TxnScan
from equeue_proto.record import decode_record
from tests.conftest import MakeConfig

OpenStore = Callable[..., Store]
T = "t"


def keyed_config(make_config: MakeConfig, **keys: int) -> StorageConfig:
    settings: dict[str, Any] = {"slot_count": 4, "entries_per_file": 1 << 12, **keys}
    return make_config(key_index=KeyIndexConfig(**settings))


def batch(
    keys: Sequence[bytes | None], extra: list[bytes] | None = None, tag: str = "v"
) -> MessageBatch:
    """One message per key; value ``<tag>-<i>``; ``extra``: a keys header for each."""
    headers = None if extra is None else [[("keys", e)] if e else [] for e in extra]
    values = [f"{tag}-{i}".encode() for i in range(len(keys))]
    return MessageBatch(values=values, keys=keys, headers=headers)


def found(keys: KeyQuery, key: bytes, limit: int = 10_000, topic: str = T) -> list[bytes]:
    """The values a query by ``key`` returns, newest first."""
    result = keys.by_key(topic, key, limit=limit)
    return [decode_record(m.record, 0).value for m in result.messages]


def expected(sent: dict[bytes, list[bytes]], key: bytes) -> list[bytes]:
    return list(reversed(sent.get(key, [])))


def produce(store: Store, count: int, distinct: int, rounds: int = 1) -> dict[bytes, list[bytes]]:
    """``rounds`` batches of ``count`` messages over two queues with keys
    ``k<i % distinct>``; key -> values in the order written."""
    sent: dict[bytes, list[bytes]] = {}
    for r in range(rounds):
        keys = [b"k%d" % (i % distinct) for i in range(count)]
        store.append(T, r % 2, batch(keys, tag=f"r{r}"))
        for i, key in enumerate(keys):
            sent.setdefault(key, []).append(f"r{r}-{i}".encode())
    return sent


def assert_answers(store: Store, sent: dict[bytes, list[bytes]]) -> None:
    for key in sent:
        assert found(store.keys, key) == expected(sent, key), key


def test_colliding_keys_return_exactly_their_own(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    store = open_store(keyed_config(make_config, slot_count=1))
    store.create_topic(T, 2)
    sent = produce(store, 200, 100, rounds=3)
    assert_answers(store, sent)
    assert found(store.keys, b"k-none") == []
    assert found(store.keys, b"k1", limit=2) == expected(sent, b"k1")[:2]
    assert store.keys.by_key(T, b"k1", limit=2).truncated


def test_keys_header_and_message_key_both_find_it(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    store = open_store(keyed_config(make_config))
    store.create_topic(T, 1)
    store.append(T, 0, batch([b"own", None, b"x"], [b"a b", b"b  c", b"x x"]))
    assert found(store.keys, b"own") == [b"v-0"]
    assert found(store.keys, b"a") == [b"v-0"]
    assert found(store.keys, b"b") == [b"v-1", b"v-0"]
    assert found(store.keys, b"c") == [b"v-1"]
    assert found(store.keys, b"x") == [b"v-2"]  # a key given twice is one message
    assert found(store.keys, b"") == []  # empty parts of the header are no keys


def test_max_extra_keys_bounds_what_is_indexed(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    store = open_store(keyed_config(make_config, max_extra_keys=2))
    store.create_topic(T, 1)
    store.append(T, 0, batch([None], [b"a b c"]))
    assert (found(store.keys, b"a"), found(store.keys, b"b"), found(store.keys, b"c")) == (
        [b"v-0"], [b"v-0"], [],
    )  # fmt: skip


def test_staged_records_show_once_committed_aborted_never(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    store = open_store(keyed_config(make_config))
    store.create_topic(T, 2)
    store.transactions.stage("live", T, [(0, batch([b"k", b"k"], tag="live"))])
    store.transactions.stage("dead", T, [(1, batch([b"k"], tag="dead"))])
    assert found(store.keys, b"k") == []
    store.transactions.commit([("live", 2)])
    store.transactions.abort(["dead"])
    result = store.keys.by_key(T, b"k")
    assert [decode_record(m.record, 0).value for m in result.messages] == [b"live-1", b"live-0"]
    # Served like a read: with the committed offsets.
    assert sorted(decode_record(m.record, 0).queue_offset for m in result.messages) == [0, 1]


def test_delayed_records_show_once_delivered(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    store = open_store(keyed_config(make_config))
    store.create_topic(T, 1)
    now = int(time.time() * 1000)
    store.append(T, 0, batch([b"d"], tag="later"), deliver_at_ms=[now + 5_000])
    assert found(store.keys, b"d") == []
    while store.delivery.deliver_due(now + 10_000):
        pass
    assert found(store.keys, b"d") == [b"later-0"]


def test_a_recreated_topic_does_not_answer_with_the_old_messages(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    store = open_store(keyed_config(make_config))
    store.create_topic(T, 1)
    store.append(T, 0, batch([b"k"], tag="old"))
    store.topic_admin.delete_topic(T)
    with pytest.raises(NotFound):
        store.keys.by_key(T, b"k")
    store.create_topic(T, 1)
    store.append(T, 0, batch([b"k"], tag="new"))
    assert found(store.keys, b"k") == [b"new-0"]


def test_windows_roll_on_capacity(open_store: OpenStore, make_config: MakeConfig) -> None:
    store = open_store(keyed_config(make_config, entries_per_file=7))
    store.create_topic(T, 2)
    sent = produce(store, 5, 3, rounds=6)  # 30 entries, at most 7 per window
    windows = sorted((store.config.data_dir / "keys").glob("*.kidx"))
    assert len(windows) >= 5
    assert_answers(store, sent)


def test_windows_roll_on_store_time(open_store: OpenStore, make_config: MakeConfig) -> None:
    store = open_store(keyed_config(make_config, window_ms=1))
    store.create_topic(T, 1)
    for i in range(3):
        stamp = int(time.time() * 1000)
        while int(time.time() * 1000) <= stamp + 1:  # the next window: its ms must pass
            pass
        store.append(T, 0, batch([b"k"], tag=f"w{i}"))
    assert len(list((store.config.data_dir / "keys").glob("*.kidx"))) == 3
    assert found(store.keys, b"k") == [b"w2-0", b"w1-0", b"w0-0"]
    # A time range skips the windows after it (and checks each record's time).
    newest = store.keys.by_key(T, b"k").messages[0].store_ms
    older = store.keys.by_key(T, b"k", 0, newest)
    assert [decode_record(m.record, 0).value for m in older.messages] == [b"w1-0", b"w0-0"]


def test_retention_drops_windows_below_the_log_start(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    config = make_config(
        key_index=KeyIndexConfig(slot_count=4, entries_per_file=50),
        retention=RetentionConfig(max_chunks=2, max_age_ms=None),
    )
    store = open_store(config)
    store.create_topic(T, 1)
    for r in range(200):  # about 5 log chunks of 64 KiB
        store.append(T, 0, batch([b"k%d" % (i % 5) for i in range(20)], tag=f"r{r}"))
    before = len(list((config.data_dir / "keys").glob("*.kidx")))
    report = store.apply_retention()
    assert report.log_chunks_deleted > 0
    after = sorted(int(p.stem) for p in (config.data_dir / "keys").glob("*.kidx"))
    assert len(after) < before
    start = store.log_start
    index = store._state.keys
    assert index is not None
    for window in index.windows[1:]:
        assert window.header.end_position > start
    # Every answer is a record still in the log, and every record of k0 still there is found.
    earliest = store.queue_info(T, 0).earliest
    kept = {m.value for m in store.read(T, 0, earliest, max_messages=10_000).messages
            if m.key == b"k0"}  # fmt: skip
    assert set(found(store.keys, b"k0")) == kept


def test_truncate_then_append_again(open_store: OpenStore, make_config: MakeConfig) -> None:
    config = keyed_config(make_config, entries_per_file=16)
    store = open_store(config)
    store.create_topic(T, 1)
    scan = TxnScan(1, {}, False, store.epochs, store.producers)
    store.append(T, 0, batch([b"a", b"b"] * 10, tag="one"))
    cut = store.log_end
    store.append(T, 0, batch([b"a", b"b"] * 10, tag="two"))
    assert len(found(store.keys, b"a")) == 20
    store.truncate(cut, scan)
    assert found(store.keys, b"a") == [f"one-{i}".encode() for i in range(18, -1, -2)]
    store.append(T, 0, batch([b"a"], tag="three"))
    assert found(store.keys, b"a")[:2] == [b"three-0", b"one-18"]
    store.close()
    reopened = open_store(config)
    assert found(reopened.keys, b"a")[:2] == [b"three-0", b"one-18"]
    assert len(found(reopened.keys, b"b")) == 10


@pytest.mark.parametrize("slots_every_s", [0.0, 3600.0])
def test_recovery_after_a_kill_past_the_checkpoint(
    open_store: OpenStore, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch,
    slots_every_s: float,
) -> None:  # fmt: skip
    """Slot pages written at every checkpoint (recovery relinks the entries
    after the last one) or never (it relinks all of them)."""
    monkeypatch.setattr(key_index, "SLOTS_EVERY_S", slots_every_s)
    config = keyed_config(make_config)
    store = open_store(config)
    store.create_topic(T, 2)
    sent = produce(store, 50, 7, rounds=2)
    store.flush()
    more = produce(store, 40, 9, rounds=3)
    for key, values in more.items():
        sent.setdefault(key, []).extend(values)
    store.abandon()  # killed: entries and slots after the checkpoint are only in the page cache
    store = open_store(config)
    assert_answers(store, sent)
    more = produce(store, 10, 5)  # and it goes on indexing
    store.close()
    store = open_store(config)
    for key, values in more.items():
        assert found(store.keys, key)[: len(values)] == list(reversed(values))


def _damage(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))


@pytest.mark.parametrize("damage", ["entry", "header", "deleted file", "deleted dir"])
def test_damage_rebuilds_from_the_log_with_the_same_answers(
    open_store: OpenStore, make_config: MakeConfig, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    config = keyed_config(make_config, slot_count=8, entries_per_file=64)
    store = open_store(config)
    store.create_topic(T, 2)
    sent = produce(store, 30, 11, rounds=5)
    store.close()
    directory = config.data_dir / "keys"
    first = directory / "000000000.kidx"
    if damage == "entry":
        _damage(first, HEADER_SIZE + 8 * 4 + 5 * ENTRY_SIZE + 3)
    elif damage == "header":
        _damage(first, 20)
    elif damage == "deleted file":
        first.unlink()
    else:
        shutil.rmtree(directory)
    caplog.set_level(logging.WARNING)
    store = open_store(config)
    assert_answers(store, sent)
    assert "KEY INDEX REBUILT" in caplog.text


def test_off_refuses_by_key_but_answers_by_time(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    store = open_store(make_config(key_index=KeyIndexConfig(enabled=False)))
    store.create_topic(T, 1)
    store.append(T, 0, batch([b"k"]))
    with pytest.raises(PreconditionFailed, match="--no-key-index"):
        store.keys.by_key(T, b"k")
    assert not (store.config.data_dir / "keys").exists()
    assert len(store.keys.by_time(T).messages) == 1


def test_by_time_merges_queues_newest_first(open_store: OpenStore, make_config: MakeConfig) -> None:
    store = open_store(keyed_config(make_config))
    store.create_topic(T, 2)
    stamps = []
    for i in range(6):
        store.append(T, i % 2, batch([None], tag=f"m{i}"))
        stamps.append(store.reads.read(T, i % 2, i // 2).messages[0].store_timestamp_ms)
    result = store.keys.by_time(T, limit=4)
    values = [decode_record(m.record, 0).value for m in result.messages]
    assert values == [b"m5-0", b"m4-0", b"m3-0", b"m2-0"] and result.truncated
    ranged = store.keys.by_time(T, stamps[1], stamps[4] + 1, limit=100)
    assert {decode_record(m.record, 0).value for m in ranged.messages} >= {b"m2-0", b"m3-0"}
    assert all(stamps[1] <= m.store_ms <= stamps[4] for m in ranged.messages)


# -- the format -------------------------------------------------------------------------


def test_header_round_trip_and_every_flipped_byte_is_detected() -> None:
    header = WindowHeader(
        1 << 22, 1 << 24, True, 123, 456_789, 1_700_000_000_000, 1_700_000_360_000, 99
    )
    raw = encode_header(header)
    assert len(raw) == HEADER_SIZE and decode_header(raw) == header
    for i in range(HEADER_SIZE):
        for bit in (0x01, 0x80):
            bad = bytearray(raw)
            bad[i] ^= bit
            with pytest.raises(KeyIndexDamaged):
                decode_header(bytes(bad))


def test_entry_round_trip_and_every_flipped_byte_is_detected() -> None:
    fields = (0xFEDC_BA98_7654_3210, 1 << 40, 3_600_000, 77, 0xDEAD_BEEF)
    raw = encode_entry(*fields)
    assert len(raw) == ENTRY_SIZE and decode_entry(raw) == fields
    for i in range(ENTRY_SIZE):
        for bit in (0x01, 0x80):
            bad = bytearray(raw)
            bad[i] ^= bit
            with pytest.raises(KeyIndexDamaged):
                decode_entry(bytes(bad))


def test_murmur2_matches_known_values() -> None:
    # Kafka's Utils.murmur2 (the partitioner's hash), as unsigned 32-bit values.
    assert keyhash.murmur2(b"21") == (-973932308) & 0xFFFFFFFF
    assert keyhash.murmur2(b"foobar") == (-790332482) & 0xFFFFFFFF
    assert keyhash.murmur2(b"a-little-bit-long-string") == (-985981536) & 0xFFFFFFFF
    assert keyhash.murmur2(b"") == 275646681


def _random_records(store: Store, rng: random.Random) -> bytes:
    """The log bytes of random records: keys, keys headers, other headers, none."""
    for _ in range(20):
        count = rng.randint(1, 30)
        keys: list[bytes | None] = [
            None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 12)) for _ in range(count)
        ]
        headers = []
        for _ in range(count):
            h = [("x", rng.randbytes(rng.randint(0, 5)))] if rng.random() < 0.5 else []
            if rng.random() < 0.6:
                parts = [rng.choice([b"", b"a", b"bb", rng.randbytes(3).replace(b" ", b"_")])
                         for _ in range(rng.randint(0, 40))]  # fmt: skip
                h.append(("keys", b" ".join(parts)))
            headers.append(h)
        store.append(T, 0, MessageBatch([b"v"] * count, keys=keys, headers=headers))
    return bytes(store._state.log.copy(0, store.log_end))


@pytest.mark.skipif(keyhash.key_entries is keyhash.key_entries_py, reason="C not built")
def test_c_key_entries_equal_the_python_reference(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    store = open_store(make_config(key_index=KeyIndexConfig(enabled=False)))
    store.create_topic(T, 1)
    data = _random_records(store, random.Random(28))
    for slots, capacity, max_extra in ((1, 1 << 20, 32), (64, 100, 5), (4096, 37, 0)):
        results = []
        for build in (keyhash.key_entries, keyhash.key_entries_py):
            slot_array = memoryview(bytearray(4 * slots)).cast("I")
            dirty = bytearray(-(-slots // 1024))
            done, outs = 0, []
            while done < len(data):
                out = build(
                    memoryview(data)[done:],
                    done,
                    slot_array,
                    dirty,
                    0,
                    capacity,
                    0,
                    1 << 40,
                    max_extra,
                )
                outs.append(out)
                done += out[1]
            results.append((outs, bytes(slot_array), bytes(dirty)))
        assert results[0] == results[1]
    entries = keyhash.key_entries_py(data, 0, memoryview(bytearray(4 * 64)).cast("I"),
                                     bytearray(1), 0, 1 << 20, 0, 1 << 40, 32)[0]  # fmt: skip
    relinked = []
    for relink in (keyhash.key_relink, keyhash.key_relink_py):
        slot_array, dirty = memoryview(bytearray(4 * 64)).cast("I"), bytearray(1)
        relink(entries, 5, slot_array, dirty)
        relinked.append(bytes(slot_array))
    assert relinked[0] == relinked[1]
    joined = b"t\x00key"
    assert keyhash.hash64_joined(joined) == keyhash.hash64_py(joined)


def test_a_checkpoint_never_writes_old_slot_pages_over_a_sealed_window(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """The checkpoint copies the active window's dirty slot pages under the
    engine lock and writes them after it; a roll in between seals the window
    (its whole slot array written): the copied pages are older and must not
    land over it (review 28 p13)."""
    store = open_store(keyed_config(make_config, slot_count=8, entries_per_file=40))
    store.create_topic(T, 1)
    index = store._state.keys
    assert index is not None
    sent = produce(store, 10, 4)  # 10 entries in window 0
    index._slots_written = float("-inf")  # this checkpoint copies the slot pages
    _doc, work = index.checkpoint_state()
    assert work.pages
    sent_more = produce(store, 40, 4)  # fills window 0 (seals it) and goes on in window 1
    for key, values in sent_more.items():
        sent[key] = [*sent.get(key, []), *values]
    assert len(index.windows) == 2
    key_index.KeyIndex.persist(work)
    # The sealed window's slot array is the one relinked from its own entries.
    window = index.windows[0]
    on_disk = [window.head(s) for s in range(8)]
    heads = [0] * 8
    for i in range(window.count):
        heads[window.entry(i)[0] % 8] = i + 1
    assert on_disk == heads
    for key in sent:  # every message of a key is found (values repeat across rounds)
        assert len(found(store.keys, key)) == len(sent[key]), key


def test_an_entry_in_a_wrong_slot_is_damage(open_store: OpenStore, make_config: MakeConfig) -> None:
    store = open_store(keyed_config(make_config, slot_count=8))
    store.create_topic(T, 1)
    sent = produce(store, 20, 8)
    active = store._state.keys.active  # type: ignore[union-attr]
    assert active is not None and active.slots is not None
    slot_of = {s: active.slots[s] for s in range(8) if active.slots[s]}
    (a, ha), (b, hb) = list(slot_of.items())[:2]
    active.slots[a], active.slots[b] = hb, ha  # two slot heads swapped
    assert_answers(store, sent)  # detected, rebuilt from the log
    assert store._state.keys.rebuilds == 1  # type: ignore[union-attr]


def test_results_stop_at_max_read_bytes(open_store: OpenStore, make_config: MakeConfig) -> None:
    """A reply never carries more than ``max_read_bytes`` of records (it must
    fit a gRPC message, and the broker's memory): the newest that fit, truncated."""
    config = keyed_config(make_config)
    config = make_config(key_index=config.key_index, max_read_bytes=10_000)
    store = open_store(config)
    store.create_topic(T, 2)
    for q in range(2):
        store.append(T, q, MessageBatch(values=[b"x" * 1000] * 20, keys=[b"k"] * 20))
    for result in (store.keys.by_key(T, b"k", limit=100), store.keys.by_time(T, limit=100)):
        assert result.truncated
        assert 5 <= len(result.messages) < 40
        assert sum(len(m.record) for m in result.messages) <= 10_000
        times = [(m.store_ms, m.position) for m in result.messages]
        assert times == sorted(times, reverse=True)
    small = store.keys.by_key(T, b"k", limit=3)
    assert len(small.messages) == 3 and small.truncated


def test_a_walk_in_chunks_stops_when_windows_go_meanwhile(
    open_store: OpenStore, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine lock is released between chunks of a walk: a window dropped
    meanwhile (retention) ends the walk (truncated), never a read of its file."""
    store = open_store(keyed_config(make_config, entries_per_file=8))
    store.create_topic(T, 1)
    sent = produce(store, 40, 1)  # one key, five windows
    index = store._state.keys
    assert index is not None and len(index.windows) == 5
    monkeypatch.setattr(query, "CHUNK", 3)
    whole = store.keys.by_key(T, b"k0", limit=100)
    assert len(whole.messages) == 40 and not whole.truncated  # many chunks, same answer
    walk_chunk = KeyQuery._walk
    calls: list[bool] = []

    def then_drop(self: KeyQuery, *args: Any) -> bool:
        done = walk_chunk(self, *args)
        if not calls:
            index.drop_below(1 << 62)  # as retention would: every sealed window goes
        calls.append(done)
        return done

    monkeypatch.setattr(KeyQuery, "_walk", then_drop)
    cut = store.keys.by_key(T, b"k0", limit=100)
    assert cut.truncated and len(calls) == 1
    assert [decode_record(m.record, 0).value for m in cut.messages] == expected(sent, b"k0")[:3]


def test_a_query_stops_at_its_time_budget(
    open_store: OpenStore, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(keyed_config(make_config))
    store.create_topic(T, 1)
    produce(store, 20, 1)
    monkeypatch.setattr(query, "CHUNK", 4)
    monkeypatch.setattr(query, "TIME_BUDGET_S", 0.0)
    result = store.keys.by_key(T, b"k0", limit=100)
    assert result.truncated and len(result.messages) == 4


def test_a_checkpoint_never_writes_slot_pages_of_entries_cut_meanwhile(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """A replica's truncation between the checkpoint's copy of the slot pages
    and their write: the pages name entries that are gone; not written."""
    store = open_store(keyed_config(make_config, slot_count=8, entries_per_file=1 << 10))
    store.create_topic(T, 1)
    index = store._state.keys
    assert index is not None
    store.append(T, 0, batch([b"a", b"b"] * 10, tag="one"))
    cut = store.log_end
    store.append(T, 0, batch([b"a", b"b"] * 10, tag="two"))
    index._slots_written = float("-inf")
    _doc, work = index.checkpoint_state()
    store.truncate(cut, TxnScan(1, {}, False, store.epochs, store.producers))
    key_index.KeyIndex.persist(work)
    window = index.windows[-1]
    window.slots = None  # read the slot array from the file
    on_disk = [window.head(s) for s in range(8)]
    assert max(on_disk) <= window.count == 20


def test_a_start_bound_skips_plain_records_but_reads_staged_ones(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """Plain records stored before ``start_ms`` are skipped from their fixed
    fields; a transactional one written before it but committed after still shows."""
    store = open_store(keyed_config(make_config))
    store.create_topic(T, 1)
    store.transactions.stage("live", T, [(0, batch([b"k"], tag="live"))])
    store.append(T, 0, batch([b"k"], tag="plain"))
    written = int(time.time() * 1000)
    while int(time.time() * 1000) <= written + 1:  # the commit is stored later
        pass
    store.transactions.commit([("live", 1)])
    newest = store.keys.by_key(T, b"k").messages
    assert [decode_record(m.record, 0).value for m in newest] == [b"live-0", b"plain-0"]
    later = store.keys.by_key(T, b"k", start_ms=newest[0].store_ms).messages
    assert [decode_record(m.record, 0).value for m in later] == [b"live-0"]
