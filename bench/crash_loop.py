"""Crash loop: SIGKILL a broker at random moments under concurrent producers and consumers.

Run ``python bench/crash_loop.py --cycles 50 --mode sync`` (``make crash-loop``);
``--mode async`` checks the async flush mode, ``--machine-crash`` (async only)
also throws away, after each kill, every byte the broker had not fsynced, as
a power loss would. Prints one row per cycle and a summary, and exits 1 if any
check failed. ``tests/test_crash_loop.py`` runs a few cycles of each.

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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import struct
import sys
import tempfile
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from crc32c import crc32c

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench._harness import check_store, details_of, pull_queue, recovery_seconds, status_of, table
from equeue_broker.storage.chunk import HEADER_SIZE, ChunkHeader, active_size
from equeue_broker.storage.queue_index import ENTRY, ENTRY_SIZE
from equeue_broker.testing import BrokerProcess
from equeue_proto.protocol import format_message_id
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client.records import Message, decode_records

TOPIC = "crash"
GROUP = "crash-group"
ID = struct.Struct(">IHI")
"""cycle u32, producer u16, sequence u32: the head of every value."""
KiB = 1024


@dataclass(frozen=True)
class CrashLoopConfig:
    cycles: int = 50
    mode: str = "sync"
    machine_crash: bool = False
    """Async only: after each kill, drop what the broker had not fsynced."""
    producers: int = 4
    consumers: int = 2
    queues: int = 4
    min_run_s: float = 0.3
    seconds_per_cycle: float = 2.0
    """Longest a cycle runs before the kill; the kill comes at a uniform random time."""
    seed: int = 1
    chunk_size: int = 256 * KiB
    """Small, so that chunks roll (and get sealed) during the run."""
    flush_interval_ms: int = 100
    max_batch: int = 32
    max_value_bytes: int = 400
    stream_share: float = 0.2
    """Share of produce calls that pipeline 2-5 requests on one ProduceStream."""
    startup_kill_share: float = 0.0
    """Share of cycles that also kill a broker while it starts (during recovery)."""
    loss_slack_s: float = 1.5
    """Machine-crash mode: how much older than one flush interval a lost ack may be."""
    rpc_timeout_s: float = 15.0
    get_message_samples: int = 20

    def __post_init__(self) -> None:
        if self.mode not in ("sync", "async"):
            raise ValueError(f"mode must be sync or async, got {self.mode!r}")
        if self.machine_crash and self.mode != "async":
            raise ValueError("--machine-crash is for async mode: sync acks are fsynced")
        if not 0 < self.min_run_s <= self.seconds_per_cycle:
            raise ValueError("need 0 < min_run_s <= seconds_per_cycle")


@dataclass
class CycleResult:
    cycle: int
    run_s: float = 0.0
    acked: int = 0
    in_doubt: int = 0
    in_doubt_applied: int = 0
    consumed: int = 0
    lost: int = 0
    oldest_loss_s: float = 0.0
    """Machine-crash mode: how long before the kill the oldest lost message was acked."""
    duplicated: int = 0
    commit_regressions: int = 0
    commits_past_end: int = 0
    """Committed offsets beyond the recovered end (a failure; recovery clamps them)."""
    startup_kills: int = 0
    start_s: float = 0.0
    """Spawn to ready line of the restart that verified this cycle."""
    recovery_s: float | None = None
    """The store's own recovery time at that restart (from its log)."""
    dropped_bytes: int = 0
    verify_s: float = 0.0
    problems: list[str] = field(default_factory=list)


@dataclass
class CrashLoopResult:
    config: CrashLoopConfig
    cycles: list[CycleResult] = field(default_factory=list)
    final_records: int = 0
    store_problems: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        out = [f"cycle {c.cycle}: {p}" for c in self.cycles for p in c.problems]
        return out + [f"final store check: {p}" for p in self.store_problems]

    def total(self, name: str) -> int:
        return sum(int(getattr(c, name)) for c in self.cycles)

    @property
    def survived(self) -> int:
        return sum(1 for c in self.cycles if not c.problems)


