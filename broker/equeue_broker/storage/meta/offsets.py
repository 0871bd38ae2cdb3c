"""Consumer-group offsets: ``{group: {topic: {queue_id: next_offset}}}``.

The stored value is the **next offset to consume** (the Kafka/RocketMQ
convention, not EQueue's "last consumed"): a group that committed 10 for a
queue has processed offsets 0..9 and resumes at 10. A queue with no entry has
no committed progress.

Persistence: ``<data_dir>/offsets.json`` written atomically with a ``.bak``
copy (see ``atomic_file.py``). The store decides when to persist (every
commit in sync flush mode, on an interval in async mode, and on close).

Lost offsets: when neither copy of the file is intact (both fail their
checksum), no committed offset can be trusted, and a group that resumed from
nothing would re-consume or skip messages silently. The store then opens with
no offsets and the ``lost`` mark: every group is refused (``OffsetsLost``,
FAILED_PRECONDITION) on fetch and commit until an operator resets it with
``equeue groups reset`` (a commit with ``reset``) or deletes it. The broker
cannot tell a new group from a lost one, so a new group needs a reset too. The
mark and the groups reset since are saved in the file (``"lost"``), so they
survive restarts.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from equeue_broker.storage.errors import CorruptionError, PreconditionFailed
from equeue_broker.storage.meta.atomic_file import keep_damaged, load_json, save_json

log = logging.getLogger(__name__)

GroupOffsets = dict[str, dict[int, int]]
"""{topic: {queue_id: next_offset}} of one group."""


class OffsetsLost(PreconditionFailed):
    """The group's committed offsets were lost with a damaged offsets file."""


@dataclass
class LostOffsets:
    """Why the offsets were lost, since when, and the groups reset since."""

    reason: str
    since_ms: int
    reset: set[str] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "since_ms": self.since_ms, "reset": sorted(self.reset)}


