"""The crash loop's other scenarios (``hardening/crash_loop.py --scenario``): kills
around topic deletes, retention and transaction commits.

The default scenario (``traffic``: producers and consumers, ``CrashLoop``)
is unchanged. Each scenario here runs the same loop: start the broker on one
data directory, run the scenario's workers for a random time, SIGKILL the
broker (or at once when a worker asks for the kill, e.g. right after an
acknowledged delete), in some cycles (``--startup-kill-share``) kill it again
while it starts, restart it and check through the broker what the
scenario's workers saw acknowledged and in doubt. At the end the broker is
stopped and the files are checked with ``Store`` (``check_store``).

The scenarios themselves are in ``hardening/_crash_delete.py`` (delete-topic) and
``hardening/_crash_retention.py`` (retention, transaction); what they share with
this loop (``Workers``, ``Scenario``) is in ``hardening/_crash_workers.py``, below
both, so nothing imports in a circle. Nothing here is imported by the broker or
the client.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from pathlib import Path

from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_checks import check_store, recovery_seconds
from hardening._crash_cycle import CrashLoopConfig, CrashLoopResult, CycleResult
from hardening._crash_delete import DeleteTopicScenario
from hardening._crash_retention import RetentionScenario, TransactionScenario
from hardening._crash_workers import Scenario


def scenario_of(config: CrashLoopConfig) -> Scenario:
    if config.scenario == "delete-topic":
        return DeleteTopicScenario(config)
    if config.scenario == "retention":
        return RetentionScenario(config)
    if config.scenario == "transaction":
        return TransactionScenario(config)
    raise ValueError(f"no scenario {config.scenario!r} here")


class ScenarioLoop:
    """The kill-restart-verify loop of one scenario."""

    def __init__(self, config: CrashLoopConfig, work_dir: Path, *, echo: bool = False) -> None:
        self.config = config
        self.echo = echo
        self.rng = random.Random(config.seed)
        self.scenario = scenario_of(config)
        flags = [
            "--flush", config.mode, "--flush-interval-ms", str(config.flush_interval_ms),
            "--chunk-size", str(config.chunk_size),
            "--max-message-bytes", str(min(config.chunk_size, 4 << 20)),
            "--log-format", "json", "--log-level", "INFO", *self.scenario.flags,
        ]  # fmt: skip
        self.broker = BrokerProcess(work_dir / "data", *flags, log_path=work_dir / "broker.log")
        self.result = CrashLoopResult(config)

    def run(self, row: Callable[[CycleResult], str]) -> CrashLoopResult:
        address = self.broker.start()
        try:
            self.scenario.setup(address)
            for number in range(1, self.config.cycles + 1):
                outcome = CycleResult(number)
                self.result.cycles.append(outcome)
                ok = self._cycle(number, address, outcome)
                if self.echo:
                    print(row(outcome), flush=True)
                if not ok:
                    return self.result
                address = self.broker.address
            code = self.broker.stop()
            if code != 0:
                self.result.store_problems.append(f"broker exited with {code} on SIGTERM")
            found = check_store(self.broker.data_dir, self.scenario.topics)
            self.result.store_problems += found.problems
            self.result.final_records = sum(len(m) for m in found.messages.values())
        finally:
            self.broker.kill()
        return self.result

    def _cycle(self, number: int, address: str, outcome: CycleResult) -> bool:
        """Run, kill, restart, verify; False if the broker could not restart or serve."""
        config = self.config
        run_for = self.rng.uniform(config.min_run_s, config.seconds_per_cycle)
        started = time.monotonic()
        workers = self.scenario.start_cycle(number, address, self.rng)
        workers.kill_now.wait(max(run_for, workers.wait_for_kill_s))  # bounded
        workers.killed.set()
        outcome.killed_after_ack = int(workers.kill_now.is_set())
        self.broker.kill()
        outcome.run_s = time.monotonic() - started
        hung = workers.stop(config.rpc_timeout_s + 10)
        if hung:
            outcome.problems.append(f"workers still running after the kill: {hung}")
        outcome.problems += workers.errors
        if self.rng.random() < config.startup_kill_share:
            self._kill_while_starting(outcome)
        try:
            address = self.broker.start()
            outcome.start_s = self.broker.start_seconds
            outcome.recovery_s = recovery_seconds(self.broker)
            started = time.monotonic()
            self.scenario.verify(address, workers, outcome)
        except Exception as exc:
            outcome.problems.append(f"restart or verification failed: {exc!r}")
            return False
        outcome.verify_s = time.monotonic() - started
        return True

    def _kill_while_starting(self, outcome: CycleResult) -> None:
        """Kill a broker at a random moment of its start (recovery, the sweep of
        what a delete left, transactions and commits read back from the log)."""
        expected = self.broker.start_seconds or 1.0
        process = self.broker.spawn()
        with contextlib.suppress(Exception):
            process.wait(self.rng.uniform(0.05, expected))
        self.broker.kill()
        outcome.startup_kills += 1
