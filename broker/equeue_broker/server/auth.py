"""Token authentication and role/topic authorization (off unless tokens are configured).

Tokens come from a TOML document: the file given with ``--tokens-file``, or the
text of ``$EQUEUE_BROKER_TOKENS``::

    [[tokens]]
    name = "etl"                      # unique; what logs and errors show, never the secret
    sha256 = "9f86d081884c7d65..."    # hex SHA-256 of the secret (or: secret = "...")
    roles = ["produce", "consume"]    # any of admin, produce, consume, monitor, broker
    topics = ["orders*", "audit"]     # optional fnmatch patterns; default: every topic

Clients send the secret as ``authorization: Bearer <secret>`` metadata. A call
without a known secret gets UNAUTHENTICATED; one whose token lacks the role the
method needs, or names a topic outside the token's patterns, gets
PERMISSION_DENIED. Roles: ``consume`` covers the Broker service's read side
(Pull, PullStream, offsets, heartbeats, ListOffsets, OffsetForBytes, and Nack,
which gives a consumed message back to its group's retry topic); ``produce``
its write side (Produce, ProduceStream, CommitTransactions, AbortTransactions,
CancelDelayed, and TransactionChecks, a producer group's check-back stream);
``admin`` the Admin service and, being the operator's role, everything else
(DescribeTopic and GetSchema are open to the produce and consume roles too:
clients read a topic's queues and schemas; SetSchema, SetCompatibility and
DeleteSchemas need admin); ``monitor`` the read-only figures (``MONITOR_METHODS``:
GetStats, ListTopics, DescribeTopic, ListGroups, DescribeGroup,
ListTransactions, ListOffsets, GetSchema; never message contents such as
GetMessage, QueryMessages or dead letters, nor anything that writes), within
its topic patterns like every role.
``broker`` is a broker's token to its name servers (namesrv/auth.py: only it
may register, unregister and report a role there); on a broker it grants
nothing, so a broker token that should also produce, consume or administer
lists those roles too. Topic patterns restrict every call of every role, admin
included: the interceptor checks the topics a request names (on every request
of a stream, ``topics_of``); what a call reaches without naming it is checked
by its handler with ``scoped``: a consumer group's topics (every group call
needs a token covering all of them, ``BrokerState.check_group``), the topic of
a message fetched by id, and the listings, cut to the token's topics. The
transaction calls name no topic, their messages were checked when staged, and
the transaction ids, sinks and prefixes of any token but an admin one for every
topic are put in its own namespace (``<name>@``), so tokens cannot touch each
other's transactions. Health checks need no token (probes), nor does
``Membership.Identify`` (membership.py: a group member's name, role and epoch,
what name servers and the group's members check a claim against); server
reflection needs a valid one.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from equeue_broker.server.errors import BadRequest, PermissionDenied, Unauthenticated, abort
from equeue_broker.server.handlers import MethodHandler, rebuild, wrap_requests
from equeue_broker.server.tokens import (
    BROKER_ROLE,
    ROLES,
    Principal,
    TokenFileError,
    bearer,
)
from equeue_broker.server.tokens import TokenTable as _TokenTable
from equeue_proto.v1 import broker_pb2 as pb

_BROKER = "/equeue.v1.Broker/"
_ADMIN = "/equeue.v1.Admin/"
_OPEN = ("/grpc.health.v1.Health/", "/equeue.v1.Membership/")
"""Services every caller may use without a token."""
METHOD_ROLES = {
    **{_BROKER + m: "produce" for m in (
        "Produce", "ProduceStream", "CommitTransactions", "AbortTransactions", "InitProducer",
        "CancelDelayed", "TransactionChecks",
    )},
    **{_BROKER + m: "consume" for m in (
        "Pull", "PullStream", "CommitOffsets", "FetchOffsets", "Heartbeat", "ListOffsets",
        "OffsetForBytes", "Nack",
    )},
}  # fmt: skip
"""The role each Broker method needs; every Admin method needs ``admin``."""
MONITOR_METHODS = frozenset({
    *(_ADMIN + m for m in (
        "GetStats", "ListTopics", "DescribeTopic", "ListGroups", "DescribeGroup",
        "ListTransactions", "GetSchema",
    )),
    _BROKER + "ListOffsets",
})  # fmt: skip
"""Read-only calls a ``monitor`` token may make besides their own role's
callers: figures, no message contents, no writes."""


__all__ = [
    "BROKER_ROLE", "METHOD_ROLES", "MONITOR_METHODS", "ROLES", "AuthInterceptor", "Principal",
    "TokenFileError",
    "TokenTable", "bearer", "scoped",
]  # fmt: skip


class TokenTable(_TokenTable):
    """The broker's token table: a bad document is a ``BadRequest`` (tokens.py)."""

    error = BadRequest


def scoped(tokens: TokenTable | None, metadata: Any) -> Principal | None:
    """The caller's token if it is limited to some topics; None: it may use every
    topic (or authentication is off). For handlers whose checks need broker state
    (a group's topics, a message's topic, listings); the interceptor has already
    refused calls without a valid token."""
    if tokens is None:
        return None
    secret = bearer(metadata)
    principal = tokens.lookup(secret) if secret else None
    if principal is None or principal.topics is None:
        return None
    return principal


