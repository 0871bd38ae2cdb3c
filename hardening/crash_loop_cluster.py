"""Cluster crash loop: SIGKILL the master of a replicated group under load, again and again.

Run ``python hardening/crash_loop_cluster.py --kills 20`` (``make crash-loop-cluster``);
``--quick`` is a smoke run (2 kills, short runs). ``tests/hardening/test_crash_loop_cluster.py``
runs the quick mode.

The group: a private ZooKeeper (``equeue_broker.testing_zk``) and three brokers
of one broker name with ``--zookeeper``, ``--zk-session-timeout-ms`` (2000 by
default) and ``--replication sync`` (every acknowledged write is on every
in-sync member), registered with a name server. Producers (paced to ``--rate``
messages/s in all, 3,000 by default) and a consumer (``hardening/_crash_cluster.py``)
run for the whole loop: two producers and the consumer on raw gRPC stubs,
following the master through each member's ``GetStats``, and one producer on
the client library (``--client-producers``), keyed, through the name server,
idempotent (``--no-idempotence``: at-least-once, the control), whose retries
resend a batch across a failover. Each kill:

1. waits until every member is in the master's in-sync set with its log end
   (a kill before that could leave no in-sync replica, and no election: not
   what this loop measures);
2. lets the load run for a random time in ``[--min-run-s, --max-run-s]``;
3. SIGKILLs the current master, then times the first member that says it is
   master with a newer epoch ("new master") and the first write acknowledged
   after the kill ("first ack");
4. restarts the killed broker over its data directory: it rejoins as a
   replica, truncating what the new epoch does not hold.

At the end the workers stop and the final master's log is read from offset 0
(``Pull``): every acknowledged message must be there exactly once, at its
acknowledged queue and offset with its bytes (0 lost; 0 duplicated: no
acknowledged message, and no message of a failed request, held twice), every
record a consumer read must still be there, every record must be one that
was sent, and every member's copy must equal the master's. Messages of failed
requests (in doubt at a kill) that turn out present are counted separately:
they are not errors. Prints a row per kill and a summary; exits 1 on any
problem.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `hardening` as a package

from equeue_broker.testing_group import Group, GroupConfig, Member, MissingFeature
from equeue_broker.testing_report import table
from equeue_spark.client import Admin
from hardening._crash_cluster import TOPIC, Accounting, Load, LoadConfig, account


@dataclass(frozen=True)
class ClusterLoopConfig:
    kills: int = 20
    min_run_s: float = 1.0
    max_run_s: float = 3.0
    session_timeout_ms: int = 2000
    replication: str = "sync"
    flush: str = "async"
    producers: int = 2
    rate: float = 3000.0
    """Messages per second over all producers (0: unbounded)."""
    consumers: int = 1
    client_producers: int = 1
    """Keyed producers on the client library, through the group's name server."""
    idempotence: bool = True
    """The client producers' ``enable_idempotence`` (False: the at-least-once control)."""
    queues: int = 4
    seed: int = 1
    failover_timeout_s: float = 60.0
    """Longest wait for a new master after a kill (then the loop stops, failed)."""
    rejoin_timeout_s: float = 120.0
    zk_hosts: str = ""
    """An existing ZooKeeper (``HOST:PORT/chroot``, a test's fixture); "" starts one."""


@dataclass
class KillResult:
    number: int
    killed: str
    run_s: float = 0.0
    new_master: str = ""
    new_master_s: float | None = None
    first_ack_s: float | None = None
    rejoin_s: float | None = None
    problems: list[str] = field(default_factory=list)


@dataclass
class ClusterLoopResult:
    config: ClusterLoopConfig
    kills: list[KillResult] = field(default_factory=list)
    accounting: Accounting | None = None
    problems: list[str] = field(default_factory=list)

    def all_problems(self) -> list[str]:
        out = [f"kill {k.number}: {p}" for k in self.kills for p in k.problems]
        if self.accounting is not None:
            out += [f"accounting: {p}" for p in self.accounting.problems]
        return out + self.problems


HEADERS = ("kill", "killed", "run s", "new master", "new master s", "first ack s",
           "rejoined in sync s", "checks")  # fmt: skip


