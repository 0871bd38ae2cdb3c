"""One cycle of the crash loop (``hardening/crash_loop.py``): its settings, workers and results.

``Cycle`` runs the producer and consumer threads of one cycle on raw gRPC
stubs, without retries, so that "acknowledged" is exact; each keeps a
``WorkerLog`` of what was acknowledged, what is in doubt (the request failed
at the kill) and what it read and committed. Every value starts with a unique
id (cycle, producer, sequence). Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import random
import struct
import threading
import time
from dataclasses import dataclass, field

import grpc
from crc32c import crc32c

from equeue_broker.testing_checks import details_of, status_of
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client.records import decode_records

TOPIC = "crash"
GROUP = "crash-group"
ID = struct.Struct(">IHI")
"""cycle u32, producer u16, sequence u32: the head of every value."""
KiB = 1024
SCENARIOS = ("traffic", "delete-topic", "retention", "transaction")


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
    scenario: str = "traffic"
    """traffic (producers and consumers), or a scenario of hardening/_crash_modes.py."""

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"scenario must be one of {SCENARIOS}, got {self.scenario!r}")
        if self.scenario != "traffic" and self.machine_crash:
            raise ValueError("--machine-crash is for the traffic scenario")
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
    reappeared: int = 0
    killed_after_ack: int = 0
    """1 if a worker asked for the kill right after an acknowledged call."""
    """Records or group offsets of a deleted topic found again (delete-topic scenario)."""
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
