"""A replica's side of log replication: the master's bytes at the master's positions.

A replica's message log is a byte-for-byte copy of its master's (every record
at the same global position, chunks rolled where the master's were).
``ReplicaLog`` is the one entry point that writes such bytes: ``append``
(checked, placed and indexed by the store: ``Store.append_at``,
storage/log/positioned.py, with one ``TxnScan`` kept across pieces), ``truncate``
(a divergent tail, ``Store.truncate``), ``apply_metadata``, which makes
topics (with their incarnations) and consumer-group offsets the master's, and
``apply_schemas``, which makes the topic schemas the master's (the document
of schemas.json, storage/meta/schemas.py, sent when its generation moved).

Metadata document (JSON, UTF-8; ``encode_metadata``/``decode_metadata``)::

    {"broker_name": "broker-a",
     "topics": [{"name": "t", "incarnation": 123, "created_ms": 1700000000000,
                 "created_position": 4096,
                 "queues": [[queue_id, producer_visible, consumer_visible], ...]}],
     "offsets": {"group": {"topic": [[queue_id, next_offset], ...]}}}

It uses the store's public API only.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from equeue_broker.storage.errors import CorruptionError, InvalidArgument
from equeue_broker.storage.meta.offsets import GroupOffsets
from equeue_broker.storage.meta.topics import QueueMeta, TopicMeta
from equeue_broker.storage.store import Store
from equeue_broker.storage.txn.txn_recovery import TxnScan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Metadata:
    """A master's group metadata (the module docstring's document)."""

    broker_name: str
    topics: tuple[TopicMeta, ...]
    offsets: dict[str, GroupOffsets]


def encode_metadata(meta: Metadata) -> bytes:
    document = {
        "broker_name": meta.broker_name,
        "topics": [
            {
                "name": t.name,
                "incarnation": t.incarnation,
                "created_ms": t.created_ms,
                "created_position": t.created_position,
                "queues": [[q.queue_id, q.producer_visible, q.consumer_visible] for q in t.queues],
            }
            for t in meta.topics
        ],
        "offsets": {
            group: {topic: sorted(queues.items()) for topic, queues in topics.items()}
            for group, topics in meta.offsets.items()
        },
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def decode_metadata(data: bytes) -> Metadata:
    """The document ``data`` holds; ``InvalidArgument`` naming what is wrong."""
    try:
        document: Any = json.loads(data)
        topics = tuple(
            TopicMeta(
                str(t["name"]),
                tuple(QueueMeta(int(q), bool(p), bool(c)) for q, p, c in t["queues"]),
                int(t["created_ms"]),
                incarnation=int(t["incarnation"]),
                created_position=int(t.get("created_position", 0)),
            )
            for t in document["topics"]
        )
        offsets = {
            str(group): {str(topic): {int(q): int(o) for q, o in qs} for topic, qs in ts.items()}
            for group, ts in document["offsets"].items()
        }
        return Metadata(str(document["broker_name"]), topics, offsets)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidArgument(f"bad replication metadata: {exc!r}") from None


def encode_schemas(store: Store) -> tuple[int, bytes]:
    """(generation, the schemas document as JSON): what a master sends its replicas."""
    document = store.schemas.document()
    encoded = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    return int(document["generation"]), encoded


def master_metadata(store: Store, broker_name: str) -> Metadata:
    """What a master sends its replicas."""
    return Metadata(broker_name, tuple(store.topic_admin.listing()), store.offsets_snapshot())


class ReplicaLog:
    """Writes a master's log into ``store`` (the store must take no other writes),
    through the store's log-by-position API (storage/log/positioned.py)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        found = store.transactions.recovered()
        self._scan = TxnScan(found.next_serial, found.sinks, False, store.epochs, store.producers)
        """Transactions found in the replicated bytes, kept across pieces."""
        self._scan.found.open = found.open

    @property
    def end(self) -> int:
        return self._store.log_end

    @property
    def capacity(self) -> int:
        return self._store.chunk_capacity

    def append(self, position: int, data: bytes | memoryview) -> int:
        """Append the master's bytes ``data`` at ``position``; return the new log end.

        ``PreconditionFailed`` if ``position`` is not where this log can
        continue, ``CorruptionError`` if a frame fails its checks (nothing is
        written then)."""
        return self._store.append_at(position, data, self._scan)

    def truncate(self, position: int) -> None:
        """Cut the log at ``position`` (a divergent tail), and every index entry,
        open transaction and epoch marker at or after it, into sealed chunks if
        need be. Loud: it drops records."""
        self._store.truncate(position, self._scan)

    def apply_schemas(self, data: bytes) -> bool:
        """Make the topic schemas the master's (saved before memory); True if
        anything changed. ``InvalidArgument`` if ``data`` is not a document."""
        try:
            document = json.loads(data)
        except ValueError as exc:
            raise InvalidArgument(f"bad replicated schemas: {exc}") from None
        try:
            return self._store.schemas.adopt(document)
        except CorruptionError as exc:
            raise InvalidArgument(f"bad replicated schemas: {exc}") from None

    def apply_metadata(self, meta: Metadata) -> bool:
        """Make topics and group offsets the master's; True if anything changed."""
        store = self._store
        changed = False
        wanted = {t.name: t for t in meta.topics}
        for name, have in {t.name: t for t in store.topic_admin.listing()}.items():
            if name not in wanted or wanted[name].incarnation != have.incarnation:
                log.info("replica: topic %s deleted (the master's is gone or newer)", name)
                store.topic_admin.delete_topic(name)
                changed = True
        if store.topic_admin.adopt(wanted):
            changed = True
        if store.replace_offsets(meta.offsets):
            changed = True
        return changed
