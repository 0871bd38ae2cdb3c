"""The storage layer's exceptions.

Every error the storage engine raises on purpose is a ``StorageError``. The
server maps these classes to gRPC status codes in exactly one place; the storage
layer itself knows nothing of gRPC::

    StorageError                 base class; never raised directly
    ├── InvalidArgument          the caller passed a bad value (the message names it)
    │   └── InvalidName          a topic or group name outside the allowed charset/length
    ├── LimitExceeded            a size or count limit was hit (message, batch, queues)
    ├── NotFound                 a topic, queue or message that does not exist
    ├── AlreadyExists            a topic that already exists
    ├── PreconditionFailed       the operation is not allowed in the current state
    │   ├── OutOfOrderSequence   an idempotent batch's sequence is not its queue's next
    │   ├── ProducerFenced       an idempotent batch from an older producer epoch
    │   └── UnknownProducer      a producer id the store does not know sent sequence > 0
    ├── CorruptionError          on-disk data failed validation (names file and position)
    │   ├── ChunkQuarantined     the data lies in a quarantined log chunk (damage.py)
    │   └── DamagedRecord        a read met a record that fails its checksum (names it)
    ├── DiskFullError            the disk refused a write (ENOSPC/EDQUOT/EFBIG)
    └── StoreClosed              the store was closed ("closed by you")

Programmer errors (broken internal invariants) are ``AssertionError``s, not
``StorageError``s.
"""

from __future__ import annotations

import errno


class StorageError(Exception):
    """Base class of every error the storage engine raises on purpose."""


class InvalidArgument(StorageError):
    """The caller passed a bad value; the message names the value."""


class InvalidName(InvalidArgument):
    """A topic or group name is empty, too long or uses forbidden characters."""


class LimitExceeded(StorageError):
    """A configured size or count limit was exceeded."""


class NotFound(StorageError):
    """A topic, queue or message does not exist."""


class AlreadyExists(StorageError):
    """The object to create exists already."""


class PreconditionFailed(StorageError):
    """The operation is not allowed in the object's current state."""


class OutOfOrderSequence(PreconditionFailed):
    """An idempotent batch's sequence is not the next one of its queue: a gap
    (an earlier batch never arrived) or older than the remembered window."""


class ProducerFenced(PreconditionFailed):
    """An idempotent batch carries an older epoch than its producer id's latest."""


class UnknownProducer(PreconditionFailed):
    """A producer id the store does not know (expired, or never given out)
    sent a batch with a sequence other than 0."""


class CorruptionError(StorageError):
    """On-disk data failed validation.

    ``path`` and ``position`` say where, so an operator can inspect the file.
    """

    def __init__(self, message: str, path: str = "", position: int = -1) -> None:
        where = f" ({path} at byte {position})" if path else ""
        super().__init__(f"{message}{where}")
        self.path = path
        self.position = position


class ChunkQuarantined(CorruptionError):
    """The data asked for lies in a log chunk quarantined at open (damage.py)."""


class DamagedRecord(CorruptionError):
    """A read met a stored record that fails its checksum: the first record the
    read would have returned (records before it are served, not this error).

    The message starts ``damaged record: <topic>/<queue> offset <n>`` (clients
    parse the offset to skip the record if they choose to; docs/client.md).
    """

    def __init__(self, topic: str, queue_id: int, offset: int, path: str, position: int) -> None:
        super().__init__(f"damaged record: {topic}/{queue_id} offset {offset}", path, position)
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset


class DiskFullError(StorageError):
    """The file system refused a write because it is full or a size limit was hit."""


class StoreClosed(StorageError):
    """The store was closed; no further operations are accepted."""


_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def io_error(what: str, exc: OSError) -> StorageError:
    """The storage error for an OSError while writing ``what``: ``DiskFullError``
    for a full disk or a size limit, else ``StorageError``."""
    if exc.errno in _DISK_FULL:
        return DiskFullError(f"disk full while writing {what}: {exc}")
    return StorageError(f"I/O error while writing {what}: {exc}")
