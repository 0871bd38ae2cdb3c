"""The client's exceptions, mapped from gRPC status codes in exactly one place.

::

    EqueueError                  base class
    ├── InvalidRequest           INVALID_ARGUMENT: a bad value (the message names it)
    ├── NotFoundError            NOT_FOUND: topic, queue, group or message missing
    ├── AlreadyExistsError       ALREADY_EXISTS
    ├── PreconditionError        FAILED_PRECONDITION: not allowed in the current state
    │   ├── NotMasterError       a write sent to a replica (the group's master moved)
    │   ├── OutOfOrderSequenceError  an idempotent batch's sequence is not its queue's next
    │   ├── ProducerFencedError  an idempotent batch from an older epoch of its producer id
    │   ├── UnknownProducerError the broker group does not know the producer id (expired)
    │   ├── SchemaIncompatibleError  a schema the subject's compatibility rule refuses
    │   └── SchemaConflictError  a cluster's broker groups hold different schema histories
    ├── LimitError               RESOURCE_EXHAUSTED: a limit or back-pressure
    ├── BrokerUnavailable        UNAVAILABLE: broker down or shutting down (retriable)
    │   └── NotSent              the attempt never reached the broker (no connection)
    ├── DeadlineExceeded         DEADLINE_EXCEEDED: the call's deadline passed (retriable)
    ├── DataLossError            DATA_LOSS: corruption on the broker, or a record that
    │                            fails its checksum on arrival
    ├── AuthenticationError      UNAUTHENTICATED: no token, or one the broker does not know
    ├── PermissionDeniedError    PERMISSION_DENIED: the token lacks the role or topic
    ├── BrokerError              anything else (INTERNAL, UNKNOWN, ...)
    ├── InvalidAddress           a malformed broker address, refused before dialling
    │                            (also a ValueError)
    └── SchemaValidationError    a value that does not match its topic's schema, refused
                                 by the client before anything of its batch is sent
"""

from __future__ import annotations

import json
from typing import Any

import grpc

from equeue_proto.protocol import (
    DAMAGED_RECORD_KEY,
    ERROR_KIND_KEY,
    NOT_MASTER,
    OUT_OF_ORDER_SEQUENCE,
    PRODUCER_FENCED,
    UNKNOWN_PRODUCER,
)
from equeue_proto.schema_rules import SCHEMA_INCOMPATIBLE


class EqueueError(Exception):
    """Base class of every client error. ``code`` is the gRPC status, if any."""

    retriable = False

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class InvalidRequest(EqueueError):
    """The broker rejected a value (INVALID_ARGUMENT)."""


class NotFoundError(EqueueError):
    """A topic, queue, group or message does not exist (NOT_FOUND)."""


class AlreadyExistsError(EqueueError):
    """The object to create exists already (ALREADY_EXISTS)."""


class PreconditionError(EqueueError):
    """Not allowed in the current state (FAILED_PRECONDITION)."""


class NotMasterError(PreconditionError):
    """A write (produce, offset commit, transaction) refused by a replica: the
    broker group's master is elsewhere. Not retried on the same broker; the
    cluster clients refresh the route and retry on the group's master."""


class OutOfOrderSequenceError(PreconditionError):
    """An idempotent batch's sequence is not the next of its queue on the
    broker: an earlier batch is missing, or the batch is older than the
    broker's window (docs/client.md, "Idempotent produce")."""


class ProducerFencedError(PreconditionError):
    """A newer epoch of this producer id exists: another producer took it over."""


class UnknownProducerError(PreconditionError):
    """The broker group forgot this producer id (expired, or its state was lost)."""


class SchemaIncompatibleError(PreconditionError):
    """A schema the subject's compatibility rule refuses (SetSchema,
    FAILED_PRECONDITION kind ``schema-incompatible``). ``problems`` are the
    incompatibilities, one line each (the message's lines after the first)."""

    def __init__(
        self, message: str, code: grpc.StatusCode | None = None, problems: list[str] | None = None
    ) -> None:
        super().__init__(message, code)
        self.problems: list[str] = problems if problems is not None else problem_lines(message)


def problem_lines(details: str) -> list[str]:
    """The incompatibilities of a refusal's text: its lines after the first
    (the broker lists one per line), or the whole text when it is one line."""
    lines = [line.strip().lstrip("-").strip() for line in details.splitlines()]
    return [line for line in lines[1:] if line] or [details.strip()]


class SchemaConflictError(PreconditionError):
    """A cluster's broker groups hold schema histories that are not prefixes of
    one another (same version number, different schemas): registering on top
    would make the numbers mean different schemas. ``histories`` is
    {broker group: [fingerprint of version 1, 2, ...]}."""

    def __init__(self, message: str, histories: dict[str, list[str]]) -> None:
        super().__init__(message)
        self.histories = histories


NOT_MASTER_MARK = "serves reads only"
"""What a replica's refusal of a write says: how one from an older broker,
which sends no ``protocol.ERROR_KIND_KEY`` trailer, is recognised."""


class LimitError(EqueueError):
    """A size/count limit or back-pressure (RESOURCE_EXHAUSTED)."""


class BrokerUnavailable(EqueueError):
    """The broker cannot be reached or is shutting down (UNAVAILABLE)."""

    retriable = True


