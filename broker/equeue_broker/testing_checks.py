"""Invariant checks on a broker for tests and hardening runs (``equeue_broker.testing_checks``).

The shipped harness beside ``equeue_broker.testing`` (which starts the broker
processes these look at):

- ``recovery_seconds``: the store's recovery time at a broker's last start.
- ``pull_queue``: a whole queue read back through the broker's ``Pull`` RPC,
  every record's checksum verified (the contract's decoder, ``equeue_proto``:
  this module never imports the client).
- ``status_of``, ``details_of``: a gRPC error's status code and details.
- ``layout_violations``: what in a data directory is outside its documented layout.
- ``check_store``: open a stopped broker's data directory with ``Store`` and
  check that every queue index agrees with the message log.

Nothing in the broker imports this module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import grpc

from equeue_broker.storage import MessageLimits, StorageConfig, Store
from equeue_broker.storage.log.chunk import HEADER_SIZE, ChunkHeader
from equeue_broker.testing import BrokerProcess
from equeue_proto.accel import CODEC
from equeue_proto.record import (
    FLAG_CONTROL,
    FLAG_TXN,
    Buffer,
    RecordMeta,
    check_frame,
    decode_record,
    read_meta,
)
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

PULL_BATCH = 10_000
"""The broker's default ``--max-pull-messages``: the most one Pull returns."""


def recovery_seconds(broker: BrokerProcess) -> float | None:
    """The store's own recovery time at the broker's last start (needs ``--log-format json``)."""
    for line in broker.log_since_start().splitlines():
        if '"recovery_s"' not in line:
            continue
        try:
            value = json.loads(line).get("recovery_s")
        except ValueError:
            continue
        if isinstance(value, int | float):
            return float(value)
    return None


class PulledMessage(NamedTuple):
    """One record of a ``Pull`` reply, its checksum verified. The fields, in
    order, of the client's ``Message`` (the C decoder builds either)."""

    topic: str
    queue_id: int
    offset: int
    key: bytes | None
    value: bytes
    tag: str
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int
    store_timestamp_ms: int
    position: int
    broker_id: str


_decode_c: Callable[[Buffer, type[PulledMessage], str], list[PulledMessage]] | None = (
    CODEC.decode_frames if CODEC else None
)


def decode_pulled(records: Buffer, broker_id: str) -> list[PulledMessage]:
    """Every record of a ``Pull`` reply; ``AssertionError`` naming the first damaged one."""
    if _decode_c is not None:
        try:
            return _decode_c(records, PulledMessage, broker_id)
        except ValueError as exc:
            raise AssertionError(f"a damaged record: {exc}") from None
    out = []
    pos, end = 0, len(records)
    while pos < end:
        size = check_frame(records, pos, end)
        if isinstance(size, str):
            raise AssertionError(f"a damaged record at byte {pos}: {size}")
        m = decode_record(records, pos)
        fields = (m.topic, m.queue_id, m.queue_offset, m.key, m.value, m.tag, m.headers)
        out.append(
            PulledMessage(
                *fields, m.producer_timestamp_ms, m.store_timestamp_ms, m.position, broker_id
            )
        )
        pos += size
    return out


def pull_queue(
    stub: pb_grpc.BrokerStub, topic: str, queue_id: int, start: int = 0, timeout_s: float = 30.0
) -> tuple[list[PulledMessage], pb.PullReply]:
    """Every record of a queue from ``start`` to its end (as of the first reply),
    via ``Pull``; also the first reply (earliest and end offsets)."""
    out: list[PulledMessage] = []
    offset = start
    first: pb.PullReply | None = None
    for _ in range(1_000_000):  # bounded: every round returns >= 1 record or ends
        reply = stub.Pull(
            pb.PullRequest(
                topic=topic, queue_id=queue_id, offset=offset, max_messages=PULL_BATCH,
                max_bytes=64 << 20,
            ),
            timeout=timeout_s,
        )  # fmt: skip
        if first is None:
            first = reply
        if reply.status != pb.PULL_STATUS_OK:
            raise AssertionError(f"{topic}/{queue_id} offset {offset}: pull status {reply.status}")
        out += decode_pulled(reply.records, reply.broker_id)
        if reply.count == 0 or reply.next_offset >= first.end_offset:
            return out, first
        offset = reply.next_offset
    raise AssertionError("pull loop did not reach the end")


