"""Topic and queue admin: the store's topic metadata, and every change to it.

``Store.create_topic``, ``delete_topic``, ``add_queues``,
``set_queue_visibility``, ``delete_queue``, ``topics``, ``topic`` and
``queue_info`` delegate to ``TopicAdmin``, which holds the current metadata
(``topics``, as saved in ``topics.json``, topics.py) and opens, releases and
buries the queues' indexes as topics and queues come and go. It is separate
from the store because admin is a concept of its own, with its own rules (the
save-first order below, the limits, settling deletes; deletion.py), that the
write and read paths only consult: they look a queue up through ``topic``,
``live_queue`` and ``queue_meta``. Like the store's other helper modules it
works on the state the store owns and hands it (the locks, the log, the
queues, the group offsets) and never imports store.py; what it needs of the
store's durability (check open, flush, persist offsets, the checkpoint) it
gets as callables.

Every metadata change is saved to ``topics.json`` before memory changes: if
the save fails (disk full), the broker goes on as if the call never happened,
rather than accepting appends to a topic a restart would not know.

Locking: the admin calls (``create_topic`` to ``delete_queue``, ``listing``,
``describe``, ``queue_info``) take the store's locks themselves, as the store
did: the admin lock serialises deletes and (re)creations, the store lock
guards the queues and topics. ``topic``, ``live_queue``, ``save``,
``open_queues`` and ``forget`` must be called with the store lock held.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from equeue_broker.storage.config import StorageConfig
from equeue_broker.storage.deletion import bury_index
from equeue_broker.storage.errors import (
    AlreadyExists,
    LimitExceeded,
    NotFound,
    PreconditionFailed,
    io_error,
)
from equeue_broker.storage.message_log import MessageLog
from equeue_broker.storage.names import validate_topic
from equeue_broker.storage.offsets import OffsetStore
from equeue_broker.storage.queue_state import QueueKey, QueueState, open_queue
from equeue_broker.storage.results import QueueInfo
from equeue_broker.storage.topics import QueueMeta, TopicMeta, save_topics


class TopicAdmin:
    """The store's topics and queues, created and deleted (see the module docstring)."""

    def __init__(
        self,
        config: StorageConfig,
        *,
        lock: threading.RLock,
        admin_lock: threading.Lock,
        message_log: MessageLog,
        queues: dict[QueueKey, QueueState],
        offsets: OffsetStore,
        topics: dict[str, TopicMeta],
        check_open: Callable[[], None],
        flush: Callable[[], None],
        persist_offsets: Callable[[], None],
        checkpoint: Callable[[], int],
    ) -> None:
        """``queues`` and ``offsets`` are the store's own (changed here, under
        the store lock); ``topics`` is the metadata loaded at open.
        ``check_open()`` raises ``StoreClosed``; ``flush()`` and
        ``persist_offsets()`` are the store's; ``checkpoint()`` is the log
        position below which every index entry is fsynced."""
        self._config = config
        self._lock = lock
        self._admin_lock = admin_lock
        self._log = message_log
        self._queues = queues
        self._offsets = offsets
        self.topics = topics
        """The current metadata by name; replaced, never changed in place (``save``)."""
        self._check_open = check_open
        self._flush = flush
        self._persist_offsets = persist_offsets
        self._checkpoint = checkpoint
        self._deleted_below = 0  # every record of a deleted topic or queue is below it

    # -- the admin calls (they take the locks) ----------------------------------------

    def create_topic(self, name: str, queue_count: int | None = None) -> TopicMeta:
        validate_topic(name)
        config = self._config
        count = config.default_queue_count if queue_count is None else queue_count
        self._check_queue_count(name, count)
        with self._admin_lock:  # no delete is half done while the name is taken again
            self._settle_deletes()  # nothing of an older topic of this name may come back
            with self._lock:
                self._check_open()
                if name in self.topics:
                    raise AlreadyExists(f"topic {name!r} already exists")
                bury_index(config.data_dir, name)  # what a failed delete left
                if len(self.topics) >= config.max_topics:
                    raise LimitExceeded(
                        f"cannot create topic {name!r}: max_topics={config.max_topics}"
                    )
                meta = TopicMeta(name, tuple(QueueMeta(i) for i in range(count)), _now_ms())
                before = self.topics
                self.save({**before, name: meta})
                self.open_queues(name, [q.queue_id for q in meta.queues], before)
                return meta

    def delete_topic(self, name: str) -> None:
        """Delete a topic, its indexes and groups' offsets, for good (deletion.py)."""
        with self._admin_lock:
            self._flush()  # the saves a full disk refuses fail here, before any change
            with self._lock:
                self.topic(name)
                self.save({k: v for k, v in self.topics.items() if k != name})
                for key in [k for k in self._queues if k[0] == name]:
                    self._queues.pop(key).index.release()
                self.forget(name, None)
            self._settle_deletes()

    def add_queues(self, name: str, count: int = 1) -> TopicMeta:
        with self._admin_lock:
            self._settle_deletes()  # a deleted queue's id may be used again
            with self._lock:
                meta = self.topic(name)
                self._check_queue_count(name, len(meta.queues) + count)
                next_id = max((q.queue_id for q in meta.queues), default=-1) + 1
                new_ids = range(next_id, next_id + count)
                for queue_id in new_ids:
                    meta = meta.with_queue(QueueMeta(queue_id))
                before = self.topics
                self.save({**before, name: meta})
                self.open_queues(name, list(new_ids), before)
                return meta

    def set_queue_visibility(
        self, topic: str, queue_id: int, producer: bool | None = None, consumer: bool | None = None
    ) -> QueueMeta:
        with self._lock:
            meta = self.topic(topic)
            current = queue_meta(meta, queue_id)
            updated = QueueMeta(
                queue_id,
                current.producer_visible if producer is None else producer,
                current.consumer_visible if consumer is None else consumer,
            )
            self.save({**self.topics, topic: meta.with_queue(updated)})
            self._queues[(topic, queue_id)].producer_visible = updated.producer_visible
            return updated

    def delete_queue(self, topic: str, queue_id: int, force: bool = False) -> int:
        """Delete a queue hidden from producers and consumers; unless ``force``,
        only if every group that committed on the topic consumed all of it, or
        it is empty. The number of unconsumed messages it dropped."""
        with self._admin_lock:
            with self._lock:
                meta = self.topic(topic)
                qmeta = queue_meta(meta, queue_id)
                if qmeta.producer_visible or qmeta.consumer_visible:
                    raise PreconditionFailed(
                        f"queue {topic}/{queue_id} must be hidden from producers and consumers"
                    )
                queue = self._queues[(topic, queue_id)]
                index = queue.index
                unread = self._offsets.unconsumed(
                    topic, queue_id, index.earliest, queue.visible_end
                )
                if unread and not force:
                    raise PreconditionFailed(
                        f"queue {topic}/{queue_id} still has {unread} unconsumed messages; "
                        "consume them with every group first, or delete it with force "
                        "(--force) to drop them"
                    )
                self.save({**self.topics, topic: meta.without_queue(queue_id)})
                self._queues.pop((topic, queue_id)).index.release()
                self.forget(topic, queue_id)
            self._settle_deletes()
            return unread

    def listing(self) -> list[TopicMeta]:
        """Every topic, by name."""
        with self._lock:
            return sorted(self.topics.values(), key=lambda t: t.name)

    def describe(self, name: str) -> TopicMeta:
        """``topic``, taking the lock."""
        with self._lock:
            return self.topic(name)

    def queue_info(self, topic: str, queue_id: int) -> QueueInfo:
        with self._lock:
            qmeta = queue_meta(self.topic(topic), queue_id)
            queue = self._queues[(topic, queue_id)]
            return QueueInfo(
                topic,
                queue_id,
                queue.index.earliest,
                queue.visible_end,
                qmeta.producer_visible,
                qmeta.consumer_visible,
            )

    # -- lookups and changes (lock held) ----------------------------------------------

    def adopt(self, wanted: dict[str, TopicMeta]) -> bool:
        """Make the topics present in ``wanted`` exactly these (their
        incarnations, queues and producer visibility: a replica takes its
        master's); True if anything changed. Deleting the topics not wanted is
        the caller's (``delete_topic``, first). Takes the locks itself."""
        changed = False
        with self._admin_lock, self._lock:
            for name, topic in wanted.items():
                have_meta = self.topics.get(name)
                if have_meta == topic:
                    continue
                changed = True
                before = self.topics
                old_ids = {q.queue_id for q in have_meta.queues} if have_meta else set()
                new_ids = {q.queue_id for q in topic.queues}
                self.save({**before, name: topic})
                for queue_id in sorted(old_ids - new_ids):
                    self._queues.pop((name, queue_id)).index.release()
                    self.forget(name, queue_id)
                self.open_queues(name, sorted(new_ids - old_ids), before)
                for q in topic.queues:
                    self._queues[(name, q.queue_id)].producer_visible = q.producer_visible
        return changed

    def topic(self, name: str) -> TopicMeta:
        """The topic's metadata, if the store is open and the topic exists (lock held)."""
        self._check_open()
        meta = self.topics.get(name)
        if meta is None:
            validate_topic(name)
            raise NotFound(f"topic {name!r} does not exist")
        return meta

    def live_queue(self, topic: str, queue_id: int) -> QueueState:
        """The queue, if the store is open and the topic and queue exist (lock held)."""
        queue_meta(self.topic(topic), queue_id)
        return self._queues[(topic, queue_id)]

    def save(self, topics: dict[str, TopicMeta]) -> None:
        """Persist ``topics``, then make them the store's (lock held)."""
        try:
            save_topics(self._config.data_dir / "topics.json", topics)
        except OSError as exc:
            raise io_error("topics.json", exc) from exc
        self.topics = topics

    def open_queues(self, topic: str, queue_ids: list[int], before: dict[str, TopicMeta]) -> None:
        """Open new queues' indexes; if that fails, put the metadata back (lock held)."""
        try:
            for queue_id in queue_ids:
                self._open_queue(topic, queue_id)
        except OSError as exc:
            for queue_id in queue_ids:
                queue = self._queues.pop((topic, queue_id), None)
                if queue is not None:
                    queue.index.release()
            self.save(before)
            raise io_error(f"the index of {topic}", exc) from exc

    def forget(self, topic: str, queue_id: int | None) -> None:
        """After the metadata save of a delete: its index and offsets go (lock held)."""
        self._offsets.forget(topic, queue_id)
        self._deleted_below = self._log.write_position  # its records are all below
        bury_index(self._config.data_dir, topic, queue_id)

    def _open_queue(self, topic: str, queue_id: int) -> QueueState:
        """Open a new queue's index and make the queue the store's (lock held)."""
        config = self._config
        queue = open_queue(
            config.data_dir, config.index_entries_per_chunk, topic, queue_id,
            config.max_open_index_files,
        )  # fmt: skip
        self._queues[(topic, queue_id)] = queue
        return queue

    def _settle_deletes(self) -> None:
        """Make deletes final: offsets saved, the checkpoint past their records
        (admin lock held)."""
        self._persist_offsets()
        if self._checkpoint() < self._deleted_below:
            self._flush()

    def _check_queue_count(self, name: str, count: int) -> None:
        if not isinstance(count, int) or not 1 <= count <= self._config.max_queues_per_topic:
            raise LimitExceeded(
                f"topic {name!r}: queue count {count!r} outside [1, "
                f"{self._config.max_queues_per_topic}] (max_queues_per_topic)"
            )


def queue_meta(meta: TopicMeta, queue_id: int) -> QueueMeta:
    """The queue's metadata, if ``meta``'s topic has it."""
    qmeta = meta.queue(queue_id) if isinstance(queue_id, int) else None
    if qmeta is None:
        raise NotFound(f"topic {meta.name!r} has no queue {queue_id!r}")
    return qmeta


def _now_ms() -> int:
    return int(time.time() * 1000)
