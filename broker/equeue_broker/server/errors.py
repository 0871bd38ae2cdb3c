"""Server-side errors and THE mapping from domain errors to gRPC status codes.

Every handler runs inside ``rpc`` or ``rpc_stream`` (service_base.py), which
end a failed call with ``abort`` (``status_for``'s code and message, and
``trailers_for``'s kind for the errors a client acts on by kind: a replica's
refusal, a stale epoch, too few in-sync replicas); nothing else in the server
picks a status code.
Exceptions that are not ``StorageError``s are bugs: they are logged with their
traceback and answered with INTERNAL, never allowed to take the server down.

Server errors, and replication's (replication/errors.py, re-exported here),
extend the storage hierarchy::

    StorageError
    ├── InvalidArgument ── BadRequest      a malformed request field
    │                      └── BadFilter    a filter expression that does not parse (kind below)
    ├── InvalidArgument ── SchemaInvalid   a schema text that does not parse (meta/schemas.py)
    ├── PreconditionFailed ── SchemaIncompatible, SchemaVersionConflict
    │                                      a schema refused by its rule, a wrong explicit version
    ├── PreconditionFailed ── ReplicaReadOnly  a write sent to a replica (replication/)
    │                      ├── StaleEpoch       a request from an older group epoch (replication/)
    │                      └── OutOfOrderSequence, ProducerFenced, UnknownProducer (storage)
    │                                           an idempotent batch refused (kinds below)
    ├── LimitExceeded   ── TooManyPulls    the parked-pull limit
    ├── ShuttingDown                       the broker is stopping
    ├── NotEnoughReplicas                  sync replication: too few in-sync replicas (replication/)
    ├── RequestTimeout                     a request body arrived too slowly (intake.py)
    ├── Unauthenticated                    no valid token (auth.py)
    ├── PermissionDenied                   the token lacks a role or topic (auth.py)
    └── CorruptionError (storage)
        ├── DamagedRecord (storage)        a read met a record failing its checksum
        └── DamagedMessage                 GetMessage's record fails its checksum

A damaged record's DATA_LOSS carries its topic, queue, offset and log position
in a ``protocol.DAMAGED_RECORD_KEY`` trailer too (``trailers_for``).
"""

from __future__ import annotations

import json
import logging
from typing import Any, NoReturn

import grpc

from equeue_broker.replication.errors import NotEnoughReplicas, ReplicaReadOnly, StaleEpoch
from equeue_broker.storage.errors import (
    AlreadyExists,
    CorruptionError,
    DamagedRecord,
    DiskFullError,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    OutOfOrderSequence,
    PreconditionFailed,
    ProducerFenced,
    StorageError,
    StoreClosed,
    UnknownProducer,
)
from equeue_broker.storage.meta.schemas import (
    SchemaIncompatible,
    SchemaInvalid,
    SchemaVersionConflict,
)
from equeue_proto.protocol import (
    DAMAGED_RECORD_KEY,
    ERROR_KIND_KEY,
    NOT_ENOUGH_REPLICAS,
    NOT_MASTER,
    OUT_OF_ORDER_SEQUENCE,
    PRODUCER_FENCED,
    STALE_EPOCH,
    UNKNOWN_PRODUCER,
)
from equeue_proto.schema_rules import SCHEMA_INCOMPATIBLE, SCHEMA_INVALID, SCHEMA_VERSION_CONFLICT
from equeue_proto.selector import ERROR_KIND as BAD_FILTER

log = logging.getLogger(__name__)

__all__ = [  # replication's errors are named here too: this module maps every error
    "BadFilter", "BadRequest", "DamagedMessage", "NotEnoughReplicas", "PermissionDenied",
    "ReplicaReadOnly", "RequestTimeout", "ShuttingDown", "StaleEpoch", "TooManyPulls",
    "Unauthenticated", "abort", "status_for", "trailers_for",
]  # fmt: skip


class BadRequest(InvalidArgument):
    """A request field is missing, malformed or inconsistent."""


class BadFilter(BadRequest):
    """A pull's filter expression does not parse (the message names the position)."""


class TooManyPulls(LimitExceeded):
    """Too many pulls are parked already."""


