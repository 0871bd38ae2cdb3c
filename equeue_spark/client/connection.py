"""One gRPC channel to a broker, with deadlines and retries on every call."""

from __future__ import annotations

import collections
import dataclasses
import ipaddress
import os
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client.errors import EqueueError, InvalidAddress, from_rpc_error
from equeue_spark.client.wire import PullReply, parse_pull_reply

T = TypeVar("T")

DEFAULT_BROKER = "127.0.0.1:5000"
BROKER_ENV = "EQUEUE_BROKER"
NAMESRV_ENV = "EQUEUE_NAMESRV"
MAX_NAMESRVS = 16
TOKEN_ENV = "EQUEUE_TOKEN"
TLS_CA_ENV = "EQUEUE_TLS_CA"
TLS_CERT_ENV = "EQUEUE_TLS_CERT"
TLS_KEY_ENV = "EQUEUE_TLS_KEY"
MAX_MESSAGE_BYTES = 80 * 1024 * 1024


def default_broker() -> str:
    """``$EQUEUE_BROKER``, else 127.0.0.1:5000."""
    return os.environ.get(BROKER_ENV, DEFAULT_BROKER)


_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?")


def check_address(address: str, source: str = "broker address") -> str:
    """``address`` without surrounding blanks if it is one ``HOST:PORT``
    (``[IPv6]:PORT`` for IPv6), else ``InvalidAddress`` naming ``source`` and
    the value. The one check of the client, the CLI and the Spark connector:
    gRPC would dial port 443 for a missing port, wrap ``:99999`` to 34463 and
    fail a comma-separated list late with a DNS error.
    """
    text = address.strip()

    def bad(why: str) -> InvalidAddress:
        reason = f"{why}; give one HOST:PORT, e.g. 127.0.0.1:5000"
        return InvalidAddress(f"{source} {address!r} {reason}", address, reason)

    if not text:
        raise bad("is empty")
    if "," in text or any(c.isspace() for c in text):
        raise bad("is not one address (equeue connects to one broker)")
    if text.startswith("["):  # [IPv6]:port
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise bad("has no port after the bracketed host")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad(f"has {host!r} in brackets, which is not an IPv6 address") from None
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            raise bad("has no port")
        if ":" in host:
            raise bad("has more than one ':' (write an IPv6 host in brackets, e.g. [::1]:5000)")
        if not _HOSTNAME.fullmatch(host):
            raise bad("has no host" if not host else f"has host {host!r}, not a host name or IP")
    if not (port.isascii() and port.isdigit()):
        raise bad(f"has port {port!r}, not a number")
    if not 1 <= int(port) <= 65535:
        raise bad(f"has port {port}, outside 1-65535")
    return text


def parse_namesrv(value: str | Sequence[str], source: str = "namesrv") -> tuple[str, ...]:
    """Name server addresses from ``HOST:PORT[,HOST:PORT...]`` or a list of
    them, each checked; ``InvalidAddress`` naming ``source`` and the value."""
    items = value.split(",") if isinstance(value, str) else list(value)
    addresses = tuple(check_address(a, f"{source} address") for a in items if a.strip())
    if not addresses:
        reason = "names no name server; give HOST:PORT[,HOST:PORT...]"
        raise InvalidAddress(f"{source} {value!r} {reason}", str(value), reason)
    if len(addresses) > MAX_NAMESRVS:
        reason = f"names {len(addresses)} name servers; the limit is {MAX_NAMESRVS}"
        raise InvalidAddress(f"{source} {reason}", str(value), reason)
    return addresses


def resolve_address(broker: str = "") -> tuple[str, str]:
    """(address, where it came from) for a broker setting, empty meaning the
    default: ``$EQUEUE_BROKER``, else 127.0.0.1:5000."""
    if broker:
        return broker, "broker address"
    if BROKER_ENV in os.environ:
        return os.environ[BROKER_ENV], f"${BROKER_ENV}"
    return DEFAULT_BROKER, "default broker address"


