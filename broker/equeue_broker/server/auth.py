"""Token authentication and role/topic authorization (off unless tokens are configured).

Tokens come from a TOML document: the file given with ``--tokens-file``, or the
text of ``$EQUEUE_BROKER_TOKENS``::

    [[tokens]]
    name = "etl"                      # unique; what logs and errors show, never the secret
    sha256 = "9f86d081884c7d65..."    # hex SHA-256 of the secret (or: secret = "...")
    roles = ["produce", "consume"]    # any of admin, produce, consume
    topics = ["orders*", "audit"]     # optional fnmatch patterns; default: every topic

Clients send the secret as ``authorization: Bearer <secret>`` metadata. A call
without a known secret gets UNAUTHENTICATED; one whose token lacks the role the
method needs, or names a topic outside the token's patterns, gets
PERMISSION_DENIED. Roles: ``consume`` covers the Broker service's read side
(Pull, PullStream, offsets, heartbeats, ListOffsets, OffsetForBytes);
``produce`` its write side (Produce, ProduceStream, CommitTransactions,
AbortTransactions); ``admin`` the Admin service and, being the operator's role,
everything else. Topic patterns restrict every call of every role, admin
included: the interceptor checks the topics a request names (on every request
of a stream, ``topics_of``); what a call reaches without naming it is checked
by its handler with ``scoped``: a consumer group's topics (every group call
needs a token covering all of them, ``BrokerState.check_group``), the topic of
a message fetched by id, and the listings, cut to the token's topics. The
transaction calls name no topic, their messages were checked when staged, and
the transaction ids, sinks and prefixes of any token but an admin one for
every topic are put in its own namespace (``<name>@``), so tokens cannot
touch each other's transactions. Health checks need no token (probes);
server reflection needs a valid one.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import re
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from equeue_broker.server.errors import BadRequest, PermissionDenied, Unauthenticated, abort
from equeue_broker.server.handlers import MethodHandler, rebuild, wrap_requests
from equeue_proto.v1 import broker_pb2 as pb

ROLES = ("admin", "produce", "consume")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""Token names: they prefix the token's transaction ids (``namespace_transactions``)."""
MAX_TOKENS = 10_000
_BROKER = "/equeue.v1.Broker/"
_ADMIN = "/equeue.v1.Admin/"
_OPEN = "/grpc.health.v1.Health/"
METHOD_ROLES = {
    **{_BROKER + m: "produce" for m in (
        "Produce", "ProduceStream", "CommitTransactions", "AbortTransactions",
    )},
    **{_BROKER + m: "consume" for m in (
        "Pull", "PullStream", "CommitOffsets", "FetchOffsets", "Heartbeat", "ListOffsets",
        "OffsetForBytes",
    )},
}  # fmt: skip
"""The role each Broker method needs; every Admin method needs ``admin``."""


@dataclass(frozen=True)
class Principal:
    """Who a valid token speaks for."""

    name: str
    roles: frozenset[str]
    topics: tuple[str, ...] | None
    """fnmatch patterns; None = every topic."""

    def may(self, role: str) -> bool:
        return role in self.roles or "admin" in self.roles

    def may_use_topic(self, topic: str) -> bool:
        return self.topics is None or any(fnmatch.fnmatchcase(topic, p) for p in self.topics)

    def check_topic(self, topic: str) -> None:
        if not self.may_use_topic(topic):
            raise PermissionDenied(f"token {self.name!r} may not use topic {topic!r}")

    def sees_every_transaction(self) -> bool:
        """Only an admin token for every topic works outside its own transaction
        namespace: a topic-scoped admin could otherwise abort or fence other
        teams' transactions."""
        return "admin" in self.roles and self.topics is None


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


class TokenTable:
    """Secrets (by SHA-256) to principals."""

    def __init__(self, principals: dict[str, Principal]) -> None:
        self._by_digest = principals

    def __len__(self) -> int:
        return len(self._by_digest)

    @classmethod
    def parse(cls, text: str, source: str) -> TokenTable:
        """Parse a tokens document; ``BadRequest`` naming ``source`` and the entry."""
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise BadRequest(f"{source}: not valid TOML: {exc}") from None
        entries = document.get("tokens")
        unknown = sorted(set(document) - {"tokens"})
        if unknown or not isinstance(entries, list) or not entries:
            raise BadRequest(f"{source}: expected one or more [[tokens]] tables only")
        if len(entries) > MAX_TOKENS:
            raise BadRequest(f"{source}: {len(entries)} tokens; the limit is {MAX_TOKENS}")
        principals: dict[str, Principal] = {}
        names: set[str] = set()
        for n, entry in enumerate(entries):
            digest, principal = _parse_entry(entry, f"{source}: token {n + 1}")
            if digest in principals:
                raise BadRequest(f"{source}: token {principal.name!r} repeats another's secret")
            # A name is a transaction namespace (``<name>@``) and what logs and
            # errors show: two tokens sharing one could commit each other's work.
            if principal.name in names:
                raise BadRequest(
                    f"{source}: token {n + 1}: the name {principal.name!r} is already taken "
                    "by another token; give each token its own name"
                )
            names.add(principal.name)
            principals[digest] = principal
        return cls(principals)

    def lookup(self, secret: str) -> Principal | None:
        # Looked up by digest: what an attacker varies (the secret) is not what
        # the dict compares, so response times say nothing about a near miss.
        return self._by_digest.get(hashlib.sha256(secret.encode()).hexdigest())


def _parse_entry(entry: Any, where: str) -> tuple[str, Principal]:
    if not isinstance(entry, dict):
        raise BadRequest(f"{where}: not a table")
    unknown = sorted(set(entry) - {"name", "sha256", "secret", "roles", "topics"})
    if unknown:
        raise BadRequest(f"{where}: unknown keys {', '.join(unknown)}")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BadRequest(f"{where}: give a name of 1-64 ASCII letters, digits, '.', '_', '-'")
    secret, digest = entry.get("secret"), entry.get("sha256")
    if (secret is None) == (digest is None):
        raise BadRequest(f"{where} ({name!r}): give exactly one of secret and sha256")
    if secret is not None:
        if not isinstance(secret, str) or len(secret) < 16:
            raise BadRequest(f"{where} ({name!r}): a secret needs at least 16 characters")
        digest = hashlib.sha256(secret.encode()).hexdigest()
    elif not isinstance(digest, str) or len(digest) != 64 or not _is_hex(digest):
        raise BadRequest(f"{where} ({name!r}): sha256 must be 64 hex digits")
    roles = entry.get("roles")
    if not isinstance(roles, list) or not roles or not set(roles) <= set(ROLES):
        raise BadRequest(f"{where} ({name!r}): roles must be a list from {', '.join(ROLES)}")
    topics = entry.get("topics")
    if topics is not None and (
        not isinstance(topics, list) or not all(isinstance(t, str) and t for t in topics)
    ):
        raise BadRequest(f"{where} ({name!r}): topics must be a list of patterns")
    return digest.lower(), Principal(
        name, frozenset(roles), None if topics is None else tuple(topics)
    )


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


def bearer(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return None


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
        role = "admin" if method.startswith(_ADMIN) else METHOD_ROLES.get(method)
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