def fingerprint(value: bytes) -> int:
    return crc32c(value) << 32 | len(value)


# -- one cycle's workers -----------------------------------------------------------------


@dataclass
class Ack:
    queue_id: int
    offset: int
    position: int
    fingerprint: int
    ident: int
    at: float


@dataclass
class WorkerLog:
    acks: list[Ack] = field(default_factory=list)
    in_doubt: set[int] = field(default_factory=set)
    seen: list[tuple[int, int, int]] = field(default_factory=list)
    """Consumers: (queue, offset, fingerprint) of every message read."""
    commits: dict[int, tuple[int, float]] = field(default_factory=dict)
    """Consumers: queue -> (highest acknowledged commit, when)."""
    attempted: dict[int, int] = field(default_factory=dict)
    """Consumers: queue -> highest commit sent (acknowledged or not)."""
    errors: list[str] = field(default_factory=list)
    """Failures before the kill (there must be none)."""
    broker_id: str = ""


class Cycle:
    """The producers and consumers of one cycle, on their own channels."""

    def __init__(
        self,
        config: CrashLoopConfig,
        number: int,
        address: str,
        start_offsets: dict[int, int],
        rng: random.Random,
    ) -> None:
        self.config = config
        self.number = number
        self.address = address
        self.start_offsets = start_offsets
        self.killed = threading.Event()
        self.logs: list[WorkerLog] = []
        self.threads: list[threading.Thread] = []
        self.seeds = [rng.getrandbits(32) for _ in range(config.producers + config.consumers)]

    def start(self) -> None:
        config = self.config
        for p in range(config.producers):
            self._spawn(self._produce, p)
        for c in range(config.consumers):
            queues = [q for q in range(config.queues) if q % config.consumers == c]
            self._spawn(self._consume, c, queues)

    def _spawn(self, target: object, *args: object) -> None:
        log = WorkerLog()
        self.logs.append(log)
        thread = threading.Thread(target=target, args=(log, *args), daemon=True)  # type: ignore[arg-type]
        self.threads.append(thread)
        thread.start()

    def stop(self, timeout_s: float) -> list[str]:
        """After the kill: wait for every worker; names of those that hang."""
        self.killed.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def _failed(self, log: WorkerLog, what: str, exc: grpc.RpcError) -> bool:
        """Note a failed call; True if the worker should stop (the broker is gone)."""
        if self.killed.is_set():
            return True
        log.errors.append(f"{what}: {status_of(exc).name} {details_of(exc)}")
        return len(log.errors) > 10

    # producers -------------------------------------------------------------------

    def _produce(self, log: WorkerLog, producer: int) -> None:
        config = self.config
        rng = random.Random(self.seeds[producer])
        seq = 0
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            while not self.killed.is_set():
                stream = rng.random() < config.stream_share
                requests: list[tuple[pb.ProduceRequest, list[tuple[int, int]]]] = []
                for _ in range(rng.randint(2, 5) if stream else 1):
                    n = rng.randint(1, config.max_batch)
                    values = []
                    for _ in range(n):
                        seq += 1
                        head = ID.pack(self.number, producer, seq)
                        values.append(head + rng.randbytes(rng.randint(0, config.max_value_bytes)))
                    idents = [ident_of(v) for v in values]
                    requests.append(
                        (
                            self._request(rng, values),
                            list(zip(idents, map(fingerprint, values), strict=True)),
                        )
                    )
                if stream:
                    self._send_stream(stub, log, requests)
                else:
                    self._send_unary(stub, log, requests[0])
                if log.errors and len(log.errors) > 10:
                    return

    def _request(self, rng: random.Random, values: list[bytes]) -> pb.ProduceRequest:
        columns = pb.MessageColumns(
            count=len(values), values=b"".join(values), value_lengths=[len(v) for v in values]
        )
        request = pb.ProduceRequest(topic=TOPIC, messages=columns)
        shape = rng.random()
        if shape < 0.5:  # the whole batch to one queue
            request.queue_ids.extend([rng.randrange(self.config.queues)] * len(values))
        elif shape < 0.8:  # mixed queues: one atomic append per queue
            request.queue_ids.extend(rng.randrange(self.config.queues) for _ in values)
        else:  # keyed: the broker routes by key hash
            keys = [rng.randbytes(4) for _ in values]
            columns.keys = b"".join(keys)
            columns.key_lengths.extend(len(k) for k in keys)
        return request

    def _record(self, log: WorkerLog, reply: pb.ProduceReply, sent: list[tuple[int, int]]) -> None:
        now = time.monotonic()
        log.broker_id = reply.broker_id
        for q, offset, position, (ident, fp) in zip(
            reply.queue_ids, reply.offsets, reply.positions, sent, strict=True
        ):
            log.acks.append(Ack(q, offset, position, fp, ident, now))

    def _send_unary(
        self,
        stub: pb_grpc.BrokerStub,
        log: WorkerLog,
        item: tuple[pb.ProduceRequest, list[tuple[int, int]]],
    ) -> None:
        request, sent = item
        try:
            reply = stub.Produce(request, timeout=self.config.rpc_timeout_s)
        except grpc.RpcError as exc:
            log.in_doubt.update(ident for ident, _ in sent)
            self._failed(log, "Produce", exc)
            return
        self._record(log, reply, sent)

    def _send_stream(
        self,
        stub: pb_grpc.BrokerStub,
        log: WorkerLog,
        items: list[tuple[pb.ProduceRequest, list[tuple[int, int]]]],
    ) -> None:
        done = 0
        try:
            replies = stub.ProduceStream(
                iter([r for r, _ in items]), timeout=self.config.rpc_timeout_s
            )
            for reply in replies:
                self._record(log, reply, items[done][1])
                done += 1
        except grpc.RpcError as exc:
            for _request, sent in items[done:]:
                log.in_doubt.update(ident for ident, _ in sent)
            self._failed(log, "ProduceStream", exc)
            return
        if done != len(items):
            log.errors.append(f"ProduceStream answered {done} of {len(items)} requests")

    # consumers -------------------------------------------------------------------

    def _consume(self, log: WorkerLog, _consumer: int, queues: list[int]) -> None:
        config = self.config
        positions = {q: self.start_offsets.get(q, 0) for q in queues}
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            while not self.killed.is_set():
                for q in queues:
                    request = pb.PullRequest(
                        topic=TOPIC, queue_id=q, offset=positions[q], max_messages=500,
                        max_wait_ms=100,
                    )  # fmt: skip
                    try:
                        reply = stub.Pull(request, timeout=config.rpc_timeout_s)
                    except grpc.RpcError as exc:
                        if self._failed(log, "Pull", exc):
                            return
                        continue
                    try:
                        messages = decode_records(reply.records, reply.broker_id)
                    except Exception as exc:  # a damaged record on the wire
                        log.errors.append(f"Pull {q}@{positions[q]}: {exc}")
                        return
                    for i, m in enumerate(messages):
                        if m.offset != positions[q] + i or m.queue_id != q:
                            log.errors.append(
                                f"Pull {q}@{positions[q]}: record {i} is {m.queue_id}@{m.offset}"
                            )
                            return
                        log.seen.append((q, m.offset, fingerprint(m.value)))
                    positions[q] = reply.next_offset
                self._commit(stub, log, positions)

    def _commit(self, stub: pb_grpc.BrokerStub, log: WorkerLog, positions: dict[int, int]) -> None:
        request = pb.CommitOffsetsRequest(group=GROUP)
        for q, offset in sorted(positions.items()):
            request.offsets.add(topic=TOPIC, queue_id=q, offset=offset)
            log.attempted[q] = max(log.attempted.get(q, 0), offset)
        try:
            stub.CommitOffsets(request, timeout=self.config.rpc_timeout_s)
        except grpc.RpcError as exc:
            self._failed(log, "CommitOffsets", exc)
            return
        now = time.monotonic()
        for q, offset in positions.items():
            if offset >= log.commits.get(q, (-1, 0.0))[0]:
                log.commits[q] = (offset, now)


