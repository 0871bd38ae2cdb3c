"""The workers and the accounting of the cluster crash loop (``hardening/crash_loop_cluster.py``).

Workers run for the whole loop, across every kill, on raw gRPC stubs without
retries, so that "acknowledged" is exact:

- a **producer** sends unary ``Produce`` batches (1-32 values, one random
  queue per batch) to the member that ``GetStats`` says is master. Every value
  starts with a unique id (``hardening._crash_cycle.ID``: the kill number at the
  time of sending, the producer, a sequence) that is never sent twice: a
  failed request's ids are "in doubt" (maybe applied) and the next request
  carries new ones. After a failure it looks for the master again (each member's
  ``GetStats``, its own channels) and goes on.
- a **client producer** (``--client-producers``) sends keyed batches (1-32
  values, keys over every queue) with ``equeue_spark.client.Producer`` through
  the group's name server, idempotent unless ``--no-idempotence``: its
  retries across a failover resend a batch with the same ids, producer id,
  epoch and sequences, so an acknowledged id present twice is a batch
  appended twice (what idempotent produce prevents). A batch that fails for
  good is in doubt, and the next carries new ids.
- a **consumer** pulls every queue from the master in turn, checking that
  offsets are contiguous, and notes (queue, offset, fingerprint) of what it
  read, resuming after a failover where it was.

``account`` then reads every queue of the final master from offset 0 and
checks each acknowledged id present exactly once (an acknowledged id held
more than once counts in ``duplicated``, an in-doubt one in
``duplicated_in_doubt``; either fails the run) at its acknowledged queue
and offset with identical bytes (0 lost, 0 duplicated, 0 moved), every
record read by the consumer still there (a failover never took back what a
consumer saw), every record of the log one that was sent (acknowledged or
in doubt), and every member's copy identical to the master's.

Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import bisect
import contextlib
import random
import threading
import time
from dataclasses import dataclass, field

import grpc

from equeue_broker.testing_checks import details_of, pull_queue, status_of
from equeue_broker.testing_group import CHANNEL_OPTIONS, Group, Member
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client import ClientConfig, EqueueError, Producer
from equeue_spark.client.records import decode_records
from hardening._crash_cycle import ID, fingerprint, ident_of

TOPIC = "crash-cluster"


@dataclass
class Sent:
    queue_id: int
    offset: int
    fingerprint: int
    at: float


@dataclass
class WorkerLog:
    acked: dict[int, Sent] = field(default_factory=dict)
    """Acknowledged ids: where the broker said it put them."""
    in_doubt: dict[int, int] = field(default_factory=dict)
    """Ids of failed requests (maybe applied) -> fingerprint."""
    seen: list[tuple[int, int, int]] = field(default_factory=list)
    """Consumer: (queue, offset, fingerprint) of every record read."""
    failures: dict[str, int] = field(default_factory=dict)
    """Failed calls by status (expected around a kill)."""
    errors: list[str] = field(default_factory=list)
    """What must not happen (a reply that does not match the request, a gap)."""


class Locator:
    """A worker's own channels to the group's members, and its idea of the master."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self.channels: dict[str, grpc.Channel] = {}
        self.master = ""

    def channel(self, address: str) -> grpc.Channel:
        if address not in self.channels:
            self.channels[address] = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        return self.channels[address]

    def find_master(self) -> str:
        """The address of the live member that says master with the newest epoch ("")."""
        best: tuple[int, str] | None = None
        for member in list(self.group.members):
            address = member.address
            if not member.alive() or not address:
                continue
            with contextlib.suppress(grpc.RpcError):
                stats = pb_grpc.AdminStub(self.channel(address)).GetStats(
                    pb.GetStatsRequest(), timeout=1.0
                )
                if stats.role == "master" and (best is None or stats.epoch > best[0]):
                    best = (stats.epoch, address)
        self.master = "" if best is None else best[1]
        return self.master

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self.channels.clear()


