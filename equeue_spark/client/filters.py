"""Filter expressions on the client: checked early, and only sent to brokers that apply them.

A consumer's or a range read's ``filter`` (``equeue_proto.selector``: RocketMQ's
SQL92 subset over tags, keys and headers) is parsed here first, so a bad one
fails where it is given (``InvalidRequest`` naming the position) rather than at
the first pull. A broker older than filters ignores the unknown request field
and would send every record: before a connection's first filtered read the
client asks the broker (``BrokerStats.features`` has "filter"; a token without
the admin role cannot read stats, so then a pull with an unparsable filter
tells: a broker that applies filters refuses it as ``bad-filter``).
"""

from __future__ import annotations

import threading
import weakref

import grpc

from equeue_proto.protocol import ERROR_KIND_KEY
from equeue_proto.selector import ERROR_KIND, SelectorError, parse
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.connection import Connection
from equeue_spark.client.errors import (
    EqueueError,
    InvalidRequest,
    PermissionDeniedError,
    from_rpc_error,
)

FEATURE = "filter"
"""The ``BrokerStats.features`` word of brokers that apply ``filter``."""
_PROBE = "("
"""A filter no broker that applies filters accepts."""

_checked: weakref.WeakKeyDictionary[Connection, bool] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def check_filter(text: str) -> str:
    """``text`` if it is a valid filter expression ("" = none), else ``InvalidRequest``
    with the parser's message (``filter: ... at position N: ...``)."""
    if not isinstance(text, str):
        raise InvalidRequest(f"filter must be a string, got {type(text).__name__}")
    if text:
        try:
            parse(text)
        except SelectorError as exc:
            raise InvalidRequest(str(exc), grpc.StatusCode.INVALID_ARGUMENT) from None
    return text


def require_filters(conn: Connection, topic: str) -> None:
    """Raise ``UnsupportedFilter`` unless the broker behind ``conn`` applies
    filters (asked once per connection; ``topic``, one the caller reads, is
    named by the probe pull, which a topic-scoped token may make)."""
    with _lock:
        if _checked.get(conn):
            return
    if not _supported(conn, topic):
        raise UnsupportedFilter(
            f"broker {conn.config.target} does not apply filter expressions (an older "
            "version): upgrade it, or read without filter"
        )
    with _lock:
        _checked[conn] = True


def _supported(conn: Connection, topic: str) -> bool:
    try:
        stats: pb.BrokerStats = conn.call(conn.admin.GetStats, pb.GetStatsRequest())
    except PermissionDeniedError:  # a consume-only token: ask by a pull instead
        return _probe(conn, topic)
    return FEATURE in stats.features


def _probe(conn: Connection, topic: str) -> bool:
    request = pb.PullRequest(topic=topic, queue_id=0, offset=0, max_messages=1, filter=_PROBE)
    try:
        conn.pull(request, timeout=conn.config.timeout_s)
    except grpc.RpcError as exc:
        trailers_of = getattr(exc, "trailing_metadata", None)
        trailers = trailers_of() if callable(trailers_of) else None
        if any(key == ERROR_KIND_KEY and value == ERROR_KIND for key, value in trailers or ()):
            return True
        # Refused for another reason (the token may not read the topic, the topic
        # may not exist): that is the error to report, not an old broker.
        raise from_rpc_error(exc) from exc
    return False


class UnsupportedFilter(InvalidRequest):
    """The broker is too old to apply filter expressions."""


__all__ = ["EqueueError", "UnsupportedFilter", "check_filter", "require_filters"]
