"""When an open transaction is checked with its producer group (check-back).

RocketMQ's transaction check, adapted (docs/client.md "Transaction
check-back"): a transaction staged with a producer group whose outcome has
not come ``after_ms`` after its last staged write is checked with a live
producer of the group, then again every ``interval_ms`` while the answer is
unknown or nobody answers, at most ``max_checks`` times; then it is rolled
back, or, with ``on_exhausted == "keep"``, left to the idle timeout.

Everything here is derived from ``StagedTxn`` fields that the log holds (the
begin record's group, the staged records' store times, the check records), so
a restarted broker or a promoted replica continues the same schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from equeue_broker.storage.config import TransactionConfig
from equeue_broker.storage.txn.txn_recovery import StagedTxn

MAX_DUE_PER_TICK = 1_000
"""Checks one tick sends at most (the oldest first); the rest wait a tick."""


@dataclass(frozen=True)
class CheckPolicy:
    after_ms: int
    interval_ms: int
    max_checks: int
    on_exhausted: str
    """"rollback" or "keep"."""

    @classmethod
    def of(cls, config: TransactionConfig) -> CheckPolicy:
        return cls(
            config.check_after_ms, config.check_every_ms, config.check_max, config.check_exhausted
        )


@dataclass(frozen=True)
class CheckDue:
    txn_id: str
    serial: int
    group: str
    created_ms: int
    checks: int
    """Checks made before this one."""
    queues: dict[tuple[str, int], int]
    """Staged messages per (topic, queue)."""


def quiet_since(staged: StagedTxn) -> int:
    """When the transaction was last written to (ms)."""
    return max(staged.created_ms, staged.last_staged_ms)


def next_check_ms(staged: StagedTxn, policy: CheckPolicy) -> int:
    """When the transaction is checked next, or (after the last check) rolled
    back; 0: never (no group, or exhausted with "keep")."""
    if not staged.group:
        return 0
    first = quiet_since(staged) + policy.after_ms
    if staged.checks == 0:
        return first
    if staged.checks >= policy.max_checks and policy.on_exhausted != "rollback":
        return 0
    return max(first, staged.last_check_ms + policy.interval_ms)


def is_due(staged: StagedTxn, now_ms: int, policy: CheckPolicy) -> bool:
    """Due for another check (not yet exhausted)."""
    return (
        bool(staged.group)
        and staged.checks < policy.max_checks
        and now_ms >= next_check_ms(staged, policy)
    )


def is_exhausted(staged: StagedTxn, now_ms: int, policy: CheckPolicy) -> bool:
    """Checked ``max_checks`` times, the last one unanswered for an interval,
    and to be rolled back."""
    return (
        bool(staged.group)
        and policy.on_exhausted == "rollback"
        and staged.checks >= policy.max_checks
        and now_ms >= staged.last_check_ms + policy.interval_ms
    )