def status_of(exc: grpc.RpcError) -> grpc.StatusCode:
    code = getattr(exc, "code", None)
    return code() if callable(code) else grpc.StatusCode.UNKNOWN


def details_of(exc: grpc.RpcError) -> str:
    details = getattr(exc, "details", None)
    return str(details()) if callable(details) else str(exc)


# -- the data directory -----------------------------------------------------------------

NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_TOP_LEVEL_FILES = {
    "LOCK",
    *(f"{name}{suffix}" for name in ("topics", "offsets", "checkpoint", "broker")
      for suffix in (".json", ".json.bak")),
}  # fmt: skip
_LOG_FILE = re.compile(r"\d{9}\.chunk")
_INDEX_FILE = re.compile(r"\d{9}\.idx")
_TIMER_FILE = re.compile(r"wheel|\d{9}\.tlog")
_KEYS_FILE = re.compile(r"\d{9}\.kidx")
_NAME = re.compile(rf"(?:%(?:RETRY|DLQ|RESENT)%)?{NAME}")
"""A topic's name: a user's, or a group's retry or dead-letter topic's."""


def layout_violations(data_dir: Path, *, allow_temp: bool = False) -> list[str]:
    """Paths under ``data_dir`` outside the layout of ``broker/equeue_broker/storage/store.py``
    (transactions keep no files: they live in the log).

    ``allow_temp``: also accept ``*.tmp`` (a save or chunk creation in progress).
    """
    bad: list[str] = []
    for path in sorted(data_dir.rglob("*")):
        parts = path.relative_to(data_dir).parts
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            bad.append(f"{path} (not a plain file or directory)")
            continue
        if allow_temp and path.name.endswith(".tmp") and path.is_file():
            continue
        if _layout_ok(parts, path.is_dir()):
            continue
        bad.append(str(path))
    return bad


def _layout_ok(parts: tuple[str, ...], is_dir: bool) -> bool:
    if len(parts) == 1:
        return (parts[0] in ("log", "index", "timer", "keys") and is_dir) or (
            parts[0] in _TOP_LEVEL_FILES and not is_dir
        )
    if parts[0] == "log":
        return len(parts) == 2 and not is_dir and bool(_LOG_FILE.fullmatch(parts[1]))
    if parts[0] == "timer":  # delayed records' index (storage/timer/wheel.py)
        return len(parts) == 2 and not is_dir and bool(_TIMER_FILE.fullmatch(parts[1]))
    if parts[0] == "keys":  # the key index's windows (storage/keys/key_index.py)
        return len(parts) == 2 and not is_dir and bool(_KEYS_FILE.fullmatch(parts[1]))
    if parts[0] == "index":
        if not _NAME.fullmatch(parts[1]):
            return False
        if len(parts) == 2:
            return is_dir
        if not parts[2].isdigit() or str(int(parts[2])) != parts[2]:
            return False
        if len(parts) == 3:
            return is_dir
        return len(parts) == 4 and not is_dir and bool(_INDEX_FILE.fullmatch(parts[3]))
    return False


@dataclass
class StoreCheck:
    """What ``check_store`` found."""

    messages: dict[tuple[str, int], list[tuple[int, bytes]]] = field(default_factory=dict)
    """(topic, queue) -> [(offset, value)] of every retained record, via the index."""
    log_records: int = 0
    problems: list[str] = field(default_factory=list)


