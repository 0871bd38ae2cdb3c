"""Deleting a topic, cut short at every file-system step by a process crash or an
I/O error: nothing of the deleted topic may come back, and a topic created
again under the same name starts empty (no records, no group offsets).

A process crash is simulated as tests/storage/test_recovery_crash.py does: the store is
abandoned (nothing more flushed; what was written stays, as in the page cache)
at the chosen step, by an exception no store code catches.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from equeue_broker.storage import FlushMode, MessageBatch, Store
from equeue_broker.storage.errors import NotFound
from equeue_broker.storage.meta.atomic_file import decode_document, encode_document
from tests.conftest import MakeConfig

TOPIC = "doomed"
GROUP = "g"
STEPS = ("replace", "rename", "unlink", "rmdir", "fsync", "write")
"""The ``os`` calls that change the files: a delete is cut short before each one."""


class Crash(BaseException):
    """The process dies here (a BaseException: no store code catches it)."""


@contextmanager
def cut_short(at: int | None, fault: str) -> Iterator[list[str]]:
    """Count the file-changing calls; the ``at``-th one (0-based) fails instead
    of running: a ``Crash``, or ``OSError(EIO)``. The calls are yielded as named."""
    calls: list[str] = []
    real = {name: getattr(os, name) for name in STEPS}

    def wrap(name: str) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            if at is not None and len(calls) == at:
                calls.append(name)
                if fault == "crash":
                    raise Crash(name)
                raise OSError(errno.EIO, f"injected before {name}")
            calls.append(name)
            return real[name](*args, **kwargs)

        return step

    try:
        for name in STEPS:
            setattr(os, name, wrap(name))
        yield calls
    finally:
        for name, function in real.items():
            setattr(os, name, function)


def build(config_dir: Path, make_config: MakeConfig) -> Store:
    """A topic with flushed and unflushed records in two queues, and a group's
    offsets persisted: the state a recreated topic must not inherit."""
    config = make_config(data_dir=config_dir, flush_mode=FlushMode.ASYNC)
    store = Store(config, background=False)
    store.create_topic(TOPIC, 2)
    for q in range(2):
        store.append(TOPIC, q, MessageBatch(values=[b"old-%d-%d" % (q, i) for i in range(5)]))
    store.flush()  # some records behind the checkpoint ...
    for q in range(2):  # ... and some after it, which recovery scans again
        store.append(TOPIC, q, MessageBatch(values=[b"late-%d-%d" % (q, i) for i in range(4)]))
    store.commit_offsets(GROUP, [(TOPIC, 0, 7), (TOPIC, 1, 3)])
    store._state.offsets.persist()  # what the background thread does every second
    return store


def assert_fresh(store: Store) -> None:
    """The topic exists, holds only the ``new`` record, and no group has offsets on it."""
    assert [m.value for m in store.read(TOPIC, 0, 0).messages] == [b"new"]
    assert store.read(TOPIC, 1, 0).messages == []
    assert store.queue_info(TOPIC, 1).end == 0
    assert TOPIC not in store.committed_offsets(GROUP)


def assert_whole_or_gone(store: Store) -> None:
    """A delete that did not return: the topic is untouched, or gone entirely."""
    try:
        values = [m.value for m in store.read(TOPIC, 0, 0).messages]
    except NotFound:
        return  # its offsets are checked once the topic is created again
    assert values == [b"old-0-%d" % i for i in range(5)] + [b"late-0-%d" % i for i in range(4)]
    assert store.committed_offsets(GROUP)[TOPIC] == {0: 7, 1: 3}


def recreate(store: Store) -> None:
    """Delete the topic if it is still there, create it again, append ``new``."""
    with suppress(NotFound):
        store.topic_admin.delete_topic(TOPIC)
    store.create_topic(TOPIC, 2)
    store.append(TOPIC, 0, MessageBatch(values=[b"new"]))


def steps_of_a_delete(tmp_path: Path, make_config: MakeConfig) -> list[str]:
    store = build(tmp_path / "count", make_config)
    with cut_short(None, "crash") as calls:
        store.topic_admin.delete_topic(TOPIC)
    store.close()
    return calls


def test_a_delete_takes_a_few_file_steps(tmp_path: Path, make_config: MakeConfig) -> None:
    calls = steps_of_a_delete(tmp_path, make_config)
    assert "rename" in calls and "replace" in calls, calls


def test_delete_cut_short_by_a_crash_at_each_step(tmp_path: Path, make_config: MakeConfig) -> None:
    """Crash at each step of a delete, restart; then (the delete was never
    acknowledged) delete if need be, create again: the new topic starts empty,
    also after a second crash right after it was created."""
    steps = steps_of_a_delete(tmp_path, make_config)
    failed = []
    for at in range(len(steps) + 1):
        try:
            crash_at(tmp_path / f"at{at}", make_config, at, len(steps))
        except AssertionError as exc:  # every step is tried: the report names them all
            failed.append(f"crash before step {at} ({([*steps, 'return'])[at]}): {exc}")
    assert not failed, "\n".join(failed)


def crash_at(data: Path, make_config: MakeConfig, at: int, steps: int) -> None:
    store = build(data, make_config)
    with cut_short(at, "crash"), pytest.raises(Crash):
        store.topic_admin.delete_topic(TOPIC)
        raise Crash("after the delete returned")  # acknowledged, then killed
    store.abandon()
    store = Store(store.config, background=False)
    try:
        if at < steps:
            assert_whole_or_gone(store)
        else:
            with pytest.raises(NotFound):
                store.topic_admin.describe(TOPIC)
        recreate(store)
        store.abandon()  # killed right after the topic was created again
        store = Store(store.config, background=False)
        assert_fresh(store)
    finally:
        store.close()


def test_delete_cut_short_by_an_io_error_at_each_step(
    tmp_path: Path, make_config: MakeConfig
) -> None:
    """An I/O error at each step of a delete, the broker goes on: the topic
    created again in the same process starts empty, before and after a crash."""
    steps = len(steps_of_a_delete(tmp_path, make_config))
    for at in range(steps):
        data = tmp_path / f"at{at}"
        store = build(data, make_config)
        with cut_short(at, "error") as calls:
            try:
                store.topic_admin.delete_topic(TOPIC)
            except Exception as exc:
                print(f"step {at} ({calls[-1]}): {exc}")
        recreate(store)
        assert_fresh(store)
        store.abandon()
        store = Store(store.config, background=False)
        assert_fresh(store)
        store.close()
        shutil.rmtree(data)


def test_open_removes_what_a_delete_left_behind(tmp_path: Path, make_config: MakeConfig) -> None:
    """Leftovers of deletes cut short by older brokers: a tombstone, the index of a
    topic topics.json does not have, offsets of topics and queues that are gone."""
    store = build(tmp_path / "data", make_config)
    store.create_topic("kept", 1)
    store.commit_offsets(GROUP, [("kept", 0, 0)])
    store.close()
    index = tmp_path / "data" / "index"
    (index / ".deleted.0123").mkdir()
    shutil.copytree(index / TOPIC, index / "ghost")
    topics = tmp_path / "data" / "topics.json"
    for path in (topics, tmp_path / "data" / "topics.json.bak"):
        # Rewritten through the metadata layer, so its checksum stays intact.
        document, _ = decode_document(path.read_bytes())
        renamed = json.loads(json.dumps(document).replace(f'"{TOPIC}"', '"other"'))
        path.write_bytes(encode_document(renamed))
    store = Store(store.config, background=False)
    assert sorted(p.name for p in index.iterdir()) == ["kept", "other"]
    assert store.committed_offsets(GROUP) == {"kept": {0: 0}}
    store.close()


def test_a_queue_added_after_a_killed_queue_delete_starts_empty(
    tmp_path: Path, make_config: MakeConfig
) -> None:
    """``delete_queue`` is final when it returns too: the queue added next
    reuses the deleted one's id and must not inherit its records or offsets."""
    store = build(tmp_path / "data", make_config)
    store.topic_admin.set_queue_visibility(TOPIC, 1, producer=False, consumer=False)
    store.topic_admin.delete_queue(TOPIC, 1, force=True)
    store.abandon()  # killed right after the delete returned
    store = Store(store.config, background=False)
    assert [q.queue_id for q in store.topic_admin.add_queues(TOPIC, 1).queues] == [0, 1]
    assert store.read(TOPIC, 1, 0).messages == []
    assert store.committed_offsets(GROUP)[TOPIC] == {0: 7}
    store.abandon()
    store = Store(store.config, background=False)
    assert store.queue_info(TOPIC, 1).end == 0
    assert store.committed_offsets(GROUP)[TOPIC] == {0: 7}
    store.close()
