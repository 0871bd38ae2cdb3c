"""Answering the broker's transaction checks: ``CheckResponder``.

A ``Producer(group=..., checker=fn)`` holds a ``TransactionChecks`` stream open
to the master of every broker group (one broker is a cluster of one; with name
servers, each group's master from ``Routes.brokers``). The broker sends a
``TransactionCheck`` down it when a transaction of the producer group stays
open too long (docs/client.md, "Transaction check-back"); this module runs
``fn(transaction_id)`` on a small thread pool (one check at a time per
transaction) and sends the answer up the stream. ``fn`` returns "commit",
"rollback" or "unknown" (or a ``TransactionResolution``); an exception or any
other value counts as unknown (logged, never raised: the broker asks again).

Each group's stream is kept by one thread: after an error (the broker
restarted, a failover) it reconnects with back-off to the group's master as
the routes name it then; a supervisor also moves it when the group's master
changes while the old one lives on as a replica (where a stream stays idle).
``close()`` ends the streams.
"""

from __future__ import annotations

import enum
import logging
import os
import queue
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from equeue_proto.protocol import default_consumer_id
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.errors import EqueueError, from_rpc_error
from equeue_spark.client.routing import Routes
from equeue_spark.client.transactions import TransactionResolution

log = logging.getLogger(__name__)

Checker = Callable[[str], object]
"""``fn(transaction_id)`` -> "commit" | "rollback" | "unknown" (or the enum)."""

CHECK_THREADS = 4
"""Checkers running at once (the application's own lookups)."""
REFRESH_S = 2.0
"""How often the supervisor looks for new broker groups and moved masters."""
MAX_BACKOFF_S = 5.0
STABLE_S = 10.0
"""A stream that lived this long starts the back-off from its start again."""

_RESOLUTIONS = {
    TransactionResolution.COMMIT: pb.TRANSACTION_RESOLUTION_COMMIT,
    TransactionResolution.ROLLBACK: pb.TRANSACTION_RESOLUTION_ROLLBACK,
    TransactionResolution.UNKNOWN: pb.TRANSACTION_RESOLUTION_UNKNOWN,
}
_REFUSED = (
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNIMPLEMENTED,
)
"""Stream errors logged at WARNING: a mistake to fix, not a passing failure."""
_BROKER_UP = (*_REFUSED, grpc.StatusCode.RESOURCE_EXHAUSTED)
"""Stream errors that say nothing against the broker's health (never marked down)."""
_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""The broker's group name rule (storage/meta/names.py)."""
_END = object()
"""Put on a stream's outgoing queue: end the request stream."""


def group_problem(group: str) -> str | None:
    """Why the broker refuses ``group`` as a producer group name, or None."""
    if _GROUP.fullmatch(group):
        return None
    shown = repr(group[:40]) + ("..." if len(group) > 40 else "")
    return (
        f"producer group {shown} is invalid: give 1 to 128 ASCII letters, digits, '.', "
        "'_' and '-', starting with a letter or digit"
    )


def resolve(checker: Checker, txn_id: str) -> TransactionResolution:
    """What ``checker`` says of ``txn_id``; UNKNOWN for an exception or any
    value that is not one of the three (both logged)."""
    try:
        said = checker(txn_id)
    except Exception:  # the application's code: logged, never the broker's problem
        log.exception("transaction checker raised for %s: answered unknown", txn_id)
        return TransactionResolution.UNKNOWN
    value = said.value if isinstance(said, enum.Enum) else said  # the application's own enum
    if isinstance(value, str):  # TransactionResolution's members are strings too
        try:
            return TransactionResolution(value.lower())
        except ValueError:
            pass
    log.warning(
        "transaction checker returned %r for %s (not 'commit', 'rollback' or 'unknown'): "
        "answered unknown", said, txn_id,
    )  # fmt: skip
    return TransactionResolution.UNKNOWN


