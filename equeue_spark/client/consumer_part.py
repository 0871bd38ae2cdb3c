"""``ConsumerPart``: what ``Consumer`` reads one broker group's member with.

Pulls with long polling, alone (``assign``) or as a member of a consumer
group on that broker. A heartbeat thread tells the broker the member is
alive (every ``heartbeat_interval_s``). The broker owns the assignment: it
allocates queues (``equeue_proto.protocol.allocate_average``) and hands each
queue to one member at a time as a lock (see "Queue ownership" in
broker.proto). Each heartbeat reply says which queues this member holds (it
starts them at the group's committed offsets, or ``start``) and which it
must give up (it stops pulling them, commits their positions, then releases
them, so their new owner starts where it stopped). Pulls and commits carry
the membership; the broker refuses them on a queue the member no longer
holds, which it takes as a rebalance: it drops the queue.

``poll`` returns messages and advances the positions (only past records it
decoded and returns); ``commit`` hands the positions to ``committer``, which
stores them on the group's master. consumer.py describes the whole.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

import grpc

from equeue_proto.retry_topics import RETRY_PREFIX
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.connection import Connection
from equeue_spark.client.errors import (
    DataLossError,
    EqueueError,
    InvalidRequest,
    NotMasterError,
    PreconditionError,
    from_rpc_error,
)
from equeue_spark.client.filters import require_filters
from equeue_spark.client.records import Message, decode_intact, decode_records
from equeue_spark.client.wire import PullReply

log = logging.getLogger("equeue_spark.client.consumer")

Start = Literal["earliest", "latest", "group"]
OnDataLoss = Literal["raise", "skip"]
_DAMAGED = re.compile(r"damaged record: .*/\d+ offset (\d+)")
"""How the broker names a stored record that fails its checksum (DATA_LOSS)."""
QueueKey = tuple[str, int]
Member = tuple[str, int] | None
"""A group member's (consumer id, session); None: a commit from outside the group."""
Committer = Callable[[str, dict[QueueKey, int], Member], None]
"""Commits (group, offsets, member identity) on the broker group's master."""