@dataclass
class LoadConfig:
    producers: int = 2
    consumers: int = 1
    queues: int = 4
    max_batch: int = 32
    max_value_bytes: int = 200
    rpc_timeout_s: float = 5.0
    seed: int = 1
    rate: float = 3000.0
    """Messages per second over all producers (0: as fast as they can). Unbounded
    producers saturate a 2-core machine, and a restarted broker then never
    catches up: not what the loop is about."""
    client_producers: int = 1
    """Producers on the client library through the name server (the group needs one)."""
    idempotence: bool = True
    """The client producers' ``enable_idempotence``."""
    client_failover_timeout_s: float = 30.0


CLIENT_PRODUCER_BASE = 100
"""The producer number (in each id) of client producer 0."""


class Load:
    """Producers and consumers running until ``stop``."""

    def __init__(self, group: Group, config: LoadConfig) -> None:
        self.group = group
        self.config = config
        self.stopping = threading.Event()
        self.kill_number = 0
        """Stamped into each id: the kill count when it was sent."""
        self.producer_logs = [WorkerLog() for _ in range(config.producers)]
        self.client_logs = [WorkerLog() for _ in range(config.client_producers)]
        self.consumer_logs = [WorkerLog() for _ in range(config.consumers)]
        self.threads: list[threading.Thread] = []
        self._ack_lock = threading.Lock()
        self._ack_times: list[float] = []
        """When each acknowledgement arrived (sorted: appended under the lock)."""

    def start(self) -> None:
        for p, log in enumerate(self.producer_logs):
            self._spawn(self._produce, log, p)
        if self.client_logs and self.group.namesrv is None:
            raise RuntimeError("client producers route through the group's name server")
        for p, log in enumerate(self.client_logs):
            self._spawn(self._client_produce, log, CLIENT_PRODUCER_BASE + p)
        for c, log in enumerate(self.consumer_logs):
            queues = [q for q in range(self.config.queues) if q % self.config.consumers == c]
            self._spawn(self._consume, log, queues)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self.threads.append(thread)
        thread.start()

    def stop(self, timeout_s: float = 60.0) -> list[str]:
        """Stop the workers; the names of any still running after ``timeout_s``."""
        self.stopping.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def first_ack_after(self, at: float) -> float | None:
        """Seconds from ``at`` to the first acknowledgement received after it."""
        with self._ack_lock:
            i = bisect.bisect_right(self._ack_times, at)
            return self._ack_times[i] - at if i < len(self._ack_times) else None

    def _acked_now(self) -> float:
        with self._ack_lock:
            now = time.monotonic()
            self._ack_times.append(now)
            return now

    @staticmethod
    def _fail(log: WorkerLog, exc: grpc.RpcError) -> None:
        name = status_of(exc).name
        log.failures[name] = log.failures.get(name, 0) + 1

    # producers ------------------------------------------------------------------

    def _produce(self, log: WorkerLog, producer: int) -> None:
        config = self.config
        rng = random.Random(config.seed * 1000 + producer)
        locator = Locator(self.group)
        seq = 0
        every = config.producers + config.client_producers
        per_second = config.rate / every if config.rate > 0 else 0.0
        due = time.monotonic()
        try:
            while not self.stopping.is_set():
                if per_second:
                    self.stopping.wait(max(0.0, due - time.monotonic()))  # pacing, bounded
                address = locator.master or locator.find_master()
                if not address:
                    time.sleep(0.05)
                    continue
                values = []
                for _ in range(rng.randint(1, config.max_batch)):
                    seq += 1
                    head = ID.pack(self.kill_number, producer, seq)
                    values.append(head + rng.randbytes(rng.randint(0, config.max_value_bytes)))
                queue = rng.randrange(config.queues)
                if per_second:
                    due = max(due, time.monotonic() - 1.0) + len(values) / per_second
                request = pb.ProduceRequest(
                    topic=TOPIC,
                    messages=pb.MessageColumns(count=len(values), values=b"".join(values),
                                               value_lengths=[len(v) for v in values]),
                    queue_ids=[queue] * len(values),
                )  # fmt: skip
                try:
                    reply = pb_grpc.BrokerStub(locator.channel(address)).Produce(
                        request, timeout=config.rpc_timeout_s
                    )
                except grpc.RpcError as exc:
                    for v in values:
                        log.in_doubt[ident_of(v)] = fingerprint(v)
                    self._fail(log, exc)
                    locator.master = ""
                    time.sleep(0.02)
                    continue
                now = self._acked_now()
                if list(reply.queue_ids) != [queue] * len(values) or len(reply.offsets) != len(
                    values
                ):
                    log.errors.append(f"Produce reply does not match its request: {reply}")
                    continue
                for v, offset in zip(values, reply.offsets, strict=True):
                    log.acked[ident_of(v)] = Sent(queue, offset, fingerprint(v), now)
        finally:
            locator.close()

    def _client_produce(self, log: WorkerLog, producer: int) -> None:
        config = self.config
        assert self.group.namesrv is not None
        rng = random.Random(config.seed * 1000 + producer)
        keys = [b"key-%d" % k for k in range(64)]
        every = config.producers + config.client_producers
        per_second = config.rate / every if config.rate > 0 else 0.0
        client = ClientConfig(
            namesrv=self.group.namesrv.address, timeout_s=config.rpc_timeout_s,
            failover_timeout_s=config.client_failover_timeout_s,
        )  # fmt: skip
        seq = 0
        due = time.monotonic()
        with Producer(config=client, enable_idempotence=config.idempotence) as sender:
            while not self.stopping.is_set():
                if per_second:
                    self.stopping.wait(max(0.0, due - time.monotonic()))  # pacing, bounded
                values = []
                for _ in range(rng.randint(1, config.max_batch)):
                    seq += 1
                    head = ID.pack(self.kill_number, producer, seq)
                    values.append(head + rng.randbytes(rng.randint(0, config.max_value_bytes)))
                if per_second:
                    due = max(due, time.monotonic() - 1.0) + len(values) / per_second
                batch_keys: list[bytes | None] = [rng.choice(keys) for _ in values]
                try:
                    results = sender.send_batch(TOPIC, values, keys=batch_keys)
                except EqueueError as exc:
                    for v in values:
                        log.in_doubt[ident_of(v)] = fingerprint(v)
                    name = f"{type(exc).__name__}: {str(exc)[:160]}"
                    log.failures[name] = log.failures.get(name, 0) + 1
                    continue
                now = self._acked_now()
                if len(results) != len(values) or len(results.offsets) != len(values):
                    log.errors.append(f"send_batch acknowledged {len(results)} of {len(values)}")
                    continue
                for i, v in enumerate(values):
                    sent = Sent(results.queue_ids[i], results.offsets[i], fingerprint(v), now)
                    log.acked[ident_of(v)] = sent

    # consumers ------------------------------------------------------------------

    def _consume(self, log: WorkerLog, queues: list[int]) -> None:
        locator = Locator(self.group)
        positions = dict.fromkeys(queues, 0)
        try:
            while not self.stopping.is_set():
                address = locator.master or locator.find_master()
                if not address:
                    time.sleep(0.05)
                    continue
                stub = pb_grpc.BrokerStub(locator.channel(address))
                for q in queues:
                    request = pb.PullRequest(topic=TOPIC, queue_id=q, offset=positions[q],
                                             max_messages=500, max_wait_ms=100)  # fmt: skip
                    try:
                        reply = stub.Pull(request, timeout=self.config.rpc_timeout_s)
                    except grpc.RpcError as exc:
                        self._fail(log, exc)
                        locator.master = ""
                        break
                    if reply.status != pb.PULL_STATUS_OK:
                        log.errors.append(
                            f"Pull {q}@{positions[q]} from {address}: "
                            f"status {reply.status}, next {reply.next_offset}"
                        )
                        positions[q] = reply.next_offset
                        continue
                    for i, m in enumerate(decode_records(reply.records, reply.broker_id)):
                        if m.offset != positions[q] + i or m.queue_id != q:
                            log.errors.append(f"Pull {q}@{positions[q]}: record {i} is "
                                              f"{m.queue_id}@{m.offset}")  # fmt: skip
                        log.seen.append((q, m.offset, fingerprint(m.value)))
                    positions[q] = reply.next_offset
        finally:
            locator.close()


