"""What makes deleting a topic or queue final, and what clears a delete cut short.

``TopicAdmin.delete_topic`` (and ``delete_queue``) returns only once nothing of the
deleted topic can come back, after a crash or in a topic created later under
the same name:

1. ``topics.json`` is saved without it: the commit point. A crash before it
   leaves the topic whole; a crash after it leaves a topic that is gone.
2. Its index directory is renamed to a *tombstone* (``index/.deleted.<hex>``;
   topic names cannot start with ``.``) and ``index/`` is fsynced, then the
   tombstone is removed. A crash in between leaves a tombstone, which the
   next open removes; nothing opens a tombstone as an index.
3. Its groups' offsets are forgotten and ``offsets.json`` saved.
4. The log is flushed and the checkpoint saved past every record of the
   topic, so that recovery never scans them again: they would otherwise be
   re-indexed into a topic of the same name created later.

If a step after the commit point fails (a full disk), the delete has happened
but is not yet settled: ``create_topic`` and ``add_queues`` settle it (steps 3
and 4) before they create anything, and ``create_topic`` removes any index
directory left under the name. The store's admin lock keeps a create from
running between a delete's commit point and its settling. At open, ``sweep``
removes tombstones, index directories of topics and queues that
``topics.json`` does not have, and their groups' offsets.

The records themselves stay in the log until retention deletes their chunk.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path

from equeue_broker.storage.errors import io_error
from equeue_broker.storage.meta.atomic_file import fsync_dir
from equeue_broker.storage.meta.offsets import OffsetStore
from equeue_broker.storage.meta.topics import TopicMeta

log = logging.getLogger(__name__)

TOMBSTONE_PREFIX = ".deleted."


def bury(directory: Path, index_root: Path) -> None:
    """Remove ``directory`` (an index directory under ``index_root``) so that no
    crash can leave it where an index is looked for: rename it to a tombstone,
    make the rename durable, then remove the tombstone."""
    if not directory.exists():
        return
    tombstone = index_root / f"{TOMBSTONE_PREFIX}{secrets.token_hex(8)}"
    os.rename(directory, tombstone)
    fsync_dir(directory.parent)
    if directory.parent != index_root:
        fsync_dir(index_root)
    # Best effort: a tombstone left behind is removed by the next open.
    shutil.rmtree(tombstone, ignore_errors=True)


def bury_index(data_dir: Path, topic: str, queue_id: int | None = None) -> None:
    """``bury`` the index directory of a topic (or of one of its queues); an
    ``OSError`` becomes a ``StorageError`` (``DiskFullError`` on a full disk)."""
    path = data_dir / "index" / topic
    try:
        bury(path if queue_id is None else path / str(queue_id), path.parent)
    except OSError as exc:
        raise io_error(f"the index of {topic}", exc) from exc


def sweep(data_dir: Path, topics: Mapping[str, TopicMeta], offsets: OffsetStore) -> None:
    """At open: remove what deletes cut short left behind (see the module docstring).

    A failure to save the cleaned offsets is logged, not raised: they are
    forgotten in memory, and ``create_topic`` saves them before it reuses a name.
    """
    index_root = data_dir / "index"
    if index_root.is_dir():
        for entry in sorted(index_root.iterdir()):
            if not entry.is_dir():
                continue  # not an index; left alone
            if entry.name.startswith(TOMBSTONE_PREFIX):
                shutil.rmtree(entry, ignore_errors=True)
                continue
            meta = topics.get(entry.name)
            if meta is None:
                log.warning("removing index directory %s of a deleted topic", entry)
                bury(entry, index_root)
                continue
            _sweep_queues(entry, meta, index_root)
    if _forget_stale_offsets(topics, offsets):
        try:
            offsets.persist()
        except OSError as exc:
            log.error("cannot save offsets without those of deleted topics: %s", exc)


def _sweep_queues(topic_dir: Path, meta: TopicMeta, index_root: Path) -> None:
    """Remove index directories of the topic's queues that were deleted.
    One directory read (``scandir``: no stat per entry, no ``Path`` per
    queue), as a broker of many queues runs this at every open."""
    live = {str(q.queue_id) for q in meta.queues}
    with os.scandir(topic_dir) as entries:
        gone = sorted(
            e.name
            for e in entries
            if e.name.isdigit() and e.name not in live and e.is_dir(follow_symlinks=False)
        )
    for name in gone:
        entry = topic_dir / name
        log.warning("removing index directory %s of a deleted queue", entry)
        bury(entry, index_root)


def _forget_stale_offsets(topics: Mapping[str, TopicMeta], offsets: OffsetStore) -> bool:
    """Forget offsets of topics and queues that do not exist; True if there were any."""
    stale: set[tuple[str, int | None]] = set()
    for group in offsets.groups():
        for topic, queues in offsets.get(group).items():
            meta = topics.get(topic)
            if meta is None:
                stale.add((topic, None))
                continue
            stale.update((topic, q) for q in queues if meta.queue(q) is None)
    for topic, queue_id in sorted(stale, key=lambda s: (s[0], -1 if s[1] is None else s[1])):
        which = "*" if queue_id is None else queue_id
        log.warning("forgetting committed offsets of deleted %s/%s", topic, which)
        offsets.forget(topic, queue_id)
    return bool(stale)
