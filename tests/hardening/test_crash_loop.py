"""The crash loop of ``hardening/crash_loop.py``, bounded: a few cycles per flush mode,
and a few of each other scenario (``--scenario delete-topic``, ``retention``,
``transaction``).

A broker under concurrent producers and consumers is SIGKILLed at random
moments and restarted; after each restart everything is read back through
the broker and checked (see the harness's docstring for the full list), and
at the end the files are checked with ``Store``. ``make crash-loop`` runs the
long version (50 cycles).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import pytest

from equeue_broker.storage import FlushMode, MessageBatch, MessageLimits, StorageConfig, Store
from equeue_broker.storage.index.queue_index import ENTRY
from hardening import crash_loop
from hardening.crash_loop import CrashLoopConfig, CrashLoopResult, summary
from tests.support.faults import simulate_machine_crash

pytestmark = pytest.mark.slow  # make test-fast skips it (see pyproject.toml)

KiB = 1024


def run(tmp_path: Path, **settings: Any) -> CrashLoopResult:
    config = CrashLoopConfig(producers=3, consumers=2, seconds_per_cycle=1.2, **settings)
    result = crash_loop.run(config, tmp_path)
    print(summary(result))
    return result


def test_sync_mode_crash_loop_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    result = run(tmp_path, cycles=5, mode="sync", seed=11, startup_kill_share=0.2)
    assert result.problems == []
    assert result.survived == 5
    assert result.total("acked") >= 1_000, "too little traffic to mean anything"
    assert result.total("lost") == 0
    assert result.total("duplicated") == 0
    assert result.total("commit_regressions") == 0
    assert result.total("consumed") > 0
    assert result.total("in_doubt") > 0, "no kill landed on a request in flight"
    assert result.final_records >= result.total("acked")


def test_async_mode_process_kill_loses_nothing(tmp_path: Path) -> None:
    """A process crash leaves the written data in the page cache: nothing is lost."""
    result = run(tmp_path, cycles=2, mode="async", seed=12)
    assert result.problems == []
    assert result.total("lost") == 0
    assert result.total("duplicated") == 0


def test_async_mode_machine_crash_loses_only_the_last_flush_window(tmp_path: Path) -> None:
    """Unsynced bytes dropped after each kill: what is lost was acknowledged within
    the last flush window, the rest reads back identical, offsets stay contiguous."""
    # 2 MiB chunks roll about once a cycle; with smaller ones a kill often lands in the
    # roll's fsyncs, when nothing unsynced is left to drop.
    result = run(tmp_path, cycles=3, mode="async", machine_crash=True, seed=13, chunk_size=2 << 20)
    assert result.problems == []
    assert result.total("dropped_bytes") > 0, "the simulated power loss dropped nothing"
    assert result.total("duplicated") == 0
    assert max(c.oldest_loss_s for c in result.cycles) <= 0.1 + 1.5


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_kills_around_delete_topic_never_bring_the_topic_back(tmp_path: Path, mode: str) -> None:
    """``--scenario delete-topic``: a topic created, written, committed on and
    deleted over and over, SIGKILLed right after an acknowledged DeleteTopic or
    CreateTopic (or at a random moment). After each restart no record or group
    offset of a deleted generation is back, and a recreated topic starts empty."""
    result = run(
        tmp_path, cycles=8, mode=mode, seed=21, scenario="delete-topic", startup_kill_share=0.25
    )
    assert result.problems == []
    assert result.survived == 8
    assert result.total("reappeared") == 0
    assert result.total("killed_after_ack") >= 2, "no kill right after an acknowledged call"
    assert result.total("acked") > 0


def test_kills_during_retention_lose_nothing_retention_keeps(tmp_path: Path) -> None:
    """``--scenario retention``: chunks deleted while producers write; each queue
    reads contiguous from an earliest offset that never moves back."""
    result = run(
        tmp_path, cycles=4, mode="sync", seed=22, scenario="retention", chunk_size=64 * KiB
    )
    assert result.problems == []
    assert result.total("lost") == 0
    assert result.total("duplicated") == 0
    assert 0 < result.final_records < result.total("acked"), "retention deleted nothing"


def test_kills_during_transaction_commits_are_all_or_nothing(tmp_path: Path) -> None:
    """``--scenario transaction``: an acknowledged commit is all there at the
    offsets it named; one in doubt is all there or not at all."""
    result = run(tmp_path, cycles=4, mode="sync", seed=23, scenario="transaction")
    assert result.problems == []
    assert result.total("lost") == 0
    assert result.total("acked") > 0


def test_the_harness_notices_lost_acknowledged_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Self-check: drop unsynced bytes behind the harness's back (async mode, not
    declared as a machine crash) and the harness must report the losses."""
    run_cycle = crash_loop.CrashLoop._run_cycle

    def run_and_drop(
        self: crash_loop.CrashLoop, number: int, address: str, outcome: crash_loop.CycleResult
    ) -> tuple[list[crash_loop.WorkerLog], float]:
        logs, kill_at = run_cycle(self, number, address, outcome)
        crash_loop.drop_unsynced(self.broker.data_dir)
        return logs, kill_at

    monkeypatch.setattr(crash_loop.CrashLoop, "_run_cycle", run_and_drop)
    # Large chunks: the kill never lands in a chunk roll. A flush interval longer than
    # the cycle: nothing written after the broker's start is fsynced before the kill,
    # so every acknowledged message is unsynced, however slowly a loaded machine ran
    # the producers (with 100 ms, a producer starved in the last interval left
    # nothing unsynced to drop).
    result = run(
        tmp_path, cycles=1, mode="async", seed=14, min_run_s=0.8, chunk_size=16 << 20,
        flush_interval_ms=60_000,
    )  # fmt: skip
    assert result.total("acked") > 0
    assert result.total("lost") > 0
    assert any("acknowledged, lost" in p for p in result.problems)


