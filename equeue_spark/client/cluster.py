"""A cluster seen from a client: routes from name servers (``NameServerRoutes``).

``NameServerRoutes`` asks any live name server for a topic's route (a random
one at first, then the one that answered last, then the others), caches it,
and fetches it again once it is older than ``ClientConfig.route_refresh_s``
or after an error (``invalidate``). If no name server answers, a cached route
keeps serving, however old: routes are soft state, and the brokers are what
matters.

A route names each broker group's master and replicas. Writes and offset
commits go to the master (``Route.address``); reads go where
``read_addresses`` says (replica_reads.py): the master, else a replica while
the master cannot be reached (``mark_down``), or a replica always with
``ClientConfig.read_from_replicas``. A route with a member marked down is
fetched again at its next use, so a new master is learnt as soon as the name
servers know it (a broker registers at once when its role changes). What to
do when a member fails is routing.py's (``Routes``).

Name servers are dialled as brokers are (``connection.open_channel``): the
same TLS settings and the same token (``ClientConfig.tls_ca``/``tls_cert``/
``tls_key``, ``token``), so one set of settings reaches a secured cluster. A
name server's UNAUTHENTICATED or PERMISSION_DENIED is final: raised at once
(``AuthenticationError``, ``PermissionDeniedError``), naming the name server,
not tried on the others (they share one token file) nor retried.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Sequence

import grpc

from equeue_proto.protocol import parse_message_id
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client.connection import ClientConfig, open_channel
from equeue_spark.client.errors import (
    AuthenticationError,
    BrokerUnavailable,
    InvalidRequest,
    NotFoundError,
    PermissionDeniedError,
    from_rpc_error,
)
from equeue_spark.client.replica_reads import DOWN_S
from equeue_spark.client.route import (
    QueueRef,
    Route,
    name_broker,
    request_keys,
    split_request,
    take_rows,
)
from equeue_spark.client.routing import Routes, StaticRoutes

log = logging.getLogger(__name__)

__all__ = [
    "NameServerRoutes",
    "QueueRef",
    "Route",
    "connect",
    "name_broker",
    "request_keys",
    "routes_type",
    "split_request",
    "take_rows",
    "with_replica_reads",
]


class NameServerRoutes(Routes):
    """Routes from a cluster's name servers, cached (thread-safe)."""

    def __init__(self, config: ClientConfig) -> None:
        super().__init__(config)
        self.namesrvs = config.namesrvs()
        assert self.namesrvs, "NameServerRoutes needs name servers"
        self._routes: dict[str, Route] = {}
        self._stale: set[str] = set()
        self._brokers: list[pb.BrokerEntry] = []
        # The brokers' TLS and token (ValueError for an unreadable TLS file).
        channels = [open_channel(config, a) for a in self.namesrvs]
        self._channels = [channel for channel, _ in channels]
        self._stubs = [pb_grpc.NameServerStub(calls) for _, calls in channels]
        self._preferred = random.randrange(len(self._stubs))
        """The name server asked first: a random one at the start (clients spread
        their load over the name servers), then the last one that answered."""

    # -- name servers --------------------------------------------------------------

    def _ask(self, method: str, request: object) -> object:
        """Call ``method`` on the name servers, the last good one first;
        ``NotFoundError`` at once (every name server knows the same),
        ``AuthenticationError``/``PermissionDeniedError`` at once naming the
        name server (they share the token file: the others would refuse too),
        and ``BrokerUnavailable`` naming them all if none answers."""
        errors: list[str] = []
        count = len(self._stubs)
        for step in range(count):
            index = (self._preferred + step) % count
            try:
                reply = getattr(self._stubs[index], method)(
                    request, timeout=min(self.config.timeout_s, 5.0)
                )
            except grpc.RpcError as exc:
                error = from_rpc_error(exc)
                if isinstance(error, NotFoundError | InvalidRequest):
                    raise error from exc
                if isinstance(error, AuthenticationError | PermissionDeniedError):
                    raise _refused(self.namesrvs[index], error) from exc
                errors.append(f"{self.namesrvs[index]}: {error}")
                continue
            self._preferred = index
            return reply
        raise BrokerUnavailable("no name server answers: " + "; ".join(errors))

    def route(self, topic: str, refresh: bool = False) -> Route:
        """The topic's route, from the cache while it is fresh."""
        with self._lock:
            cached = self._routes.get(topic)
            fresh = (
                cached is not None
                and topic not in self._stale
                and time.monotonic() - cached.fetched < self.config.route_refresh_s
            )
        if cached is not None and fresh and not refresh:
            return cached
        try:
            reply = self._ask("GetRoute", pb.GetRouteRequest(topic=topic))
        except BrokerUnavailable as exc:
            if cached is None:
                raise
            log.warning("using the cached route of %s: %s", topic, exc)
            return cached
        assert isinstance(reply, pb.TopicRoute)
        route = Route(topic, tuple(reply.brokers), time.monotonic(), tuple(reply.down_brokers))
        with self._lock:
            self._routes[topic] = route
            self._stale.discard(topic)
        return route

    def invalidate(self, topic: str) -> None:
        """Fetch the route again at its next use (after an error on it)."""
        with self._lock:
            self._stale.add(topic)

    def mark_down(self, address: str, for_s: float = DOWN_S) -> None:
        """``address`` failed a call: try it last for ``for_s``, and fetch
        every route again at its next use (the group may have a new master)."""
        super().mark_down(address, for_s)
        with self._lock:
            self._stale.update(self._routes)

    def brokers(
        self, cluster: str = "", include_down: bool = False, with_topic_names: bool = False
    ) -> list[pb.BrokerEntry]:
        """The live brokers (the last list known if no name server answers);
        with ``include_down`` also those remembered as down."""
        request = pb.ListBrokersRequest(
            cluster=cluster, include_down=include_down, with_topic_names=with_topic_names
        )
        plain = not (cluster or include_down or with_topic_names)
        try:
            reply = self._ask("ListBrokers", request)
        except BrokerUnavailable:
            if not self._brokers or not plain:
                raise
            return list(self._brokers)
        assert isinstance(reply, pb.ListBrokersReply)
        if plain:
            with self._lock:
                self._brokers = list(reply.brokers)
        return list(reply.brokers)

    def broker_address(self, broker: str) -> str:
        """A broker's address from the live-broker list (topic-independent)."""
        members = [e for e in self.brokers() if e.broker_name == broker]
        for entry in members:
            if entry.routed_master:
                return entry.address
        if members:
            raise BrokerUnavailable(f"broker group {broker!r} has no master now")
        raise NotFoundError(f"broker {broker!r} is not registered with the name servers")

    def group(self, broker: str, missing: str) -> str:
        if not broker:
            raise InvalidRequest(missing)
        return broker

    def only_address(self, what: str) -> str:
        raise InvalidRequest(
            f"{what} is about one broker's queues: in a cluster use "
            "admin.broker_admin(NAME)." + what
        )

    def message_address(self, message_id: str) -> str:
        try:
            broker, _ = parse_message_id(message_id)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        return self.broker_address(broker)

    @classmethod
    def names_groups(cls) -> bool:
        return True

    def shown_group(self, broker_id: str) -> str | None:
        return broker_id

    kind = "a cluster"
    other_kind = "a single broker"

    @classmethod
    def _naming_hint(cls, shown: str, topic: str, ref: tuple[str, int]) -> str:
        return (
            f"queue {shown} of {topic!r} names no broker group, but the query reads a "
            "cluster (option namesrv or the driver $EQUEUE_NAMESRV): "
            f'write "BROKER/QUEUE", e.g. "a/{ref[1]}"'
        )

    def cluster_view(self, what: str) -> None:
        return None

    def group_members(self, group: str, given: Sequence[str] | None) -> list[str]:
        if given:
            raise InvalidRequest(f"name group {group!r}'s members or the name servers, not both")
        return [e.address for e in self.brokers() if e.broker_name == group]

    def close(self) -> None:
        super().close()
        for channel in self._channels:
            channel.close()