class ConsumerPart:
    """The reader of one member of one broker group (private to ``Consumer``).

    It pulls the queues it is given (``assign``) or, with a group, the queues
    the member's broker hands it (heartbeats), and commits through
    ``committer`` (``Consumer`` sends commits to the group's master). It uses
    a connection it does not own: ``close`` leaves the group, and the
    connection stays the routes'.
    """

    def __init__(
        self,
        conn: Connection,
        *,
        committer: Committer,
        group: str | None,
        topics: Sequence[str],
        start: Start,
        max_messages: int,
        max_bytes: int,
        max_wait_ms: int,
        tags: Sequence[str],
        heartbeat_interval_s: float,
        filter: str = "",
        consumer_id: str,
        on_data_loss: OnDataLoss,
    ) -> None:
        self.on_data_loss = on_data_loss
        self.damaged_skipped: dict[QueueKey, list[int]] = {}
        """Offsets of damaged records skipped (``on_data_loss="skip"``), per queue."""
        self._deferred: EqueueError | None = None
        """A poll's error held back to return the messages it had taken first."""
        # The pulls a poll left unfinished, kept for the next one: {queue:
        # (offset, session, call)}. Cancelling them whenever another queue
        # answers first would throw away replies the broker often sent already
        # (records served, then pulled and served again by the next poll), and
        # a filtered pull's progress (records it scanned past). At most one per
        # queue, each bounded by max_messages/max_bytes; a parked one ends by
        # its max_wait, so a consumer that stops polling holds nothing long.
        # Cancelled when the queue is sought, given up or re-joined (its offset
        # or session no longer match, see ``_pulls``) and on close.
        self._inflight: dict[QueueKey, tuple[int, int, grpc.Future[PullReply]]] = {}
        self.consumer_id = consumer_id
        self._conn = conn
        self.address = conn.config.target
        """The member read from."""
        self.group = group
        self.topics = list(topics)
        self.start = start
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.max_wait_ms = max_wait_ms
        self.tags = list(tags)
        self.filter = filter
        """A filter expression (selector.py), checked already; "" = none."""
        self._filters_checked = not filter
        """True once the broker is known to apply ``filter`` (filters.py)."""
        self._lock = threading.Lock()
        self._positions: dict[QueueKey, int] = {}
        self._committed: dict[QueueKey, int] = {}
        self._members: list[str] = []
        self._session = 0
        """The broker's id for our membership (HeartbeatReply.session); 0: not a member."""
        self._commit_lock = threading.Lock()
        """Commits one at a time: a late commit must not undo a rebalance's commit."""
        self._closed = threading.Event()
        self.failed_polls = 0
        """Polls in a row whose every pull failed retriably (UNAVAILABLE, deadline)."""
        self.failed_heartbeats = 0
        """Heartbeats in a row that failed retriably."""
        self.committer = committer
        """Where commits go: the broker group's master."""
        self._heartbeats: threading.Thread | None = None
        if self.topics:
            self._heartbeat()  # join before the first poll
            self._heartbeats = threading.Thread(
                target=self._heartbeat_loop,
                args=(heartbeat_interval_s,),
                name="equeue-heartbeat",
                daemon=True,
            )
            self._heartbeats.start()

    # -- what to read ---------------------------------------------------------------

    def assign(self, topic: str, queue_ids: Iterable[int]) -> None:
        """Read exactly these queues (adds to the current assignment)."""
        with self._lock:
            for queue_id in queue_ids:
                key = (topic, queue_id)
                if key not in self._positions:
                    self._positions[key] = self._start_offset(key)

    def assignment(self) -> list[QueueKey]:
        with self._lock:
            return sorted(self._positions)

    def members(self) -> list[str]:
        """The group's live consumers, as of the last heartbeat."""
        with self._lock:
            return list(self._members)

    def seek(self, topic: str, queue_id: int, offset: int) -> None:
        """Continue the queue at ``offset``."""
        with self._lock:
            if (topic, queue_id) not in self._positions:
                raise InvalidRequest(f"{topic}/{queue_id} is not assigned to this consumer")
            self._positions[(topic, queue_id)] = offset

    def position(self, topic: str, queue_id: int) -> int:
        with self._lock:
            return self._positions[(topic, queue_id)]

    def _start_offset(self, key: QueueKey) -> int:
        topic, queue_id = key
        if self.group is not None:  # the group's progress comes first, as in Kafka
            reply = self._conn.call(
                self._conn.broker.FetchOffsets,
                pb.FetchOffsetsRequest(group=self.group, topic=topic),
            )
            for entry in reply.offsets:
                if entry.queue_id == queue_id:
                    self._committed[key] = entry.offset
                    return entry.offset
        # No committed offset: `start` decides (Kafka's auto.offset.reset). Offset 0
        # gets the earliest retained one from the broker's first pull answer. A
        # retry topic starts at its earliest always: what it holds was given back
        # by the group (joined after the first nack, "latest" would skip retries).
        if self.start == "latest" and not topic.startswith(RETRY_PREFIX):
            return self._end_of(topic, queue_id)
        return 0

    def _end_of(self, topic: str, queue_id: int) -> int:
        request = pb.PullRequest(topic=topic, queue_id=queue_id, offset=2**62, max_messages=1)
        reply = self._conn.call(self._conn.broker.Pull, request)
        return reply.end_offset

    # -- group membership --------------------------------------------------------------

    def _heartbeat_loop(self, interval_s: float) -> None:
        while not self._closed.wait(interval_s):
            try:
                self._heartbeat()
            except EqueueError as exc:
                log.warning("heartbeat failed: %s", exc)

    def _heartbeat(self) -> None:
        """Heartbeat and follow the reply; what we gave up is released on a second
        heartbeat at once (which may grant us queues others released)."""
        released: list[QueueKey] = []
        for _ in range(2):
            released = self._follow(self._send_heartbeat(released))
            if not released:
                return
        # Still something to release: the next tick's reply lists it again.

    def _send_heartbeat(self, released: list[QueueKey]) -> pb.HeartbeatReply:
        assert self.group is not None
        request = pb.HeartbeatRequest(
            group=self.group, consumer_id=self.consumer_id, topics=self.topics
        )
        by_topic: dict[str, list[int]] = {}
        for topic, queue_id in released:
            by_topic.setdefault(topic, []).append(queue_id)
        for topic, queue_ids in sorted(by_topic.items()):
            request.released.add(topic=topic, queue_ids=sorted(queue_ids))
        try:
            reply: pb.HeartbeatReply = self._conn.call(self._conn.broker.Heartbeat, request)
        except EqueueError as exc:
            self.failed_heartbeats += exc.retriable
            raise
        self.failed_heartbeats = 0
        return reply

    def _follow(self, reply: pb.HeartbeatReply) -> list[QueueKey]:
        """Read what the broker says we hold; give up the rest (committing the
        revoked queues first). Returns the revoked queues, to release."""
        owned: set[QueueKey] = set()
        revoked: set[QueueKey] = set()
        for tq in reply.topics:
            owned.update((tq.topic, q) for q in tq.owned_queue_ids)
            revoked.update((tq.topic, q) for q in tq.revoked_queue_ids)
        with self._lock:
            self._members = list(reply.consumer_ids)
            if reply.session != self._session:
                # A new membership (we expired, or the broker restarted): what we
                # read under the old one may have gone to others since. Start over.
                self._positions.clear()
                self._committed.clear()
                self._session = reply.session
            current = set(self._positions)
        if current - owned:
            self._give_up(current - owned, commit=revoked)
        added = owned - current
        if added:
            starts = {key: self._start_offset(key) for key in sorted(added)}
            with self._lock:
                self._positions.update(starts)
        if added or current - owned:
            log.info("consumer %s: assignment now %s", self.consumer_id, self.assignment())
        return sorted(revoked)

    def _give_up(self, keys: set[QueueKey], commit: set[QueueKey]) -> None:
        """Stop reading ``keys``; commit where we got to on those we still hold."""
        with self._commit_lock:
            with self._lock:
                positions = {k: self._positions.pop(k) for k in keys if k in self._positions}
                session = self._session
            try:
                held = {k: v for k, v in positions.items() if k in commit}
                self._commit_positions(held, session)
            except EqueueError:
                # Not committed: keep reading them (and holding their locks) rather
                # than let their next owner start before where we got to. The next
                # heartbeat tries again.
                with self._lock:
                    if self._session == session:
                        for key, position in positions.items():
                            self._positions.setdefault(key, position)
                raise
            for key in keys:  # whoever reads it next may move the group's offset
                self._committed.pop(key, None)

    # -- reading -----------------------------------------------------------------------

    def poll(self, timeout_s: float = 1.0) -> list[Message]:
        """Messages from the assigned queues, waiting up to ``timeout_s`` for some.

        One long-polling pull per queue runs concurrently; the call returns as
        soon as any queue has messages (or the timeout passes). A queue's error
        is raised when the call would return empty; if other queues brought
        messages, they are returned and the next call raises it.
        """
        if self._deferred is not None:
            error, self._deferred = self._deferred, None
            raise error
        with self._lock:
            positions = dict(self._positions)
            session = self._session
        if not positions:
            self._closed.wait(min(timeout_s, 0.1))  # nothing assigned (yet)
            return []
        wait_ms = max(0, min(self.max_wait_ms, int(timeout_s * 1000)))
        pending = self._pulls(positions, wait_ms, session)
        finished = threading.Event()
        for call in pending.values():
            call.add_done_callback(lambda _call: finished.set())
        deadline = time.monotonic() + timeout_s + self._conn.config.timeout_s
        messages: list[Message] = []
        errors: list[EqueueError] = []
        started = time.monotonic()
        failures = 0
        try:
            # An error does not end the wait: the other queues' pulls may still
            # bring messages (else a damaged queue would starve them).
            while pending and not messages and time.monotonic() < deadline:
                ready = [key for key, call in pending.items() if call.done()]
                if not ready:
                    finished.wait(max(0.0, deadline - time.monotonic()))
                    finished.clear()
                    continue
                for key in ready:
                    taken = self._take_noting(
                        key, pending.pop(key), positions[key], session, errors
                    )
                    failures += taken is None
                    messages += taken or []
            # Keep replies that arrived meanwhile rather than cancel them and
            # pull the same records again on the next poll.
            for key in [key for key, call in pending.items() if call.done()]:
                call = pending.pop(key)
                messages += self._take_noting(key, call, positions[key], session, errors) or []
        finally:
            # Unfinished pulls carry on: the next poll takes their replies.
            self._inflight = {key: (positions[key], session, call) for key, call in pending.items()}
            if self._closed.is_set():
                self.cancel_pulls()
        if errors:  # raised now, or by the next poll once the messages taken are returned
            if not messages:
                raise errors[0]
            self._deferred = errors[0]
        if failures == len(positions):  # broker unreachable: wait, do not spin
            self.failed_polls += 1
            self._closed.wait(max(0.0, timeout_s - (time.monotonic() - started)))
        else:
            self.failed_polls = 0
        return messages

    def positions(self) -> dict[QueueKey, int]:
        """Where each assigned queue is read next."""
        with self._lock:
            return dict(self._positions)

    def adopt(self, positions: dict[QueueKey, int]) -> None:
        """Continue where another consumer of the same queues got to (the
        same broker group's other member): outside a group every queue is
        taken over; in one, the queues this membership holds, never moving
        back behind the group's committed offset."""
        with self._lock:
            for key, position in positions.items():
                if not self._session:
                    self._positions[key] = position
                elif key in self._positions:
                    self._positions[key] = max(self._positions[key], position)

    def _pulls(
        self, positions: dict[QueueKey, int], wait_ms: int, session: int
    ) -> dict[QueueKey, grpc.Future[PullReply]]:
        """A pull per queue: the previous poll's unfinished one if it reads from
        the same offset in the same session (and has not ended with nothing to
        take), else a new one."""
        kept, self._inflight = self._inflight, {}
        pending: dict[QueueKey, grpc.Future[PullReply]] = {}
        try:
            for key, offset in positions.items():
                old = kept.pop(key, None)
                if old is not None:
                    same = old[:2] == (offset, session)
                    if same and _worth_taking(old[2], offset):
                        pending[key] = old[2]
                        continue
                    old[2].cancel()  # sought, re-joined, or nothing to take
                pending[key] = self._pull_async(key, offset, wait_ms, session)
        except BaseException:  # e.g. UnsupportedFilter: no pull left running
            for call in [*pending.values(), *(c for _o, _s, c in kept.values())]:
                call.cancel()
            raise
        for _offset, _session, call in kept.values():
            call.cancel()  # no longer assigned
        return pending

    def cancel_pulls(self) -> None:
        """Cancel the pulls polls left unfinished (closing)."""
        kept, self._inflight = self._inflight, {}
        for _offset, _session, call in kept.values():
            call.cancel()

    def _pull_async(
        self, key: QueueKey, offset: int, wait_ms: int, session: int
    ) -> grpc.Future[PullReply]:
        request = pb.PullRequest(
            topic=key[0],
            queue_id=key[1],
            offset=offset,
            max_messages=self.max_messages,
            max_bytes=self.max_bytes,
            tags=self.tags,
            max_wait_ms=wait_ms,
            filter=self.filter,
        )
        if not self._filters_checked:  # an older broker would send every record
            require_filters(self._conn, key[0])
            self._filters_checked = True
        if session and self.group is not None:  # a member's pull: must hold the queue
            request.group, request.consumer_id, request.session = (
                self.group, self.consumer_id, session,
            )  # fmt: skip
        timeout = self._conn.config.timeout_s + wait_ms / 1000
        return self._conn.pull.future(request, timeout=timeout)

    def _take_noting(
        self, key: QueueKey, call: grpc.Future[PullReply], position: int, session: int,
        errors: list[EqueueError],
    ) -> list[Message] | None:  # fmt: skip
        """``_take``, but an error is added to ``errors`` rather than raised: the
        other replies ready now are still taken (their positions advance only
        with messages that ``poll`` returns)."""
        try:
            return self._take(key, call, position, session)
        except EqueueError as exc:
            errors.append(exc)
            return []

    def _take(
        self, key: QueueKey, call: grpc.Future[PullReply], position: int, session: int
    ) -> list[Message] | None:
        """The messages of one finished pull (advancing the queue's position past
        them only once they are decoded), or None if it failed in a way worth
        retrying (the next poll asks again)."""
        try:
            reply = call.result()
        except grpc.RpcError as exc:
            error = from_rpc_error(exc)
            if isinstance(error, DataLossError):
                return self._damaged(key, position, session, error)
            if error.retriable:
                log.warning("pull of %s/%d failed: %s", key[0], key[1], error)
                return None
            if session and isinstance(error, PreconditionError):
                # Not ours any more: a rebalance is under way. The heartbeat
                # gives it back if the broker grants it to us again.
                log.info("consumer %s: dropping %s/%d: %s", self.consumer_id, *key, error)
                self._drop({key: position}, session)
                return []
            raise error from exc
        messages, next_offset, damage = self._decode(reply)
        with self._lock:
            if self._positions.get(key) != position or self._session != session:
                return []  # revoked or sought meanwhile: drop the reply
            if reply.status == pb.PULL_STATUS_OFFSET_TOO_SMALL:
                log.warning(
                    "%s/%d: offset %d was deleted by retention; skipping to %d",
                    key[0], key[1], position, reply.next_offset,
                )  # fmt: skip
            if not messages and damage is not None:  # nothing intact before it: stay
                raise DataLossError(
                    f"{key[0]}/{key[1]} offset {position}: {damage}",
                    topic=key[0], queue_id=key[1], offset=position,
                )  # fmt: skip
            self._positions[key] = next_offset
        return messages

    @staticmethod
    def _decode(reply: PullReply) -> tuple[list[Message], int, str | None]:
        """(messages, next position, damage): a reply with a damaged record in it
        (caught by its checksum here) yields the records before it, and the
        position moves only past those."""
        if not reply.count:
            return [], reply.next_offset, None
        try:
            return decode_records(reply.records, reply.broker_id), reply.next_offset, None
        except DataLossError:
            messages, damage = decode_intact(reply.records, reply.broker_id)
        next_offset = messages[-1].offset + 1 if messages else reply.next_offset
        return messages, next_offset, damage

    def _damaged(
        self, key: QueueKey, position: int, session: int, error: DataLossError
    ) -> list[Message]:
        """The broker reports a damaged stored record (DATA_LOSS): raise, or
        with ``on_data_loss="skip"`` move past that one record."""
        offset = error.offset
        if offset is None:  # a broker that names the record in its message only
            found = _DAMAGED.search(str(error))
            offset = int(found.group(1)) if found else -1
        if self.on_data_loss != "skip" or offset < position:
            raise error
        with self._lock:
            if self._positions.get(key) != position or self._session != session:
                return []
            self._positions[key] = offset + 1
            self.damaged_skipped.setdefault(key, []).append(offset)
        log.error("%s/%d: skipped damaged record at offset %d (on_data_loss=skip)", *key, offset)
        return []

    # -- progress ----------------------------------------------------------------------

    def commit(self) -> None:
        """Store the positions as the group's next offsets to consume.

        A member commits only the queues it still holds: a queue the broker
        handed to another member meanwhile is dropped, without an error."""
        with self._commit_lock:
            with self._lock:
                positions = dict(self._positions)
                session = self._session
            self._commit_positions(positions, session)

    def _commit_positions(self, positions: dict[QueueKey, int], session: int) -> None:
        """Commit (holding ``_commit_lock``) what changed since the last commit;
        ``positions`` were read under membership ``session`` and are committed
        as that membership, never a later one."""
        if self.group is None:
            raise InvalidRequest("commit needs a group")
        changed = {k: v for k, v in positions.items() if self._committed.get(k) != v}
        if not changed:
            return
        if not session:  # not a member (assign()): a commit from outside the group
            self._commit_offsets(changed, None)
            self._committed.update(changed)
            return
        member = (self.consumer_id, session)
        try:
            self._commit_offsets(changed, member)
            self._committed.update(changed)
            return
        except NotMasterError:
            raise  # the group's master moved: nothing to do with queue ownership
        except PreconditionError:
            pass  # some queue changed hands: find which, commit the others
        for key, offset in changed.items():
            try:
                self._commit_offsets({key: offset}, member)
                self._committed[key] = offset
            except NotMasterError:
                raise
            except PreconditionError as exc:
                log.info("consumer %s: dropping %s/%d: %s", self.consumer_id, *key, exc)
                self._drop({key: offset}, session)

    def _commit_offsets(self, offsets: dict[QueueKey, int], member: tuple[str, int] | None) -> None:
        assert self.group is not None
        self.committer(self.group, offsets, member)

    def _drop(self, positions: dict[QueueKey, int], session: int) -> None:
        """Stop reading queues we no longer hold, unless they were restarted meanwhile."""
        with self._lock:
            if self._session != session:
                return
            for key, position in positions.items():
                if self._positions.get(key) == position:
                    del self._positions[key]
                    self._committed.pop(key, None)

    def close(self) -> None:
        """Leave the group (its other members take over the queues). Positions
        are not committed here; the connection stays open (the routes own it)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.cancel_pulls()
        if self._heartbeats is not None:
            self._heartbeats.join(timeout=self._conn.config.timeout_s)
            self._leave()

    def _leave(self) -> None:
        """Tell the broker at once, so the others take over our queues now."""
        assert self.group is not None
        request = pb.HeartbeatRequest(group=self.group, consumer_id=self.consumer_id, leave=True)
        try:
            self._conn.call(self._conn.broker.Heartbeat, request, timeout_s=2.0, retry=False)
        except EqueueError as exc:  # the broker drops us after its timeout anyway
            log.warning("could not leave group %s: %s", self.group, exc)


def _worth_taking(call: grpc.Future[PullReply], offset: int) -> bool:
    """Whether a kept pull from ``offset`` may still bring something: running,
    or answered with records or a move (retention, records a filter left
    out). One that failed (e.g. its member went away) or timed out empty is
    pulled again at once rather than taken: this poll then waits on that
    queue too, and a failure is met as a new pull's would be."""
    if not call.done():
        return True
    if call.cancelled() or call.exception() is not None:
        return False
    reply = call.result()
    return bool(reply.count) or reply.next_offset != offset
