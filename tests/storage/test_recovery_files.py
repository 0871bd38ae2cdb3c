"""Recovery of the metadata files and leftovers: offsets, topics and checkpoint files
(missing, garbled, with or without a good backup), temp files of interrupted
saves, and a second store on the same data directory.

As ``tests/storage/test_recovery.py``: build a store, damage its files, reopen it, and
assert exactly what survives.
"""

from __future__ import annotations

import json
from unittest.mock import ANY

import pytest

from equeue_broker.storage import (
    FlushMode,
    PreconditionFailed,
    StorageConfig,
    Store,
)
from equeue_broker.storage.index.queue_index import INDEX_SUFFIX
from equeue_broker.storage.log.chunk import chunk_file_name
from equeue_broker.storage.log.message_log import LOG_SUFFIX
from equeue_broker.storage.meta.offsets import OffsetsLost
from tests.conftest import MakeConfig
from tests.support.faults import garble, read_document
from tests.support.sent import (
    TOPIC,
    OpenStore,
    Sent,
    append,
    assert_queue_holds,
    payload,
    reopen,
)

# -- leftovers and metadata files ------------------------------------------------------


def test_leftover_temp_chunk(open_store: OpenStore) -> None:
    """Temp files of interrupted chunk creations and metadata saves are removed."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    sent = append(store, 0, "a", 3)
    store.close()
    data = store.config.data_dir
    leftovers = [
        data / "log" / (chunk_file_name(1, LOG_SUFFIX) + ".tmp"),
        data / "index" / TOPIC / "0" / (chunk_file_name(1, INDEX_SUFFIX) + ".tmp"),
        data / "topics.json.tmp",
        data / "offsets.json.tmp",
        data / "checkpoint.json.tmp",
    ]
    for path in leftovers[:2]:
        path.write_bytes(payload("tmp", 0, 4096))
    ghost = {"topics": {"ghost": {"queues": [], "created_ms": 0, "extra": {}}}}
    leftovers[2].write_text(json.dumps(ghost))
    leftovers[3].write_text(json.dumps({"groups": {"g": {TOPIC: {"0": 1}}}}))
    leftovers[4].write_text(json.dumps({"index_position": 0}))

    store = open_store(store.config)
    assert [p for p in leftovers if p.exists()] == [leftovers[1]]
    assert [t.name for t in store.topic_admin.listing()] == [TOPIC]
    assert store.groups() == []
    assert store.recovery.index_entries_rebuilt == 0
    assert_queue_holds(store, 0, sent)
    # An index's own leftovers go when it is first used: a queue the checkpoint
    # vouches for is not opened at restart (docs/storage.md, Recovery on open).
    assert not leftovers[1].exists()
    more = append(store, 0, "b", 2)
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, sent + more)


def commit_twice(open_store: OpenStore, make_config: MakeConfig) -> StorageConfig:
    """A closed store whose offsets.json holds round 2 and offsets.json.bak round 1."""
    store = open_store(make_config(flush_mode=FlushMode.SYNC))  # a commit persists
    store.create_topic(TOPIC, 2)
    append(store, 0, "a", 10)
    append(store, 1, "b", 10)
    store.commit_offset("g", TOPIC, 0, 3)
    store.commit_offset("g", TOPIC, 1, 4)
    store.commit_offset("g", TOPIC, 0, 7)
    store.close()
    data = store.config.data_dir
    assert read_document(data / "offsets.json")["groups"]["g"][TOPIC]["0"] == 7
    assert read_document(data / "offsets.json.bak")["groups"]["g"][TOPIC]["0"] == 3
    return store.config


def test_missing_offsets_file_uses_backup(open_store: OpenStore, make_config: MakeConfig) -> None:
    config = commit_twice(open_store, make_config)
    (config.data_dir / "offsets.json").unlink()
    store = open_store(config)
    assert store.committed_offsets("g") == {TOPIC: {0: 3, 1: 4}}


def test_corrupt_offsets_file_uses_backup(open_store: OpenStore, make_config: MakeConfig) -> None:
    config = commit_twice(open_store, make_config)
    garble(config.data_dir / "offsets.json")
    store = open_store(config)
    assert store.committed_offsets("g") == {TOPIC: {0: 3, 1: 4}}
    store.commit_offset("g", TOPIC, 0, 9)
    store = reopen(open_store, store)
    assert store.committed_offsets("g") == {TOPIC: {0: 9, 1: 4}}


def test_corrupt_offsets_file_and_backup(open_store: OpenStore, make_config: MakeConfig) -> None:
    """No intact copy: the store opens and serves the log, but every group's
    offsets are lost until reset (tests/storage/test_damage.py has the details)."""
    config = commit_twice(open_store, make_config)
    main = config.data_dir / "offsets.json"
    garble(main)
    backup = config.data_dir / "offsets.json.bak"
    backup.write_bytes(backup.read_bytes()[:10])
    store = open_store(config)
    assert len(store.read(TOPIC, 0, 0).messages) == 10
    with pytest.raises(OffsetsLost) as caught:
        store.committed_offsets("g")
    assert "equeue groups reset" in str(caught.value)
    assert str(main) in store.damage().metadata()[0]


def topics_twice(open_store: OpenStore) -> tuple[StorageConfig, list[Sent]]:
    """A closed store whose topics.json hides queue 1 from producers, and whose
    topics.json.bak is the previous save, with queue 1 visible."""
    store = open_store()
    store.create_topic(TOPIC, 2)
    store.topic_admin.set_queue_visibility(TOPIC, 1, producer=False)
    sent = append(store, 0, "a", 4)
    store.close()
    data = store.config.data_dir
    assert read_document(data / "topics.json")["topics"][TOPIC]["queues"][1] == {
        "id": 1,
        "producer": False,
        "consumer": True,
    }
    assert (data / "topics.json.bak").exists()
    return store.config, sent


def test_corrupt_topics_file_uses_backup(open_store: OpenStore) -> None:
    config, sent = topics_twice(open_store)
    garble(config.data_dir / "topics.json")
    store = open_store(config)
    assert [t.name for t in store.topic_admin.listing()] == [TOPIC]
    assert store.queue_info(TOPIC, 1).producer_visible  # the previous round
    assert_queue_holds(store, 0, sent)
    more = append(store, 1, "b")
    assert more[0].offset == 0


def test_corrupt_topics_file_and_backup(open_store: OpenStore) -> None:
    """No intact copy: the topics are rebuilt from the index directories, so
    every message stays readable; visibility and incarnations are lost (before:
    the store refused to open)."""
    config, sent = topics_twice(open_store)
    main = config.data_dir / "topics.json"
    garble(main)
    garble(config.data_dir / "topics.json.bak")
    store = open_store(config)
    assert [t.name for t in store.topic_admin.listing()] == [TOPIC]
    assert store.queue_info(TOPIC, 1).producer_visible  # hidden before: lost
    assert_queue_holds(store, 0, sent)
    [what] = store.damage().metadata()
    assert what.startswith("topics.json: no intact copy") and str(main) in what
    assert (config.data_dir / "topics.json.damaged").exists()
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, sent)
    assert store.damage().metadata() == []


def test_sink_progress_survives_losing_every_checkpoint_copy(open_store: OpenStore) -> None:
    """Sink progress is kept in checkpoint.json, and every commit record in the
    log names its sink's batch: with no intact copy of the checkpoint, it is
    rebuilt from the log (before, a lost txn/sinks.json forgot it)."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    sent = append(store, 0, "a", 3)
    store.transactions.commit([], sink="s", batch_id=1)
    store.transactions.commit([], sink="s", batch_id=2)
    store.close()
    checkpoint = store.config.data_dir / "checkpoint.json"
    assert read_document(checkpoint)["sinks"] == {"s": [2, ANY]}
    garble(checkpoint)
    garble(checkpoint.with_name("checkpoint.json.bak"))
    store = open_store(store.config)
    assert_queue_holds(store, 0, sent)
    assert [(s.sink, s.batch_id) for s in store.transactions.sinks()] == [("s", 2)]
    assert store.transactions.commit([], sink="s", batch_id=2).already_committed
    assert store.damage().metadata() == []


