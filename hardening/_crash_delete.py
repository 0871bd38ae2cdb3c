"""The crash loop's delete-topic scenario (``--scenario delete-topic``).

One worker goes round and round: create topic ``doomed`` (two queues),
produce to it, commit a group's offsets on it, delete it; each life of the
topic is a *generation*, written into every value. Right after
an acknowledged ``DeleteTopic`` or ``CreateTopic`` (odd cycles), it asks for
the kill at once; otherwise the kill lands at a random moment, maybe on a
call in flight (in doubt: applied or not).

After the restart, through the broker: the topic exists if and only if the
last acknowledged call left it so (or the call in doubt may have); no record
of a deleted generation is readable; every acknowledged record of the live
generation is at its offset; the group's offsets on the topic are ones
committed in the live generation (a recreated topic starts with none).
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import grpc

from equeue_broker.testing_checks import pull_queue, status_of
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from hardening._crash_cycle import GROUP, CrashLoopConfig, CycleResult, fingerprint
from hardening._crash_workers import Workers

DOOMED = "doomed"
QUEUES = 2
HEAD = struct.Struct(">QI")
"""generation u64, sequence u32: the head of every value."""


@dataclass
class Life:
    """What is acknowledged of the topic, and the call in doubt at the kill."""

    exists: bool = False
    generation: int = 0
    acked: dict[tuple[int, int], int] = field(default_factory=dict)
    """(queue, offset) -> fingerprint of the live generation's acknowledged records."""
    commits: dict[int, set[int]] = field(default_factory=dict)
    """queue -> offsets committed (or sent) in the live generation."""
    dead: set[int] = field(default_factory=set)
    """Generations deleted with an acknowledged (or applied) DeleteTopic."""
    doubt: str = ""
    """The call that failed at the kill: create, produce, commit, delete, or ""."""
    doubt_generation: int = 0
    produced: int = 0
    acked_in_cycle: int = 0
    kill_after: int = 0
    """Kill right after this many acknowledged deletes and creates (0: at random)."""


