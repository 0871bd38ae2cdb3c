"""The replication scenarios of ``bench/cluster_bench.py`` (issue 18), each beside a
baseline measured in the same run.

- ``catch_up``: an empty ``--role replica`` started beside a master holding
  N MB; seconds until its ``log_end_position`` equals the master's (GetStats,
  polled every 20 ms), as MB/s of the master's log, beside the rate at which
  one consumer streams the same data from the master (``PullStream`` over every
  queue, records decoded), both counted as the same log bytes.
- ``sync_produce``: produce throughput of a master with ``--replication sync``
  and one in-sync replica (``--min-insync-replicas 2``, so every acknowledged
  batch waited for the replica), beside a lone master (no replication), at
  each value size: pipelined ``ProduceStream`` (``Producer.send_batches``) and
  unary ``Produce`` one batch at a time (``send_batch``).
- ``failover``: one ZooKeeper and two groups of 3 brokers (``--zookeeper``,
  ``--replication sync`` by default, the broker's default session timeout
  unless ``--zk-session-timeout-ms`` says otherwise), each with a name server:
  one with the default failover settings (a dead master is found by its
  replicas, issue 31), one with ``--no-zk-fast-failover`` (the session timeout
  alone: the old path, the baseline). Each round waits until every member of a
  group is in the in-sync set (the master's GetStats and ZooKeeper's ``isr``
  znode, which is what an election reads), SIGKILLs its master, then times
  from the signal (a) the first read served by the group: a reader trying
  each member in turn with ``Pull`` of a queue (a replica serves reads), and,
  with ``--read-via namesrv`` (the default), a ``Consumer(namesrv=...)`` made
  before the kill whose poll returns records; (b) the first acknowledged
  write: one message sent to the member ``GetStats`` says is master (newest
  epoch), and, with the name server, a ``Producer(namesrv=...)`` made before
  the kill (it retries on the group's new master). The killed broker is
  restarted (it rejoins as a replica) before the next round. Rounds alternate
  between the two groups; ``--load N [N ...]`` repeats them with N busy-loop
  processes running (started and stopped by PID by the script). The figures
  are the median and max of the rounds per load and group.

Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_group import (
    GROUP_NAME,
    Group,
    GroupConfig,
    Member,
    require_flags,
    wait_for,
)
from equeue_broker.testing_zk import ZooKeeperProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client import Admin, Producer
from equeue_spark.client.connection import ClientConfig, Connection
from equeue_spark.client.reader import stream_replies
from equeue_spark.client.records import decode_records

TOPIC = "repl"
QUEUES = 4
MB = 1_000_000


def _batches(total_bytes: int, size: int, batch: int) -> Iterator[list[bytes]]:
    count = max(1, total_bytes // size)
    value = b"r" * size
    for start in range(0, count, batch):
        yield [value] * min(batch, count - start)


def _create_topic(address: str, queues: int = QUEUES) -> None:
    with Admin(address) as admin:
        admin.create_topic(TOPIC, queues=queues)


def _stats(address: str) -> pb.BrokerStats:
    with grpc.insecure_channel(address) as channel:
        reply: pb.BrokerStats = pb_grpc.AdminStub(channel).GetStats(pb.GetStatsRequest(), timeout=5)
        return reply


# -- (a) catch-up of an empty replica ----------------------------------------------------


@dataclass
class CatchUpResult:
    log_bytes: int = 0
    pull_s: list[float] = field(default_factory=list)
    catch_up_s: list[float] = field(default_factory=list)
    """From the replica's ready line to its log end equal to the master's."""
    with_start_s: list[float] = field(default_factory=list)
    """From spawning the replica process (its start-up included)."""

    def rows(self) -> list[list[object]]:
        def rate(seconds: list[float]) -> float:
            return self.log_bytes / statistics.median(seconds) / MB

        pull = rate(self.pull_s)
        return [
            ["consumer PullStream from the master (baseline)", f"{pull:,.1f}", "1.00x",
             f"{statistics.median(self.pull_s):.2f}"],
            ["empty replica catch-up, from its ready line", f"{rate(self.catch_up_s):,.1f}",
             f"{rate(self.catch_up_s) / pull:.2f}x", f"{statistics.median(self.catch_up_s):.2f}"],
            ["empty replica catch-up, from spawn (start-up included)",
             f"{rate(self.with_start_s):,.1f}", f"{rate(self.with_start_s) / pull:.2f}x",
             f"{statistics.median(self.with_start_s):.2f}"],
        ]  # fmt: skip


CATCH_UP_HEADERS = ("what", "MB/s (median)", "ratio", "seconds")


def pull_all(address: str, queues: int = QUEUES) -> int:
    """Stream every queue of the topic from offset 0 and decode it; the record count."""
    count = 0
    with Connection(ClientConfig(broker=address, timeout_s=300)) as conn:
        for q in range(queues):
            for reply in stream_replies(conn, TOPIC, q, 0, 0, batch_messages=10_000,
                                        batch_bytes=4 << 20):  # fmt: skip
                if reply.count:
                    count += len(decode_records(reply.records, reply.broker_id))
    return count


def catch_up(root: Path, megabytes: int, size: int, repeat: int) -> CatchUpResult:
    """Scenario (a); ``repeat`` alternating rounds of pull and catch-up."""
    result = CatchUpResult()
    common = ("--broker-name", GROUP_NAME, "--flush", "async", "--log-level", "WARNING")
    master = BrokerProcess(root / "master", *common, log_path=root / "master.log")
    master.start()
    try:
        _create_topic(master.address)
        with Producer(master.address) as producer:
            sent = sum(len(r) for r in producer.send_batches(
                TOPIC, _batches(megabytes * MB, size, 1000)))  # fmt: skip
        result.log_bytes = _stats(master.address).log_end_position
        for i in range(repeat):
            started = time.perf_counter()
            got = pull_all(master.address)
            result.pull_s.append(time.perf_counter() - started)
            if got != sent:
                raise RuntimeError(f"the pull read {got} records of {sent}")
            result.catch_up_s.append(0.0)
            result.with_start_s.append(0.0)
            _catch_up_once(root / f"replica{i}", master, result, common)
    finally:
        master.stop()
    return result


def _catch_up_once(
    data_dir: Path, master: BrokerProcess, result: CatchUpResult, common: tuple[str, ...]
) -> None:
    replica = BrokerProcess(data_dir, *common, "--role", "replica", "--master", master.address,
                            log_path=data_dir.parent / f"{data_dir.name}.log")  # fmt: skip
    spawned = time.perf_counter()
    replica.start()
    ready = time.perf_counter()
    try:
        with grpc.insecure_channel(replica.address) as channel:
            stub = pb_grpc.AdminStub(channel)

            def caught_up() -> bool:
                stats = stub.GetStats(pb.GetStatsRequest(), timeout=5)
                return bool(stats.log_end_position == result.log_bytes)

            wait_for("the empty replica to catch up", caught_up, 600)
        done = time.perf_counter()
        result.catch_up_s[-1] = done - ready
        result.with_start_s[-1] = done - spawned
    finally:
        replica.kill()
        shutil.rmtree(data_dir, ignore_errors=True)


# -- (b) produce with sync replication ---------------------------------------------------


@dataclass
class ProduceRow:
    size: int
    setup: str
    streaming: list[float] = field(default_factory=list)
    unary: list[float] = field(default_factory=list)


SYNC_HEADERS = ("value size", "setup", "streaming msg/s (median)", "ratio",
                "unary batches msg/s (median)", "ratio")  # fmt: skip


def _produce_rates(address: str, total_bytes: int, size: int, batch: int) -> tuple[float, float]:
    with Producer(address) as producer:
        for _ in producer.send_batches(TOPIC, _batches(min(total_bytes, MB), size, batch)):
            pass  # warm-up: connection, first chunk, the replica's stream
        started = time.perf_counter()
        count = sum(len(r) for r in producer.send_batches(
            TOPIC, _batches(total_bytes, size, batch)))  # fmt: skip
        streaming = count / (time.perf_counter() - started)
        started = time.perf_counter()
        count = 0
        for values in _batches(total_bytes // 2, size, batch):
            count += len(producer.send_batch(TOPIC, values))
        unary = count / (time.perf_counter() - started)
    return streaming, unary


def sync_produce(
    root: Path, sizes: list[int], megabytes: int, batch: int, repeat: int
) -> list[ProduceRow]:
    """Scenario (b): a lone master against master + in-sync replica, alternating."""
    require_flags("produce with sync replication", "--replication", "--min-insync-replicas")
    rows: list[ProduceRow] = []
    for size in sizes:
        lone = ProduceRow(size, "lone master, no replication (baseline)")
        sync = ProduceRow(size, "--replication sync, 1 replica, --min-insync-replicas 2")
        for i in range(repeat):
            for row, replicated in ((lone, False), (sync, True)):
                streaming, unary = _one_setup(root / f"{size}-{i}-{replicated}", replicated,
                                              megabytes * MB, size, batch)  # fmt: skip
                row.streaming.append(streaming)
                row.unary.append(unary)
        rows += [lone, sync]
    return rows


def _one_setup(
    work: Path, replicated: bool, total: int, size: int, batch: int
) -> tuple[float, float]:
    common = ["--broker-name", GROUP_NAME, "--flush", "async", "--log-level", "WARNING"]
    started: list[BrokerProcess] = []
    try:
        flags = [*common]
        if replicated:
            flags += ["--replication", "sync", "--min-insync-replicas", "2"]
        master = BrokerProcess(work / "master", *flags, log_path=work / "master.log")
        started.append(master)
        master.start()
        _create_topic(master.address)
        if replicated:
            replica = BrokerProcess(work / "replica", *common, "--replication", "sync",
                                    "--role", "replica", "--master", master.address,
                                    log_path=work / "replica.log")  # fmt: skip
            started.append(replica)
            replica.start()
            wait_for("the replica to join the in-sync set",
                     lambda: len(_stats(master.address).in_sync) >= 2, 60)  # fmt: skip
        rates = _produce_rates(master.address, total, size, batch)
        if replicated and len(_stats(master.address).in_sync) < 2:
            raise RuntimeError("the replica left the in-sync set during the run")
        return rates
    finally:
        for process in reversed(started):
            process.kill()
        shutil.rmtree(work, ignore_errors=True)


def sync_rows(rows: list[ProduceRow]) -> list[list[object]]:
    out: list[list[object]] = []
    base: dict[int, ProduceRow] = {}
    for row in rows:
        base.setdefault(row.size, row)
        one = base[row.size]
        s, u = statistics.median(row.streaming), statistics.median(row.unary)
        s1, u1 = statistics.median(one.streaming), statistics.median(one.unary)
        out.append([f"{row.size} B", row.setup, f"{s:,.0f}", f"{s / s1:.2f}x",
                    f"{u:,.0f}", f"{u / u1:.2f}x"])  # fmt: skip
    return out


# -- (c) failover ------------------------------------------------------------------------

FAST = "fast"
"""The broker's default settings: a dead master is found by its replicas (issue 31)."""
SLOW = "session"
"""The baseline: ``--no-zk-fast-failover``, the session timeout alone (the old path)."""
PATHS = {FAST: "fast (defaults)", SLOW: "session timeout only (--no-zk-fast-failover)"}


