"""What the servicers share: the broker state and the ``rpc`` wrappers.

``BrokerState`` holds what every handler needs (config, store, parked pulls,
consumer groups, counters, the replication roles) and, through
``StoreCalls``, decides where a storage call runs: blocking calls on the
thread pool (sync-mode appends wait there for their fsync), short ones
inline on the event loop.

``rpc`` and ``rpc_stream`` wrap every handler so that a failure becomes the
status ``errors.status_for`` picks (this module maps nothing itself), and
time it (metrics_hot.py).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import grpc

from equeue_broker.replication.failover import RoleSwitch
from equeue_broker.replication.insync import InSyncSet
from equeue_broker.replication.replicas import ReplicaTracker
from equeue_broker.replication.role import BrokerRole
from equeue_broker.server.auth import Principal, TokenTable, scoped
from equeue_broker.server.budgets import ByteBudget
from equeue_broker.server.config import BrokerConfig
from equeue_broker.server.disk_usage import DiskUsage
from equeue_broker.server.errors import PermissionDenied, ShuttingDown, status_for, trailers_for
from equeue_broker.server.groups import ConsumerRegistry
from equeue_broker.server.health import BrokerHealth
from equeue_broker.server.longpoll import PullWaiters
from equeue_broker.server.metrics_hot import RPC_TIMES, STREAM_TIMES, timed
from equeue_broker.server.registration import Registrar
from equeue_broker.server.stats import Counters
from equeue_broker.server.txn_checks import TransactionChecker
from equeue_broker.storage import Store

P = ParamSpec("P")
T = TypeVar("T")


class StoreCalls:
    """Where a storage call runs: blocking calls on the thread pool (sync-mode
    appends wait there for their fsync), short ones inline on the event loop.
    Once ``shutting_down``, neither takes a call (``ShuttingDown``)."""

    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self.executor = executor
        self.shutting_down = False

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a blocking storage call on the thread pool."""
        if self.shutting_down:
            raise ShuttingDown("the broker is shutting down")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def inline(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a short storage call on the event loop itself.

        For work that never waits on the disk (reads from the page cache,
        async-mode appends): a hop to the thread pool costs more than the
        call, and the GIL serialises the two anyway.
        """
        if self.shutting_down:
            raise ShuttingDown("the broker is shutting down")
        return fn(*args, **kwargs)


@dataclass
class BrokerState:
    """What the servicers share; built complete in one place (``app.create_server``)."""

    config: BrokerConfig
    store: Store
    broker_id: str
    instance_id: str
    """The data directory's random id; ``broker_id`` is the broker name when
    one is given (--broker-name), else this. Message ids of either resolve."""
    calls: StoreCalls
    """Where storage calls run (``call``, ``inline``)."""
    waiters: PullWaiters
    consumers: ConsumerRegistry
    reply_bytes: ByteBudget
    """Pull replies being read or sent (the pulls' half of ``max_reply_bytes``)."""
    stream_reply_bytes: ByteBudget
    """PullStream replies being read or sent (the streams' half of ``max_reply_bytes``)."""
    produce_bytes: ByteBudget
    """Produce requests being decoded and appended (``max_produce_bytes``)."""
    tokens: TokenTable | None
    """The tokens the broker accepts; None: no authentication."""
    role: BrokerRole
    """Master or replica now, its master and epoch (replication/role.py; failover changes it)."""
    insync: InSyncSet
    """A master's in-sync set; with sync replication, writes wait for it (replication/insync.py)."""
    replicas: ReplicaTracker
    """A master: the replicas following it (replication/replicas.py; limit ``max_replicas``)."""
    role_switch: RoleSwitch
    """Promotes and demotes (SetRole, elections); owns a replica's follower
    (replication/failover.py)."""
    registrar: Registrar | None
    """The name-server registration (--namesrv); None: a standalone broker."""
    health: BrokerHealth
    """The grpc.health.v1 statuses, per role (health.py)."""
    checker: TransactionChecker
    """Transaction check-back: the producer groups' check streams and the
    checking task (txn_checks.py)."""
    counters: Counters = field(default_factory=Counters)
    disk: DiskUsage = field(default_factory=DiskUsage)
    """The data directory's size, measured at most every 30 s (disk_usage.py)."""
    pull_streams: int = 0
    """PullStreams open now (at most ``max_pull_streams``)."""
    produce_streams: int = 0
    """ProduceStreams open now (at most ``max_produce_streams``)."""
    fetch_address: str = ""
    """HOST:PORT of the fetch port once it listens (fetch_port.py); empty: not
    served. Reported in BrokerStats and in the name-server registration."""
    _round_robin: dict[str, itertools.count[int]] = field(default_factory=dict)

    def topology_changed(self) -> None:
        """A topic or queue was created, deleted or changed: tell the name servers now."""
        if self.registrar is not None:
            self.registrar.changed()

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a blocking storage call on the thread pool (``StoreCalls.call``)."""
        return await self.calls.call(fn, *args, **kwargs)

    def inline(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a short storage call on the event loop (``StoreCalls.inline``)."""
        return self.calls.inline(fn, *args, **kwargs)

    def next_round_robin(self, topic: str) -> int:
        return next(self._round_robin.setdefault(topic, itertools.count()))

    @property
    def auth_tokens(self) -> int:
        """Tokens the broker accepts; 0: no authentication."""
        return 0 if self.tokens is None else len(self.tokens)

    def scope(self, context: grpc.aio.ServicerContext[Any, Any]) -> Principal | None:
        """The caller's token if it may use only some topics (auth.py); None: every topic."""
        return scoped(self.tokens, context.invocation_metadata())

    def group_topics(self, group: str) -> set[str]:
        """Every topic of a group: those its live members subscribe to and
        those it has committed offsets on."""
        return set(self.store.committed_offsets(group)) | self.consumers.topics(group)

    def check_group(self, scope: Principal | None, group: str) -> None:
        """PERMISSION_DENIED unless ``scope`` covers every topic of ``group``: a
        group call shows its members and moves their queues and offsets, so a
        token for some topics must not reach a group that also reads others."""
        if scope is None:
            return
        for topic in sorted(self.group_topics(group)):
            check_group_topic(scope, group, topic)


def check_group_topic(scope: Principal, group: str, topic: str) -> None:
    if not scope.may_use_topic(topic):
        raise PermissionDenied(
            f"token {scope.name!r} may not use group {group!r}: the group reads topic "
            f"{topic!r}, outside the token's topics; use a token that covers all its topics"
        )


Handler = Callable[[Any, Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


def rpc(method: Handler) -> Handler:
    """Answer every failure with the status code ``status_for`` picks, and
    time the call into ``RPC_TIMES`` (metrics_hot.py) under its status."""
    name = method.__name__

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.perf_counter()  # inline, not ``timed``: a few tenths of a us per call
        code = "OK"
        try:
            return await method(self, request, context)
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except Exception as exc:  # every error becomes a status; see errors.py
            status, message = status_for(exc)  # once: it logs unexpected errors
            code = status.name
            await context.abort(status, message, trailing_metadata=trailers_for(exc))
            raise AssertionError("unreachable: abort raises") from exc  # for type checkers
        finally:
            RPC_TIMES.observe(name, code, time.perf_counter() - started)

    return wrapper


StreamHandler = Callable[[Any, Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]


def rpc_stream(method: StreamHandler) -> StreamHandler:
    """``rpc`` for handlers that stream replies: replies already sent stand,
    and the first failure ends the stream with its status. The stream's whole
    life is timed into ``STREAM_TIMES``."""
    name = method.__name__

    @functools.wraps(method)
    async def wrapper(
        self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        with timed(STREAM_TIMES, name) as call:  # once per stream: the object costs nothing
            try:
                async for reply in method(self, request, context):
                    yield reply
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # every error becomes a status; see errors.py
                status, message = status_for(exc)  # once: it logs unexpected errors
                call.code = status.name
                await context.abort(status, message, trailing_metadata=trailers_for(exc))

    return wrapper