class DeleteTopicScenario:
    flags: tuple[str, ...] = ("--retention-max-chunks", "-1", "--retention-max-age-hours", "-1")

    def __init__(self, config: CrashLoopConfig) -> None:
        self.config = config
        self.topics: list[str] = []
        """No topic for the final Store check: the log holds deleted generations' records
        under the topic's name, which that check would take for unindexed ones."""
        self.life = Life()
        self.next_generation = 1

    def setup(self, address: str) -> None:
        pass

    def start_cycle(self, number: int, address: str, rng: random.Random) -> Workers:
        workers = Workers()
        life = self.life
        life.doubt, life.produced, life.acked_in_cycle = "", 0, 0
        # Odd cycles are killed right after an acknowledged delete or create (the
        # 1st to 6th of the cycle), even ones at a random moment.
        life.kill_after = rng.randint(1, 6) if number % 2 else 0
        if life.kill_after:
            workers.wait_for_kill_s = self.config.rpc_timeout_s
        workers.spawn(self._work, workers, address, random.Random(rng.getrandbits(32)))
        return workers

    # the worker ---------------------------------------------------------------------

    def _work(self, workers: Workers, address: str, rng: random.Random) -> None:
        life = self.life
        with grpc.insecure_channel(address) as channel:
            stub, admin = pb_grpc.BrokerStub(channel), pb_grpc.AdminStub(channel)
            while not workers.killed.is_set() and not workers.errors:
                if not life.exists and not self._create(admin, workers):
                    return
                for _ in range(rng.randint(1, 3)):
                    if not self._produce(stub, workers, rng):
                        return
                if not self._commit(stub, workers, rng) or not self._delete(admin, workers):
                    return

    def _call(self, workers: Workers, what: str, call: grpc.UnaryUnaryMultiCallable[Any, Any],
              request: object) -> object | None:  # fmt: skip
        try:
            return cast(object, call(request, timeout=self.config.rpc_timeout_s))
        except grpc.RpcError as exc:
            workers.failed(what, exc)
            self.life.doubt = what
            return None

    def _ack_then_maybe_kill(self, workers: Workers) -> bool:
        """True to go on; False after asking for the kill right after this ack."""
        life = self.life
        life.kill_after -= 1
        if life.kill_after == 0:
            workers.kill_now.set()
            return False
        return True

    def _create(self, admin: pb_grpc.AdminStub, workers: Workers) -> bool:
        life = self.life
        life.doubt_generation = self.next_generation
        self.next_generation += 1
        request = pb.CreateTopicRequest(name=DOOMED, queue_count=QUEUES)
        if self._call(workers, "create", admin.CreateTopic, request) is None:
            return False
        life.exists, life.generation = True, life.doubt_generation
        life.acked, life.commits = {}, {}
        return self._ack_then_maybe_kill(workers)

    def _produce(self, stub: pb_grpc.BrokerStub, workers: Workers, rng: random.Random) -> bool:
        life = self.life
        values = []
        for _ in range(rng.randint(1, 20)):
            life.produced += 1
            head = HEAD.pack(life.generation, life.produced)
            values.append(head + rng.randbytes(rng.randint(0, 200)))
        columns = pb.MessageColumns(
            count=len(values), values=b"".join(values), value_lengths=[len(v) for v in values]
        )
        queue_ids = [rng.randrange(QUEUES) for _ in values]
        request = pb.ProduceRequest(topic=DOOMED, messages=columns, queue_ids=queue_ids)
        reply = self._call(workers, "produce", stub.Produce, request)
        if not isinstance(reply, pb.ProduceReply):
            return False
        for q, offset, value in zip(reply.queue_ids, reply.offsets, values, strict=True):
            life.acked[(q, offset)] = fingerprint(value)
        life.acked_in_cycle += len(values)
        return True

    def _commit(self, stub: pb_grpc.BrokerStub, workers: Workers, rng: random.Random) -> bool:
        life = self.life
        request = pb.CommitOffsetsRequest(group=GROUP)
        for q in range(QUEUES):
            end = 1 + max((o for queue, o in life.acked if queue == q), default=-1)
            offset = rng.randint(min(1, end), end)
            request.offsets.add(topic=DOOMED, queue_id=q, offset=offset)
            life.commits.setdefault(q, set()).add(offset)
        return self._call(workers, "commit", stub.CommitOffsets, request) is not None

    def _delete(self, admin: pb_grpc.AdminStub, workers: Workers) -> bool:
        life = self.life
        request = pb.DeleteTopicRequest(name=DOOMED)
        if self._call(workers, "delete", admin.DeleteTopic, request) is not None:
            life.dead.add(life.generation)
            life.exists, life.acked, life.commits = False, {}, {}
            return self._ack_then_maybe_kill(workers)
        return False

    # the checks ---------------------------------------------------------------------

    def verify(self, address: str, workers: Workers, outcome: CycleResult) -> None:
        life = self.life
        outcome.acked = life.acked_in_cycle
        outcome.in_doubt = int(life.doubt == "produce")
        with grpc.insecure_channel(address) as channel:
            stub, admin = pb_grpc.BrokerStub(channel), pb_grpc.AdminStub(channel)
            present = self._present(admin)
            if present and not life.exists and life.doubt != "create":
                outcome.problems.append(f"deleted topic {DOOMED} exists after the restart")
            if not present and life.exists and life.doubt != "delete":
                outcome.problems.append(f"acknowledged topic {DOOMED} is gone after the restart")
            if present and not life.exists:  # the create in doubt was applied
                life.exists, life.generation = True, life.doubt_generation
                life.acked, life.commits = {}, {}
            if not present and life.exists:  # the delete in doubt was applied
                life.dead.add(life.generation)
                life.exists, life.acked, life.commits = False, {}, {}
            if present:
                self._check_records(stub, outcome)
            self._check_offsets(stub, present, outcome)

    def _present(self, admin: pb_grpc.AdminStub) -> bool:
        try:
            admin.DescribeTopic(
                pb.DescribeTopicRequest(name=DOOMED), timeout=self.config.rpc_timeout_s
            )
        except grpc.RpcError as exc:
            if status_of(exc) is grpc.StatusCode.NOT_FOUND:
                return False
            raise
        return True

    def _check_records(self, stub: pb_grpc.BrokerStub, outcome: CycleResult) -> None:
        life = self.life
        read: dict[tuple[int, int], int] = {}
        for q in range(QUEUES):
            messages, first = pull_queue(stub, DOOMED, q, timeout_s=self.config.rpc_timeout_s)
            if [m.offset for m in messages] != list(range(first.end_offset)):
                outcome.problems.append(f"{DOOMED}/{q}: offsets not [0, {first.end_offset})")
            for m in messages:
                generation = HEAD.unpack_from(m.value)[0] if len(m.value) >= HEAD.size else -1
                if generation in life.dead:
                    outcome.reappeared += 1
                elif generation != life.generation:
                    outcome.problems.append(f"{DOOMED}/{q}@{m.offset}: generation {generation}?")
                elif (q, m.offset) not in life.acked:
                    if life.doubt != "produce":
                        outcome.problems.append(f"{DOOMED}/{q}@{m.offset}: never acknowledged")
                    outcome.in_doubt_applied += 1
                read[(q, m.offset)] = fingerprint(m.value)
        for key, fp in life.acked.items():
            if read.get(key) != fp:
                outcome.lost += 1
        if outcome.reappeared:
            outcome.problems.append(f"{outcome.reappeared} records of a deleted {DOOMED} read")
        if outcome.lost:
            outcome.problems.append(f"{outcome.lost} acknowledged records missing or changed")
        life.acked = read

    def _check_offsets(self, stub: pb_grpc.BrokerStub, present: bool, out: CycleResult) -> None:
        life = self.life
        request = pb.FetchOffsetsRequest(group=GROUP, topic=DOOMED)
        fetched: Sequence[pb.QueueOffset]
        try:
            fetched = stub.FetchOffsets(request, timeout=self.config.rpc_timeout_s).offsets
        except grpc.RpcError as exc:
            if status_of(exc) is not grpc.StatusCode.NOT_FOUND:
                raise
            fetched = []
        for offset in fetched:
            if offset.topic != DOOMED:
                continue
            if not present or offset.offset not in life.commits.get(offset.queue_id, set()):
                out.reappeared += 1
                out.problems.append(
                    f"group offset {offset.offset} of {DOOMED}/{offset.queue_id} was not "
                    "committed in the topic's live generation (a deleted one's?)"
                )