class _GroupStream:
    """The check stream to one broker group's master, kept open by a thread."""

    def __init__(self, responder: CheckResponder, broker: str) -> None:
        self.responder = responder
        self.broker = broker
        self.address = ""
        self.call: Any = None
        self.outgoing: queue.Queue[object] = queue.Queue()
        self.in_flight: set[str] = set()
        self.lock = threading.Lock()
        self.thread = threading.Thread(
            target=self._run, name=f"equeue-checks-{broker or 'broker'}", daemon=True
        )

    def _run(self) -> None:
        responder = self.responder
        delay = responder.backoff_s
        while not responder.stopped.is_set():
            started = time.monotonic()
            try:
                self.address = responder.master_of(self.broker)
                self._serve(self.address)
            except EqueueError as exc:
                if not responder.stopped.is_set():
                    log.info("check stream to broker group %r: %s", self.broker, exc)
            except Exception:  # never let the thread die: checks would stop for good
                log.exception("check stream to broker group %r failed", self.broker)
            if time.monotonic() - started >= STABLE_S:
                delay = responder.backoff_s
            if responder.stopped.wait(delay):
                return
            delay = min(delay * 2, MAX_BACKOFF_S)

    def _serve(self, address: str) -> None:
        responder = self.responder
        outgoing: queue.Queue[object] = queue.Queue()
        self.outgoing = outgoing
        outgoing.put(
            pb.CheckStreamRequest(
                hello=pb.CheckHello(group=responder.group, client_id=responder.client_id)
            )
        )

        def requests() -> Iterator[pb.CheckStreamRequest]:
            while True:
                item = outgoing.get()
                if item is _END:
                    return
                assert isinstance(item, pb.CheckStreamRequest)
                yield item

        conn = responder.routes.connection(address)
        with self.lock:
            if responder.stopped.is_set():
                return
            self.call = conn.broker.TransactionChecks(requests())
        try:
            for check in self.call:
                self._take(check, outgoing)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.CANCELLED:
                return
            if code in _REFUSED:  # the broker is up and said no: retrying will not help soon
                log.warning(
                    "the broker at %s refused the check stream of producer group %r: %s",
                    address, responder.group, exc.details(),
                )  # fmt: skip
            elif code not in _BROKER_UP:
                responder.routes.mark_down(address)
            raise from_rpc_error(exc) from exc
        finally:
            outgoing.put(_END)

    def _take(self, check: pb.TransactionCheck, outgoing: queue.Queue[object]) -> None:
        txn_id = check.transaction_id
        with self.lock:
            if txn_id in self.in_flight:  # its checker still runs: that answer will do
                return
            self.in_flight.add(txn_id)

        def run() -> None:
            try:
                said = resolve(self.responder.checker, txn_id)
                answer = pb.CheckAnswer(
                    transaction_id=txn_id, check=check.check, resolution=_RESOLUTIONS[said]
                )
                outgoing.put(pb.CheckStreamRequest(answer=answer))
            finally:
                with self.lock:
                    self.in_flight.discard(txn_id)

        try:
            self.responder.pool.submit(run)
        except RuntimeError:  # closing
            with self.lock:
                self.in_flight.discard(txn_id)

    def move(self) -> None:
        """End the current stream (it reconnects to the master the routes name)."""
        with self.lock:
            call = self.call
        if call is not None:
            call.cancel()


class CheckResponder:
    """Answers the broker's transaction checks for one producer group."""

    def __init__(self, routes: Routes, group: str, checker: Checker) -> None:
        self.routes = routes
        self.group = group
        self.checker = checker
        self.client_id = default_consumer_id(socket.gethostname(), os.getpid(), "checks")
        self.backoff_s = max(0.05, routes.config.backoff_s)
        self.stopped = threading.Event()
        self.pool = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="equeue-checker")
        self._streams: dict[str, _GroupStream] = {}
        self._lock = threading.Lock()
        """Guards ``_streams`` (the supervisor adds, ``close`` ends them)."""
        self._supervisor = threading.Thread(
            target=self._supervise, name="equeue-checks", daemon=True
        )
        self._supervisor.start()

    def master_of(self, broker: str) -> str:
        return self.routes.broker_address(broker)

    def _supervise(self) -> None:
        while not self.stopped.is_set():
            try:
                masters = {e.broker_name: e.address for e in self.routes.brokers()
                           if e.routed_master}  # fmt: skip
            except Exception as exc:  # the name servers down, say: asked again soon
                log.info("transaction checks: the brokers are not known now: %s", exc)
                masters = {}
            with self._lock:
                for broker, address in masters.items():
                    if self.stopped.is_set():
                        return
                    stream = self._streams.get(broker)
                    if stream is None:
                        stream = self._streams[broker] = _GroupStream(self, broker)
                        stream.thread.start()
                    elif stream.address and stream.address != address:
                        stream.move()  # a new master; the old one may live on as a replica
            self.stopped.wait(REFRESH_S)

    def close(self) -> None:
        """End every stream and wait (bounded) for their threads."""
        self.stopped.set()
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.outgoing.put(_END)
            stream.move()
        self._supervisor.join(timeout=REFRESH_S + 1)
        for stream in streams:
            stream.thread.join(timeout=self.routes.config.timeout_s)
        self.pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["CheckResponder", "Checker", "group_problem", "resolve"]
