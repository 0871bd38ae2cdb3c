"""Acknowledged records against what a topic holds: lost, duplicated, moved.

For the kill tests of idempotent produce (``tests/replication/test_idempotent_failover.py``,
``tests/cluster/test_idempotent_restart.py``): every value starts with a
unique id (``value``), the test notes where each acknowledged record was put
(``Place``: broker group, queue, offset) and which ids are in doubt (their
call failed), then reads every queue back (``read_topic``) and ``tally``
counts, per id, the copies the log holds.
"""

from __future__ import annotations

import collections
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from equeue_spark.client import EqueueError, Producer, SendResults, read_range

ID = struct.Struct(">Q")
"""The head of every value: its id, never sent in two different batches."""


@dataclass(frozen=True, order=True)
class Place:
    group: str
    """The broker group ("" for one broker)."""
    queue_id: int
    offset: int


def value(ident: int, size: int = 100) -> bytes:
    """A value of ``size`` bytes that starts with ``ident``."""
    return ID.pack(ident).ljust(size, b"v")


def ident_of(data: bytes) -> int | None:
    """The id a value starts with (None: too short to carry one)."""
    return int(ID.unpack_from(data)[0]) if len(data) >= ID.size else None


def read_topic(topic: str, queues: Mapping[str, tuple[str, int]]) -> list[tuple[Place, bytes]]:
    """Every record of ``topic``: ``queues`` maps a broker group to (the address to
    read it at, its number of queues); (place, value) in offset order per queue."""
    out: list[tuple[Place, bytes]] = []
    for group, (address, count) in sorted(queues.items()):
        for queue_id in range(count):
            for batch in read_range(topic, queue_id, 0, broker=address, batch_messages=5_000):
                out += [(Place(group, queue_id, m.offset), m.value) for m in batch]
    return out


@dataclass
class Tally:
    acked: int = 0
    records: int = 0
    lost: list[int] = field(default_factory=list)
    """Acknowledged ids the log does not hold."""
    duplicated: dict[int, int] = field(default_factory=dict)
    """Acknowledged id -> extra copies (copies - 1) the log holds."""
    moved: list[int] = field(default_factory=list)
    """Acknowledged ids held once, but not at their acknowledged place."""
    in_doubt_present: int = 0
    """Ids of failed calls that the log holds (appended after all: not errors)."""
    in_doubt_duplicated: int = 0
    """Extra copies of ids of failed calls."""
    unknown: int = 0
    """Records whose id was never sent."""

    @property
    def duplicates(self) -> int:
        """Extra copies of acknowledged records."""
        return sum(self.duplicated.values())

    def problems(self) -> list[str]:
        counts = (("acknowledged records lost", len(self.lost)),
                  ("extra copies of acknowledged records", self.duplicates),
                  ("acknowledged records at another place", len(self.moved)),
                  ("extra copies of in-doubt records", self.in_doubt_duplicated),
                  ("records never sent", self.unknown))  # fmt: skip
        return [f"{count} {what}" for what, count in counts if count]

    def summary(self) -> str:
        return (f"{self.acked:,} acknowledged, {self.records:,} records read: "
                f"{len(self.lost)} lost, {self.duplicates} duplicated, {len(self.moved)} moved, "
                f"{self.in_doubt_present} in doubt and present, {self.in_doubt_duplicated} in "
                f"doubt and duplicated, {self.unknown} unknown")  # fmt: skip


def tally(
    acked: Mapping[int, Place], log: Iterable[tuple[Place, bytes]], in_doubt: Iterable[int] = ()
) -> Tally:
    """Count, for every acknowledged id, the copies ``log`` holds and whether one
    is at its acknowledged place."""
    out = Tally(acked=len(acked))
    found: dict[int, list[Place]] = {}
    for place, data in log:
        out.records += 1
        ident = ident_of(data)
        if ident is None:
            out.unknown += 1
            continue
        found.setdefault(ident, []).append(place)
    doubtful = set(in_doubt)
    for ident, places in found.items():
        if ident in acked:
            if len(places) > 1:
                out.duplicated[ident] = len(places) - 1
            if acked[ident] not in places:
                out.moved.append(ident)
        elif ident in doubtful:
            out.in_doubt_present += 1
            out.in_doubt_duplicated += len(places) - 1
        else:
            out.unknown += 1
    out.lost = sorted(ident for ident in acked if ident not in found)
    return out


# -- a producer under kills -------------------------------------------------------------