def ident_of(value: bytes) -> int:
    cycle, producer, seq = ID.unpack_from(value)
    return int(cycle) << 48 | int(producer) << 32 | int(seq)


def cycle_of(ident: int) -> int:
    return ident >> 48


# -- machine crash ------------------------------------------------------------------------


def drop_unsynced(data_dir: Path) -> int:
    """Erase what a power loss could take after the broker's last index checkpoint:
    log bytes of the active chunk at or after the checkpoint position (sealed
    chunks were fsynced when sealed), and index entries pointing there. Returns
    the number of non-zero log bytes erased.

    Everything below ``checkpoint.json``'s position was fsynced before the
    checkpoint was saved, so this is at least as harsh as a real power loss.
    """
    document = json.loads((data_dir / "checkpoint.json").read_text())
    checkpoint = int(document["index_position"])
    chunks = sorted((data_dir / "log").glob("*.chunk"))
    if not chunks:
        return 0
    path = chunks[-1]
    with open(path, "r+b") as f:
        header = ChunkHeader.decode(f.read(HEADER_SIZE), str(path))
        size = f.seek(0, 2)
        if size != active_size(header):
            return 0  # sealed: fsynced when it was sealed
        keep = max(checkpoint - header.chunk_number * header.capacity, 0)
        f.seek(HEADER_SIZE + keep)
        dropped = 0
        for _ in range(header.capacity // (1 << 20) + 2):  # bounded by the chunk size
            block = f.read(1 << 20)
            if not block:
                break
            dropped += len(block) - block.count(0)
        f.truncate(HEADER_SIZE + keep)
        f.truncate(size)
    for index_file in (data_dir / "index").glob("*/*/*.idx"):
        data = bytearray(index_file.read_bytes())
        changed = False
        for at in range(HEADER_SIZE, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
            position_plus_one = ENTRY.unpack_from(data, at)[0]
            if position_plus_one and position_plus_one - 1 >= checkpoint:
                data[at : at + ENTRY_SIZE] = bytes(ENTRY_SIZE)
                changed = True
        if changed:
            index_file.write_bytes(bytes(data))
    return dropped


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
        self.known: dict[int, array[int]] = {q: array("Q") for q in range(config.queues)}
        """Fingerprint of every record per queue, as the last restart read them."""
        self.committed: dict[int, int] = {}
        """The group's committed offsets as the last restart fetched them."""
        self.commit_floor: dict[int, int] = {}
        """Highest acknowledged commit per queue: sync mode never goes below it."""
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
                    self._verify(address, number, logs, kill_at, outcome)
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
            self._check_files()
        finally:
            self.broker.kill()
        return self.result

    def _run_cycle(
        self, number: int, address: str, outcome: CycleResult
    ) -> tuple[list[WorkerLog], float]:
        config = self.config
        cycle = Cycle(config, number, address, dict(self.committed), self.rng)
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

    def _verify(
        self,
        address: str,
        number: int,
        logs: list[WorkerLog],
        kill_at: float,
        outcome: CycleResult,
    ) -> None:
        config = self.config
        problems = outcome.problems
        acks = [a for log in logs for a in log.acks]
        in_doubt = set().union(*(log.in_doubt for log in logs))
        outcome.acked = len(acks)
        outcome.in_doubt = len(in_doubt)
        outcome.consumed = sum(len(log.seen) for log in logs)
        window = config.flush_interval_ms / 1000 + config.loss_slack_s
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            admin = pb_grpc.AdminStub(channel)
            ends: dict[int, int] = {}
            fresh: dict[int, array[int]] = {}
            for q in range(config.queues):
                messages, first = pull_queue(stub, TOPIC, q, timeout_s=config.rpc_timeout_s)
                ends[q] = first.end_offset
                if first.earliest_offset != 0 or [m.offset for m in messages] != list(
                    range(first.end_offset)
                ):
                    problems.append(f"queue {q}: offsets read are not [0, {first.end_offset})")
                    continue
                fps = array("Q", (fingerprint(m.value) for m in messages))
                fresh[q] = fps
                old = self.known[q]
                if len(fps) < len(old) or fps[: len(old)] != old:
                    problems.append(f"queue {q}: records verified by the previous restart changed")
                idents: set[int] = set()
                for m in messages[len(old) :]:
                    ident = ident_of(m.value)
                    if ident in idents:
                        outcome.duplicated += 1
                        problems.append(f"queue {q}@{m.offset}: message {ident:x} appears twice")
                    idents.add(ident)
                    if cycle_of(ident) != number:
                        outcome.duplicated += 1
                        problems.append(f"queue {q}@{m.offset}: message of cycle {cycle_of(ident)}")
                    elif ident in in_doubt:
                        outcome.in_doubt_applied += 1
                self._check_new_records(q, messages[len(old) :], acks, in_doubt, outcome)
            for ack in acks:
                fps = fresh.get(ack.queue_id, array("Q"))
                if ack.offset < len(fps):
                    if fps[ack.offset] != ack.fingerprint:
                        problems.append(
                            f"queue {ack.queue_id}@{ack.offset}: acknowledged message "
                            f"{ack.ident:x} replaced by different content"
                        )
                    continue
                outcome.lost += 1
                age = kill_at - ack.at
                outcome.oldest_loss_s = max(outcome.oldest_loss_s, age)
                if not config.machine_crash:
                    problems.append(f"queue {ack.queue_id}@{ack.offset}: acknowledged, lost")
                elif age > window:
                    problems.append(
                        f"queue {ack.queue_id}@{ack.offset}: lost, acknowledged {age:.2f} s "
                        f"before the kill (window {window:.2f} s)"
                    )
            for log in logs:
                for q, offset, fp in log.seen:
                    fps = fresh.get(q, array("Q"))
                    if offset < len(fps) and fps[offset] != fp:
                        problems.append(f"queue {q}@{offset}: a consumer saw other content")
                    elif offset >= len(fps) and not config.machine_crash:
                        problems.append(f"queue {q}@{offset}: a consumer saw it, now it is gone")
            self._sample_get_message(admin, acks, fresh, logs, outcome)
            self._check_offsets(stub, ends, logs, outcome)
            self.known.update(fresh)

    def _check_new_records(
        self,
        q: int,
        new: list[Message],
        acks: list[Ack],
        in_doubt: set[int],
        outcome: CycleResult,
    ) -> None:
        """Each new record was acknowledged at exactly its offset, or was in doubt."""
        at = {(a.queue_id, a.ident): a.offset for a in acks}
        for m in new:
            ident = ident_of(m.value)
            acked_at = at.get((q, ident))
            if acked_at is not None and acked_at != m.offset:
                outcome.duplicated += 1
                outcome.problems.append(f"queue {q}@{m.offset}: message acked at offset {acked_at}")
            elif acked_at is None and ident not in in_doubt:
                outcome.problems.append(f"queue {q}@{m.offset}: message {ident:x} was never sent")

    def _sample_get_message(
        self,
        admin: pb_grpc.AdminStub,
        acks: list[Ack],
        fresh: dict[int, array[int]],
        logs: list[WorkerLog],
        outcome: CycleResult,
    ) -> None:
        broker_ids = {log.broker_id for log in logs if log.broker_id}
        present = [a for a in acks if a.offset < len(fresh.get(a.queue_id, array("Q")))]
        if not present or len(broker_ids) != 1:
            return
        broker_id = broker_ids.pop()
        for ack in self.rng.sample(present, min(self.config.get_message_samples, len(present))):
            by_id = pb.GetMessageRequest(message_id=format_message_id(broker_id, ack.position))
            by_address = pb.GetMessageRequest(
                address=pb.QueueOffset(topic=TOPIC, queue_id=ack.queue_id, offset=ack.offset)
            )
            for request in (by_id, by_address):
                try:
                    reply = admin.GetMessage(request, timeout=self.config.rpc_timeout_s)
                    (message,) = decode_records(reply.record, broker_id)
                except (grpc.RpcError, ValueError) as exc:
                    outcome.problems.append(f"GetMessage {request}: {exc}")
                    continue
                if (message.queue_id, message.offset, fingerprint(message.value)) != (
                    ack.queue_id,
                    ack.offset,
                    ack.fingerprint,
                ):
                    outcome.problems.append(f"GetMessage {ack.queue_id}@{ack.offset}: differs")

    def _check_offsets(
        self,
        stub: pb_grpc.BrokerStub,
        ends: dict[int, int],
        logs: list[WorkerLog],
        outcome: CycleResult,
    ) -> None:
        config = self.config
        reply = stub.FetchOffsets(
            pb.FetchOffsetsRequest(group=GROUP, topic=TOPIC), timeout=config.rpc_timeout_s
        )
        fetched = {o.queue_id: o.offset for o in reply.offsets}
        for log in logs:
            for q, (offset, _at) in log.commits.items():
                self.commit_floor[q] = max(self.commit_floor.get(q, 0), offset)
        attempted: dict[int, int] = {}
        for log in logs:
            for q, offset in log.attempted.items():
                attempted[q] = max(attempted.get(q, 0), offset)
        for q in range(config.queues):
            now = fetched.get(q)
            if now is None:
                if self.commit_floor.get(q, 0) > 0:
                    outcome.commit_regressions += 1
                    if config.mode == "sync":
                        outcome.problems.append(f"queue {q}: committed offset gone")
                continue
            if now > ends[q]:
                outcome.commits_past_end += 1
                outcome.problems.append(f"queue {q}: committed offset {now} > end {ends[q]}")
            if now > max(attempted.get(q, 0), self.committed.get(q, 0)):
                outcome.problems.append(f"queue {q}: committed offset {now} was never sent")
            floor = max(self.commit_floor.get(q, 0), self.committed.get(q, 0))
            if now < floor:
                outcome.commit_regressions += 1
                if config.mode == "sync":
                    outcome.problems.append(
                        f"queue {q}: committed offset moved back from {floor} to {now}"
                    )
        self.committed = fetched
        if config.mode != "sync":  # what the group resumes from defines the new floor
            self.commit_floor = dict(fetched)

    def _check_files(self) -> None:
        found = check_store(self.broker.data_dir, [TOPIC])
        self.result.store_problems += found.problems
        self.result.final_records = found.log_records
        for q in range(self.config.queues):
            records = found.messages.get((TOPIC, q), [])
            fps = array("Q", (fingerprint(v) for _o, v in records))
            if fps != self.known[q]:
                self.result.store_problems.append(
                    f"queue {q}: the files hold other records than the broker served"
                )

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
    rows: list[list[object]] = [
        ["mode", mode],
        ["cycles run / survived", f"{len(cycles)} / {result.survived}"],
        ["messages acknowledged", result.total("acked")],
        ["lost (acknowledged, missing after restart)", result.total("lost")],
        ["duplicated", result.total("duplicated")],
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
    if work_dir is not None:
        return CrashLoop(config, work_dir, echo=echo).run()
    with tempfile.TemporaryDirectory(prefix="equeue-crash-") as tmp:
        return CrashLoop(config, Path(tmp), echo=echo).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
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