def test_corrupt_checkpoint_file_uses_backup(open_store: OpenStore) -> None:
    """The checkpoint falls back to the previous one, which only costs a longer
    index rebuild."""
    store = open_store()
    store.create_topic(TOPIC, 2)
    sent0 = append(store, 0, "a", 4)
    store.flush()
    later = append(store, 1, "b", 3) + append(store, 0, "c", 2)
    store.flush()
    store.close()
    data = store.config.data_dir
    assert read_document(data / "checkpoint.json.bak")["index_position"] == later[0].position
    garble(data / "checkpoint.json")

    store = open_store(store.config)
    assert store.recovery.index_entries_rebuilt == len(later)
    assert_queue_holds(store, 0, sent0 + [s for s in later if s.queue_id == 0])
    assert_queue_holds(store, 1, [s for s in later if s.queue_id == 1])


def test_corrupt_checkpoint_file_and_backup(open_store: OpenStore) -> None:
    """No intact copy of the checkpoint: every index entry is rebuilt from the
    log start (before: the store refused to open)."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    sent = append(store, 0, "a", 4)
    store.flush()
    sent += append(store, 0, "b", 3)
    store.close()
    garble(store.config.data_dir / "checkpoint.json")
    garble(store.config.data_dir / "checkpoint.json.bak")
    store = open_store(store.config)
    assert store.recovery.index_entries_rebuilt == len(sent)
    assert_queue_holds(store, 0, sent)


# -- exclusive access -----------------------------------------------------------------------


def test_second_store_on_same_data_dir_fails(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic(TOPIC, 1)
    sent = append(store, 0, "a", 2)
    leftover = store.config.data_dir / "topics.json.tmp"
    leftover.write_text("{}")
    with pytest.raises(PreconditionFailed):
        Store(store.config, background=False)
    assert leftover.exists()  # the refused store touched nothing
    with pytest.raises(PreconditionFailed):  # and did not release the first one's lock
        Store(store.config, background=False)
    sent += append(store, 0, "b")
    assert_queue_holds(store, 0, sent)
    store = reopen(open_store, store)  # closing released the directory
    assert_queue_holds(store, 0, sent)
