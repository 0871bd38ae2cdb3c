"""Idempotent produce, the client's half: producer ids, epochs and sequence numbers.

A ``Sequencer`` belongs to one ``Producer``. Per broker group it holds the
producer id and epoch the group's master gave (``InitProducer``) and, per
queue, the next sequence number; ``stamp`` writes them into a request once,
before its first attempt, so every retry of the request (the connection's,
a failover's, a broken stream's) carries the same numbers and the broker
acknowledges a batch it appended already with its original offsets instead
of appending it again (broker.proto, "Idempotent produce").

Order: a queue's batches must reach the broker in sequence order, so a
group's stamped requests are sent one after another (``lock``: held from
stamping until acknowledged) or pipelined in order on one stream, with at
most the broker's window of them unacknowledged (Kafka's limit of 5
requests in flight for an idempotent producer, for the same reason: a
resend must still be among the batches the broker remembers). After a
batch fails for good its sequence may or may not be taken, so the group
starts a new epoch (``reset``): the next batch asks ``InitProducer`` with
the same id, whose older epoch is then fenced.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from equeue_proto.v1 import broker_pb2 as pb

Init = Callable[[int], tuple[int, int, int]]
"""``InitProducer`` on a group's master: (producer id or 0) -> (id, epoch, window)."""

DEFAULT_WINDOW = 5
"""Batches per queue a broker remembers unless it says otherwise."""


@dataclass
class _Group:
    producer_id: int = 0
    epoch: int = 0
    window: int = DEFAULT_WINDOW
    """The broker's window: at most this many of the group's batches may be
    unacknowledged at once, or a resend could fall out of it."""
    fresh: bool = False
    """False: ask InitProducer before the next batch (first use, or after ``reset``)."""
    next: dict[tuple[str, int], int] = field(default_factory=dict)
    """(topic, queue id) -> the next batch's sequence."""
    lock: threading.RLock = field(default_factory=threading.RLock)


class Sequencer:
    """One producer's ids, epochs and sequences, per broker group."""

    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}
        self._lock = threading.Lock()

    def _group(self, group: str) -> _Group:
        with self._lock:
            return self._groups.setdefault(group, _Group())

    def lock(self, group: str) -> threading.RLock:
        """Held while a stamped request of ``group`` is on its way (module doc)."""
        return self._group(group).lock

    def stamp(self, group: str, request: pb.ProduceRequest, init: Init) -> None:
        """Give ``request`` (``lock`` held) the group's producer id and epoch
        and each of its queues' next sequence: the queues of its queue ids,
        or, a batch for one queue without them, the queue its one sequence
        entry names."""
        state = self._group(group)
        if not state.fresh:
            state.producer_id, state.epoch, state.window = init(state.producer_id)
            state.next.clear()
            state.fresh = True
        request.producer_id = state.producer_id
        request.producer_epoch = state.epoch
        queues = sorted(set(request.queue_ids)) or [e.queue_id for e in request.sequences]
        del request.sequences[:]
        for queue_id in queues:
            key = (request.topic, queue_id)
            sequence = state.next.get(key, 0)
            state.next[key] = sequence + 1
            request.sequences.add(queue_id=queue_id, sequence=sequence)

    def unstamp(self, group: str, request: pb.ProduceRequest) -> None:
        """Give back the sequences of ``request``, the group's last stamped
        (``lock`` held): it never reached the broker."""
        state = self._group(group)
        for entry in request.sequences:
            key = (request.topic, entry.queue_id)
            if state.next.get(key) == entry.sequence + 1:
                state.next[key] = entry.sequence

    def reset(self, group: str) -> None:
        """A stamped batch of ``group`` failed for good: start a new epoch
        before the next one (its sequences start at 0 again)."""
        self._group(group).fresh = False

    def window(self, group: str) -> int:
        """Batches of ``group`` that may be unacknowledged at once."""
        return max(1, self._group(group).window)

    def identity(self, group: str) -> tuple[int, int]:
        """(producer id, epoch) used with ``group`` (0, 0 before the first batch)."""
        state = self._group(group)
        return state.producer_id, state.epoch


def init_producer(call: Callable[[pb.InitProducerRequest], pb.InitProducerReply]) -> Init:
    """An ``Init`` from a way to call ``InitProducer``."""

    def init(producer_id: int) -> tuple[int, int, int]:
        reply = call(pb.InitProducerRequest(producer_id=producer_id))
        window = int(reply.window) or DEFAULT_WINDOW
        return int(reply.producer_id), int(reply.producer_epoch), window

    return init
