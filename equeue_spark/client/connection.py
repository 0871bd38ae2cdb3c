"""One gRPC channel to a broker, with deadlines and retries on every call."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client.errors import EqueueError, from_rpc_error

T = TypeVar("T")

DEFAULT_BROKER = "127.0.0.1:5000"
BROKER_ENV = "EQUEUE_BROKER"
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

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")

    @property
    def target(self) -> str:
        return self.broker or default_broker()


class Connection:
    """A channel plus the two service stubs; closes with ``close()`` or ``with``."""

    def __init__(self, config: ClientConfig | None = None) -> None:
        self.config = config or ClientConfig()
        self.channel = grpc.insecure_channel(
            self.config.target,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self.broker = pb_grpc.BrokerStub(self.channel)
        self.admin = pb_grpc.AdminStub(self.channel)

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


__all__ = ["ClientConfig", "Connection", "EqueueError", "default_broker"]