_NAMED_TOPIC = (
    pb.CreateTopicRequest, pb.DeleteTopicRequest, pb.DescribeTopicRequest, pb.AddQueuesRequest,
    pb.SetQueueVisibilityRequest, pb.DeleteQueueRequest,
)  # fmt: skip
"""Admin requests whose ``name`` is a topic."""


def topics_of(request: Any) -> list[str]:
    """The topics a request names. Calls that reach topics without naming them
    (a group's, a message id's, listings) are checked by their handlers
    (``BrokerState.scope``)."""
    if isinstance(request, pb.CommitOffsetsRequest):
        return [o.topic for o in request.offsets]
    if isinstance(request, pb.NackRequest):  # the retry topics come with the group
        return [e.topic for e in request.entries if not e.topic.startswith("%")]
    if isinstance(request, pb.HeartbeatRequest):
        return list(request.topics) + [r.topic for r in request.released]
    if isinstance(request, pb.FetchOffsetsRequest) and not request.topic:
        raise PermissionDenied("a topic-scoped token must name the topic of FetchOffsets")
    if isinstance(request, _NAMED_TOPIC):
        return [request.name]
    if isinstance(request, pb.GetMessageRequest):
        return [request.address.topic] if request.HasField("address") else []
    topic = getattr(request, "topic", None)
    return [topic] if isinstance(topic, str) else []


_TRANSACTION_METHODS = frozenset(m for m, role in METHOD_ROLES.items() if role == "produce")
"""Methods carrying transaction ids: exactly the produce-role ones."""


def namespace_transactions(principal: Principal, request: Any) -> None:
    """Put the token's name in front of every transaction id, sink and abort
    prefix a non-admin token sends (``<name>@<id>``), so one token's writers
    cannot commit, abort or fence another's; an admin token sees and uses the
    full ids."""
    mine = f"{principal.name}@"
    if isinstance(request, pb.ProduceRequest):
        if request.transaction_id:
            request.transaction_id = mine + request.transaction_id
    elif isinstance(request, pb.CommitTransactionsRequest):
        for ref in request.transactions:
            ref.transaction_id = mine + ref.transaction_id
        if request.sink:
            request.sink = mine + request.sink
        if request.abort_prefix:
            request.abort_prefix = mine + request.abort_prefix
    elif isinstance(request, pb.AbortTransactionsRequest):
        request.transaction_ids[:] = [mine + t for t in request.transaction_ids]
        if request.prefix:
            request.prefix = mine + request.prefix


def check_topics(principal: Principal, request: Any) -> None:
    for topic in topics_of(request):
        principal.check_topic(topic)


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Authenticates every call (see the module doc) before its handler runs."""

    def __init__(self, tokens: TokenTable) -> None:
        self.tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[MethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> MethodHandler:
        handler = await continuation(details)
        method = details.method
        if handler is None or method.startswith(_OPEN):
            return handler
        secret = bearer(details.invocation_metadata)
        principal = self.tokens.lookup(secret) if secret else None
        if principal is None:
            return _refuse(handler, Unauthenticated("missing or unknown token"))
        role = _role_for(method, principal)
        if role is not None and not principal.may(role):
            name = method.rsplit("/", 1)[-1]
            return _refuse(
                handler,
                PermissionDenied(f"token {principal.name!r} lacks role {role!r} for {name}"),
            )
        checks: list[Callable[[Any], None]] = []
        if principal.topics is not None and role is not None:  # admin's patterns bind too
            checks.append(functools.partial(check_topics, principal))
        if method in _TRANSACTION_METHODS and not principal.sees_every_transaction():
            checks.append(functools.partial(namespace_transactions, principal))
        if not checks:
            return handler

        def check_all(request: Any) -> None:
            for check in checks:
                check(request)

        return wrap_requests(handler, check_all)


DESCRIBE_TOPIC = _ADMIN + "DescribeTopic"
"""Also open to the produce and consume roles (for their topics): a client
learns a topic's queues from it, as a Kafka client reads topic metadata."""
GET_SCHEMA = _ADMIN + "GetSchema"
"""Also open to the produce and consume roles (for their topics): producers
encode with a topic's schema and consumers decode with it."""
_CLIENT_READS = frozenset({DESCRIBE_TOPIC, GET_SCHEMA})


def _role_for(method: str, principal: Principal) -> str | None:
    """The role ``method`` needs from ``principal`` (None: none): the method's
    own, else one of the roles that may also call it (a produce or consume
    token reading a topic's queues or schema, a monitor token's reads) that
    the token has."""
    role = "admin" if method.startswith(_ADMIN) else METHOD_ROLES.get(method)
    if role is None or principal.may(role):
        return role
    if method in _CLIENT_READS:
        for other in ("produce", "consume"):
            if principal.may(other):
                return other
    if method in MONITOR_METHODS and principal.may("monitor"):
        return "monitor"
    return role


def _refuse(handler: MethodHandler, error: Exception) -> MethodHandler:
    """A handler of the same kind that answers with ``error``'s status."""

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await abort(context, error)

    async def streaming(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        nothing: Any
        for nothing in ():  # a yield makes this an async generator, as the handler must be
            yield nothing
        await abort(context, error)

    return rebuild(handler, unary, streaming)
