"""Consumer groups' committed offsets: the part of ``Store``'s API that commits,
reads and deletes them (``Store`` inherits it; offsets.py keeps the table and
its file). Committed offsets are persisted before a commit returns in sync
mode, and on every operator's reset or delete."""

from __future__ import annotations

from collections.abc import Iterable

from equeue_broker.storage.config import FlushMode, StorageConfig
from equeue_broker.storage.engine import EngineState
from equeue_broker.storage.errors import InvalidArgument, NotFound, io_error
from equeue_broker.storage.meta.names import validate_group
from equeue_broker.storage.meta.offsets import GroupOffsets


class GroupOffsetsApi:
    """Needs the store's ``_state`` and ``config``."""

    _state: EngineState
    config: StorageConfig

    def commit_offset(self, group: str, topic: str, queue_id: int, next_offset: int) -> None:
        """Record that ``group`` will next consume ``next_offset`` of the queue."""
        self.commit_offsets(group, [(topic, queue_id, next_offset)])

    def commit_offsets(
        self, group: str, offsets: Iterable[tuple[str, int, int]], reset: bool = False
    ) -> None:
        """Commit several (topic, queue_id, next_offset) at once: all are checked
        before any is recorded, and sync mode persists them with one write.
        ``reset``: an operator's reset, allowed for a group whose offsets were lost."""
        validate_group(group)
        with self._state.lock:
            checked = []
            for topic, queue_id, next_offset in offsets:
                end = self._state.live_queue(topic, queue_id).visible_end
                if not isinstance(next_offset, int) or not 0 <= next_offset <= end:
                    raise InvalidArgument(
                        f"offset {next_offset!r} for {topic}/{queue_id} outside [0, {end}]"
                    )
                checked.append((topic, queue_id, next_offset))
            for topic, queue_id, next_offset in checked:
                self._state.offsets.commit(group, topic, queue_id, next_offset, reset)
        if reset or self.config.flush_mode is FlushMode.SYNC:  # a reset is an admin change
            self._persist_offsets()

    def _persist_offsets(self) -> None:
        try:
            self._state.offsets.persist()
        except OSError as exc:
            raise io_error("offsets.json", exc) from exc

    def min_committed(self, topic: str, queue_id: int) -> int | None:
        """Lowest offset any group committed on the queue (None if none did)."""
        return self._state.offsets.min_committed(topic, queue_id)

    def committed_offsets(self, group: str) -> GroupOffsets:
        validate_group(group)
        return self._state.offsets.get(group)

    def groups(self) -> list[str]:
        return self._state.offsets.groups()

    def delete_group(self, group: str) -> None:
        validate_group(group)
        if not self._state.offsets.delete_group(group):
            raise NotFound(f"group {group!r} has no committed offsets")
        self._persist_offsets()