def _refused(
    address: str, error: AuthenticationError | PermissionDeniedError
) -> AuthenticationError | PermissionDeniedError:
    """``error`` from the name server at ``address``, saying so and which token it had."""
    hint = (
        " (the client sends name servers the token it sends brokers: ClientConfig.token or "
        "$EQUEUE_TOKEN, the CLI's --token-file, Spark's option token)"
        if isinstance(error, AuthenticationError)
        else ""
    )
    return type(error)(f"name server {address} refused the call: {error}{hint}", error.code)


def with_replica_reads(config: ClientConfig) -> ClientConfig:
    """``config`` reading from replicas (``read_from_replicas``); ValueError
    for one broker (a cluster of one member: no replica to choose)."""
    if not config.is_cluster:
        raise ValueError(
            "read_from_replicas needs a cluster: give namesrv= (one broker has no replicas "
            "to choose from)"
        )
    return dataclasses.replace(config, read_from_replicas=True)


def target(config: ClientConfig) -> tuple[str, str]:
    """How an error names what ``config`` reaches, and the option that sets it:
    a cluster behind name servers, or one broker (a cluster of one)."""
    if config.is_cluster:
        return f"the cluster behind name servers {','.join(config.namesrvs())}", "namesrv"
    return f"broker {config.broker}", "broker"


def routes_type(config: ClientConfig) -> type[Routes]:
    """The kind of routes ``config`` names, without connecting: name servers
    (``namesrv``, or ``$EQUEUE_NAMESRV``), else one broker (a cluster of one).
    For what a class answers (``Routes.names_groups``) before any call."""
    return NameServerRoutes if config.is_cluster else StaticRoutes


def connect(config: ClientConfig) -> Routes:
    """The routes ``config`` names (``routes_type``)."""
    return routes_type(config)(config)