@dataclass
class Kill:
    round: int
    killed: str
    path: str = FAST
    load: int = 0
    """Busy-loop processes running during the kill (``--load``)."""
    new_master: str = ""
    first_read_s: float | None = None
    first_namesrv_read_s: float | None = None
    first_namesrv_write_s: float | None = None
    first_write_s: float | None = None
    rejoin_s: float = 0.0
    problems: list[str] = field(default_factory=list)


FAILOVER_HEADERS = ("load", "path", "round", "killed", "new master", "first read s",
                    "first read via namesrv s", "first acked write s",
                    "first acked write via namesrv s", "old master back in sync s",
                    "problems")  # fmt: skip


def kill_rows(kills: list[Kill]) -> list[list[object]]:
    def cell(v: float | None) -> object:
        return "-" if v is None else round(v, 3)

    return [[k.load, PATHS[k.path], k.round, k.killed, k.new_master or "-", cell(k.first_read_s),
             cell(k.first_namesrv_read_s), cell(k.first_write_s), cell(k.first_namesrv_write_s),
             round(k.rejoin_s, 2),
             "; ".join(k.problems) or "-"] for k in kills]  # fmt: skip


def failover_summary(kills: list[Kill], session_timeout_ms: int) -> list[list[object]]:
    """Per load and path: medians and maxima; the fast path's first write against
    the target (< 5 s) and against the baseline's of the same load."""

    def got(values: list[float | None]) -> list[float]:
        return [v for v in values if v is not None]

    def stat(values: list[float | None], target: float | None) -> list[object]:
        have = got(values)
        if not have:
            return ["-", "-", "-" if target is None else f"< {target:.0f} s", "not measured"]
        med = statistics.median(have)
        missing = len(values) - len(have)
        if target is None:
            note = "-"
        else:
            note = "met" if med < target and max(have) < target and not missing else "NOT MET"
        if missing:
            note += f" ({missing} round(s) without one)"
        return [f"{med:.2f}", f"{max(have):.2f}", "-" if target is None else f"< {target:.0f} s",
                note]  # fmt: skip

    rows: list[list[object]] = []
    for load in sorted({k.load for k in kills}):
        by_path = {p: [k for k in kills if k.load == load and k.path == p] for p in PATHS}
        for path, runs in by_path.items():
            if not runs:
                continue
            target = 5.0 if path == FAST else None
            name = PATHS[path]
            rows.append([load, name, "first acknowledged write",
                         *stat([k.first_write_s for k in runs], target)])  # fmt: skip
            if any(k.first_namesrv_write_s is not None for k in runs):
                rows.append([load, name, "first acknowledged write (Producer via name server)",
                             *stat([k.first_namesrv_write_s for k in runs], target)])  # fmt: skip
            rows.append([load, name, "first read served (member by member)",
                         *stat([k.first_read_s for k in runs], None)])  # fmt: skip
        fast, slow = got([k.first_write_s for k in by_path[FAST]]), got(
            [k.first_write_s for k in by_path[SLOW]])  # fmt: skip
        if fast and slow:
            ratio = statistics.median(slow) / statistics.median(fast)
            verdict = "faster" if ratio > 1 else "NOT faster"
            rows.append([load, "baseline / fast", "first acknowledged write, medians",
                         f"{ratio:.1f}x", "-", "-", verdict])  # fmt: skip
    rows.append(["-", "ZooKeeper session timeout", "(the old path's floor)",
                 f"{session_timeout_ms / 1000:.2f}", "-", "-", "-"])  # fmt: skip
    return rows


