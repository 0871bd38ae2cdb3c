"""Topic and queue metadata, persisted in ``<data_dir>/topics.json``.

Each topic records its queues with two switches, as in EQueue: a
producer-visible queue receives new messages, a consumer-visible queue is
handed to consumers. Hiding a queue from producers and waiting until every
group has consumed it makes it safe to delete. The file is rewritten
atomically (with a ``.bak`` copy) before any admin change returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from equeue_broker.storage.atomic_file import load_json, save_json
from equeue_broker.storage.errors import CorruptionError


@dataclass(frozen=True)
class QueueMeta:
    queue_id: int
    producer_visible: bool = True
    consumer_visible: bool = True


@dataclass(frozen=True)
class TopicMeta:
    name: str
    queues: tuple[QueueMeta, ...]
    created_ms: int
    extra: dict[str, Any] = field(default_factory=dict)

    def queue(self, queue_id: int) -> QueueMeta | None:
        return next((q for q in self.queues if q.queue_id == queue_id), None)

    def with_queue(self, meta: QueueMeta) -> TopicMeta:
        others = tuple(q for q in self.queues if q.queue_id != meta.queue_id)
        return replace(self, queues=tuple(sorted((*others, meta), key=lambda q: q.queue_id)))

    def without_queue(self, queue_id: int) -> TopicMeta:
        return replace(self, queues=tuple(q for q in self.queues if q.queue_id != queue_id))


def load_topics(path: Path) -> dict[str, TopicMeta]:
    document = load_json(path)
    if document is None:
        return {}
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
            )
            for name, entry in document["topics"].items()
        }
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        raise CorruptionError(f"topics file has an unexpected shape: {exc}", str(path)) from exc


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
                }
                for t in topics.values()
            }
        },
    )