class OffsetStore:
    """Thread-safe in-memory map with explicit persistence."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._groups: dict[str, GroupOffsets] = {}
        self._version = 0
        self._saved_version = 0
        self._save_lock = threading.Lock()
        self.lost: LostOffsets | None = None
        self._load()

    @property
    def version(self) -> int:
        """Counts changes: a replication master resends its metadata only after one."""
        return self._version

    def _load(self) -> None:
        try:
            document = load_json(self.path)
        except CorruptionError as exc:
            kept = keep_damaged(self.path)
            log.error(
                "CONSUMER OFFSETS LOST: %s. Every group's fetch and commit are refused "
                "until an operator resets the group (equeue groups reset); the damaged "
                "copies are kept as %s", exc, ", ".join(map(str, kept)),
            )  # fmt: skip
            self.lost = LostOffsets(str(exc), int(time.time() * 1000))
            # Saved at once, in both copies: the mark must outlive a restart, and
            # the damaged copies must not be left for a later load to choose from.
            self._version += 1
            self.persist()
            self._version += 1
            self.persist()
            return
        if document is None:
            return
        try:
            if "lost" in document:
                lost = document["lost"]
                self.lost = LostOffsets(
                    str(lost["reason"]), int(lost["since_ms"]), set(map(str, lost["reset"]))
                )
            self._groups = {
                group: {
                    topic: {int(q): int(off) for q, off in queues.items()}
                    for topic, queues in topics.items()
                }
                for group, topics in document["groups"].items()
            }
        except (KeyError, AttributeError, TypeError, ValueError) as exc:
            raise CorruptionError(
                f"offsets file has an unexpected shape: {exc}", str(self.path)
            ) from exc

    def check_group(self, group: str) -> None:
        """``OffsetsLost`` if the group's offsets were lost and not reset since."""
        lost = self.lost
        if lost is not None and group not in lost.reset:
            raise OffsetsLost(
                f"the committed offsets of group {group!r} were lost (offsets.json and its "
                "backup are damaged); an operator must reset them with `equeue groups reset` "
                "(or delete the group) before it can fetch or commit offsets"
            )

    def commit(
        self, group: str, topic: str, queue_id: int, next_offset: int, reset: bool = False
    ) -> None:
        """Record an offset; ``reset`` (an operator's reset) also clears a lost mark."""
        with self._lock:
            if reset and self.lost is not None:
                self.lost.reset.add(group)
            self.check_group(group)
            self._groups.setdefault(group, {}).setdefault(topic, {})[queue_id] = next_offset
            self._version += 1

    def get(self, group: str) -> GroupOffsets:
        with self._lock:
            self.check_group(group)
            return {t: dict(q) for t, q in self._groups.get(group, {}).items()}

    def committed(self, group: str, topic: str, queue_id: int) -> int | None:
        with self._lock:
            return self._groups.get(group, {}).get(topic, {}).get(queue_id)

    def groups(self) -> list[str]:
        with self._lock:
            return sorted(self._groups)

    def min_committed(self, topic: str, queue_id: int) -> int | None:
        """Lowest committed offset of any group on this queue (None if no group has one)."""
        with self._lock:
            values = [
                topics[topic][queue_id]
                for topics in self._groups.values()
                if queue_id in topics.get(topic, {})
            ]
        return min(values) if values else None

    def unconsumed(self, topic: str, queue_id: int, earliest: int, end: int) -> int:
        """Messages of the queue (``earliest`` to ``end``) that some group has
        not consumed: every group that committed on the topic counts, those
        without an entry for this queue as having consumed none of it, and
        when no group committed on the topic every message is unconsumed."""
        with self._lock:
            lows = [queues.get(queue_id, 0) for queues in self._topic_queues(topic)]
        low = min(lows) if lows else earliest
        return max(0, end - max(low, earliest))

    def _topic_queues(self, topic: str) -> list[dict[int, int]]:
        """Each group's offsets on ``topic`` (lock held)."""
        return [topics[topic] for topics in self._groups.values() if topic in topics]

    def clamp(self, ends: dict[tuple[str, int], int]) -> list[tuple[str, str, int, int, int]]:
        """Lower every committed offset above its queue's end to the end;
        return (group, topic, queue, was, now) for each one lowered."""
        lowered = []
        with self._lock:
            for group, topics in self._groups.items():
                for topic, queues in topics.items():
                    for queue_id, offset in queues.items():
                        end = ends.get((topic, queue_id))
                        if end is not None and offset > end:
                            queues[queue_id] = end
                            lowered.append((group, topic, queue_id, offset, end))
            if lowered:
                self._version += 1
        return lowered

    def snapshot(self) -> dict[str, GroupOffsets]:
        """Every group's offsets (a copy): what a master sends its replicas."""
        with self._lock:
            groups = self._groups.items()
            return {g: {t: dict(q) for t, q in topics.items()} for g, topics in groups}

    def replace_all(self, groups: dict[str, GroupOffsets]) -> bool:
        """Make every group's offsets ``groups`` (a replica taking its master's);
        True if anything changed."""
        with self._lock:
            if groups == self._groups:
                return False
            self._groups = {g: {t: dict(q) for t, q in ts.items()} for g, ts in groups.items()}
            self._version += 1
            return True

    def delete_group(self, group: str) -> bool:
        """Forget a group; a group whose offsets were lost counts as existing."""
        with self._lock:
            existed = self._groups.pop(group, None) is not None
            if self.lost is not None and group not in self.lost.reset:
                self.lost.reset.add(group)
                existed = True
            self._version += 1
        return existed

    def forget(self, topic: str, queue_id: int | None = None) -> None:
        """Drop every group's offsets for a deleted topic (or one of its queues)."""
        with self._lock:
            for topics in self._groups.values():
                if queue_id is None:
                    topics.pop(topic, None)
                elif topic in topics:
                    topics[topic].pop(queue_id, None)
            self._version += 1

    def persist(self) -> None:
        """Write the current offsets if they changed since the last write.

        Concurrent callers coalesce: whoever holds the save lock writes the
        newest version, and a caller whose version is already saved returns.
        """
        with self._save_lock:
            with self._lock:
                version = self._version
                if version == self._saved_version:
                    return
                document: dict[str, Any] = {
                    "groups": {
                        group: {
                            topic: {str(q): off for q, off in queues.items()}
                            for topic, queues in topics.items()
                        }
                        for group, topics in self._groups.items()
                    }
                }
                if self.lost is not None:
                    document["lost"] = self.lost.to_json()
            save_json(self.path, document)
            self._saved_version = version
