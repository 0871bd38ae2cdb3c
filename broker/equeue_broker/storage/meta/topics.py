"""Topic and queue metadata, persisted in ``<data_dir>/topics.json``.

Each topic records its queues with two switches, as in EQueue: a
producer-visible queue receives new messages, a consumer-visible queue is
handed to consumers. Hiding a queue from producers and waiting until every
group has consumed it makes it safe to delete. The file is rewritten
atomically (with a ``.bak`` copy) before any admin change returns.

Each topic also has an *incarnation*: a random non-zero 63-bit id drawn when the
topic is created. A topic deleted and created again under the same name gets a
new one, so a reader holding offsets of the old topic (a Spark checkpoint) can
tell that they do not apply to the new one. Files written before incarnations
existed get one per topic at load, saved at once so it never changes again.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from equeue_broker.storage.errors import CorruptionError, InvalidName, NotFound
from equeue_broker.storage.meta.atomic_file import keep_damaged, load_json, save_json
from equeue_broker.storage.meta.names import validate_topic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueMeta:
    queue_id: int
    producer_visible: bool = True
    consumer_visible: bool = True


def new_incarnation() -> int:
    """A fresh incarnation: random, non-zero (0 means "unknown" on the wire),
    below 2**63 so it fits a signed 64-bit integer (Java's long, JSON readers)."""
    return secrets.randbelow(2**63 - 1) + 1


@dataclass(frozen=True)
class TopicMeta:
    name: str
    queues: tuple[QueueMeta, ...]
    created_ms: int
    extra: dict[str, Any] = field(default_factory=dict)
    incarnation: int = field(default_factory=new_incarnation)
    """Drawn at creation (the default); kept by every later change of the topic."""
    created_position: int = 0
    """The log's end when this incarnation was created (0: not known, a topic
    from an older version): a delayed record below it was sent to an earlier
    topic of the same name, and is not delivered into this one (timer/)."""

    def queue(self, queue_id: int) -> QueueMeta | None:
        return next((q for q in self.queues if q.queue_id == queue_id), None)

    def with_queue(self, meta: QueueMeta) -> TopicMeta:
        others = tuple(q for q in self.queues if q.queue_id != meta.queue_id)
        return replace(self, queues=tuple(sorted((*others, meta), key=lambda q: q.queue_id)))

    def without_queue(self, queue_id: int) -> TopicMeta:
        return replace(self, queues=tuple(q for q in self.queues if q.queue_id != queue_id))


def load_topics(path: Path) -> tuple[dict[str, TopicMeta], str | None]:
    """The topics saved in ``path``, and what was lost if no copy of it was
    intact (None: nothing). Topics saved without an incarnation (by a broker
    that had none) are given one, and the file is saved again before this
    returns: an incarnation must not change across restarts."""
    try:
        document = load_json(path)
    except CorruptionError as exc:
        return _rebuild_topics(path, exc)
    if document is None:
        return {}, None
    topics = _parse_topics(document, path)
    if any("incarnation" not in entry for entry in document["topics"].values()):
        save_topics(path, topics)
    return topics, None


def _rebuild_topics(path: Path, exc: CorruptionError) -> tuple[dict[str, TopicMeta], str]:
    """Topics and queues rebuilt from the index directories (``index/<topic>/<q>``)
    when neither copy of the topics file is intact: the messages stay reachable.
    What the directories cannot tell is lost: queue visibility (every queue is
    visible again), creation times, extras and incarnations (new ones: a Spark
    checkpoint of such a topic sees a new topic). Saved at once."""
    kept = keep_damaged(path)
    topics = {}
    now = int(time.time() * 1000)
    for directory in sorted((path.parent / "index").glob("*/")):
        queues = sorted(int(q.name) for q in directory.iterdir() if q.name.isdigit())
        try:
            validate_topic(directory.name)
        except InvalidName:
            continue
        if queues:
            topics[directory.name] = TopicMeta(
                directory.name, tuple(QueueMeta(q) for q in queues), now
            )
    what = (
        f"topics.json: no intact copy ({exc}); {len(topics)} topics rebuilt from the "
        "index directories with every queue visible and new incarnations"
    )
    log.error("TOPICS FILE LOST: %s; damaged copies kept as %s", what, kept)
    save_topics(path, topics)
    save_topics(path, topics)
    return topics, what


def _parse_topics(document: Any, path: Path) -> dict[str, TopicMeta]:
    try:
        return {
            name: TopicMeta(
                name,
                tuple(
                    QueueMeta(int(q["id"]), bool(q["producer"]), bool(q["consumer"]))
                    for q in entry["queues"]
                ),
                int(entry["created_ms"]),
                dict(entry.get("extra", {})),
                _incarnation(entry),
                int(entry.get("created_position", 0)),
            )
            for name, entry in document["topics"].items()
        }
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        raise CorruptionError(f"topics file has an unexpected shape: {exc}", str(path)) from exc


def _incarnation(entry: dict[str, Any]) -> int:
    if "incarnation" not in entry:
        return new_incarnation()
    value = int(entry["incarnation"])
    if not 0 < value < 2**63:
        raise ValueError(f"incarnation {value} outside [1, 2**63)")
    return value


def save_topics(path: Path, topics: dict[str, TopicMeta]) -> None:
    save_json(
        path,
        {
            "topics": {
                t.name: {
                    "queues": [
                        {
                            "id": q.queue_id,
                            "producer": q.producer_visible,
                            "consumer": q.consumer_visible,
                        }
                        for q in t.queues
                    ],
                    "created_ms": t.created_ms,
                    "extra": t.extra,
                    "incarnation": t.incarnation,
                    "created_position": t.created_position,
                }
                for t in topics.values()
            }
        },
    )


def queue_meta(meta: TopicMeta, queue_id: int) -> QueueMeta:
    """The queue's metadata, if ``meta``'s topic has it."""
    qmeta = meta.queue(queue_id) if isinstance(queue_id, int) else None
    if qmeta is None:
        raise NotFound(f"topic {meta.name!r} has no queue {queue_id!r}")
    return qmeta
