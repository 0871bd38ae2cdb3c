"""The name server's TLS and tokens: the broker's, with a role for brokers.

Tokens (``--tokens-file`` or ``$EQUEUE_NAMESRV_TOKENS``) use the broker's
file format (server/tokens.py). With tokens on:

- ``RegisterBroker`` and ``UnregisterBroker`` (what moves routes and reports
  roles) need a token with the ``broker`` role (``admin`` does not imply it):
  none is UNAUTHENTICATED, another token PERMISSION_DENIED;
- ``GetRoute`` and ``ListBrokers`` (and server reflection) need any valid
  token; ``GetRoute`` of a topic outside a token's topic patterns is
  PERMISSION_DENIED (servicer: ``NameServerService.GetRoute``);
- health checks need none (probes);
- ``may_read_metrics`` is the check for reading the name server's metrics
  (issue 30's HTTP endpoint): the ``monitor`` role, which ``admin`` implies.

Without tokens every call is open, as before; a registration's claim is
checked with the address it names either way (claims.py).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from equeue_broker.namesrv.config import NameServerConfig
from equeue_broker.server.tokens import BROKER_ROLE, Principal, TokenTable, bearer

TOKENS_ENV = "EQUEUE_NAMESRV_TOKENS"
METRICS_ROLE = "monitor"
"""The role a token needs to read the name server's metrics (as the broker's)."""
_SERVICE = "/equeue.v1.NameServer/"
BROKER_METHODS = frozenset(_SERVICE + m for m in ("RegisterBroker", "UnregisterBroker"))
"""What only a broker token may call."""
_OPEN = "/grpc.health.v1.Health/"

MethodHandler = Any
"""A ``grpc.RpcMethodHandler`` of an aio server (grpc-stubs types only sync ones)."""


def load_tokens(config: NameServerConfig) -> TokenTable | None:
    """The tokens of ``tokens_file``, else of ``$EQUEUE_NAMESRV_TOKENS``; None:
    no authentication. ``OSError`` (unreadable file) or ``TokenFileError``."""
    if config.tokens_file:
        try:
            text = Path(config.tokens_file).read_text()
        except OSError as exc:
            raise OSError(f"cannot read tokens file: {exc}") from None
        return TokenTable.parse(text, config.tokens_file)
    text = os.environ.get(TOKENS_ENV, "")
    return TokenTable.parse(text, f"${TOKENS_ENV}") if text else None


def server_credentials(config: NameServerConfig) -> grpc.ServerCredentials | None:
    """TLS for the name server's port (None: plaintext); ``OSError`` if a file
    cannot be read."""
    if not config.tls_cert:
        return None
    try:
        chain = Path(config.tls_cert).read_bytes()
        key = Path(config.tls_key).read_bytes()
        client_ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
    except OSError as exc:
        raise OSError(f"cannot read TLS files: {exc}") from None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def broker_credentials(config: NameServerConfig) -> grpc.ChannelCredentials | None:
    """TLS for the name server's calls to brokers (None: plaintext)."""
    if not config.broker_tls_ca:
        return None
    try:
        ca = Path(config.broker_tls_ca).read_bytes()
        cert = Path(config.broker_tls_cert).read_bytes() if config.broker_tls_cert else None
        key = Path(config.broker_tls_key).read_bytes() if config.broker_tls_key else None
    except OSError as exc:
        raise OSError(f"cannot read the brokers' TLS files: {exc}") from None
    return grpc.ssl_channel_credentials(ca, key, cert)


def principal_of(tokens: TokenTable | None, metadata: Any) -> Principal | None:
    """The caller's token (None: authentication off, or no valid token)."""
    if tokens is None:
        return None
    secret = bearer(metadata)
    return tokens.lookup(secret) if secret else None


class NameServerAuth(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Authenticates every call but health checks (see the module doc)."""

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
        principal = principal_of(self.tokens, details.invocation_metadata)
        if principal is None:
            return _refuse(handler, grpc.StatusCode.UNAUTHENTICATED, "missing or unknown token")
        if method in BROKER_METHODS and BROKER_ROLE not in principal.roles:
            name = method.rsplit("/", 1)[-1]
            return _refuse(
                handler,
                grpc.StatusCode.PERMISSION_DENIED,
                f"token {principal.name!r} lacks role {BROKER_ROLE!r} for {name}",
            )
        return handler


def _refuse(handler: MethodHandler, code: grpc.StatusCode, message: str) -> MethodHandler:
    """A handler of ``handler``'s kind that answers ``code`` with ``message``."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)

    async def refuse_stream(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        nothing: Any
        for nothing in ():  # a yield makes this an async generator, as the handler must be
            yield nothing
        await context.abort(code, message)

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(
        refuse_stream if handler.response_streaming else refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def may_read_metrics(principal: Principal) -> bool:
    """Whether ``principal``'s token may read the metrics: ``monitor`` or ``admin``."""
    return principal.may(METRICS_ROLE)