FAILOVER_SUMMARY_HEADERS = ("load", "path", "figure (SIGKILL to ...)", "median s", "max s",
                            "target", "")  # fmt: skip


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[list[int]]:
    """``count`` processes spinning on a core each for the duration; their PIDs.
    Stopped by PID (SIGKILL, reaped) however the block ends."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            started.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        yield [p.pid for p in started]
    finally:
        for process in started:
            process.kill()
        for process in started:
            process.wait(30)


class _Probe:
    """Runs ``attempt`` in a thread until it succeeds or ``timeout_s`` passes; the
    seconds from ``since`` to the first success (None if none)."""

    def __init__(self, attempt: Callable[[], bool], since: float, timeout_s: float) -> None:
        self.attempt = attempt
        self.since = since
        self.timeout_s = timeout_s
        self.seconds: float | None = None
        self.error = ""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = self.since + self.timeout_s
        while time.monotonic() < deadline:
            try:
                if self.attempt():
                    self.seconds = time.monotonic() - self.since
                    return
            except Exception as exc:  # every failure means: not yet
                self.error = repr(exc)[:200]
            time.sleep(0.02)

    def join(self) -> float | None:
        self.thread.join(self.timeout_s + 30)
        return self.seconds


def _read_any(members: list[Member]) -> bool:
    """A Pull of queue 0 from offset 0 answered with records by any live member."""
    for member in members:
        if not member.alive():
            continue
        with contextlib.suppress(grpc.RpcError):
            reply = member.broker().Pull(
                pb.PullRequest(topic=TOPIC, queue_id=0, offset=0, max_messages=10),
                timeout=0.5,
            )
            if reply.status == pb.PULL_STATUS_OK and reply.count > 0:
                return True
    return False


def _write_any(group: Group, value: bytes) -> bool:
    """One message acknowledged by the member that ``GetStats`` says is master (a
    client that knows the group's members; replicas are not sent writes)."""
    master = group.master()
    if master is None:
        return False
    request = pb.ProduceRequest(topic=TOPIC, messages=pb.MessageColumns(
        count=1, values=value, value_lengths=[len(value)]))  # fmt: skip
    with contextlib.suppress(grpc.RpcError):
        master.broker().Produce(request, timeout=1.0)
        return True
    return False


class _NamesrvClients:
    """A consumer and a producer of the client library that reach the group through
    the name server, made before the kill (their routes name the old master):
    each read seeks queue 0 back to offset 0 and polls; each write sends one
    message (the producer retries on the group's new master, failover_timeout_s)."""

    def __init__(self, namesrv: str) -> None:
        from equeue_spark.client.cluster_consumer import ClusterConsumer

        config = ClientConfig(namesrv=namesrv, timeout_s=2.0, retries=0, failover_timeout_s=1.0)
        self.consumer = ClusterConsumer(config=config, start="earliest", max_wait_ms=200)
        self.consumer.assign(TOPIC, [0], broker=GROUP_NAME)
        self.producer = Producer(config=config)
        self.read()  # warm: routes fetched, connections open
        self.write(b"warm")

    def read(self) -> bool:
        self.consumer.seek(TOPIC, 0, 0, broker=GROUP_NAME)
        return bool(self.consumer.poll(0.5))

    def write(self, value: bytes) -> bool:
        return len(self.producer.send_batch(TOPIC, [value])) == 1

    def close(self) -> None:
        self.consumer.close()
        self.producer.close()


def failover(
    root: Path,
    kills: int,
    *,
    session_timeout_ms: int | None,
    replication: str,
    via_namesrv: bool,
    loads: tuple[int, ...] = (0,),
    baseline: bool = True,
    echo: bool = True,
) -> list[Kill]:
    """Scenario (c): one ZooKeeper; a group with the default failover settings and,
    with ``baseline``, a second group with ``--no-zk-fast-failover`` (the
    session timeout alone); for each load of ``loads`` (busy-loop processes
    running), ``kills`` rounds, each killing the master of one group then of the
    other (interleaved, so both see the same machine)."""
    require_flags("fast failover", "--zookeeper", *(["--zk-fast-failover"] if baseline else []))
    paths = [FAST, SLOW] if baseline else [FAST]
    zk = ZooKeeperProcess(root / "zookeeper")
    zk.start()
    groups: dict[str, Group] = {}
    out: list[Kill] = []
    try:
        for path in paths:
            config = GroupConfig(
                replication=replication, session_timeout_ms=session_timeout_ms,
                namesrv=via_namesrv, zk_hosts=f"{zk.hosts}/{path}",
                extra_flags=("--no-zk-fast-failover",) if path == SLOW else (),
            )  # fmt: skip
            groups[path] = Group(root / path, config)
            _prepare(groups[path].start())
        for load in loads:
            with busy_loops(load):
                for number in range(1, kills + 1):
                    for path, group in groups.items():
                        kill = _kill_once(group, Kill(number, "", path, load), via_namesrv)
                        out.append(kill)
                        if echo:
                            print(f"kill: {kill_rows([kill])[0]}", flush=True)
                        if kill.problems and kill.new_master == "":
                            return out  # no master: nothing more to measure
    finally:
        for group in groups.values():
            group.stop()
        zk.stop()
    return out


def _prepare(group: Group) -> None:
    """A master, the topic, a first write, the topic's route on the name server."""
    master = group.wait_master(60)
    with Admin(master.address) as admin:
        admin.create_topic(TOPIC, queues=QUEUES)
    if not _write_any(group, b"seed"):
        raise RuntimeError("the group took no write before the first kill")
    if group.namesrv is not None:
        namesrv = group.namesrv.address

        def routed() -> bool:
            with Admin(namesrv=namesrv) as admin:
                return len(admin.route(TOPIC).queues()) == QUEUES

        wait_for("the topic's route on the name server", routed, 60)


def _kill_once(group: Group, kill: Kill, via_namesrv: bool) -> Kill:
    """SIGKILL the master once every member is in sync; time the first read and
    write; restart the killed member and wait until it is in sync again."""
    master = group.in_sync(120)
    kill.killed = master.name
    survivors = [m for m in group.members if m is not master]
    clients = None
    if via_namesrv and group.namesrv is not None:
        clients = _NamesrvClients(group.namesrv.address)
    killed_at = group.kill(master)
    number = kill.round
    probes = [
        _Probe(functools.partial(_read_any, survivors), killed_at, 60),
        _Probe(functools.partial(_write_any, group, b"after-%d" % number), killed_at, 90),
    ]
    if clients is not None:
        probes.append(_Probe(clients.read, killed_at, 60))
        probes.append(_Probe(functools.partial(clients.write, b"ns-%d" % number), killed_at, 90))
    kill.first_read_s = probes[0].join()
    kill.first_write_s = probes[1].join()
    if len(probes) > 2:
        kill.first_namesrv_read_s = probes[2].join()
        kill.first_namesrv_write_s = probes[3].join()
    if clients is not None:
        clients.close()
    whats = ("read", "write", "namesrv read", "namesrv write")
    for probe, what in zip(probes, whats, strict=False):
        if probe.seconds is None:
            kill.problems.append(f"no {what}: {probe.error or 'timed out'}")
    with contextlib.suppress(TimeoutError):
        kill.new_master = group.wait_master(30, exclude=[master]).name
    back = time.monotonic()
    group.restart(master)
    try:
        group.in_sync(120)
    except TimeoutError as exc:
        kill.problems.append(str(exc))
    kill.rejoin_s = time.monotonic() - back
    return kill


__all__ = [
    "CATCH_UP_HEADERS",
    "FAILOVER_HEADERS",
    "FAILOVER_SUMMARY_HEADERS",
    "SYNC_HEADERS",
    "CatchUpResult",
    "Kill",
    "ProduceRow",
    "busy_loops",
    "catch_up",
    "failover",
    "failover_summary",
    "kill_rows",
    "sync_produce",
    "sync_rows",
    "wait_for",
]
