"""Concurrent appends and reads on one Store, in both flush modes.

Eight writer threads append batches to four queues (two writers per queue)
while a reader thread tails every queue. Afterwards, for every queue:

- the append results tile the offsets: their ranges are disjoint, contiguous
  from 0 and end exactly at the queue's end (no gap, no duplicate);
- every message reads back identical at the offsets its append returned, and at
  the log positions it returned, and each writer's messages are in its order;
- whatever the reader saw while the writers ran is what is there at the end
  (a reader never sees a record that later changes or disappears).

Sync mode's group commit must share fsyncs between concurrent appenders, and
listeners must hear every queue's visible end grow in order.

Messages are identified by the writer id and a sequence number in the value.
Threads start together on a barrier; every join has a timeout; nothing sleeps.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from equeue_broker.storage import (
    AppendResult,
    FlushMode,
    MessageBatch,
    ReadStatus,
    Store,
    StoredMessage,
)
from tests.conftest import MakeConfig

TOPIC = "load"
QUEUE_COUNT = 4
WRITERS_PER_QUEUE = 2
WRITERS = QUEUE_COUNT * WRITERS_PER_QUEUE
BATCHES_PER_WRITER = 80
JOIN_TIMEOUT_S = 60.0

OpenStore = Callable[..., Store]


def message_value(writer: int, seq: int, rng: random.Random) -> bytes:
    """``w<writer>:<seq>:`` then random filler (sometimes none)."""
    return f"w{writer}:{seq}:".encode() + rng.randbytes(rng.choice([0, 10, 100, 700, 3000]))


def parse_value(value: bytes) -> tuple[int, int]:
    writer, seq, _ = value.split(b":", 2)
    return int(writer[1:]), int(seq)


@dataclass
class Writer:
    writer_id: int
    queue_id: int
    results: list[tuple[AppendResult, list[bytes]]] = field(default_factory=list)

    def run(self, store: Store) -> None:
        rng = random.Random(self.writer_id)
        seq = 0
        for _ in range(BATCHES_PER_WRITER):
            values = []
            for _ in range(rng.randint(1, 8)):
                values.append(message_value(self.writer_id, seq, rng))
                seq += 1
            self.results.append((store.append(TOPIC, self.queue_id, MessageBatch(values)), values))


@dataclass
class Reader:
    """Tails every queue until told to stop, checking each message as it comes."""

    seen: dict[tuple[int, int], bytes] = field(default_factory=dict)
    reads: int = 0

    def run(self, store: Store, stop: threading.Event) -> None:
        cursors = [0] * QUEUE_COUNT
        last_seq: dict[int, int] = {}
        while True:
            stopping = stop.is_set()  # read up to the end once the writers are done
            caught_up = True
            for queue_id in range(QUEUE_COUNT):
                result = store.read(TOPIC, queue_id, cursors[queue_id], max_messages=50)
                self.reads += 1
                assert result.status is ReadStatus.OK, (result.status, result.next_offset)
                for i, message in enumerate(result.messages):
                    assert message.queue_offset == cursors[queue_id] + i
                    assert (message.topic, message.queue_id) == (TOPIC, queue_id)
                    writer, seq = parse_value(message.value)
                    assert writer % QUEUE_COUNT == queue_id, "message in another writer's queue"
                    assert seq > last_seq.get(writer, -1), f"writer {writer} out of order"
                    last_seq[writer] = seq
                    self.seen[(queue_id, message.queue_offset)] = message.value
                cursors[queue_id] = result.next_offset
                caught_up = caught_up and result.next_offset == result.end
            if stopping and caught_up:
                return


def run_threads(targets: list[Callable[[], None]], barrier: threading.Barrier) -> None:
    """Run each target in its own thread after ``barrier``; re-raise the first error."""
    errors: list[BaseException] = []

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                barrier.wait(timeout=JOIN_TIMEOUT_S)
                target()
            except BaseException as exc:
                errors.append(exc)
                barrier.abort()

        return run

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=JOIN_TIMEOUT_S)
        assert not thread.is_alive(), "a thread did not finish in time"
    if errors:
        raise errors[0]


def read_queue(store: Store, queue_id: int) -> Iterator[StoredMessage]:
    offset = 0
    while True:
        result = store.read(TOPIC, queue_id, offset, max_messages=500)
        assert result.status is ReadStatus.OK
        yield from result.messages
        if result.next_offset == result.end:
            return
        offset = result.next_offset


MODES = [
    pytest.param(FlushMode.SYNC, False, id="sync"),
    pytest.param(FlushMode.SYNC, True, id="sync-with-flusher"),
    pytest.param(FlushMode.ASYNC, True, id="async-with-flusher"),
    pytest.param(FlushMode.ASYNC, False, id="async"),
]


@pytest.mark.parametrize(("mode", "background"), MODES)
def test_concurrent_writers_and_reader(
    make_config: MakeConfig, open_store: OpenStore, mode: FlushMode, background: bool
) -> None:
    store = open_store(make_config(flush_mode=mode), background=background)
    store.create_topic(TOPIC, QUEUE_COUNT)
    writers = [Writer(w, w % QUEUE_COUNT) for w in range(WRITERS)]
    reader = Reader()
    writers_done = threading.Event()
    barrier = threading.Barrier(WRITERS + 1)
    remaining = [WRITERS]
    lock = threading.Lock()

    def write(writer: Writer) -> Callable[[], None]:
        def run() -> None:
            try:
                writer.run(store)
            finally:
                with lock:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        writers_done.set()

        return run

    def read() -> None:
        reader.run(store, writers_done)

    run_threads([*(write(w) for w in writers), read], barrier)

    appends = sum(len(w.results) for w in writers)
    assert appends == WRITERS * BATCHES_PER_WRITER
    by_queue: dict[int, list[tuple[AppendResult, list[bytes]]]] = defaultdict(list)
    for writer in writers:
        firsts = [r.first_offset for r, _ in writer.results]
        assert firsts == sorted(firsts), "one writer's appends must get increasing offsets"
        by_queue[writer.queue_id] += writer.results

    for queue_id in range(QUEUE_COUNT):
        end = store.queue_info(TOPIC, queue_id).end
        messages = list(read_queue(store, queue_id))
        assert [m.queue_offset for m in messages] == list(range(end))
        results = sorted(by_queue[queue_id], key=lambda rv: rv[0].first_offset)
        expected_offset = 0
        for result, values in results:
            assert (result.topic, result.queue_id) == (TOPIC, queue_id)
            assert result.first_offset == expected_offset, "gap or overlap between appends"
            assert result.count == len(values)
            got = messages[result.first_offset : result.first_offset + result.count]
            assert [m.value for m in got] == values
            assert [m.position for m in got] == result.positions()
            expected_offset += result.count
        assert expected_offset == end, "messages that no append returned"
        for (seen_queue, offset), value in reader.seen.items():
            if seen_queue == queue_id:
                assert messages[offset].value == value
    assert len(reader.seen) == sum(store.queue_info(TOPIC, q).end for q in range(QUEUE_COUNT))
    assert reader.reads > QUEUE_COUNT

    fsyncs = store.stats()["fsyncs"]
    if mode is FlushMode.SYNC and not background:
        # group commit: concurrent appenders share fsyncs
        assert 0 < fsyncs < appends, (fsyncs, appends)


@pytest.mark.parametrize(("mode", "background"), MODES)
def test_listener_sees_increasing_visible_ends(
    make_config: MakeConfig, open_store: OpenStore, mode: FlushMode, background: bool
) -> None:
    """Per queue, listeners hear each new visible end once, in increasing order,
    ending at the queue's end, however many threads append (and flush)."""
    store = open_store(make_config(flush_mode=mode), background=background)
    store.create_topic(TOPIC, QUEUE_COUNT)
    calls: list[tuple[str, int, int]] = []
    store.add_listener(lambda topic, queue_id, end: calls.append((topic, queue_id, end)))
    writers = [Writer(w, w % QUEUE_COUNT) for w in range(WRITERS)]
    barrier = threading.Barrier(WRITERS)

    def write(writer: Writer) -> Callable[[], None]:
        return lambda: writer.run(store)

    run_threads([write(w) for w in writers], barrier)

    for queue_id in range(QUEUE_COUNT):
        ends = [end for topic, q, end in calls if (topic, q) == (TOPIC, queue_id)]
        boundaries = {
            r.first_offset + r.count
            for w in writers
            if w.queue_id == queue_id
            for r, _ in w.results
        }
        final = store.queue_info(TOPIC, queue_id).end
        assert ends, f"queue {queue_id}: listener never called"
        assert ends == sorted(ends), f"queue {queue_id}: visible end went backwards: {ends}"
        assert len(set(ends)) == len(ends), f"queue {queue_id}: repeated visible end: {ends}"
        assert set(ends) <= boundaries, "a visible end that is not the end of an append"
        assert ends[-1] == final