def row(k: KillResult) -> list[object]:
    def cell(v: float | None) -> object:
        return "-" if v is None else round(v, 2)

    return [k.number, k.killed, round(k.run_s, 2), k.new_master or "-", cell(k.new_master_s),
            cell(k.first_ack_s), cell(k.rejoin_s),
            "ok" if not k.problems else "; ".join(k.problems)]  # fmt: skip


def run(
    config: ClusterLoopConfig, work_dir: Path | None = None, echo: bool = False
) -> ClusterLoopResult:
    """Run the loop in ``work_dir`` (default: a temporary directory, removed after)."""
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="equeue-crash-cluster-") as tmp:
            return run(config, Path(tmp), echo)
    result = ClusterLoopResult(config)
    group_config = GroupConfig(
        replication=config.replication, session_timeout_ms=config.session_timeout_ms,
        flush=config.flush, zk_hosts=config.zk_hosts, namesrv=config.client_producers > 0,
        extra_flags=("--register-interval-ms", "300"),
    )  # fmt: skip
    rng = random.Random(config.seed)
    with Group(work_dir, group_config) as group:
        group.start()
        master = group.wait_master(60)
        with Admin(master.address) as admin:
            admin.create_topic(TOPIC, queues=config.queues)
        load_config = LoadConfig(
            producers=config.producers, consumers=config.consumers, queues=config.queues,
            seed=config.seed, rate=config.rate, client_producers=config.client_producers,
            idempotence=config.idempotence,
        )  # fmt: skip
        load = Load(group, load_config)
        load.start()
        try:
            for number in range(1, config.kills + 1):
                kill = _one_kill(group, load, config, number, rng)
                result.kills.append(kill)
                if echo:
                    print(table(HEADERS, [row(kill)]).splitlines()[-1], flush=True)
                if kill.new_master == "" or kill.rejoin_s is None:
                    result.problems.append(f"stopped after kill {number}: the group did not "
                                           "recover (see its row)")  # fmt: skip
                    break
        finally:
            hung = load.stop()
            if hung:
                result.problems.append(f"workers still running at the end: {hung}")
        try:
            final = group.in_sync(config.rejoin_timeout_s)
            others = [m for m in group.members if m is not final]
            result.accounting = account(load, final, others, config.queues)
        except Exception as exc:
            result.problems.append(f"final accounting failed: {exc!r}")
    return result


def _one_kill(
    group: Group, load: Load, config: ClusterLoopConfig, number: int, rng: random.Random
) -> KillResult:
    try:
        master = group.in_sync(config.rejoin_timeout_s)
    except TimeoutError as exc:
        return KillResult(number, "-", problems=[f"before the kill: {exc}"])
    kill = KillResult(number, master.name)
    kill.run_s = rng.uniform(config.min_run_s, config.max_run_s)
    load.stopping.wait(kill.run_s)  # bounded: the load runs meanwhile
    load.kill_number = number
    killed_at = group.kill(master)
    with contextlib.suppress(TimeoutError):
        new = group.wait_master(config.failover_timeout_s, exclude=[master])
        kill.new_master_s = time.monotonic() - killed_at
        kill.new_master = new.name
    if not kill.new_master:
        kill.problems.append(f"no new master within {config.failover_timeout_s:.0f} s")
        return kill
    _wait_first_ack(load, killed_at, config.failover_timeout_s)
    kill.first_ack_s = load.first_ack_after(killed_at)
    if kill.first_ack_s is None:
        kill.problems.append("no write acknowledged after the kill")
    back = time.monotonic()
    try:
        group.restart(master)
        group.in_sync(config.rejoin_timeout_s)
        kill.rejoin_s = time.monotonic() - back
    except (RuntimeError, TimeoutError) as exc:
        kill.problems.append(f"the old master did not rejoin in sync: {exc}")
    return kill


