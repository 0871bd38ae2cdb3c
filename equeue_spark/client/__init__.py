"""The equeue Python client: ``Producer``, ``Consumer`` and ``Admin``.

Spark-free: importing it never imports pyspark. Every call has a deadline, and
failures raise the ``EqueueError`` tree of ``errors.py``.
"""

from equeue_spark.client.admin import Admin
from equeue_spark.client.batches import SendResult, SendResults
from equeue_spark.client.cluster_consumer import ClusterConsumer
from equeue_spark.client.connection import ClientConfig, default_broker
from equeue_spark.client.consumer import Consumer
from equeue_spark.client.errors import (
    AlreadyExistsError,
    AuthenticationError,
    BrokerError,
    BrokerUnavailable,
    DataLossError,
    DeadlineExceeded,
    EqueueError,
    InvalidAddress,
    InvalidRequest,
    LimitError,
    NotFoundError,
    NotMasterError,
    OutOfOrderSequenceError,
    PermissionDeniedError,
    PreconditionError,
    ProducerFencedError,
    UnknownProducerError,
)
from equeue_spark.client.filters import UnsupportedFilter
from equeue_spark.client.producer import Producer
from equeue_spark.client.queries import QueryResult
from equeue_spark.client.reader import read_range
from equeue_spark.client.records import Message, Origin
from equeue_spark.client.retries import RetryMessage
from equeue_spark.client.transactions import CommitOutcome, Transaction, TransactionResolution

__all__ = [
    "Admin",
    "AlreadyExistsError",
    "AuthenticationError",
    "BrokerError",
    "BrokerUnavailable",
    "ClientConfig",
    "ClusterConsumer",
    "CommitOutcome",
    "Consumer",
    "DataLossError",
    "DeadlineExceeded",
    "EqueueError",
    "InvalidAddress",
    "InvalidRequest",
    "LimitError",
    "Message",
    "NotFoundError",
    "NotMasterError",
    "Origin",
    "OutOfOrderSequenceError",
    "PermissionDeniedError",
    "PreconditionError",
    "Producer",
    "ProducerFencedError",
    "QueryResult",
    "RetryMessage",
    "SendResult",
    "SendResults",
    "Transaction",
    "TransactionResolution",
    "UnknownProducerError",
    "UnsupportedFilter",
    "default_broker",
    "read_range",
]