@dataclass(frozen=True)
class ClientConfig:
    """Connection settings shared by Producer, Consumer and Admin."""

    broker: str = ""
    """host:port; empty means ``default_broker()`` (unless name servers are given)."""
    namesrv: str | Sequence[str] = ""
    """Name servers of a cluster (``HOST:PORT[,HOST:PORT...]`` or a list): the
    alternative to ``broker``. Empty means ``$EQUEUE_NAMESRV`` when ``broker``
    is empty too; ``$EQUEUE_NAMESRV`` wins over ``$EQUEUE_BROKER``."""
    route_refresh_s: float = 30.0
    """A cached topic route older than this is fetched again at its next use
    (and at once after an error); with every name server down the cached
    route keeps serving."""
    read_from_replicas: bool = False
    """Cluster only: read (pull, list offsets, fetch group offsets) from a
    replica of each broker group, chosen deterministically, falling back to
    the master when no replica is live. False: read from the master, and from
    a replica only while the master cannot be reached. Writes and offset
    commits always go to the master."""
    failover_timeout_s: float = 30.0
    """Cluster only: how long a write (a produce, a staged transaction part)
    that meets an unreachable master, or a replica that refuses writes, keeps
    refreshing the route and retrying on the group's master before it fails."""
    timeout_s: float = 30.0
    """Deadline of every call (a long poll adds its wait to it)."""
    retries: int = 5
    """Extra attempts for retriable failures (UNAVAILABLE, DEADLINE_EXCEEDED)."""
    backoff_s: float = 0.1
    """First retry delay; doubles each attempt, with jitter, up to ``max_backoff_s``."""
    max_backoff_s: float = 2.0
    retries_within_timeout: bool = False
    """True: a call's retries share its deadline (``timeout_s``), so a call that
    keeps failing fails within it (each attempt gets what is left, backoffs
    end at it). False: every attempt has the full deadline. The Spark
    connector sets it: its ``timeoutMs`` bounds a failure, not one attempt."""
    token: str | None = field(default=None, repr=False)
    """Access token sent with every call, to brokers and name servers alike;
    None means ``$EQUEUE_TOKEN`` (if set)."""
    tls: bool | None = None
    """Use TLS; None means "if a CA is given" (``tls_ca`` or ``$EQUEUE_TLS_CA``)."""
    tls_ca: str | None = None
    """PEM file of the CA that signed the broker's (and the name servers')
    certificate; None means ``$EQUEUE_TLS_CA``, and "" the system's roots.
    Name servers get the same TLS settings as brokers (``open_channel``)."""
    tls_cert: str | None = None
    """PEM client certificate for mutual TLS (else ``$EQUEUE_TLS_CERT``)."""
    tls_key: str | None = field(default=None, repr=False)
    """PEM private key of ``tls_cert`` (else ``$EQUEUE_TLS_KEY``)."""

    def __post_init__(self) -> None:
        if self.broker and self.namesrv:
            raise ValueError("give a broker or name servers (namesrv), not both")
        if not self.namesrvs():  # checked at once, not at the first call
            check_address(*resolve_address(self.broker))
        if self.route_refresh_s <= 0:
            raise ValueError(f"route_refresh_s must be positive, got {self.route_refresh_s}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if not 0 <= self.failover_timeout_s <= 3600:
            raise ValueError(
                f"failover_timeout_s must be 0-3600 seconds, got {self.failover_timeout_s}"
            )
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")

    def namesrvs(self) -> tuple[str, ...]:
        """The name servers to use, () for one broker: ``namesrv``, else (with
        no ``broker``) ``$EQUEUE_NAMESRV``."""
        if self.namesrv:
            return parse_namesrv(self.namesrv)
        if not self.broker and os.environ.get(NAMESRV_ENV, "").strip():
            return parse_namesrv(os.environ[NAMESRV_ENV], f"${NAMESRV_ENV}")
        return ()

    @property
    def is_cluster(self) -> bool:
        return bool(self.namesrvs())

    def for_broker(self, address: str) -> ClientConfig:
        """These settings for one broker of a cluster."""
        return dataclasses.replace(self, broker=address, namesrv=())

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
        return check_address(*resolve_address(self.broker))


def open_channel(config: ClientConfig, target: str) -> tuple[grpc.Channel, grpc.Channel]:
    """(the channel to ``target``, the channel to call through) with
    ``config``'s security: TLS credentials (``credentials()``) and the token
    (``resolved_token()``) on every call. The one way the client dials
    anything: a broker (``Connection``) or a name server (cluster.py's
    ``NameServerRoutes``). Close the first; ``ValueError`` for an unreadable
    TLS file."""
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    credentials = config.credentials()
    if credentials is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        channel = grpc.secure_channel(target, credentials, options=options)
    token = config.resolved_token()
    calls = grpc.intercept_channel(channel, TokenInterceptor(token)) if token else channel
    return channel, calls


MIN_ATTEMPT_S = 0.001
"""An attempt's smallest deadline (``retries_within_timeout``): the first attempt
always gets the whole timeout; a later one at least this."""


class Connection:
    """A channel plus the two service stubs; closes with ``close()`` or ``with``."""

    def __init__(self, config: ClientConfig | None = None) -> None:
        self.config = config or ClientConfig()
        # The raw channel is kept for close(); calls go through the token interceptor.
        self.channel, calls = open_channel(self.config, self.config.target)
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
        deadline = time.monotonic() + timeout if config.retries_within_timeout else None
        for attempt in range(attempts):
            left = timeout if deadline is None else deadline - time.monotonic()
            try:
                return method(request, timeout=max(left, MIN_ATTEMPT_S))
            except grpc.RpcError as exc:
                error = from_rpc_error(exc)
                pause = delay * (0.5 + random.random())  # jitter spreads reconnects
                out_of_time = deadline is not None and time.monotonic() + pause >= deadline
                if not error.retriable or attempt == attempts - 1 or out_of_time:
                    raise error from exc
            time.sleep(pause)
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


__all__ = [
    "ClientConfig",
    "Connection",
    "EqueueError",
    "check_address",
    "default_broker",
    "open_channel",
    "parse_namesrv",
    "resolve_address",
]
