"""The equeue storage engine: message log, queue indexes, offsets, retention.

This package imports nothing from the server, the client or Spark.
"""

from equeue_broker.storage.config import (
    FlushMode,
    MessageLimits,
    RetentionConfig,
    StorageConfig,
    TimerConfig,
)
from equeue_broker.storage.errors import (
    AlreadyExists,
    CorruptionError,
    DamagedRecord,
    DiskFullError,
    InvalidArgument,
    InvalidName,
    LimitExceeded,
    NotFound,
    PreconditionFailed,
    StorageError,
    StoreClosed,
)
from equeue_broker.storage.log.record import MessageBatch
from equeue_broker.storage.results import (
    AppendResult,
    Framer,
    QueueInfo,
    ReadResult,
    ReadStatus,
    RecordsResult,
    RecoveryReport,
    RetentionReport,
)
from equeue_broker.storage.store import Store
from equeue_broker.storage.timer.delivery import DelayedMessage
from equeue_proto.record import StoredMessage

__all__ = [
    "AlreadyExists",
    "AppendResult",
    "CorruptionError",
    "DamagedRecord",
    "DelayedMessage",
    "DiskFullError",
    "FlushMode",
    "Framer",
    "InvalidArgument",
    "InvalidName",
    "LimitExceeded",
    "MessageBatch",
    "MessageLimits",
    "NotFound",
    "PreconditionFailed",
    "QueueInfo",
    "ReadResult",
    "ReadStatus",
    "RecordsResult",
    "RecoveryReport",
    "RetentionConfig",
    "RetentionReport",
    "StorageConfig",
    "StorageError",
    "Store",
    "StoreClosed",
    "StoredMessage",
    "TimerConfig",
]