class Sending:
    """A producer's keyed (or keyless) batches sent from a thread (``unary``: ``send_batch`` one
    at a time; else ``send_batches`` calls of ``per_stream`` batches each), noting
    where each acknowledged record went and the ids of failed batches.

    ``group_of`` names the group of an acknowledged record from
    ``SendResults.broker_of`` (identity for a cluster's merged batches; one
    broker: always ""). ``wait_acked(n)`` blocks until ``n`` batches are
    acknowledged (bounded), so a test kills mid-stream without sleeping;
    ``allow(n)`` lets the sender take only the first ``n`` batches until
    allowed more, so that it cannot finish before the test's last kill
    (every batch allowed by default).
    """

    def __init__(
        self, producer: Producer, topic: str, batches: int, batch: int, *, unary: bool = True,
        per_stream: int = 20, size: int = 100, keys: int = 64,
        group_of: Callable[[str], str] = lambda name: name, keyed: bool = True,
    ) -> None:  # fmt: skip
        self.producer = producer
        self.topic = topic
        self.batches = batches
        self.batch = batch
        self.unary = unary
        self.per_stream = per_stream
        self.size = size
        self.keys = [b"key-%d" % k for k in range(keys)]
        self.keyed = keyed
        """False: keyless batches (each goes whole to one queue the producer picks)."""
        self.group_of = group_of
        self.acked: dict[int, Place] = {}
        self.in_doubt: set[int] = set()
        self.errors: list[str] = []
        self.acked_batches = 0
        self.allowed = batches
        self.taken = 0
        self._next = 0
        self._changed = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="sending", daemon=True)

    def start(self) -> Sending:
        self.thread.start()
        return self

    def allow(self, batches: int) -> None:
        with self._changed:
            self.allowed = min(batches, self.batches)
            self._changed.notify_all()

    def _take(self, timeout_s: float = 300.0) -> None:
        """Wait until the next batch is allowed (the test allows every batch in the end)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self.taken >= self.allowed:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"batch {self.taken} never allowed")
                self._changed.wait(left)
            self.taken += 1

    def _values(self) -> tuple[list[int], list[bytes], list[bytes | None]]:
        self._take()
        first = self._next
        self._next += self.batch
        idents = list(range(first, first + self.batch))
        keys: list[bytes | None] = [
            self.keys[i % len(self.keys)] if self.keyed else None for i in idents
        ]
        return idents, [value(i, self.size) for i in idents], keys

    def _acknowledge(self, idents: Sequence[int], results: SendResults) -> None:
        offsets = results.offsets
        if len(results) != len(idents) or len(offsets) != len(idents):
            self.errors.append(f"{len(results)} acknowledgements for {len(idents)} messages")
            return
        with self._changed:
            for i, ident in enumerate(idents):
                group = self.group_of(results.broker_of(i))
                self.acked[ident] = Place(group, results.queue_ids[i], offsets[i])
            self.acked_batches += 1
            self._changed.notify_all()

    def _fail(self, idents: Iterable[int], exc: BaseException) -> None:
        with self._changed:
            self.in_doubt.update(idents)
            self.errors.append(f"{type(exc).__name__}: {exc}")
            self._changed.notify_all()

    def _run(self) -> None:
        try:
            if self.unary:
                for _ in range(self.batches):
                    idents, values, keys = self._values()
                    try:
                        results = self.producer.send_batch(self.topic, values, keys=keys)
                    except EqueueError as exc:
                        self._fail(idents, exc)
                        continue
                    self._acknowledge(idents, results)
            else:
                for start in range(0, self.batches, self.per_stream):
                    self._stream(min(self.per_stream, self.batches - start))
        finally:
            with self._changed:
                self._changed.notify_all()

    def _stream(self, count: int) -> None:
        taken: collections.deque[list[int]] = collections.deque()
        columns: collections.deque[list[bytes | None]] = collections.deque()

        def batches() -> Iterator[list[bytes]]:
            for _ in range(count):
                idents, values, keys = self._values()
                taken.append(idents)
                columns.append(keys)
                yield values

        def keys() -> Iterator[list[bytes | None]]:
            while True:
                yield columns.popleft()

        try:
            for results in self.producer.send_batches(self.topic, batches(), keys=keys()):
                self._acknowledge(taken.popleft(), results)
        except EqueueError as exc:
            self._fail([i for idents in taken for i in idents], exc)

    def wait_acked(self, batches: int, timeout_s: float) -> None:
        """Until ``batches`` batches are acknowledged (or the sender ended)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self.acked_batches < batches and self.thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{self.acked_batches} of {batches} batches acknowledged in "
                        f"{timeout_s:.0f} s: {self.errors}"
                    )
                self._changed.wait(left)

    def join(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), (
            f"the producer is still sending after {timeout_s:.0f} s "
            f"({self.acked_batches} of {self.batches} batches acknowledged)"
        )
