"""One gRPC channel to a broker, with deadlines and retries on every call."""

from __future__ import annotations

import collections
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client.errors import EqueueError, from_rpc_error
from equeue_spark.client.wire import PullReply, parse_pull_reply

T = TypeVar("T")

DEFAULT_BROKER = "127.0.0.1:5000"
BROKER_ENV = "EQUEUE_BROKER"
TOKEN_ENV = "EQUEUE_TOKEN"
TLS_CA_ENV = "EQUEUE_TLS_CA"
TLS_CERT_ENV = "EQUEUE_TLS_CERT"
TLS_KEY_ENV = "EQUEUE_TLS_KEY"
MAX_MESSAGE_BYTES = 80 * 1024 * 1024


def default_broker() -> str:
    """``$EQUEUE_BROKER``, else 127.0.0.1:5000."""
    return os.environ.get(BROKER_ENV, DEFAULT_BROKER)


@dataclass(frozen=True)
class ClientConfig:
    """Connection settings shared by Producer, Consumer and Admin."""

    broker: str = ""
    """host:port; empty means ``default_broker()``."""
    timeout_s: float = 30.0
    """Deadline of every call (a long poll adds its wait to it)."""
    retries: int = 5
    """Extra attempts for retriable failures (UNAVAILABLE, DEADLINE_EXCEEDED)."""
    backoff_s: float = 0.1
    """First retry delay; doubles each attempt, with jitter, up to ``max_backoff_s``."""
    max_backoff_s: float = 2.0
    token: str | None = field(default=None, repr=False)
    """Access token sent with every call; None means ``$EQUEUE_TOKEN`` (if set)."""
    tls: bool | None = None
    """Use TLS; None means "if a CA is given" (``tls_ca`` or ``$EQUEUE_TLS_CA``)."""
    tls_ca: str | None = None
    """PEM file of the CA that signed the broker's certificate; None means
    ``$EQUEUE_TLS_CA``, and "" the system's roots."""
    tls_cert: str | None = None
    """PEM client certificate for mutual TLS (else ``$EQUEUE_TLS_CERT``)."""
    tls_key: str | None = field(default=None, repr=False)
    """PEM private key of ``tls_cert`` (else ``$EQUEUE_TLS_KEY``)."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")

    def resolved_token(self) -> str:
        return os.environ.get(TOKEN_ENV, "") if self.token is None else self.token

    def credentials(self) -> grpc.ChannelCredentials | None:
        """Channel credentials for TLS, or None for plaintext."""
        ca = os.environ.get(TLS_CA_ENV) if self.tls_ca is None else self.tls_ca
        cert = os.environ.get(TLS_CERT_ENV) if self.tls_cert is None else self.tls_cert
        key = os.environ.get(TLS_KEY_ENV) if self.tls_key is None else self.tls_key
        if not (self.tls if self.tls is not None else bool(ca)):
            return None
        if bool(cert) != bool(key):
            raise ValueError("give both a TLS client certificate and its key, or neither")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(ca, "TLS CA"),
            private_key=_read(key, "TLS client key"),
            certificate_chain=_read(cert, "TLS client certificate"),
        )

    @property
    def target(self) -> str:
        return self.broker or default_broker()


class Connection:
    """A channel plus the two service stubs; closes with ``close()`` or ``with``."""

    def __init__(self, config: ClientConfig | None = None) -> None:
        self.config = config or ClientConfig()
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        credentials = self.config.credentials()
        if credentials is None:
            self.channel = grpc.insecure_channel(self.config.target, options=options)
        else:
            self.channel = grpc.secure_channel(self.config.target, credentials, options=options)
        token = self.config.resolved_token()
        # The raw channel is kept for close(); calls go through the token interceptor.
        calls = (
            grpc.intercept_channel(self.channel, TokenInterceptor(token)) if token else self.channel
        )
        self.broker = pb_grpc.BrokerStub(calls)
        self.admin = pb_grpc.AdminStub(calls)
        # Pulls decode their replies with wire.py: the records stay in the
        # received message instead of being copied out by protobuf.
        self.pull: grpc.UnaryUnaryMultiCallable[pb.PullRequest, PullReply] = calls.unary_unary(
            "/equeue.v1.Broker/Pull",
            request_serializer=pb.PullRequest.SerializeToString,
            response_deserializer=parse_pull_reply,
        )
        self.pull_stream: grpc.UnaryStreamMultiCallable[pb.PullStreamRequest, PullReply] = (
            calls.unary_stream(
                "/equeue.v1.Broker/PullStream",
                request_serializer=pb.PullStreamRequest.SerializeToString,
                response_deserializer=parse_pull_reply,
            )
        )

    def call(
        self,
        method: Callable[..., T],
        request: Any,
        *,
        timeout_s: float | None = None,
        retry: bool = True,
    ) -> T:
        """Call ``method(request)`` with a deadline, retrying retriable failures
        with exponential backoff; raise the mapped ``EqueueError`` otherwise.

        ``retry=False`` for calls that must not be repeated blindly.
        """
        config = self.config
        timeout = config.timeout_s if timeout_s is None else timeout_s
        attempts = 1 + (config.retries if retry else 0)
        delay = config.backoff_s
        for attempt in range(attempts):
            try:
                return method(request, timeout=timeout)
            except grpc.RpcError as exc:
                error = from_rpc_error(exc)
                if not error.retriable or attempt == attempts - 1:
                    raise error from exc
            time.sleep(delay * (0.5 + random.random()))  # jitter spreads reconnects
            delay = min(delay * 2, config.max_backoff_s)
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read(path: str | None, what: str) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {path!r}: {exc.strerror}") from None


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    """``grpc.ClientCallDetails`` with fields (the grpc class has none to copy)."""


class TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds ``authorization: Bearer <token>`` to every call (the broker's auth.py)."""

    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def __repr__(self) -> str:
        return "TokenInterceptor(<token>)"

    def _with_token(self, details: Any) -> _CallDetails:
        return _CallDetails(
            details.method,
            details.timeout,
            (*(details.metadata or ()), *self._metadata),
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)


__all__ = ["ClientConfig", "Connection", "EqueueError", "default_broker"]
