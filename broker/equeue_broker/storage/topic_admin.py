"""Topic and queue admin: every change to the store's topic metadata.

``store.topic_admin`` (a ``TopicAdmin``) creates and deletes topics, adds,
hides and deletes queues, and lists and describes them; it saves the
metadata (``EngineState.topics``, as in ``topics.json``, topics.py) and
opens, releases and buries the queues' indexes as topics and queues come and
go. It is separate from the store because admin is a concept of its own,
with its own rules (the save-first order below, the limits, settling
deletes; deletion.py), that the write and read paths only consult, through
the engine state's lookups (``EngineState.topic``, ``live_queue``,
``writable_queue``). Like the engine's other modules it works on the
``EngineState`` (engine.py) it is given and never imports store.py; what it
needs of the store's durability (flush, persist offsets) it gets as
callables.

Every metadata change is saved to ``topics.json`` before memory changes: if
the save fails (disk full), the broker goes on as if the call never happened,
rather than accepting appends to a topic a restart would not know.

Locking: the admin calls (``create_topic`` to ``delete_queue``, ``listing``,
``describe``, ``queue_info``, ``adopt``) take the engine's locks themselves:
the admin lock serialises deletes and (re)creations, the engine lock guards
the queues and topics. ``save``, ``open_queues`` and ``forget`` must be
called with the engine lock held, and assert it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from equeue_broker.storage.deletion import bury_index
from equeue_broker.storage.engine import EngineState
from equeue_broker.storage.errors import (
    AlreadyExists,
    LimitExceeded,
    PreconditionFailed,
    io_error,
)
from equeue_broker.storage.index.queue_state import QueueState, open_queue
from equeue_broker.storage.meta.names import validate_topic
from equeue_broker.storage.meta.topics import QueueMeta, TopicMeta, queue_meta, save_topics
from equeue_broker.storage.results import QueueInfo


class TopicAdmin:
    """The store's topics and queues, created and deleted (see the module docstring)."""

    def __init__(
        self,
        state: EngineState,
        *,
        flush: Callable[[], None],
        persist_offsets: Callable[[], None],
        forget_schemas: Callable[[str], None] = lambda topic: None,
    ) -> None:
        """``state`` is the engine's (its queues, offsets and topics are changed
        here, under its lock); ``flush()`` and ``persist_offsets()`` are the
        store's, ``forget_schemas(topic)`` its schemas' (meta/schemas.py)."""
        self._state = state
        self._config = state.config
        self._flush = flush
        self._persist_offsets = persist_offsets
        self._forget_schemas = forget_schemas
        self._deleted_below = 0  # every record of a deleted topic or queue is below it

    @property
    def topics(self) -> dict[str, TopicMeta]:
        """The current metadata by name (``EngineState.topics``); replaced on
        every change, never changed in place."""
        return self._state.topics

    # -- the admin calls (they take the locks) ----------------------------------------

    def create_topic(self, name: str, queue_count: int | None = None) -> TopicMeta:
        validate_topic(name)
        config = self._config
        count = config.default_queue_count if queue_count is None else queue_count
        self._check_queue_count(name, count)
        with self._state.admin_lock:  # no delete is half done while the name is taken again
            self._settle_deletes()  # nothing of an older topic of this name may come back
            with self._state.lock:
                self._state.check_open()
                if name in self.topics:
                    raise AlreadyExists(f"topic {name!r} already exists")
                bury_index(config.data_dir, name)  # what a failed delete left
                if len(self.topics) >= config.max_topics:
                    raise LimitExceeded(
                        f"cannot create topic {name!r}: max_topics={config.max_topics}; "
                        "delete topics or groups no longer used (a group's deletion "
                        "removes its retry and dead-letter topics)"
                    )
                queues = tuple(QueueMeta(i) for i in range(count))
                position = self._state.log.write_position
                meta = TopicMeta(name, queues, _now_ms(), created_position=position)
                before = self.topics
                self.save({**before, name: meta})
                self.open_queues(name, [q.queue_id for q in meta.queues], before)
                return meta

    def delete_topic(self, name: str) -> None:
        """Delete a topic, its indexes and groups' offsets, for good (deletion.py)."""
        with self._state.admin_lock:
            self._flush()  # the saves a full disk refuses fail here, before any change
            with self._state.lock:
                self._state.topic(name)
                self.save({k: v for k, v in self.topics.items() if k != name})
                for key in [k for k in self._state.queues if k[0] == name]:
                    self._state.queues.pop(key).index.release()
                self.forget(name, None)
            # After the topics' save: a crash in between leaves schemas of an
            # incarnation that is gone, which the next open drops (schemas.retain).
            self._forget_schemas(name)
            self._settle_deletes()

    def add_queues(self, name: str, count: int = 1) -> TopicMeta:
        with self._state.admin_lock:
            self._settle_deletes()  # a deleted queue's id may be used again
            with self._state.lock:
                meta = self._state.topic(name)
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
        with self._state.lock:
            meta = self._state.topic(topic)
            current = queue_meta(meta, queue_id)
            updated = QueueMeta(
                queue_id,
                current.producer_visible if producer is None else producer,
                current.consumer_visible if consumer is None else consumer,
            )
            self.save({**self.topics, topic: meta.with_queue(updated)})
            self._state.queues[(topic, queue_id)].producer_visible = updated.producer_visible
            return updated

    def delete_queue(self, topic: str, queue_id: int, force: bool = False) -> int:
        """Delete a queue hidden from producers and consumers; unless ``force``,
        only if every group that committed on the topic consumed all of it, or
        it is empty. The number of unconsumed messages it dropped."""
        with self._state.admin_lock:
            with self._state.lock:
                meta = self._state.topic(topic)
                qmeta = queue_meta(meta, queue_id)
                if qmeta.producer_visible or qmeta.consumer_visible:
                    raise PreconditionFailed(
                        f"queue {topic}/{queue_id} must be hidden from producers and consumers"
                    )
                queue = self._state.queues[(topic, queue_id)]
                index = queue.index
                unread = self._state.offsets.unconsumed(
                    topic, queue_id, index.earliest, queue.visible_end
                )
                if unread and not force:
                    raise PreconditionFailed(
                        f"queue {topic}/{queue_id} still has {unread} unconsumed messages; "
                        "consume them with every group first, or delete it with force "
                        "(--force) to drop them"
                    )
                self.save({**self.topics, topic: meta.without_queue(queue_id)})
                self._state.queues.pop((topic, queue_id)).index.release()
                self.forget(topic, queue_id)
            self._settle_deletes()
            return unread

    def listing(self) -> list[TopicMeta]:
        """Every topic, by name."""
        with self._state.lock:
            return sorted(self.topics.values(), key=lambda t: t.name)

    def describe(self, name: str) -> TopicMeta:
        """``EngineState.topic``, taking the lock."""
        with self._state.lock:
            return self._state.topic(name)

    def queue_info(self, topic: str, queue_id: int) -> QueueInfo:
        with self._state.lock:
            qmeta = queue_meta(self._state.topic(topic), queue_id)
            queue = self._state.queues[(topic, queue_id)]
            return QueueInfo(
                topic,
                queue_id,
                queue.index.earliest,
                queue.visible_end,
                qmeta.producer_visible,
                qmeta.consumer_visible,
            )

    # -- changes (lock held, except adopt) ----------------------------------------------

    def adopt(self, wanted: dict[str, TopicMeta]) -> bool:
        """Make the topics present in ``wanted`` exactly these (their
        incarnations, queues and producer visibility: a replica takes its
        master's); True if anything changed. Deleting the topics not wanted is
        the caller's (``delete_topic``, first). Takes the locks itself."""
        changed = False
        with self._state.admin_lock, self._state.lock:
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
                    self._state.queues.pop((name, queue_id)).index.release()
                    self.forget(name, queue_id)
                self.open_queues(name, sorted(new_ids - old_ids), before)
                for q in topic.queues:
                    self._state.queues[(name, q.queue_id)].producer_visible = q.producer_visible
        return changed

    def save(self, topics: dict[str, TopicMeta]) -> None:
        """Persist ``topics``, then make them the store's (lock held)."""
        assert self._state.held()
        try:
            save_topics(self._config.data_dir / "topics.json", topics)
        except OSError as exc:
            raise io_error("topics.json", exc) from exc
        self._state.topics = topics

    def open_queues(self, topic: str, queue_ids: list[int], before: dict[str, TopicMeta]) -> None:
        """Open new queues' indexes; if that fails, put the metadata back (lock held)."""
        assert self._state.held()
        try:
            for queue_id in queue_ids:
                self._open_queue(topic, queue_id)
        except OSError as exc:
            for queue_id in queue_ids:
                queue = self._state.queues.pop((topic, queue_id), None)
                if queue is not None:
                    queue.index.release()
            self.save(before)
            raise io_error(f"the index of {topic}", exc) from exc

    def forget(self, topic: str, queue_id: int | None) -> None:
        """After the metadata save of a delete: its index and offsets go (lock held)."""
        assert self._state.held()
        self._state.offsets.forget(topic, queue_id)
        self._deleted_below = self._state.log.write_position  # its records are all below
        bury_index(self._config.data_dir, topic, queue_id)

    def _open_queue(self, topic: str, queue_id: int) -> QueueState:
        """Open a new queue's index and make the queue the engine's (lock held)."""
        config = self._config
        queue = open_queue(
            config.data_dir, config.index_entries_per_chunk, topic, queue_id,
            config.max_open_index_files,
        )  # fmt: skip
        self._state.queues[(topic, queue_id)] = queue
        return queue

    def _settle_deletes(self) -> None:
        """Make deletes final: offsets saved, the checkpoint past their records
        (admin lock held)."""
        self._persist_offsets()
        if self._state.checkpoint < self._deleted_below:
            self._flush()

    def _check_queue_count(self, name: str, count: int) -> None:
        if not isinstance(count, int) or not 1 <= count <= self._config.max_queues_per_topic:
            raise LimitExceeded(
                f"topic {name!r}: queue count {count!r} outside [1, "
                f"{self._config.max_queues_per_topic}] (max_queues_per_topic)"
            )


def _now_ms() -> int:
    return int(time.time() * 1000)