class ShuttingDown(StorageError):
    """The broker is shutting down."""


class RequestTimeout(StorageError):
    """A request's body did not arrive within ``request_read_timeout_ms``."""


class Unauthenticated(StorageError):
    """The call carries no token the broker knows."""


class PermissionDenied(StorageError):
    """The call's token lacks the role or the topic it needs."""


class DamagedMessage(CorruptionError):
    """The record GetMessage would return fails its checksum. Names its log
    position, and its topic, queue and offset where known (None otherwise:
    a message id names only the position, and the damage may be in the
    record's header)."""

    def __init__(
        self, position: int, why: str, topic: str | None = None,
        queue_id: int | None = None, offset: int | None = None,
    ) -> None:  # fmt: skip
        if topic is not None and queue_id is not None and offset is not None:
            what = f"damaged record: {topic}/{queue_id} offset {offset} (log position {position})"
        else:
            what = f"damaged record at log position {position}"
        super().__init__(f"{what}: {why}")
        self.position = position
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset


_CODES: list[tuple[type[StorageError], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (LimitExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DiskFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (PreconditionFailed, grpc.StatusCode.FAILED_PRECONDITION),
    (CorruptionError, grpc.StatusCode.DATA_LOSS),
    (StoreClosed, grpc.StatusCode.UNAVAILABLE),
    (ShuttingDown, grpc.StatusCode.UNAVAILABLE),
    (NotEnoughReplicas, grpc.StatusCode.UNAVAILABLE),
    (RequestTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
]


_KINDS: list[tuple[type[StorageError], str]] = [
    (ReplicaReadOnly, NOT_MASTER),
    (OutOfOrderSequence, OUT_OF_ORDER_SEQUENCE),
    (ProducerFenced, PRODUCER_FENCED),
    (UnknownProducer, UNKNOWN_PRODUCER),
    (StaleEpoch, STALE_EPOCH),
    (NotEnoughReplicas, NOT_ENOUGH_REPLICAS),
    (BadFilter, BAD_FILTER),
    (SchemaInvalid, SCHEMA_INVALID),
    (SchemaIncompatible, SCHEMA_INCOMPATIBLE),
    (SchemaVersionConflict, SCHEMA_VERSION_CONFLICT),
]
"""The errors a client tells apart by kind (``protocol.ERROR_KIND_KEY``)."""


MAX_DETAIL = 1024
"""Longest status message sent: the details travel in gRPC metadata (8 KiB in
all by default); a longer one would turn any error into RESOURCE_EXHAUSTED."""


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message a failed request is answered with."""
    if isinstance(exc, StorageError):
        for cls, code in _CODES:
            if isinstance(exc, cls):
                return code, _short(str(exc))
        return grpc.StatusCode.UNAVAILABLE, _short(f"storage error: {exc}")
    log.error("unexpected error serving a request", exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"


def trailers_for(exc: BaseException) -> tuple[tuple[str, str], ...]:
    """The trailing metadata a failed request is answered with: its kind, for
    the errors a client acts on by kind (``_KINDS``), or the place of a damaged
    record (``DAMAGED_RECORD_KEY``); else none."""
    for cls, kind in _KINDS:
        if isinstance(exc, cls):
            return ((ERROR_KIND_KEY, kind),)
    if isinstance(exc, (DamagedRecord, DamagedMessage)):
        where = {
            "topic": exc.topic, "queue_id": exc.queue_id, "offset": exc.offset,
            "position": exc.position if exc.position >= 0 else None,
        }  # fmt: skip
        return ((DAMAGED_RECORD_KEY, _short(json.dumps(where, ensure_ascii=True))),)
    return ()


async def abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> NoReturn:
    """End the call with ``exc``'s status (``status_for``) and kind (``trailers_for``)."""
    code, message = status_for(exc)
    await context.abort(code, message, trailing_metadata=trailers_for(exc))
    raise AssertionError("unreachable: abort raises")  # for type checkers


def _short(detail: str) -> str:
    return detail if len(detail) <= MAX_DETAIL else detail[: MAX_DETAIL - 3] + "..."
