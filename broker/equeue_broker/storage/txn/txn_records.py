"""Transaction control records: begin, commit and abort, written into the message log.

A transaction lives in the log alone (transactions.py): its staged records
carry the TXN flag and its serial (``equeue_proto.record``), and its fate is
told by control records, which recovery reads back (txn_recovery.py). This
module is the only place that encodes or decodes them.

A control record is a record of the record format with the CONTROL flag set,
topic "" (no topic may have that name), queue id 0, queue offset 0, its kind as
its tag and a JSON object (UTF-8, compact) as its value::

    tag "begin"   {"serial": s, "txn": id, "created_ms": ms, "group": g}
                  written just before a transaction's first staged records;
                  "group" (optional, "" when absent): the producer group
                  asked about the transaction if its outcome is late
    tag "commit"  {"serials": [s, ...], "sink": "", "batch": -1,
                   "queues": [[topic, queue_id, first_offset, count], ...]}
                  makes the staged records of ``serials`` visible: each queue's
                  records (serial by serial in the listed order, each
                  serial's in log order) take the offsets ``first_offset`` ..
                  ``first_offset + count - 1``; a sink's last batch becomes
                  ``batch`` (when ``sink`` is not "")
    tag "abort"   {"serials": [s, ...]}
                  the staged records of ``serials`` stay invisible for ever
    tag "check"   {"serial": s, "checks": n, "ms": t, "answer": "unknown"|"none"}
                  the transaction of ``serial`` was checked for the n-th time
                  at t (ms) with a producer of its group ("none": nobody was
                  there to ask); written before the check is sent, so the
                  count survives restarts and failover (server/txn_checks.py)

Unknown keys are ignored, so fields can be added.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from equeue_broker.storage.config import MessageLimits
from equeue_broker.storage.errors import CorruptionError
from equeue_broker.storage.index.queue_index import ENTRY_SIZE
from equeue_broker.storage.index.queue_state import QueueKey
from equeue_broker.storage.log.record import (
    MessageBatch,
    PreparedBatch,
    encode_records,
    prepare_batch,
)
from equeue_proto.record import FLAG_CONTROL

BEGIN, COMMIT, ABORT, CHECK = "begin", "commit", "abort", "check"
_LIMITS = MessageLimits(max_batch_bytes=1 << 30, max_message_bytes=1 << 30)
"""Control records are the broker's own: not held to client limits."""


@dataclass(frozen=True)
class Begin:
    serial: int
    txn_id: str
    created_ms: int
    group: str = ""
    """The producer group checked about the transaction ("": never checked)."""


@dataclass(frozen=True)
class Commit:
    serials: tuple[int, ...]
    sink: str
    batch: int
    queues: tuple[tuple[QueueKey, int, int], ...]
    """((topic, queue_id), first offset, count) per queue."""


@dataclass(frozen=True)
class Abort:
    serials: tuple[int, ...]


@dataclass(frozen=True)
class Check:
    serial: int
    checks: int
    """The number of this check (1-based)."""
    ms: int
    answer: str
    """"unknown" (a producer was asked) or "none" (no producer was there)."""


Control = Begin | Commit | Abort | Check


def encode_value(control: Control) -> tuple[str, bytes]:
    """(tag, value) of a control record."""
    document: dict[str, Any]
    if isinstance(control, Begin):
        tag = BEGIN
        document = {"serial": control.serial, "txn": control.txn_id}
        document["created_ms"] = control.created_ms
        if control.group:  # absent otherwise: older brokers' records look the same
            document["group"] = control.group
    elif isinstance(control, Commit):
        tag = COMMIT
        document = {
            "serials": list(control.serials),
            "sink": control.sink,
            "batch": control.batch,
            "queues": [[t, q, first, n] for (t, q), first, n in control.queues],
        }
    elif isinstance(control, Check):
        tag = CHECK
        document = {"serial": control.serial, "checks": control.checks, "ms": control.ms}
        document["answer"] = control.answer
    else:
        tag, document = ABORT, {"serials": list(control.serials)}
    return tag, json.dumps(document, separators=(",", ":")).encode()


def decode_value(tag: str, value: bytes) -> Control:
    """The control record of ``tag`` and ``value``; ``CorruptionError`` if it is
    not one (its checksum passed, so this means a bug or a newer broker)."""
    try:
        document = json.loads(value)
        if tag == BEGIN:
            group = str(document.get("group", ""))
            return Begin(
                int(document["serial"]), str(document["txn"]), int(document["created_ms"]), group
            )
        if tag == COMMIT:
            queues = tuple(((str(t), int(q)), int(f), int(n)) for t, q, f, n in document["queues"])
            serials = tuple(int(s) for s in document["serials"])
            return Commit(serials, str(document["sink"]), int(document["batch"]), queues)
        if tag == ABORT:
            return Abort(tuple(int(s) for s in document["serials"]))
        if tag == CHECK:
            serial, checks = int(document["serial"]), int(document["checks"])
            return Check(serial, checks, int(document["ms"]), str(document["answer"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptionError(f"unreadable {tag!r} control record: {exc}") from None
    raise CorruptionError(f"unknown control record {tag!r}")


def prepare_control(control: Control) -> PreparedBatch:
    """The control record as a one-message batch for the log writer."""
    tag, value = encode_value(control)
    return prepare_batch(MessageBatch([value], tags=[tag]), b"", _LIMITS)


def encode_control(
    out: bytearray | memoryview, position: int, prepared: PreparedBatch, store_ms: int
) -> int:
    """Encode a prepared control record at log ``position`` into ``out``; a
    commit's ``store_ms`` is the store time of the entries it makes."""
    return encode_records(
        out, position=position, topic=b"", queue_id=0, first_offset=0, store_ms=store_ms,
        prepared=prepared, start=0, stop=1, index_out=bytearray(ENTRY_SIZE), flags=FLAG_CONTROL,
    )  # fmt: skip
