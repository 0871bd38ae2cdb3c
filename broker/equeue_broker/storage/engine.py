"""The storage engine's shared state, as one object: ``EngineState``.

Every part of the engine works on the same state: the message log, the
queues, consumer-group offsets, what is written but not readable yet
(visibility.py), the index checkpoint, whether the store is open or failed,
and the listeners told about newly readable records. ``EngineState`` holds
it with the lock that guards it, and is passed explicitly to the modules that
work on it (the store's write path in store.py, replica writes in
log/positioned.py, reads in reads.py, topic admin in topic_admin.py, the log
writer, retention); none of them reaches into another's private fields.

Thread safety: ``lock`` (reentrant) guards the log, the queues and the
topics. A function or method that says "lock held" must be called with it
held, and asserts so (``assert state.held()``): here ``fail``, the ``*_locked``
methods and the lookups ``topic``, ``live_queue`` and ``writable_queue``;
elsewhere the public ``LogWriter`` methods, ``retention.delete_expired``,
``append_at`` and ``truncate_at`` of log/positioned.py, the private entry
points of ``Reads`` and the changes of ``TopicAdmin``. ``admin_lock``
serialises topic and queue deletes and (re)creations (topic_admin.py).
Listeners are called outside ``lock``, under ``notify_lock``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable

from equeue_broker.storage.config import FlushMode, StorageConfig
from equeue_broker.storage.errors import NotFound, PreconditionFailed, StorageError, StoreClosed
from equeue_broker.storage.index.queue_state import QueueKey, QueueState
from equeue_broker.storage.keys.key_index import KeyIndex
from equeue_broker.storage.log.flush import GroupCommit
from equeue_broker.storage.log.message_log import MessageLog
from equeue_broker.storage.meta.names import validate_topic
from equeue_broker.storage.meta.offsets import OffsetStore
from equeue_broker.storage.meta.topics import TopicMeta, queue_meta
from equeue_broker.storage.visibility import Change, Visibility

Listener = Callable[[str, int, int], None]
"""Called with (topic, queue_id, visible_end) when new records become readable."""


class EngineState:
    """One data directory's open log, queues and offsets, and the lock over them."""

    def __init__(  # noqa: PLR0917 (built in one place, by the store)
        self,
        config: StorageConfig,
        message_log: MessageLog,
        offsets: OffsetStore,
        queues: dict[QueueKey, QueueState],
        topics: dict[str, TopicMeta],
        checkpoint: int,
    ) -> None:
        """The state of a store just recovered (recovery.py): its log, offsets,
        queues, topic metadata and index checkpoint."""
        self.config = config
        self.lock = threading.RLock()
        # CPython's ownership test of a reentrant lock (threading.Condition uses it).
        self._owned: Callable[[], bool] = self.lock._is_owned  # type: ignore[attr-defined]
        self.admin_lock = threading.Lock()
        """Serialises topic and queue deletes and (re)creations (topic_admin.py)."""
        self.log = message_log
        self.queues = queues
        """Every live queue (recovered at open; topic admin changes it)."""
        self.topics = topics
        """The topic metadata by name, as saved in ``topics.json``; replaced,
        never changed in place (``TopicAdmin.save``)."""
        self.offsets = offsets
        self.visibility = Visibility()
        """When written records become readable (visibility.py)."""
        self.visibility.durable_seen = message_log.write_position
        self.sync_flush = config.flush_mode is FlushMode.SYNC
        """Sync flush mode: appends are readable once fsynced (group commit)."""
        self.checkpoint = checkpoint
        """Log position below which every index entry is fsynced (recovery.py)."""
        self.keys: KeyIndex | None = None
        """The key index (keys/key_index.py), None when it is off: every write
        of records into the log adds their keys to it (lock held)."""
        self.closed = False
        self.failed: BaseException | None = None
        self.listeners: list[Listener] = []
        self.notify_lock = threading.Lock()
        self.commit = GroupCommit(
            self._sync_target,
            message_log.write_position,
            self._publish_durable,
            sticky_errors=self.sync_flush,
        )

    def held(self) -> bool:
        """Whether the calling thread holds ``lock``: what "lock held" asserts."""
        return self._owned()

    # -- open, failed ------------------------------------------------------------------

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosed("the store is closed")

    def check_writable(self) -> None:
        self.check_open()
        if self.failed is not None:
            raise StorageError(
                f"store refuses writes after an unrecoverable I/O error: {self.failed}"
            )

    def fail(self, cause: BaseException) -> None:
        """Refuse writes until a restart: the log on disk may no longer be what
        the store believes it is; recovery at the next open rebuilds it (lock held)."""
        assert self.held()
        self.failed = cause

    # -- lookups (lock held) -----------------------------------------------------------

    def topic(self, name: str) -> TopicMeta:
        """The topic's metadata, if the store is open and the topic exists (lock held)."""
        assert self.held()
        self.check_open()
        meta = self.topics.get(name)
        if meta is None:
            validate_topic(name)
            raise NotFound(f"topic {name!r} does not exist")
        return meta

    def live_queue(self, topic: str, queue_id: int) -> QueueState:
        """The queue, if the store is open and the topic and queue exist (lock held)."""
        queue_meta(self.topic(topic), queue_id)
        return self.queues[(topic, queue_id)]

    def writable_queue(self, topic: str, queue_id: int) -> QueueState:
        """The queue, if it takes appends now (lock held)."""
        assert self.held()
        self.check_writable()
        queue = self.queues.get((topic, queue_id))
        if queue is None:  # find out why, for the error message
            queue_meta(self.topic(topic), queue_id)
            raise NotFound(f"queue {topic}/{queue_id} does not exist")
        if not queue.producer_visible:
            raise PreconditionFailed(f"queue {topic}/{queue_id} is hidden from producers")
        return queue

    # -- durability and visibility -----------------------------------------------------

    def durable_locked(self) -> int:
        """The log end in the flush mode's meaning: fsynced (sync) or written (async)
        (lock held)."""
        assert self.held()
        if self.sync_flush:
            return self.visibility.durable_seen
        return self.log.write_position

    def publish_locked(self) -> list[Change]:
        """Make held records readable up to the high watermark (lock held)."""
        assert self.held()
        return self.visibility.release(self.durable_locked())

    def _sync_target(self) -> tuple[int, int]:
        with self.lock:
            return self.log.sync_target()

    def _publish_durable(self, durable: int) -> None:
        """Make records below ``durable`` (now fsynced) readable; sync mode."""
        with self.lock:
            self.visibility.durable_seen = max(self.visibility.durable_seen, durable)
            changed = self.publish_locked()
        if self.listeners:
            self.notify(changed)

    def notify(self, changes: Iterable[tuple[QueueState, int]]) -> None:
        """Tell the listeners about queues whose readable end moved (outside ``lock``)."""
        # Appending threads race to get here: the notify lock plus the per-queue
        # mark make every listener see each queue's ends strictly increasing.
        with self.notify_lock:
            for queue, end in changes:
                if end <= queue.notified_end:
                    continue
                queue.notified_end = end
                for listener in self.listeners:
                    listener(queue.topic, queue.queue_id, end)


def release_files(
    lock_fd: int, queues: dict[QueueKey, QueueState], message_log: MessageLog | None
) -> None:
    """Close every file without flushing (failed open, abandon)."""
    for queue in queues.values():
        queue.index.release()
    if message_log is not None:
        message_log.close()
    os.close(lock_fd)