class NotSent(BrokerUnavailable):
    """UNAVAILABLE before the attempt reached the broker (no connection could
    be made): nothing of it can have been applied. An idempotent producer may
    send such a keyless batch to another broker group; a multi-attempt call's
    error says this of its last attempt only."""


NOT_SENT_MARK = "failed to connect to all addresses"
"""What gRPC says of a call that found no connection to send on."""


class DeadlineExceeded(EqueueError):
    """The call did not finish before its deadline (DEADLINE_EXCEEDED)."""

    retriable = True


class DataLossError(EqueueError):
    """Corrupt data on the broker (DATA_LOSS) or in a received record.

    For a damaged record, where it is (None when unknown), as Kafka's
    corrupt-record errors say: log it, and ``seek`` past it on purpose
    (docs/client.md, "Damaged records")."""

    def __init__(
        self, message: str, code: grpc.StatusCode | None = None, *,
        topic: str | None = None, queue_id: int | None = None,
        offset: int | None = None, position: int | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message, code)
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset
        """The damaged record's queue offset."""
        self.position = position
        """The damaged record's position in its broker's log."""


class AuthenticationError(EqueueError):
    """The call carried no token, or one the broker does not know (UNAUTHENTICATED)."""


class PermissionDeniedError(EqueueError):
    """The token lacks the role or the topic the call needs (PERMISSION_DENIED)."""


class BrokerError(EqueueError):
    """Any other failure (INTERNAL, UNKNOWN, ...)."""


class InvalidAddress(EqueueError, ValueError):
    """A broker address that is not one ``HOST:PORT`` (no call was made)."""

    def __init__(self, message: str, address: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.address = address
        self.reason = reason
        """What is wrong, and what to give instead (the message without the source)."""


class SchemaValidationError(EqueueError):
    """A value (or key) of a batch does not match its topic's schema: raised by
    a validating producer (``Producer(validate=True)``) or a ``Serializer``
    before anything of the batch is sent."""

    def __init__(
        self, topic: str, index: int, version: int, reason: str, key: bool = False
    ) -> None:
        what = "key" if key else "value"
        super().__init__(
            f"{topic}: message {index}'s {what} does not match {what} schema version "
            f"{version}: {reason}"
        )
        self.topic = topic
        self.index = index
        """The message's index in its batch (0 for one ``send``)."""
        self.version = version
        self.reason = reason
        self.key = key


_BY_CODE: dict[grpc.StatusCode, type[EqueueError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.OUT_OF_RANGE: InvalidRequest,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: PreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: LimitError,
    grpc.StatusCode.UNAVAILABLE: BrokerUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.DATA_LOSS: DataLossError,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}


_PRODUCER_KINDS: dict[str, type[PreconditionError]] = {
    OUT_OF_ORDER_SEQUENCE: OutOfOrderSequenceError,
    PRODUCER_FENCED: ProducerFencedError,
    UNKNOWN_PRODUCER: UnknownProducerError,
}


def from_rpc_error(exc: grpc.RpcError) -> EqueueError:
    """The client exception for a failed call (raise it ``from`` the RpcError)."""
    # Failed calls raise an object that is both RpcError and Call (code/details).
    code_of = getattr(exc, "code", None)
    code: grpc.StatusCode = code_of() if callable(code_of) else grpc.StatusCode.UNKNOWN
    details_of = getattr(exc, "details", None)
    details = details_of() if callable(details_of) else str(exc)
    cls = _BY_CODE.get(code, BrokerError)
    kind = _kind(exc)
    if cls is PreconditionError and (
        kind == NOT_MASTER or (not kind and NOT_MASTER_MARK in details)
    ):
        cls = NotMasterError
    elif cls is PreconditionError and kind in _PRODUCER_KINDS:
        cls = _PRODUCER_KINDS[kind]
    elif cls is PreconditionError and kind == SCHEMA_INCOMPATIBLE:
        cls = SchemaIncompatibleError
    if cls is BrokerUnavailable and NOT_SENT_MARK in details:
        cls = NotSent
    if cls is SchemaIncompatibleError:
        return SchemaIncompatibleError(f"{details} ({code.name})", code, problem_lines(details))
    if cls is DataLossError:
        return DataLossError(f"{details} ({code.name})", code, **_damaged_record(exc))
    return cls(f"{details} ({code.name})", code)


def _trailer(exc: grpc.RpcError, wanted: str) -> str:
    """The value of one trailing-metadata key of a failed call, or ""."""
    trailers_of = getattr(exc, "trailing_metadata", None)
    trailers = trailers_of() if callable(trailers_of) else None
    for key, value in trailers or ():
        if key == wanted:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return ""


def _damaged_record(exc: grpc.RpcError) -> dict[str, Any]:
    """Where a damaged record is (``protocol.DAMAGED_RECORD_KEY``): DataLossError's
    keyword arguments; none from a broker that does not send it."""
    try:
        where = json.loads(_trailer(exc, DAMAGED_RECORD_KEY) or "{}")
    except ValueError:
        return {}
    if not isinstance(where, dict):
        return {}
    types = {"topic": str, "queue_id": int, "offset": int, "position": int}
    return {k: where[k] for k, t in types.items() if isinstance(where.get(k), t)}


def _kind(exc: grpc.RpcError) -> str:
    """The failure's kind (``protocol.ERROR_KIND_KEY`` trailer), or ""."""
    return _trailer(exc, ERROR_KIND_KEY)
