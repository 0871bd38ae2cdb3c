"""The crash loop's retention and transaction scenarios (``--scenario retention``,
``--scenario transaction``; the loop is ``hardening/_crash_modes.py``).

retention: producers write while retention keeps two sealed chunks, checked
every 50 ms, so kills land in chunk deletes. After the restart each queue
reads contiguous from its earliest offset, which never moves back (a deleted
chunk never returns); every acknowledged record at or after it is there with
identical bytes, records verified before are unchanged, and every other
record was in doubt, once.

transaction: producers stage 1-3 requests in a transaction, then commit it
(one in four: abort it, so kills land in aborts too).
After the restart every queue reads contiguous from 0 and unchanged below
what the last restart verified; an acknowledged commit's messages are all at
the offsets its reply named; a commit in doubt shows all of its messages or
none; a transaction never committed (aborted, or whose staging failed) shows
none.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import grpc

from equeue_broker.testing_checks import PulledMessage, pull_queue
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from hardening._crash_cycle import ID, TOPIC, CrashLoopConfig, CycleResult, fingerprint, ident_of
from hardening._crash_workers import Workers

ABORT_SHARE = 0.25
"""Transactions the transaction scenario aborts instead of committing."""


def columns_of(values: list[bytes]) -> pb.MessageColumns:
    return pb.MessageColumns(
        count=len(values), values=b"".join(values), value_lengths=[len(v) for v in values]
    )


def create_topic(config: CrashLoopConfig, address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        pb_grpc.AdminStub(channel).CreateTopic(
            pb.CreateTopicRequest(name=TOPIC, queue_count=config.queues),
            timeout=config.rpc_timeout_s,
        )


@dataclass
class Sent:
    """One producer's cycle: (queue, offset) -> (ident, fingerprint) acknowledged,
    idents in doubt, and (transactions) idents of each transaction."""

    acked: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    in_doubt: set[int] = field(default_factory=set)
    staged: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    """Transaction id -> (queue, ident, fingerprint) in staging order."""
    committed: dict[str, dict[int, int]] = field(default_factory=dict)
    """Acknowledged commits: transaction id -> queue -> first offset."""
    commit_in_doubt: set[str] = field(default_factory=set)


class ProducingScenario:
    """Producer threads that record what was acknowledged; subclasses send."""

    flags: tuple[str, ...] = ()

    def __init__(self, config: CrashLoopConfig) -> None:
        self.config = config
        self.topics = [TOPIC]
        self.sent: list[Sent] = []

    def setup(self, address: str) -> None:
        create_topic(self.config, address)

    def start_cycle(self, number: int, address: str, rng: random.Random) -> Workers:
        workers = Workers()
        self.sent = [Sent() for _ in range(self.config.producers)]
        for p, sent in enumerate(self.sent):
            seed = rng.getrandbits(32)
            workers.spawn(self._produce, workers, address, number, p, sent, seed)
        return workers

    def _produce(  # noqa: PLR0917 (a thread's arguments)
        self, workers: Workers, address: str, number: int, p: int, sent: Sent, seed: int
    ) -> None:
        rng = random.Random(seed)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            seq = 0
            while not workers.killed.is_set() and not workers.errors:
                seq = self.send(stub, workers, rng, (number, p, seq), sent)

    def send(
        self,
        stub: pb_grpc.BrokerStub,
        workers: Workers,
        rng: random.Random,
        head: tuple[int, int, int],
        sent: Sent,
    ) -> int:
        raise NotImplementedError

    def values(self, rng: random.Random, head: tuple[int, int, int], n: int) -> list[bytes]:
        number, p, seq = head
        size = self.config.max_value_bytes
        return [ID.pack(number, p, seq + i + 1) + rng.randbytes(rng.randint(0, size))
                for i in range(n)]  # fmt: skip

    def read(self, stub: pb_grpc.BrokerStub, q: int) -> tuple[list[PulledMessage], int]:
        """The queue from its earliest offset (retried if retention moves it
        while reading), and that offset."""
        for _ in range(5):
            probe = stub.Pull(
                pb.PullRequest(topic=TOPIC, queue_id=q, offset=0, max_messages=1),
                timeout=self.config.rpc_timeout_s,
            )
            try:
                messages, _ = pull_queue(
                    stub, TOPIC, q, probe.earliest_offset, timeout_s=self.config.rpc_timeout_s
                )
            except AssertionError:
                continue
            return messages, probe.earliest_offset
        raise AssertionError(f"{TOPIC}/{q}: could not read from the earliest offset")


class RetentionScenario(ProducingScenario):
    flags: tuple[str, ...] = (
        "--retention-max-chunks", "2", "--retention-max-age-hours", "-1",
        "--retention-check-interval-ms", "50",
    )  # fmt: skip

    def __init__(self, config: CrashLoopConfig) -> None:
        super().__init__(config)
        self.known: dict[int, dict[int, int]] = {q: {} for q in range(config.queues)}
        """Queue -> offset -> fingerprint, as the last restart read them."""
        self.earliest: dict[int, int] = dict.fromkeys(range(config.queues), 0)

    def send(
        self,
        stub: pb_grpc.BrokerStub,
        workers: Workers,
        rng: random.Random,
        head: tuple[int, int, int],
        sent: Sent,
    ) -> int:
        values = self.values(rng, head, rng.randint(1, self.config.max_batch))
        queue_ids = [rng.randrange(self.config.queues) for _ in values]
        request = pb.ProduceRequest(topic=TOPIC, messages=columns_of(values), queue_ids=queue_ids)
        try:
            reply = stub.Produce(request, timeout=self.config.rpc_timeout_s)
        except grpc.RpcError as exc:
            workers.failed("Produce", exc)
            sent.in_doubt.update(ident_of(v) for v in values)
        else:
            for q, offset, value in zip(reply.queue_ids, reply.offsets, values, strict=True):
                sent.acked[(q, offset)] = (ident_of(value), fingerprint(value))
        return head[2] + len(values)

    def verify(self, address: str, workers: Workers, outcome: CycleResult) -> None:
        acked = {k: v for sent in self.sent for k, v in sent.acked.items()}
        in_doubt = set().union(*(sent.in_doubt for sent in self.sent))
        outcome.acked, outcome.in_doubt = len(acked), len(in_doubt)
        seen: Counter[int] = Counter()
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            for q in range(self.config.queues):
                messages, earliest = self.read(stub, q)
                self._check_queue(q, messages, earliest, acked, in_doubt, outcome)
                seen.update(ident_of(m.value) for m in messages)
        outcome.duplicated = sum(n - 1 for n in seen.values() if n > 1)
        if outcome.duplicated:
            outcome.problems.append(f"{outcome.duplicated} messages read twice")

    def _check_queue(  # noqa: PLR0917
        self,
        q: int,
        messages: list[PulledMessage],
        earliest: int,
        acked: dict[tuple[int, int], tuple[int, int]],
        in_doubt: set[int],
        outcome: CycleResult,
    ) -> None:
        problems = outcome.problems
        if earliest < self.earliest[q]:
            problems.append(f"queue {q}: earliest offset {earliest} < {self.earliest[q]} before")
        offsets = [m.offset for m in messages]
        if offsets != list(range(earliest, earliest + len(messages))):
            problems.append(f"queue {q}: offsets read are not contiguous from {earliest}")
        read = {m.offset: m for m in messages}
        for (aq, offset), (_, fp) in acked.items():
            if (
                aq == q
                and offset >= earliest
                and (offset not in read or fingerprint(read[offset].value) != fp)
            ):
                outcome.lost += 1
                problems.append(f"queue {q}@{offset}: acknowledged, lost or changed")
        old = self.known[q]
        for offset, m in read.items():
            fp = fingerprint(m.value)
            if offset in old:
                if old[offset] != fp:
                    problems.append(f"queue {q}@{offset}: changed since the last restart")
            elif (q, offset) not in acked:
                if ident_of(m.value) not in in_doubt:
                    problems.append(f"queue {q}@{offset}: never sent or acknowledged elsewhere")
                outcome.in_doubt_applied += 1
        self.known[q] = {offset: fingerprint(m.value) for offset, m in read.items()}
        self.earliest[q] = earliest


class TransactionScenario(ProducingScenario):
    flags: tuple[str, ...] = ("--retention-max-chunks", "-1", "--retention-max-age-hours", "-1")

    def __init__(self, config: CrashLoopConfig) -> None:
        super().__init__(config)
        self.known: dict[int, list[int]] = {q: [] for q in range(config.queues)}
        """Queue -> fingerprints from offset 0, as the last restart read them."""

    def send(
        self,
        stub: pb_grpc.BrokerStub,
        workers: Workers,
        rng: random.Random,
        head: tuple[int, int, int],
        sent: Sent,
    ) -> int:
        number, p, seq = head
        txn = f"c{number}-p{p}-{seq}"
        staged = sent.staged.setdefault(txn, [])
        for _ in range(rng.randint(1, 3)):
            values = self.values(rng, (number, p, seq), rng.randint(1, 10))
            seq += len(values)
            queue_ids = [rng.randrange(self.config.queues) for _ in values]
            request = pb.ProduceRequest(
                topic=TOPIC, messages=columns_of(values), queue_ids=queue_ids, transaction_id=txn
            )
            try:
                stub.Produce(request, timeout=self.config.rpc_timeout_s)
            except grpc.RpcError as exc:
                workers.failed("Produce (staged)", exc)
                return seq  # never committed: none of it may appear
            staged += [
                (q, ident_of(v), fingerprint(v)) for q, v in zip(queue_ids, values, strict=True)
            ]
        if rng.random() < ABORT_SHARE:  # acknowledged or not, none of it may appear
            try:
                stub.AbortTransactions(
                    pb.AbortTransactionsRequest(transaction_ids=[txn]),
                    timeout=self.config.rpc_timeout_s,
                )
            except grpc.RpcError as exc:
                workers.failed("AbortTransactions", exc)
            return seq
        commit = pb.CommitTransactionsRequest(
            transactions=[pb.TransactionRef(transaction_id=txn, expected_messages=len(staged))]
        )
        try:
            reply = stub.CommitTransactions(commit, timeout=self.config.rpc_timeout_s)
        except grpc.RpcError as exc:
            workers.failed("CommitTransactions", exc)
            sent.commit_in_doubt.add(txn)
            return seq
        sent.committed[txn] = {c.queue_id: c.first_offset for c in reply.queues}
        return seq

    def verify(self, address: str, workers: Workers, outcome: CycleResult) -> None:
        txn_of = {
            ident: txn for s in self.sent for txn, st in s.staged.items() for _, ident, _ in st
        }
        read: dict[int, list[PulledMessage]] = {}
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            for q in range(self.config.queues):
                messages, first = pull_queue(stub, TOPIC, q, timeout_s=self.config.rpc_timeout_s)
                if [m.offset for m in messages] != list(range(first.end_offset)):
                    outcome.problems.append(f"queue {q}: offsets not [0, {first.end_offset})")
                fps = [fingerprint(m.value) for m in messages]
                if fps[: len(self.known[q])] != self.known[q]:
                    outcome.problems.append(f"queue {q}: records verified before changed")
                read[q] = messages[len(self.known[q]) :]
                self.known[q] = fps
        found: Counter[str] = Counter()
        for q, messages in read.items():
            for m in messages:
                txn = txn_of.get(ident_of(m.value))
                if txn is None:
                    outcome.problems.append(f"queue {q}@{m.offset}: not a message of this cycle")
                found[txn or "?"] += 1
        for sent in self.sent:
            self._check_transactions(sent, read, found, outcome)

    def _check_transactions(
        self,
        sent: Sent,
        read: dict[int, list[PulledMessage]],
        found: Counter[str],
        outcome: CycleResult,
    ) -> None:
        at = {(q, m.offset): fingerprint(m.value) for q, ms in read.items() for m in ms}
        for txn, staged in sent.staged.items():
            count = found.get(txn, 0)
            if txn in sent.committed:
                outcome.acked += len(staged)
                next_offset = dict(sent.committed[txn])
                for q, _, fp in staged:
                    if at.get((q, next_offset[q])) != fp:
                        outcome.lost += 1
                        outcome.problems.append(f"{txn}: acknowledged, not at {q}@{next_offset[q]}")
                    next_offset[q] += 1
                if count > len(staged):
                    outcome.duplicated += count - len(staged)
            elif txn in sent.commit_in_doubt:
                outcome.in_doubt += len(staged)
                outcome.in_doubt_applied += count
                if count not in (0, len(staged)):
                    outcome.problems.append(f"{txn}: {count} of {len(staged)} messages visible")
            elif count:
                outcome.problems.append(f"{txn}: never committed, {count} messages visible")
        if outcome.duplicated:
            outcome.problems.append(f"{outcome.duplicated} messages of transactions read twice")
