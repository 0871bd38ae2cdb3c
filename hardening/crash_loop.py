"""Crash loop: SIGKILL a broker at random moments under concurrent producers and consumers.

Run ``python hardening/crash_loop.py --cycles 50 --mode sync`` (``make crash-loop``);
``--mode async`` checks the async flush mode, ``--machine-crash`` (async only)
also throws away, after each kill, every byte the broker had not fsynced, as
a power loss would. Prints one row per cycle and a summary, and exits 1 if any
check failed. ``tests/hardening/test_crash_loop.py`` runs a few cycles of each.

Each cycle starts the broker on the same data directory (``--port 0``, one
topic of ``--queues`` queues, retention off), then runs ``--producers``
threads sending batches of random size and shape (one queue, mixed queues per
request, keyed; unary ``Produce`` and pipelined ``ProduceStream``) and
``--consumers`` threads that long-poll their queues and commit the group's
offsets, all on raw gRPC stubs without retries, so that "acknowledged" is
exact. After a random time in ``[--min-run-s, --seconds-per-cycle]`` the
broker gets SIGKILL. A request that failed may or may not have been applied:
its messages are "in doubt". Every value carries a unique id (cycle,
producer, sequence) and random bytes.

After each restart, through the broker (``Pull``, and ``GetMessage`` for a
sample):

- every queue reads back contiguous from offset 0, every record's checksum
  verified by the client decoder;
- everything read back after the previous restart is unchanged (no offset
  reused for different content);
- every message acknowledged in the cycle is at its acknowledged offset with
  identical bytes, and so is every message a consumer saw (sync mode:
  readers see only durable records); in ``--machine-crash`` mode an
  acknowledged message may instead be missing, past the new end, if it was
  acknowledged within the last flush window before the kill;
- every new record is a message of this cycle, acknowledged at exactly that
  offset or in doubt, and no id appears twice (no duplicates);
- the group's committed offsets are within the queues and (sync mode) never
  below an acknowledged commit: they never move backwards. Async mode persists
  offsets every second, so a regression there is counted, not failed. A
  committed offset past the recovered end is a failure in every mode (after a
  power loss, recovery lowers offsets persisted for records that were lost).

Some cycles (``--startup-kill-share``) also kill a broker while it starts,
i.e. during recovery, before the restart that is verified.

At the end the broker is stopped cleanly and the data directory is opened with
``Store``: every index entry points at its record, every record of the topic is
indexed, and the content equals what the last restart read.

``--scenario`` picks what the kills land on: ``traffic`` (the default, all
of the above), ``delete-topic`` (a topic deleted and created again, killed
right after acknowledged deletes and creates), ``retention`` (log chunks
deleted by retention while producers write) or ``transaction`` (staged
transactions committed atomically); see ``hardening/_crash_modes.py``.

The cycle's settings, workers and results are in ``hardening/_crash_cycle.py``,
the checks and the simulated power loss in ``hardening/_crash_checks.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `hardening` as a package

from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_checks import recovery_seconds
from equeue_broker.testing_report import table
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from hardening._crash_checks import Verifier, drop_unsynced
from hardening._crash_cycle import (
    SCENARIOS,
    TOPIC,
    CrashLoopConfig,
    CrashLoopResult,
    Cycle,
    CycleResult,
    KiB,
    WorkerLog,
)
from hardening._crash_modes import ScenarioLoop

__all__ = [
    "CrashLoop",
    "CrashLoopConfig",
    "CrashLoopResult",
    "CycleResult",
    "WorkerLog",
    "drop_unsynced",
    "main",
    "run",
    "summary",
]
"""The names ``tests/hardening/test_crash_loop.py`` uses (some are defined beside this script)."""


# -- the loop -------------------------------------------------------------------------------


class CrashLoop:
    def __init__(self, config: CrashLoopConfig, work_dir: Path, *, echo: bool = False) -> None:
        self.config = config
        self.work_dir = work_dir
        self.echo = echo
        self.rng = random.Random(config.seed)
        flags = [
            "--flush", config.mode, "--flush-interval-ms", str(config.flush_interval_ms),
            "--chunk-size", str(config.chunk_size),
            "--max-message-bytes", str(min(config.chunk_size, 4 << 20)),
            "--retention-max-chunks", "-1", "--retention-max-age-hours", "-1",
            "--log-format", "json", "--log-level", "INFO",
        ]  # fmt: skip
        self.broker = BrokerProcess(work_dir / "data", *flags, log_path=work_dir / "broker.log")
        self.checks = Verifier(config, self.rng)
        """What the restarts verified so far: records, committed offsets."""
        self.result = CrashLoopResult(config)

    def run(self) -> CrashLoopResult:
        config = self.config
        address = self.broker.start()
        with grpc.insecure_channel(address) as channel:
            admin = pb_grpc.AdminStub(channel)
            admin.CreateTopic(
                pb.CreateTopicRequest(name=TOPIC, queue_count=config.queues),
                timeout=config.rpc_timeout_s,
            )
        try:
            for number in range(1, config.cycles + 1):
                outcome = CycleResult(number)
                self.result.cycles.append(outcome)
                logs, kill_at = self._run_cycle(number, address, outcome)
                if config.machine_crash:
                    outcome.dropped_bytes = drop_unsynced(self.broker.data_dir)
                if self.rng.random() < config.startup_kill_share:
                    self._kill_while_starting(outcome)
                started = time.monotonic()
                try:  # a broker that cannot restart or serve ends the loop, reported
                    address = self.broker.start()
                    outcome.start_s = self.broker.start_seconds
                    outcome.recovery_s = recovery_seconds(self.broker)
                    started = time.monotonic()
                    self.checks.verify(address, number, logs, kill_at, outcome)
                except Exception as exc:
                    outcome.problems.append(f"restart or verification failed: {exc!r}")
                    if self.echo:
                        print(self.row(outcome), flush=True)
                    return self.result
                outcome.verify_s = time.monotonic() - started
                if self.echo:
                    print(self.row(outcome), flush=True)
            code = self.broker.stop()
            if code != 0:
                self.result.store_problems.append(f"broker exited with {code} on SIGTERM")
            self.checks.check_files(self.broker.data_dir, self.result)
        finally:
            self.broker.kill()
        return self.result

    def _run_cycle(
        self, number: int, address: str, outcome: CycleResult
    ) -> tuple[list[WorkerLog], float]:
        config = self.config
        cycle = Cycle(config, number, address, dict(self.checks.committed), self.rng)
        run_for = self.rng.uniform(config.min_run_s, config.seconds_per_cycle)
        started = time.monotonic()
        cycle.start()
        cycle.killed.wait(run_for)  # bounded: nothing sets it before the kill below
        cycle.killed.set()
        kill_at = time.monotonic()
        self.broker.kill()
        outcome.run_s = kill_at - started
        hung = cycle.stop(config.rpc_timeout_s + 10)
        if hung:
            outcome.problems.append(f"workers still running after the kill: {hung}")
        for log in cycle.logs:
            outcome.problems += log.errors
        return cycle.logs, kill_at

    def _kill_while_starting(self, outcome: CycleResult) -> None:
        """Kill a broker at a random moment of its start (recovery included)."""
        expected = self.broker.start_seconds or 1.0
        process = self.broker.spawn()
        with contextlib.suppress(Exception):
            process.wait(self.rng.uniform(0.05, expected))
        self.broker.kill()
        outcome.startup_kills += 1

    # output ----------------------------------------------------------------------

    HEADERS = (
        "cycle", "run s", "acked", "in doubt", "in doubt applied", "consumed", "lost",
        "duplicated", "commit regressions", "restart s", "store recovery s", "checks",
    )  # fmt: skip

    def row(self, c: CycleResult) -> str:
        return table(self.HEADERS, [self._cells(c)]).splitlines()[-1]

    def _cells(self, c: CycleResult) -> list[object]:
        return [
            c.cycle, round(c.run_s, 2), c.acked, c.in_doubt, c.in_doubt_applied, c.consumed,
            c.lost, c.duplicated, c.commit_regressions, round(c.start_s, 2),
            "-" if c.recovery_s is None else round(c.recovery_s, 3),
            "ok" if not c.problems else f"{len(c.problems)} FAILED",
        ]  # fmt: skip


def summary(result: CrashLoopResult) -> str:
    config = result.config
    cycles = result.cycles
    starts = [c.start_s for c in cycles]
    recoveries = [c.recovery_s for c in cycles if c.recovery_s is not None]
    mode = config.mode + (" + machine crash" if config.machine_crash else "")
    mode += "" if config.scenario == "traffic" else f", scenario {config.scenario}"
    rows: list[list[object]] = [
        ["mode", mode],
        ["cycles run / survived", f"{len(cycles)} / {result.survived}"],
        ["messages acknowledged", result.total("acked")],
        ["lost (acknowledged, missing after restart)", result.total("lost")],
        ["duplicated", result.total("duplicated")],
        ["deleted topic's records or offsets found again", result.total("reappeared")],
        ["kills right after an acknowledged call", result.total("killed_after_ack")],
        ["in doubt (request failed at the kill) / applied",
         f"{result.total('in_doubt'):,} / {result.total('in_doubt_applied'):,}"],
        ["consumed by consumers", result.total("consumed")],
        ["committed offsets moved back", result.total("commit_regressions")],
        ["kills during startup", result.total("startup_kills")],
        ["restart to ready, s (median / max)",
         f"{statistics.median(starts):.2f} / {max(starts):.2f}" if starts else "-"],
        ["store recovery, s (median / max)",
         f"{statistics.median(recoveries):.3f} / {max(recoveries):.3f}" if recoveries else "-"],
        ["records in the log at the end (Store check)", result.final_records],
        ["problems", len(result.problems)],
    ]  # fmt: skip
    if config.machine_crash:
        rows.insert(4, ["oldest lost ack before the kill, s",
                        f"{max((c.oldest_loss_s for c in cycles), default=0.0):.3f}"])  # fmt: skip
        rows.insert(5, ["unsynced log bytes dropped", result.total("dropped_bytes")])
        rows.insert(6, ["committed offsets past the recovered end",
                        result.total("commits_past_end")])  # fmt: skip
    return table(("figure", "value"), rows)


def run(
    config: CrashLoopConfig, work_dir: Path | None = None, echo: bool = False
) -> CrashLoopResult:
    """Run the loop in ``work_dir`` (default: a temporary directory, removed after)."""
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="equeue-crash-") as tmp:
            return run(config, Path(tmp), echo)
    loop = CrashLoop(config, work_dir, echo=echo)
    if config.scenario == "traffic":
        return loop.run()
    return ScenarioLoop(config, work_dir, echo=echo).run(loop.row)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--scenario", choices=SCENARIOS, default="traffic")
    parser.add_argument("--machine-crash", action="store_true", help="async: drop unsynced bytes")
    parser.add_argument("--seconds-per-cycle", type=float, default=2.0)
    parser.add_argument("--min-run-s", type=float, default=0.3)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--chunk-size", type=int, default=256 * KiB, help="log chunk bytes")
    parser.add_argument("--startup-kill-share", type=float, default=0.2)
    parser.add_argument("--work-dir", type=Path, help="keep the data here (default: temp dir)")
    args = parser.parse_args(argv)
    config = CrashLoopConfig(
        cycles=args.cycles, mode=args.mode, machine_crash=args.machine_crash,
        seconds_per_cycle=args.seconds_per_cycle, min_run_s=args.min_run_s,
        producers=args.producers, consumers=args.consumers, queues=args.queues,
        seed=args.seed, startup_kill_share=args.startup_kill_share, chunk_size=args.chunk_size,
        scenario=args.scenario,
    )  # fmt: skip
    print(f"crash loop: {config}", flush=True)
    print(table(CrashLoop.HEADERS, []), flush=True)
    started = time.monotonic()
    result = run(config, args.work_dir, echo=True)
    print(f"\n## Summary ({time.monotonic() - started:.0f} s)\n")
    print(summary(result))
    for problem in result.problems[:50]:
        print(f"PROBLEM: {problem}")
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
