"""Storage-engine benchmark: every equeue figure beside a raw-I/O baseline from the same run.

Run ``python bench/storage_bench.py`` (about a minute here; ``--quick`` for a
smoke run of a few seconds, ``--repeat N`` to report the median of N runs).
Prints one markdown row per measurement as it completes, then the whole table.

Scenarios (messages of 100 B and 1 KiB of random bytes, generated once):

* async append, 1 writer, 1,000-message batches. Baseline: ``os.write`` of the
  same encoded volume to a file in the same directory, one write per batch of the
  same byte length, a background thread fsyncing every 100 ms (the store's
  async policy).
* sync append, 1 and 16 writers, 1,000-message batches (16 writers: one queue
  each). Baseline: one writer, ``os.write`` + ``os.fsync`` per batch.
* sync append of 1-message batches, 1 and 16 writers (group commit in
  isolation). Baseline: one writer, ``os.write`` + ``os.fsync`` per message.
* sequential read of everything the async scenario wrote, 1,000 messages per
  ``read``. Baseline: ``os.read`` in 1 MiB pieces of the async baseline's file
  (the same byte volume). Both files are read once beforehand (page cache warm).
* write-path allocation: tracemalloc peak during one append of 1,000 and 10,000
  1 KiB messages, minus the encoded batch size, per message.
* transaction commit (async): one transaction stages 10,000 messages (10
  batches of 1,000) on one queue, then the commit is timed (a commit record and
  the index entries of the staged records: no copy). Target < 10 ms.

Rates count messages; MB/s counts encoded log bytes (value + framing), 1 MB =
10^6 B. A baseline rate is its byte rate divided by the encoded message size.
With ``--repeat`` every rate is the median over runs and the ratio is the
median equeue rate over the median baseline rate.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from equeue_broker.storage import FlushMode, MessageBatch, StorageConfig, Store
from equeue_broker.storage.index.queue_index import ENTRY_SIZE
from equeue_proto.record import FRAME_OVERHEAD

TOPIC = "bench"
BATCH = 1_000
SIZES = (100, 1024)
READ_PIECE = 1 << 20
NA = "-"
READ_MAX_BYTES = 16 << 20
"""Per-read byte limit, high enough that max_messages=1000 is what bounds a read."""
READ_MESSAGES = 500_000
"""Messages the sequential-read scenario reads (a bound on its run time)."""
FLUSH_INTERVAL_MS = 100
ASYNC_TARGET = 0.5
GROUP_COMMIT_TARGET = 10.0


@dataclass(frozen=True)
class Volumes:
    async_bytes: int
    """Encoded bytes per async-append scenario (also what the read scenario reads).

    Large enough that both sides live under the fsync policy: 256 MB of raw
    writes finish in ~80 ms, before the first 100 ms fsync, so the baseline
    would measure memcpy into the page cache, not a flushed log."""
    sync_bytes: int
    """Encoded bytes per sync-append scenario (1 or 16 writers, batches of 1,000)."""
    single_appends_per_writer: int
    """1-message appends per writer in the 16-writer group-commit scenario."""
    single_appends_one_writer: int
    """1-message appends in the 1-writer sync scenario and the raw fsync baseline."""
    loop_cap_s: float
    """No measured loop runs longer than this; a capped row says so."""


FULL = Volumes(1_024_000_000, 128_000_000, 3_000, 5_000, 60.0)
QUICK = Volumes(4_000_000, 2_000_000, 50, 200, 10.0)


@dataclass
class Sample:
    """One measurement of one row."""

    rate: float
    """Messages per second (for the allocation row: transient bytes per message;
    for the commit row: milliseconds)."""
    mbps: float | None
    baseline_rate: float | None
    fsyncs_per_append: float | None = None
    capped: bool = False


@dataclass
class Row:
    scenario: str
    size: int
    writers: int
    baseline: str
    """Which baseline the ratio uses (printed in the note)."""
    samples: list[Sample] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.scenario, self.size, self.writers)


class Table:
    HEADER = (
        "| scenario | msg size | writers | msgs/s | MB/s | baseline msgs/s | ratio | note |\n"
        "|---|---|---|---:|---:|---:|---:|---|"
    )

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int, int], Row] = {}

    def add(self, row: Row, sample: Sample) -> None:
        existing = self.rows.setdefault(row.key, row)
        existing.samples.append(sample)
        print(format_row(existing), flush=True)

    def render(self) -> str:
        """The table grouped by scenario (in first-run order), then size, then writers."""
        order = list(dict.fromkeys(key[0] for key in self.rows))
        keys = sorted(self.rows, key=lambda k: (order.index(k[0]), k[1], k[2]))
        return "\n".join([self.HEADER, *(format_row(self.rows[k]) for k in keys)])

    def ratio(self, scenario: str, size: int, writers: int) -> float | None:
        row = self.rows.get((scenario, size, writers))
        return None if row is None else row_ratio(row)

    def rates(self, scenario: str, size: int, writers: int) -> tuple[float, float] | None:
        """(median msgs/s, median baseline msgs/s) of a row."""
        row = self.rows.get((scenario, size, writers))
        if row is None:
            return None
        rate = _median([s.rate for s in row.samples])
        base = _median([s.baseline_rate for s in row.samples])
        return None if rate is None or base is None else (rate, base)


# -- formatting --------------------------------------------------------------------------


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def row_ratio(row: Row) -> float | None:
    rate = _median([s.rate for s in row.samples])
    base = _median([s.baseline_rate for s in row.samples])
    return None if rate is None or not base else rate / base


def _size_label(size: int) -> str:
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"


def _num(value: float | None, digits: int = 0) -> str:
    return NA if value is None else f"{value:,.{digits}f}"


def format_row(row: Row) -> str:
    n = len(row.samples)
    rate = _median([s.rate for s in row.samples])
    notes = [row.baseline] if row.baseline else []
    if row.scenario.startswith("append allocation"):
        cells = [NA, NA, NA, NA]
        notes.insert(0, f"transient overhead {_num(rate, 1)} B/msg")
    elif row.scenario.startswith("transaction commit"):
        cells = [NA, NA, NA, NA]
        notes.insert(0, f"commit {_num(rate, 2)} ms")
    else:
        ratio = row_ratio(row)
        cells = [
            _num(rate),
            _num(_median([s.mbps for s in row.samples]), 1),
            _num(_median([s.baseline_rate for s in row.samples])),
            NA if ratio is None else f"{ratio:.{2 if ratio >= 0.1 else 3}f}x",
        ]
        fsyncs = _median([s.fsyncs_per_append for s in row.samples])
        if fsyncs is not None:
            notes.append(f"{fsyncs:.3f} fsyncs/append")
    if any(s.capped for s in row.samples):
        notes.append("time-capped")
    if n > 1:
        notes.append(f"median of {n}")
    return (
        "| "
        + " | ".join(
            [row.scenario, _size_label(row.size), str(row.writers), *cells, "; ".join(notes)]
        )
        + " |"
    )


# -- helpers -------------------------------------------------------------------------------


def frame_size(size: int) -> int:
    """Encoded bytes of one message with a ``size``-byte value in topic ``TOPIC``."""
    return FRAME_OVERHEAD + len(TOPIC.encode()) + size


def open_store(directory: Path, mode: FlushMode, queues: int, background: bool = True) -> Store:
    config = StorageConfig(data_dir=directory, flush_mode=mode, flush_interval_ms=FLUSH_INTERVAL_MS)
    store = Store(config, background=background)
    store.create_topic(TOPIC, queues)
    return store


def check_frame_size(store: Store, batch: MessageBatch, queue_id: int = 0) -> None:
    """Append once and check the encoded size this script assumes (not timed)."""
    before = store.stats()["log_write_position"]
    store.append(TOPIC, queue_id, batch)
    written = store.stats()["log_write_position"] - before
    expected = len(batch) * frame_size(len(batch.values[0]))
    if written != expected:
        raise RuntimeError(f"batch encoded to {written} bytes, expected {expected}")


def fsync_every(fd: int, interval_s: float, stop: threading.Event) -> None:
    while not stop.wait(interval_s):
        os.fsync(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def run_writers(count: int, work: Callable[[int], int]) -> tuple[int, float]:
    """Run ``work(writer_index)`` on ``count`` threads started together.

    Returns (sum of what the workers returned, seconds from start to the last join).
    """
    barrier = threading.Barrier(count + 1)
    results = [0] * count
    errors: list[BaseException] = []

    def body(index: int) -> None:
        try:
            barrier.wait()
            results[index] = work(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), name=f"writer-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return sum(results), elapsed


def quiesce() -> None:
    """Write back every dirty page before a measurement, so that no scenario pays
    for the previous one's writeback (the disk here is shared and noisy)."""
    os.sync()