def test_restart_after_a_kill_is_fast_with_many_queues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recovery reads in proportion to what was written since the checkpoint, not
    to the (sparse) chunk capacity: 100 queues, 200 messages, default chunk sizes
    (256 MiB log chunks, 1,000,000-entry index chunks of 32 MB). Work is counted,
    not timed: the bytes recovery reports scanning and the bytes it reads with
    ``pread``. Both once included the whole last index chunk of every queue (3.2 GB
    here) and, for the first, the whole unwritten rest of the active log chunk."""
    queues = 100
    config = StorageConfig(tmp_path / "data")
    store = Store(config, background=False)
    store.create_topic("many", queue_count=queues)
    log_bytes = 0
    for round_ in range(2):
        for q in range(queues):
            result = store.append("many", q, MessageBatch(values=[b"m%d" % round_]))
            log_bytes += sum(size for _, size, _, _ in ENTRY.iter_unpack(result.entries))
        if round_ == 0:
            store.flush()  # a checkpoint: the second round's index entries are rebuilt
    store.abandon()  # as a SIGKILL: nothing more is flushed

    read = [0]
    pread = os.pread

    def counting_pread(fd: int, size: int, offset: int) -> bytes:
        data = pread(fd, size, offset)
        read[0] += len(data)
        return data

    monkeypatch.setattr(os, "pread", counting_pread)
    with Store(config, background=False) as reopened:
        monkeypatch.undo()
        recovery = reopened.recovery
        print(f"{recovery}, pread {read[0]} bytes")
        assert recovery.index_entries_rebuilt == queues
        assert recovery.tail_bytes_discarded == 0
        for q in range(queues):
            assert reopened.queue_info("many", q).end == 2
        values = [m.value for m in reopened.read("many", queues - 1, 0).messages]
        assert values == [b"m0", b"m1"]
    # Per queue, its index chunk's header and the written part of its last block
    # (holes are found block by block, or page by page on tmpfs), plus the records
    # of the active log chunk.
    block = max(4 * KiB, mmap.PAGESIZE, os.statvfs(tmp_path).f_bsize)
    budget = queues * 2 * block + 2 * log_bytes
    assert recovery.bytes_scanned <= budget
    assert read[0] <= budget


def test_committed_offsets_stay_within_the_log_after_a_power_loss(tmp_path: Path) -> None:
    config = StorageConfig(
        tmp_path / "data",
        flush_mode=FlushMode.ASYNC,
        chunk_capacity_bytes=1 << 20,
        index_entries_per_chunk=1024,
        limits=MessageLimits(max_message_bytes=1 << 16),
    )
    store = Store(config, background=False)
    store.create_topic("t", queue_count=1)
    store.append("t", 0, MessageBatch(values=[b"durable"] * 10))
    store.flush()  # what the background thread does every flush interval
    store.append("t", 0, MessageBatch(values=[b"unsynced"] * 10))
    store.commit_offset("g", "t", 0, 20)  # a consumer read everything it could see
    store._state.offsets.persist()  # the background thread's periodic offsets save
    simulate_machine_crash(store)
    with Store(config, background=False) as reopened:
        end = reopened.queue_info("t", 0).end
        committed = reopened.committed_offsets("g")["t"][0]
    assert end == 10, "the power loss should take the unsynced records"
    assert committed <= end, f"committed offset {committed} past the end {end}"