def check_store(data_dir: Path, topics: Iterable[str] | None = None) -> StoreCheck:
    """Open a stopped broker's data directory and check index/log agreement.

    For every queue of ``topics`` (default: all): each offset in [earliest, end)
    reads back through the index (``Store.read`` verifies that the record the
    index points at carries that topic, queue and offset), and the same record is
    found at its log position. Then the log is scanned from its start: every
    record of a live queue must be exactly the one its queue's index points at
    for its offset, and every index entry must be matched by one log record.
    """
    result = StoreCheck()
    capacity = _log_capacity(data_dir)
    config = StorageConfig(
        data_dir,
        chunk_capacity_bytes=capacity,
        limits=MessageLimits(max_message_bytes=min(capacity, MessageLimits.max_message_bytes)),
    )
    with Store(config, background=False) as store:
        wanted = {t.name for t in store.topic_admin.listing()} if topics is None else set(topics)
        ends: dict[tuple[str, int], tuple[int, int]] = {}
        served: set[int] = set()
        for meta in store.topic_admin.listing():
            if meta.name not in wanted:
                continue
            for q in meta.queues:
                info = store.topic_admin.queue_info(meta.name, q.queue_id)
                ends[(meta.name, q.queue_id)] = (info.earliest, info.end)
                got: list[tuple[int, bytes]] = []
                offset = info.earliest
                for _ in range(info.end - info.earliest + 1):
                    if offset >= info.end:
                        break
                    read = store.reads.read(meta.name, q.queue_id, offset, max_messages=PULL_BATCH)
                    for m in read.messages:
                        served.add(m.position)
                        got.append((m.queue_offset, m.value))
                        again = store.reads.read_at_position(m.position)
                        if again != m:
                            result.problems.append(
                                f"{meta.name}/{q.queue_id}@{m.queue_offset}: position "
                                f"{m.position} holds a different record"
                            )
                    offset = read.next_offset
                if [o for o, _v in got] != list(range(info.earliest, info.end)):
                    result.problems.append(
                        f"{meta.name}/{q.queue_id}: offsets read are not "
                        f"[{info.earliest}, {info.end})"
                    )
                result.messages[(meta.name, q.queue_id)] = got
        # The other direction: every log record of a live queue is indexed.
        seen: dict[tuple[str, int], int] = {}
        for position, meta_record in _log_records(store, result.problems):
            key = (meta_record.topic.decode(), meta_record.queue_id)
            if key not in ends or meta_record.flags & FLAG_CONTROL:
                continue
            if meta_record.flags & FLAG_TXN:  # staged: indexed only if committed
                if position in served:
                    result.log_records += 1
                    seen[key] = seen.get(key, 0) + 1
                continue
            result.log_records += 1
            seen[key] = seen.get(key, 0) + 1
            earliest, end = ends[key]
            if not earliest <= meta_record.queue_offset < end:
                result.problems.append(
                    f"log record at {position} is {key} offset {meta_record.queue_offset}, "
                    f"outside the index's [{earliest}, {end})"
                )
                continue
            indexed = store.reads.position_of(key[0], key[1], meta_record.queue_offset)
            if indexed != position:
                result.problems.append(
                    f"log record at {position} is {key} offset {meta_record.queue_offset}, "
                    f"but the index points at {indexed}"
                )
        for key, (earliest, end) in ends.items():
            if seen.get(key, 0) != end - earliest:
                result.problems.append(
                    f"{key}: {seen.get(key, 0)} log records for {end - earliest} index entries"
                )
    return result


def _log_records(store: Store, problems: list[str]) -> Iterator[tuple[int, RecordMeta]]:
    """(position, meta) of every record in the store's log, from its start:
    read through ``Store.read_log`` (what a replica reads: checked whole
    records, a chunk at a time), the store's public scan of its log. A log
    that cannot be read on adds to ``problems``."""
    position = store.log_start
    while True:
        piece = store.read_log(position, 1 << 20)
        if not piece.data:
            if piece.position < piece.end:
                problems.append(f"cannot scan the log on from {position}")
            return
        offset = 0
        while offset < len(piece.data):
            meta = read_meta(piece.data, offset)
            yield piece.position + offset, meta
            offset += meta.frame_size
        position = piece.position + len(piece.data)


def _log_capacity(data_dir: Path) -> int:
    """The chunk capacity the log was created with (the default if there is no log)."""
    chunks = sorted((data_dir / "log").glob("*.chunk"))
    if not chunks:
        return StorageConfig(data_dir).chunk_capacity_bytes
    with open(chunks[0], "rb") as f:
        return ChunkHeader.decode(f.read(HEADER_SIZE), str(chunks[0])).capacity