def _wait_first_ack(load: Load, since: float, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while load.first_ack_after(since) is None and time.monotonic() < deadline:
        time.sleep(0.05)


def summary(result: ClusterLoopResult) -> str:
    kills = result.kills
    a = result.accounting or Accounting()

    def spread(values: list[float | None]) -> str:
        got = [v for v in values if v is not None]
        return f"{statistics.median(got):.2f} / {max(got):.2f}" if got else "-"

    c = result.config
    rows: list[list[object]] = [
        ["group", f"3 brokers, --replication {c.replication}, --flush {c.flush}, "
                  f"--zk-session-timeout-ms {c.session_timeout_ms}"],
        ["load", f"{c.producers} raw producers and {c.client_producers} client producer(s) "
                 f"(idempotence {'on' if c.idempotence else 'off'}) at {c.rate:,.0f} msg/s in "
                 f"all, {c.consumers} consumer(s)"],
        ["kills done / asked", f"{len(kills)} / {c.kills}"],
        ["messages acknowledged", a.acked],
        ["lost (acknowledged, missing from the final master)", a.lost],
        ["duplicated: extra copies of acknowledged messages", a.duplicated],
        ["duplicated: extra copies of in-doubt messages", a.duplicated_in_doubt],
        ["of the acknowledged, the client producers' / their in-doubt messages",
         f"{a.client_acked:,} / {a.client_in_doubt:,}"],
        ["the client producers' failed batches", "; ".join(
            f"{count} x {what}" for what, count in sorted(a.client_failures.items())) or "none"],
        ["moved (acknowledged at another offset or with other bytes)", a.moved],
        ["unknown records (never sent)", a.unknown],
        ["in doubt (request failed) / present in the log (not errors)",
         f"{a.in_doubt:,} / {a.in_doubt_present:,}"],
        ["consumed / then gone from the log", f"{a.consumed:,} / {a.consumed_missing:,}"],
        ["records in the final log", a.records],
        ["replicas identical to the master", "yes" if not a.replicas_differ else "NO"],
        ["kill to new master, s (median / max)", spread([k.new_master_s for k in kills])],
        ["kill to first acknowledged write, s (median / max)",
         spread([k.first_ack_s for k in kills])],
        ["restart to back in sync, s (median / max)", spread([k.rejoin_s for k in kills])],
        ["problems", len(result.all_problems())],
    ]  # fmt: skip
    return table(("figure", "value"), rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 kills, short runs")
    parser.add_argument("--min-run-s", type=float, default=1.0)
    parser.add_argument("--max-run-s", type=float, default=3.0)
    parser.add_argument("--zk-session-timeout-ms", type=int, default=2000)
    parser.add_argument("--replication", choices=["sync", "async"], default="sync")
    parser.add_argument("--flush", choices=["sync", "async"], default="async")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=3000.0, help="messages/s, 0: unbounded")
    parser.add_argument("--consumers", type=int, default=1)
    parser.add_argument(
        "--client-producers",
        type=int,
        default=1,
        help="keyed producers on the client library, via the name server",
    )
    parser.add_argument(
        "--no-idempotence",
        action="store_true",
        help="the client producers at-least-once (a control: may duplicate)",
    )
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, help="keep the data here (default: temp dir)")
    args = parser.parse_args(argv)
    kills, min_run, max_run = args.kills, args.min_run_s, args.max_run_s
    if args.quick:
        kills, min_run, max_run = min(kills, 2), 0.5, 1.0
    config = ClusterLoopConfig(
        kills=kills, min_run_s=min_run, max_run_s=max_run,
        session_timeout_ms=args.zk_session_timeout_ms, replication=args.replication,
        flush=args.flush, producers=args.producers, rate=args.rate, consumers=args.consumers,
        queues=args.queues, seed=args.seed, client_producers=args.client_producers,
        idempotence=not args.no_idempotence,
    )  # fmt: skip
    print(f"cluster crash loop: {config}", flush=True)
    print(table(HEADERS, []), flush=True)
    started = time.monotonic()
    try:
        result = run(config, args.work_dir, echo=True)
    except MissingFeature as exc:
        print(f"NOT RUN: {exc}")
        return 1
    print(f"\n## Summary ({time.monotonic() - started:.0f} s)\n")
    print(summary(result))
    problems = result.all_problems()
    for problem in problems[:50]:
        print(f"PROBLEM: {problem}")
    return 1 if problems else 0


__all__ = ["ClusterLoopConfig", "ClusterLoopResult", "Member", "main", "run", "summary"]

if __name__ == "__main__":
    sys.exit(main())