def drop_file(path: Path) -> None:
    path.unlink(missing_ok=True)


def warm(paths: Sequence[Path]) -> None:
    """Read files once so that the timed reads find them in the page cache."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while os.read(fd, READ_PIECE):
                pass
        finally:
            os.close(fd)


# -- baselines ------------------------------------------------------------------------------


def raw_async_write(path: Path, chunk: bytes, writes: int, cap_s: float) -> tuple[int, float]:
    """Sequential writes of ``chunk``, fsynced every 100 ms by a background thread."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    stop = threading.Event()
    syncer = threading.Thread(target=fsync_every, args=(fd, FLUSH_INTERVAL_MS / 1000, stop))
    try:
        syncer.start()
        started = time.perf_counter()
        done = 0
        for _ in range(writes):
            write_all(fd, chunk)
            done += 1
            if time.perf_counter() - started > cap_s:
                break
        elapsed = time.perf_counter() - started
    finally:
        stop.set()
        syncer.join()
        os.fsync(fd)
        os.close(fd)
    return done, elapsed


def raw_fsync_per_write(path: Path, chunk: bytes, writes: int, cap_s: float) -> tuple[int, float]:
    """One writer: each write followed by its own fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        started = time.perf_counter()
        done = 0
        for _ in range(writes):
            write_all(fd, chunk)
            os.fsync(fd)
            done += 1
            if time.perf_counter() - started > cap_s:
                break
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
    return done, elapsed


def raw_read(path: Path, nbytes: int) -> float:
    """Seconds to read ``nbytes`` from the start of ``path`` in 1 MiB pieces."""
    fd = os.open(path, os.O_RDONLY)
    try:
        started = time.perf_counter()
        total = 0
        for _ in range(nbytes // READ_PIECE + 2):
            piece = os.read(fd, min(READ_PIECE, nbytes - total))
            total += len(piece)
            if not piece or total >= nbytes:
                break
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
    if total != nbytes:
        raise RuntimeError(f"raw read got {total} bytes, expected {nbytes}")
    return elapsed


# -- scenarios ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Payload:
    size: int
    batch: MessageBatch
    """1,000 random values of ``size`` bytes."""
    single: MessageBatch
    """One of them, as a 1-message batch."""
    raw_batch: bytes
    """Random bytes as long as the encoded batch."""
    raw_single: bytes
    """Random bytes as long as one encoded message."""

    @classmethod
    def make(cls, size: int) -> Payload:
        values = [os.urandom(size) for _ in range(BATCH)]
        frame = frame_size(size)
        return cls(
            size,
            MessageBatch(values=values),
            MessageBatch(values=values[:1]),
            os.urandom(frame * BATCH),
            os.urandom(frame),
        )


def async_append_and_read(root: Path, payload: Payload, volumes: Volumes, table: Table) -> None:
    frame = frame_size(payload.size)
    batches = max(1, volumes.async_bytes // len(payload.raw_batch))
    cap = volumes.loop_cap_s

    raw_path = root / "raw-async.dat"
    quiesce()
    raw_done, raw_s = raw_async_write(raw_path, payload.raw_batch, batches, cap)
    raw_rate = raw_done * BATCH / raw_s

    quiesce()
    store = open_store(root / "async", FlushMode.ASYNC, 1)
    try:
        check_frame_size(store, payload.batch)
        fsyncs0 = store.stats()["fsyncs"]
        started = time.perf_counter()
        done = 0
        for _ in range(batches):
            store.append(TOPIC, 0, payload.batch)
            done += 1
            if time.perf_counter() - started > cap:
                break
        elapsed = time.perf_counter() - started
        fsyncs = store.stats()["fsyncs"] - fsyncs0
        rate = done * BATCH / elapsed
        table.add(
            Row("async append", payload.size, 1, "baseline: raw write per batch, fsync/100 ms"),
            Sample(rate, rate * frame / 1e6, raw_rate, fsyncs / done, raw_done < batches),
        )

        # Sequential read of the first READ_MESSAGES written (from the page cache).
        store.flush()  # so that the background thread has nothing left to write
        total = min((done + 1) * BATCH, READ_MESSAGES)
        warm(sorted((root / "async" / "log").glob("*.chunk")))
        warm([raw_path])
        nbytes = min(total * frame, raw_done * len(payload.raw_batch))
        raw_read_rate = nbytes / frame / raw_read(raw_path, nbytes)
        read_rate, capped = timed_read(store, total, payload, cap)
        table.add(
            Row("sequential read", payload.size, 1, "baseline: raw os.read 1 MiB pieces"),
            Sample(read_rate, read_rate * frame / 1e6, raw_read_rate, None, capped),
        )
    finally:
        store.close()
        shutil.rmtree(root / "async", ignore_errors=True)
        drop_file(raw_path)


def timed_read(store: Store, total: int, payload: Payload, cap_s: float) -> tuple[float, bool]:
    """Read ``total`` messages from offset 0; return (messages/s, capped)."""
    offset = 0
    started = time.perf_counter()
    for _ in range(total // BATCH + 2):
        result = store.read(TOPIC, 0, offset, max_messages=BATCH, max_bytes=READ_MAX_BYTES)
        if not result.messages:
            break
        offset = result.next_offset
        if time.perf_counter() - started > cap_s:
            break
    elapsed = time.perf_counter() - started
    if offset < total and time.perf_counter() - started <= cap_s:
        raise RuntimeError(f"read {offset} messages, expected {total}")
    first = store.read(TOPIC, 0, 0, max_messages=1)
    if first.messages[0].value != payload.batch.values[0]:
        raise RuntimeError("read back a different value than was appended")
    return offset / elapsed, offset < total


def sync_batches(root: Path, payload: Payload, volumes: Volumes, table: Table) -> None:
    frame = frame_size(payload.size)
    batches = max(1, volumes.sync_bytes // len(payload.raw_batch))
    cap = volumes.loop_cap_s
    quiesce()
    raw_done, raw_s = raw_fsync_per_write(root / "raw-sync.dat", payload.raw_batch, batches, cap)
    drop_file(root / "raw-sync.dat")
    raw_rate = raw_done * BATCH / raw_s
    baseline = "baseline: raw write+fsync per 1,000-msg batch, 1 writer"
    for writers in (1, 16):
        per_writer = max(1, batches // writers)
        quiesce()
        appends, elapsed, fsyncs = sync_run(
            root / f"sync{writers}", payload.batch, writers, per_writer, cap
        )
        rate = appends * BATCH / elapsed
        table.add(
            Row("sync append", payload.size, writers, baseline),
            Sample(rate, rate * frame / 1e6, raw_rate, fsyncs / appends,
                   raw_done < batches or appends < per_writer * writers),
        )  # fmt: skip


def sync_singles(root: Path, payload: Payload, volumes: Volumes, table: Table) -> None:
    frame = frame_size(payload.size)
    cap = volumes.loop_cap_s
    writes = volumes.single_appends_one_writer
    quiesce()
    raw_done, raw_s = raw_fsync_per_write(root / "raw-single.dat", payload.raw_single, writes, cap)
    drop_file(root / "raw-single.dat")
    raw_rate = raw_done / raw_s
    baseline = "baseline: raw write+fsync per message, 1 writer"
    for writers, per_writer in ((1, writes), (16, volumes.single_appends_per_writer)):
        quiesce()
        appends, elapsed, fsyncs = sync_run(
            root / f"single{writers}", payload.single, writers, per_writer, cap
        )
        rate = appends / elapsed
        table.add(
            Row("sync append, 1-msg batches (group commit)", payload.size, writers, baseline),
            Sample(rate, rate * frame / 1e6, raw_rate, fsyncs / appends,
                   raw_done < writes or appends < per_writer * writers),
        )  # fmt: skip


def sync_run(
    directory: Path, batch: MessageBatch, writers: int, per_writer: int, cap_s: float
) -> tuple[int, float, int]:
    """``writers`` threads each append ``batch`` ``per_writer`` times to its own queue.

    Returns (appends done, seconds, fsyncs during the run).
    """
    store = open_store(directory, FlushMode.SYNC, writers)
    try:
        for queue_id in range(writers):
            check_frame_size(store, batch, queue_id)
        fsyncs0 = store.stats()["fsyncs"]
        deadline = time.perf_counter() + cap_s

        def work(queue_id: int) -> int:
            done = 0
            for _ in range(per_writer):
                store.append(TOPIC, queue_id, batch)
                done += 1
                if time.perf_counter() > deadline:
                    break
            return done

        appends, elapsed = run_writers(writers, work)
        fsyncs = store.stats()["fsyncs"] - fsyncs0
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)
    return appends, elapsed, fsyncs


def append_allocation(root: Path, table: Table) -> None:
    size = 1024
    values = [os.urandom(size) for _ in range(10_000)]
    store = open_store(root / "alloc", FlushMode.ASYNC, 1, background=False)
    try:
        check_frame_size(store, MessageBatch(values=values[:BATCH]))
        store.append(TOPIC, 0, MessageBatch(values=values))  # grows the reused write buffer
        for count in (1_000, 10_000):
            batch = MessageBatch(values=values[:count])
            encoded = count * frame_size(size)
            gc.collect()
            tracemalloc.start()
            try:
                before, _ = tracemalloc.get_traced_memory()
                tracemalloc.reset_peak()
                store.append(TOPIC, 0, batch)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            # Records are encoded straight into the log's memory map; the only
            # per-message memory is the 32-byte index entry the result keeps.
            entries = count * ENTRY_SIZE
            transient = peak - before - entries
            table.add(
                Row(
                    f"append allocation ({count:,} msgs)",
                    size,
                    1,
                    f"Python heap peak {peak - before:,} B for {encoded:,} B of records; "
                    f"minus index entries {entries:,} B",
                ),
                Sample(transient / count, None, None),
            )
    finally:
        store.close()
        shutil.rmtree(root / "alloc", ignore_errors=True)


COMMIT_MESSAGES = 10_000
COMMIT_TARGET_MS = 10.0


def transaction_commit(root: Path, payload: Payload, table: Table) -> None:
    """Time the commit of one transaction holding ``COMMIT_MESSAGES`` staged messages."""
    store = open_store(root / "txn", FlushMode.ASYNC, 1, background=False)
    try:
        times = []
        for attempt in range(6):  # the first creates the index file: not counted
            quiesce()  # the staged pages written back first, as in the other rows
            txn_id = f"bench-{attempt}"
            for _ in range(COMMIT_MESSAGES // BATCH):
                store.transactions.stage(txn_id, TOPIC, [(0, payload.batch)])
            started = time.perf_counter()
            store.transactions.commit([(txn_id, COMMIT_MESSAGES)])
            times.append((time.perf_counter() - started) * 1000)
        times = times[1:]
        table.add(
            Row(f"transaction commit ({COMMIT_MESSAGES:,} staged msgs, async)", payload.size, 1,
                "median of 5 commits after one warm-up; staging not timed"),
            Sample(statistics.median(times), None, None),
        )  # fmt: skip
    finally:
        store.close()
        shutil.rmtree(root / "txn", ignore_errors=True)


# -- main ----------------------------------------------------------------------------------


def legend() -> str:
    overhead = frame_size(0)
    return (
        f"With --repeat N every figure is the median of N runs. MB/s counts encoded log bytes "
        f"(value + {overhead} B of framing per message), 1 MB = 10^6 B. A baseline's "
        f"msgs/s is its byte rate over the same encoded message size; ratio = equeue "
        f"msgs/s / baseline msgs/s. Baselines, all measured in the same run on a file "
        f"in the same directory: async append = os.write per 1,000-message batch with "
        f"a thread fsyncing every {FLUSH_INTERVAL_MS} ms; sync rows = os.write + "
        f"os.fsync per write, one writer (per batch for batch rows, per message for "
        f"1-msg rows); sequential read = os.read in 1 MiB pieces of the async "
        f"baseline's file. fsyncs/append = store fsyncs (group commit and background "
        f"flush) / appends. 16 writers = 16 threads, one queue each."
    )


def targets(table: Table) -> list[str]:
    lines = []
    for size in SIZES:
        row = table.rows.get(
            (f"transaction commit ({COMMIT_MESSAGES:,} staged msgs, async)", size, 1)
        )
        if row is not None:
            ms = _median([s.rate for s in row.samples]) or 0.0
            verdict = "met" if ms < COMMIT_TARGET_MS else "NOT met"
            lines.append(
                f"- commit of {COMMIT_MESSAGES:,} staged {_size_label(size)} messages (async): "
                f"{ms:.2f} ms (target < {COMMIT_TARGET_MS:g} ms): {verdict}"
            )
    ratio = table.ratio("async append", 1024, 1)
    if ratio is not None:
        verdict = "met" if ratio >= ASYNC_TARGET else "NOT met"
        lines.append(
            f"- async append 1 KiB: {ratio:.2f}x raw async write "
            f"(target >= {ASYNC_TARGET}x): {verdict}"
        )
    singles = "sync append, 1-msg batches (group commit)"
    for size in SIZES:
        batched = table.rates("sync append", size, 16)
        single = table.rates(singles, size, 1)
        if batched is not None and single is not None:
            ratio = batched[0] / single[1]
            verdict = "met" if ratio >= GROUP_COMMIT_TARGET else "NOT met"
            lines.append(
                f"- sync append, 16 writers, 1,000-msg batches, {_size_label(size)}: "
                f"{ratio:,.0f}x the raw one-fsync-per-message-write rate "
                f"(target >= {GROUP_COMMIT_TARGET:g}x): {verdict}"
            )
        ratio = table.ratio(singles, size, 16)
        if ratio is not None:
            verdict = "met" if ratio >= GROUP_COMMIT_TARGET else "NOT met"
            lines.append(
                f"- sync append, 16 writers, 1-msg batches, {_size_label(size)}: {ratio:.2f}x "
                f"raw one-fsync-per-write (target >= {GROUP_COMMIT_TARGET:g}x): {verdict}"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="tiny volumes: a smoke run")
    parser.add_argument("--repeat", type=int, default=1, help="runs per scenario (median)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    volumes = QUICK if args.quick else FULL
    payloads = [Payload.make(size) for size in SIZES]
    table = Table()
    root = Path(tempfile.mkdtemp(prefix="equeue-bench-"))
    started = time.perf_counter()
    print(f"equeue storage bench: data in {root}, {os.cpu_count()} CPUs, "
          f"repeat {args.repeat}{', quick' if args.quick else ''}\n", flush=True)  # fmt: skip
    print(Table.HEADER, flush=True)
    try:
        for _ in range(args.repeat):
            for payload in payloads:
                async_append_and_read(root, payload, volumes, table)
                sync_batches(root, payload, volumes, table)
                sync_singles(root, payload, volumes, table)
            append_allocation(root, table)
            for payload in payloads:
                transaction_commit(root, payload, table)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    elapsed = time.perf_counter() - started
    print(f"\n## Results ({elapsed:.0f} s{', quick' if args.quick else ''}, "
          f"repeat {args.repeat})\n")  # fmt: skip
    print(table.render())
    print()
    print(legend())
    print("\nTargets:")
    print("\n".join(targets(table)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