# -- accounting -------------------------------------------------------------------------


@dataclass
class Accounting:
    acked: int = 0
    in_doubt: int = 0
    in_doubt_present: int = 0
    """Unacknowledged but present: requests that failed at a kill yet were applied."""
    lost: int = 0
    duplicated: int = 0
    """Extra copies of acknowledged ids (an acknowledged batch appended twice)."""
    duplicated_in_doubt: int = 0
    """Extra copies of in-doubt ids (a failed batch appended twice)."""
    client_acked: int = 0
    """Of ``acked``: the client producers' (whose retries resend the same ids)."""
    client_in_doubt: int = 0
    client_failures: dict[str, int] = field(default_factory=dict)
    """The client producers' failed batches by error."""
    moved: int = 0
    """Acknowledged at one offset, found at another (or with other bytes)."""
    unknown: int = 0
    """Records whose id was never sent."""
    consumed: int = 0
    consumed_missing: int = 0
    """Records a consumer read that are not in the final log at that offset."""
    records: int = 0
    replicas_differ: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_log(address: str, queues: int) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of every queue of the topic: queue -> [(offset, value)]."""
    out: dict[int, list[tuple[int, bytes]]] = {}
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.BrokerStub(channel)
        for q in range(queues):
            messages, _first = pull_queue(stub, TOPIC, q)
            out[q] = [(m.offset, m.value) for m in messages]
    return out


def account(load: Load, master: Member, others: list[Member], queues: int) -> Accounting:
    result = Accounting()
    log = read_log(master.address, queues)
    acked: dict[int, Sent] = {}
    in_doubt: dict[int, int] = {}
    for w in [*load.producer_logs, *load.client_logs]:
        acked.update(w.acked)
        in_doubt.update(w.in_doubt)
        result.problems += w.errors
    result.client_acked = sum(len(w.acked) for w in load.client_logs)
    result.client_in_doubt = sum(len(w.in_doubt) for w in load.client_logs)
    for w in load.client_logs:
        for name, count in w.failures.items():
            result.client_failures[name] = result.client_failures.get(name, 0) + count
    result.acked, result.in_doubt = len(acked), len(in_doubt)
    found: dict[int, list[tuple[int, int, int]]] = {}
    at: dict[tuple[int, int], int] = {}
    for q, records in log.items():
        if [o for o, _v in records] != list(range(len(records))):
            result.problems.append(f"queue {q}: offsets are not contiguous from 0")
        for offset, value in records:
            result.records += 1
            fp = fingerprint(value)
            at[(q, offset)] = fp
            if len(value) < ID.size:
                result.unknown += 1
                continue
            found.setdefault(ident_of(value), []).append((q, offset, fp))
    for ident, sent in acked.items():
        places = found.get(ident, [])
        if not places:
            result.lost += 1
        elif (sent.queue_id, sent.offset, sent.fingerprint) not in places:
            result.moved += 1
    for ident, places in found.items():
        if len(places) > 1 and ident in acked:
            result.duplicated += len(places) - 1
        elif len(places) > 1:
            result.duplicated_in_doubt += len(places) - 1
        if ident in in_doubt:
            result.in_doubt_present += 1
        elif ident not in acked:
            result.unknown += 1
    for w in load.consumer_logs:
        result.problems += w.errors
        for q, offset, fp in w.seen:
            result.consumed += 1
            if at.get((q, offset)) != fp:
                result.consumed_missing += 1
    for member in others:
        if not member.alive():
            continue
        try:
            copy = read_log(member.address, queues)
        except (grpc.RpcError, AssertionError) as exc:
            detail = details_of(exc) if isinstance(exc, grpc.RpcError) else str(exc)
            result.replicas_differ.append(f"{member.name}: cannot read: {detail}")
            continue
        if copy != log:
            result.replicas_differ.append(f"{member.name}: its copy differs from the master's")
    counts = (("lost", result.lost),
              ("acknowledged appended more than once (extra copies)", result.duplicated),
              ("in doubt appended more than once (extra copies)", result.duplicated_in_doubt),
              ("moved", result.moved), ("unknown", result.unknown),
              ("read by a consumer, then gone", result.consumed_missing))  # fmt: skip
    for what, count in counts:
        if count:
            result.problems.append(f"{count} {what}")
    result.problems += result.replicas_differ
    return result


__all__ = ["TOPIC", "Accounting", "Load", "LoadConfig", "Locator", "account", "status_of"]
