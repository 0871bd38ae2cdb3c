"""The crash loop's checks (``hardening/crash_loop.py``) and its simulated power loss.

- ``drop_unsynced``: erase what a power loss could take from a killed broker's files.
- ``Verifier``: after each restart, read everything back through the broker and
  check it against what the cycle's workers saw acknowledged, in doubt, read
  and committed; at the end, check the files themselves with ``Store``.

Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import random
from array import array
from pathlib import Path

import grpc

from equeue_broker.storage.index.queue_index import ENTRY, ENTRY_SIZE
from equeue_broker.storage.log.chunk import HEADER_SIZE, ChunkHeader, active_size
from equeue_broker.storage.meta.atomic_file import load_json
from equeue_broker.testing_checks import PulledMessage, check_store, pull_queue
from equeue_proto.protocol import format_message_id
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client.records import decode_records
from hardening._crash_cycle import (
    GROUP,
    TOPIC,
    Ack,
    CrashLoopConfig,
    CrashLoopResult,
    CycleResult,
    WorkerLog,
    cycle_of,
    fingerprint,
    ident_of,
)

# -- machine crash ------------------------------------------------------------------------


def drop_unsynced(data_dir: Path) -> int:
    """Erase what a power loss could take after the broker's last index checkpoint:
    log bytes of the active chunk at or after the checkpoint position (sealed
    chunks were fsynced when sealed), and index entries pointing there. Returns
    the number of non-zero log bytes erased.

    Everything below ``checkpoint.json``'s position was fsynced before the
    checkpoint was saved, so this is at least as harsh as a real power loss.
    """
    # Either copy, as the broker reads it; none at all: killed before its first
    # open finished, so nothing was acknowledged and everything may go.
    document = load_json(data_dir / "checkpoint.json", repair=False) or {}
    checkpoint = int(document.get("index_position", 0))
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


# -- verification -----------------------------------------------------------------------


class Verifier:
    """What the restarts verified so far, and the checks of the next one."""

    def __init__(self, config: CrashLoopConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        self.known: dict[int, array[int]] = {q: array("Q") for q in range(config.queues)}
        """Fingerprint of every record per queue, as the last restart read them."""
        self.committed: dict[int, int] = {}
        """The group's committed offsets as the last restart fetched them."""
        self.commit_floor: dict[int, int] = {}
        """Highest acknowledged commit per queue: sync mode never goes below it."""

    def verify(
        self,
        address: str,
        number: int,
        logs: list[WorkerLog],
        kill_at: float,
        outcome: CycleResult,
    ) -> None:
        acks = [a for log in logs for a in log.acks]
        in_doubt = set().union(*(log.in_doubt for log in logs))
        outcome.acked = len(acks)
        outcome.in_doubt = len(in_doubt)
        outcome.consumed = sum(len(log.seen) for log in logs)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            admin = pb_grpc.AdminStub(channel)
            ends: dict[int, int] = {}
            fresh: dict[int, array[int]] = {}
            for q in range(self.config.queues):
                ends[q], fps = self._read_queue(
                    stub, q, number=number, acks=acks, in_doubt=in_doubt, outcome=outcome
                )
                if fps is not None:
                    fresh[q] = fps
            self._check_acks(acks, fresh, kill_at, outcome)
            self._check_seen(logs, fresh, outcome)
            self._sample_get_message(admin, acks, fresh, logs, outcome)
            self._check_offsets(stub, ends, logs, outcome)
            self.known.update(fresh)

    def _read_queue(
        self,
        stub: pb_grpc.BrokerStub,
        q: int,
        *,
        number: int,
        acks: list[Ack],
        in_doubt: set[int],
        outcome: CycleResult,
    ) -> tuple[int, array[int] | None]:
        """Queue ``q`` read back and checked: its end and the fingerprints of its
        records (None if its offsets are not contiguous from 0)."""
        problems = outcome.problems
        messages, first = pull_queue(stub, TOPIC, q, timeout_s=self.config.rpc_timeout_s)
        if first.earliest_offset != 0 or [m.offset for m in messages] != list(
            range(first.end_offset)
        ):
            problems.append(f"queue {q}: offsets read are not [0, {first.end_offset})")
            return first.end_offset, None
        fps = array("Q", (fingerprint(m.value) for m in messages))
        old = self.known[q]
        if len(fps) < len(old) or fps[: len(old)] != old:
            problems.append(f"queue {q}: records verified by the previous restart changed")
        self._check_idents(q, messages[len(old) :], number, in_doubt, outcome)
        self._check_new_records(q, messages[len(old) :], acks, in_doubt, outcome)
        return first.end_offset, fps

    def _check_idents(
        self,
        q: int,
        new: list[PulledMessage],
        number: int,
        in_doubt: set[int],
        outcome: CycleResult,
    ) -> None:
        """No new record appears twice, and each is a message of this cycle."""
        problems = outcome.problems
        idents: set[int] = set()
        for m in new:
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

    def _check_new_records(
        self,
        q: int,
        new: list[PulledMessage],
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

    def _check_acks(
        self, acks: list[Ack], fresh: dict[int, array[int]], kill_at: float, outcome: CycleResult
    ) -> None:
        """Every acknowledged message is at its offset with identical bytes (or, after
        a machine crash, lost only if acknowledged within the last flush window)."""
        config = self.config
        problems = outcome.problems
        window = config.flush_interval_ms / 1000 + config.loss_slack_s
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

    def _check_seen(
        self, logs: list[WorkerLog], fresh: dict[int, array[int]], outcome: CycleResult
    ) -> None:
        """What a consumer saw is still there, unchanged (machine crash: or gone)."""
        for log in logs:
            for q, offset, fp in log.seen:
                fps = fresh.get(q, array("Q"))
                if offset < len(fps) and fps[offset] != fp:
                    outcome.problems.append(f"queue {q}@{offset}: a consumer saw other content")
                elif offset >= len(fps) and not self.config.machine_crash:
                    outcome.problems.append(
                        f"queue {q}@{offset}: a consumer saw it, now it is gone"
                    )

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

    def check_files(self, data_dir: Path, result: CrashLoopResult) -> None:
        """The stopped broker's files, opened with ``Store``, hold what it served."""
        found = check_store(data_dir, [TOPIC])
        result.store_problems += found.problems
        result.final_records = found.log_records
        for q in range(self.config.queues):
            records = found.messages.get((TOPIC, q), [])
            fps = array("Q", (fingerprint(v) for _o, v in records))
            if fps != self.known[q]:
                result.store_problems.append(
                    f"queue {q}: the files hold other records than the broker served"
                )
