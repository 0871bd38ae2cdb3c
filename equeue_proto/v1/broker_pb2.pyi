from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TransactionResolution(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSACTION_RESOLUTION_UNSPECIFIED: _ClassVar[TransactionResolution]
    TRANSACTION_RESOLUTION_COMMIT: _ClassVar[TransactionResolution]
    TRANSACTION_RESOLUTION_ROLLBACK: _ClassVar[TransactionResolution]
    TRANSACTION_RESOLUTION_UNKNOWN: _ClassVar[TransactionResolution]

class PullStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PULL_STATUS_UNSPECIFIED: _ClassVar[PullStatus]
    PULL_STATUS_OK: _ClassVar[PullStatus]
    PULL_STATUS_OFFSET_TOO_SMALL: _ClassVar[PullStatus]
    PULL_STATUS_OFFSET_TOO_BIG: _ClassVar[PullStatus]

class SchemaType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCHEMA_TYPE_UNSPECIFIED: _ClassVar[SchemaType]
    SCHEMA_TYPE_AVRO: _ClassVar[SchemaType]
    SCHEMA_TYPE_JSON: _ClassVar[SchemaType]
    SCHEMA_TYPE_PROTOBUF: _ClassVar[SchemaType]

class Compatibility(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPATIBILITY_UNSPECIFIED: _ClassVar[Compatibility]
    COMPATIBILITY_NONE: _ClassVar[Compatibility]
    COMPATIBILITY_BACKWARD: _ClassVar[Compatibility]
    COMPATIBILITY_BACKWARD_TRANSITIVE: _ClassVar[Compatibility]
    COMPATIBILITY_FORWARD: _ClassVar[Compatibility]
    COMPATIBILITY_FORWARD_TRANSITIVE: _ClassVar[Compatibility]
    COMPATIBILITY_FULL: _ClassVar[Compatibility]
    COMPATIBILITY_FULL_TRANSITIVE: _ClassVar[Compatibility]
TRANSACTION_RESOLUTION_UNSPECIFIED: TransactionResolution
TRANSACTION_RESOLUTION_COMMIT: TransactionResolution
TRANSACTION_RESOLUTION_ROLLBACK: TransactionResolution
TRANSACTION_RESOLUTION_UNKNOWN: TransactionResolution
PULL_STATUS_UNSPECIFIED: PullStatus
PULL_STATUS_OK: PullStatus
PULL_STATUS_OFFSET_TOO_SMALL: PullStatus
PULL_STATUS_OFFSET_TOO_BIG: PullStatus
SCHEMA_TYPE_UNSPECIFIED: SchemaType
SCHEMA_TYPE_AVRO: SchemaType
SCHEMA_TYPE_JSON: SchemaType
SCHEMA_TYPE_PROTOBUF: SchemaType
COMPATIBILITY_UNSPECIFIED: Compatibility
COMPATIBILITY_NONE: Compatibility
COMPATIBILITY_BACKWARD: Compatibility
COMPATIBILITY_BACKWARD_TRANSITIVE: Compatibility
COMPATIBILITY_FORWARD: Compatibility
COMPATIBILITY_FORWARD_TRANSITIVE: Compatibility
COMPATIBILITY_FULL: Compatibility
COMPATIBILITY_FULL_TRANSITIVE: Compatibility

class CheckStreamRequest(_message.Message):
    __slots__ = ("hello", "answer")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    hello: CheckHello
    answer: CheckAnswer
    def __init__(self, hello: _Optional[_Union[CheckHello, _Mapping]] = ..., answer: _Optional[_Union[CheckAnswer, _Mapping]] = ...) -> None: ...

class CheckHello(_message.Message):
    __slots__ = ("group", "client_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    client_id: str
    def __init__(self, group: _Optional[str] = ..., client_id: _Optional[str] = ...) -> None: ...

class CheckAnswer(_message.Message):
    __slots__ = ("transaction_id", "check", "resolution")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    check: int
    resolution: TransactionResolution
    def __init__(self, transaction_id: _Optional[str] = ..., check: _Optional[int] = ..., resolution: _Optional[_Union[TransactionResolution, str]] = ...) -> None: ...

class TransactionCheck(_message.Message):
    __slots__ = ("transaction_id", "check", "created_ms", "queues", "broker_id")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    check: int
    created_ms: int
    queues: _containers.RepeatedCompositeFieldContainer[CommittedQueue]
    broker_id: str
    def __init__(self, transaction_id: _Optional[str] = ..., check: _Optional[int] = ..., created_ms: _Optional[int] = ..., queues: _Optional[_Iterable[_Union[CommittedQueue, _Mapping]]] = ..., broker_id: _Optional[str] = ...) -> None: ...

class CancelDelayedRequest(_message.Message):
    __slots__ = ("message_id",)
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    def __init__(self, message_id: _Optional[str] = ...) -> None: ...

class CancelDelayedReply(_message.Message):
    __slots__ = ("topic", "queue_id", "deliver_at_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    deliver_at_ms: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., deliver_at_ms: _Optional[int] = ...) -> None: ...

class NackEntry(_message.Message):
    __slots__ = ("topic", "queue_id", "offset", "delay_ms", "error")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    delay_ms: int
    error: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., delay_ms: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("group", "entries", "max_reconsume_times")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MAX_RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    group: str
    entries: _containers.RepeatedCompositeFieldContainer[NackEntry]
    max_reconsume_times: int
    def __init__(self, group: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[NackEntry, _Mapping]]] = ..., max_reconsume_times: _Optional[int] = ...) -> None: ...

class NackOutcome(_message.Message):
    __slots__ = ("action", "deliveries", "deliver_at_ms", "message_id")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    action: str
    deliveries: int
    deliver_at_ms: int
    message_id: str
    def __init__(self, action: _Optional[str] = ..., deliveries: _Optional[int] = ..., deliver_at_ms: _Optional[int] = ..., message_id: _Optional[str] = ...) -> None: ...

class NackReply(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[NackOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[NackOutcome, _Mapping]]] = ...) -> None: ...

class InitProducerRequest(_message.Message):
    __slots__ = ("producer_id",)
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    def __init__(self, producer_id: _Optional[int] = ...) -> None: ...

class InitProducerReply(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "window")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    window: int
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., window: _Optional[int] = ...) -> None: ...

class QueueSequence(_message.Message):
    __slots__ = ("queue_id", "sequence")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    sequence: int
    def __init__(self, queue_id: _Optional[int] = ..., sequence: _Optional[int] = ...) -> None: ...

class MessageColumns(_message.Message):
    __slots__ = ("count", "values", "value_lengths", "keys", "key_lengths", "tags", "headers", "header_lengths", "timestamps_ms")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    VALUE_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    HEADER_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_MS_FIELD_NUMBER: _ClassVar[int]
    count: int
    values: bytes
    value_lengths: _containers.RepeatedScalarFieldContainer[int]
    keys: bytes
    key_lengths: _containers.RepeatedScalarFieldContainer[int]
    tags: _containers.RepeatedScalarFieldContainer[str]
    headers: bytes
    header_lengths: _containers.RepeatedScalarFieldContainer[int]
    timestamps_ms: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, count: _Optional[int] = ..., values: _Optional[bytes] = ..., value_lengths: _Optional[_Iterable[int]] = ..., keys: _Optional[bytes] = ..., key_lengths: _Optional[_Iterable[int]] = ..., tags: _Optional[_Iterable[str]] = ..., headers: _Optional[bytes] = ..., header_lengths: _Optional[_Iterable[int]] = ..., timestamps_ms: _Optional[_Iterable[int]] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("topic", "messages", "queue_ids", "transaction_id", "producer_id", "producer_epoch", "sequences", "deliver_at_ms", "producer_group")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    messages: MessageColumns
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    transaction_id: str
    producer_id: int
    producer_epoch: int
    sequences: _containers.RepeatedCompositeFieldContainer[QueueSequence]
    deliver_at_ms: _containers.RepeatedScalarFieldContainer[int]
    producer_group: str
    def __init__(self, topic: _Optional[str] = ..., messages: _Optional[_Union[MessageColumns, _Mapping]] = ..., queue_ids: _Optional[_Iterable[int]] = ..., transaction_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., sequences: _Optional[_Iterable[_Union[QueueSequence, _Mapping]]] = ..., deliver_at_ms: _Optional[_Iterable[int]] = ..., producer_group: _Optional[str] = ...) -> None: ...

class ProduceReply(_message.Message):
    __slots__ = ("broker_id", "queue_ids", "offsets", "positions", "transaction_messages", "deliver_at_ms")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    positions: _containers.RepeatedScalarFieldContainer[int]
    transaction_messages: int
    deliver_at_ms: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, broker_id: _Optional[str] = ..., queue_ids: _Optional[_Iterable[int]] = ..., offsets: _Optional[_Iterable[int]] = ..., positions: _Optional[_Iterable[int]] = ..., transaction_messages: _Optional[int] = ..., deliver_at_ms: _Optional[_Iterable[int]] = ...) -> None: ...

class TransactionRef(_message.Message):
    __slots__ = ("transaction_id", "expected_messages")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    expected_messages: int
    def __init__(self, transaction_id: _Optional[str] = ..., expected_messages: _Optional[int] = ...) -> None: ...

class CommitTransactionsRequest(_message.Message):
    __slots__ = ("transactions", "sink", "batch_id", "abort_prefix")
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    SINK_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ABORT_PREFIX_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[TransactionRef]
    sink: str
    batch_id: int
    abort_prefix: str
    def __init__(self, transactions: _Optional[_Iterable[_Union[TransactionRef, _Mapping]]] = ..., sink: _Optional[str] = ..., batch_id: _Optional[int] = ..., abort_prefix: _Optional[str] = ...) -> None: ...

class CommittedQueue(_message.Message):
    __slots__ = ("topic", "queue_id", "first_offset", "count")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    first_offset: int
    count: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., first_offset: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class CommitTransactionsReply(_message.Message):
    __slots__ = ("already_committed", "queues", "aborted")
    ALREADY_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    already_committed: bool
    queues: _containers.RepeatedCompositeFieldContainer[CommittedQueue]
    aborted: int
    def __init__(self, already_committed: _Optional[bool] = ..., queues: _Optional[_Iterable[_Union[CommittedQueue, _Mapping]]] = ..., aborted: _Optional[int] = ...) -> None: ...

class AbortTransactionsRequest(_message.Message):
    __slots__ = ("transaction_ids", "prefix")
    TRANSACTION_IDS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    transaction_ids: _containers.RepeatedScalarFieldContainer[str]
    prefix: str
    def __init__(self, transaction_ids: _Optional[_Iterable[str]] = ..., prefix: _Optional[str] = ...) -> None: ...

class AbortTransactionsReply(_message.Message):
    __slots__ = ("aborted",)
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    aborted: int
    def __init__(self, aborted: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "offset", "max_messages", "max_bytes", "tags", "max_wait_ms", "group", "consumer_id", "session", "filter")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    max_messages: int
    max_bytes: int
    tags: _containers.RepeatedScalarFieldContainer[str]
    max_wait_ms: int
    group: str
    consumer_id: str
    session: int
    filter: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., max_bytes: _Optional[int] = ..., tags: _Optional[_Iterable[str]] = ..., max_wait_ms: _Optional[int] = ..., group: _Optional[str] = ..., consumer_id: _Optional[str] = ..., session: _Optional[int] = ..., filter: _Optional[str] = ...) -> None: ...

class PullStreamRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "offset", "end_offset", "batch_messages", "batch_bytes", "tags", "filter")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BATCH_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BATCH_BYTES_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    end_offset: int
    batch_messages: int
    batch_bytes: int
    tags: _containers.RepeatedScalarFieldContainer[str]
    filter: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., batch_messages: _Optional[int] = ..., batch_bytes: _Optional[int] = ..., tags: _Optional[_Iterable[str]] = ..., filter: _Optional[str] = ...) -> None: ...

class PullReply(_message.Message):
    __slots__ = ("status", "records", "count", "next_offset", "earliest_offset", "end_offset", "broker_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    status: PullStatus
    records: bytes
    count: int
    next_offset: int
    earliest_offset: int
    end_offset: int
    broker_id: str
    def __init__(self, status: _Optional[_Union[PullStatus, str]] = ..., records: _Optional[bytes] = ..., count: _Optional[int] = ..., next_offset: _Optional[int] = ..., earliest_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., broker_id: _Optional[str] = ...) -> None: ...

class QueueOffset(_message.Message):
    __slots__ = ("topic", "queue_id", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class CommitOffsetsRequest(_message.Message):
    __slots__ = ("group", "offsets", "consumer_id", "session")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    group: str
    offsets: _containers.RepeatedCompositeFieldContainer[QueueOffset]
    consumer_id: str
    session: int
    def __init__(self, group: _Optional[str] = ..., offsets: _Optional[_Iterable[_Union[QueueOffset, _Mapping]]] = ..., consumer_id: _Optional[str] = ..., session: _Optional[int] = ...) -> None: ...

class CommitOffsetsReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FetchOffsetsRequest(_message.Message):
    __slots__ = ("group", "topic")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class FetchOffsetsReply(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[QueueOffset]
    def __init__(self, offsets: _Optional[_Iterable[_Union[QueueOffset, _Mapping]]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("group", "consumer_id", "topics", "leave", "released")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    group: str
    consumer_id: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    leave: bool
    released: _containers.RepeatedCompositeFieldContainer[TopicQueues]
    def __init__(self, group: _Optional[str] = ..., consumer_id: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., leave: _Optional[bool] = ..., released: _Optional[_Iterable[_Union[TopicQueues, _Mapping]]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("consumer_ids", "topics", "session")
    CONSUMER_IDS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    consumer_ids: _containers.RepeatedScalarFieldContainer[str]
    topics: _containers.RepeatedCompositeFieldContainer[TopicQueues]
    session: int
    def __init__(self, consumer_ids: _Optional[_Iterable[str]] = ..., topics: _Optional[_Iterable[_Union[TopicQueues, _Mapping]]] = ..., session: _Optional[int] = ...) -> None: ...

class TopicQueues(_message.Message):
    __slots__ = ("topic", "queue_ids", "owned_queue_ids", "revoked_queue_ids")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    OWNED_QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    owned_queue_ids: _containers.RepeatedScalarFieldContainer[int]
    revoked_queue_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., queue_ids: _Optional[_Iterable[int]] = ..., owned_queue_ids: _Optional[_Iterable[int]] = ..., revoked_queue_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ListOffsetsRequest(_message.Message):
    __slots__ = ("topic", "timestamp_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class QueueOffsets(_message.Message):
    __slots__ = ("queue_id", "earliest_offset", "end_offset", "timestamp_offset", "consumer_visible")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_VISIBLE_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    earliest_offset: int
    end_offset: int
    timestamp_offset: int
    consumer_visible: bool
    def __init__(self, queue_id: _Optional[int] = ..., earliest_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., timestamp_offset: _Optional[int] = ..., consumer_visible: _Optional[bool] = ...) -> None: ...

class ListOffsetsReply(_message.Message):
    __slots__ = ("queues", "incarnation")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueOffsets]
    incarnation: int
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueOffsets, _Mapping]]] = ..., incarnation: _Optional[int] = ...) -> None: ...

class OffsetForBytesRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "start_offset", "end_offset", "max_bytes")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    start_offset: int
    end_offset: int
    max_bytes: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class OffsetForBytesReply(_message.Message):
    __slots__ = ("end_offset", "bytes")
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    end_offset: int
    bytes: int
    def __init__(self, end_offset: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class SchemaVersion(_message.Message):
    __slots__ = ("version", "type", "schema", "fingerprint", "created_ms")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    version: int
    type: SchemaType
    schema: str
    fingerprint: str
    created_ms: int
    def __init__(self, version: _Optional[int] = ..., type: _Optional[_Union[SchemaType, str]] = ..., schema: _Optional[str] = ..., fingerprint: _Optional[str] = ..., created_ms: _Optional[int] = ...) -> None: ...

class SetSchemaRequest(_message.Message):
    __slots__ = ("topic", "key", "type", "schema", "version", "compatibility", "dry_run")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: bool
    type: SchemaType
    schema: str
    version: int
    compatibility: Compatibility
    dry_run: bool
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[bool] = ..., type: _Optional[_Union[SchemaType, str]] = ..., schema: _Optional[str] = ..., version: _Optional[int] = ..., compatibility: _Optional[_Union[Compatibility, str]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class GetSchemaRequest(_message.Message):
    __slots__ = ("topic", "key", "version", "history")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: bool
    version: int
    history: bool
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[bool] = ..., version: _Optional[int] = ..., history: _Optional[bool] = ...) -> None: ...

class SetCompatibilityRequest(_message.Message):
    __slots__ = ("topic", "key", "compatibility")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: bool
    compatibility: Compatibility
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[bool] = ..., compatibility: _Optional[_Union[Compatibility, str]] = ...) -> None: ...

class DeleteSchemasRequest(_message.Message):
    __slots__ = ("topic", "key", "both")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    BOTH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: bool
    both: bool
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[bool] = ..., both: _Optional[bool] = ...) -> None: ...

class DeleteSchemasReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SchemaInfo(_message.Message):
    __slots__ = ("topic", "key", "incarnation", "compatibility", "versions", "latest_version", "created", "problems", "broker_id", "unreachable_brokers")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: bool
    incarnation: int
    compatibility: Compatibility
    versions: _containers.RepeatedCompositeFieldContainer[SchemaVersion]
    latest_version: int
    created: bool
    problems: _containers.RepeatedScalarFieldContainer[str]
    broker_id: str
    unreachable_brokers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[bool] = ..., incarnation: _Optional[int] = ..., compatibility: _Optional[_Union[Compatibility, str]] = ..., versions: _Optional[_Iterable[_Union[SchemaVersion, _Mapping]]] = ..., latest_version: _Optional[int] = ..., created: _Optional[bool] = ..., problems: _Optional[_Iterable[str]] = ..., broker_id: _Optional[str] = ..., unreachable_brokers: _Optional[_Iterable[str]] = ...) -> None: ...

class QueryMessagesRequest(_message.Message):
    __slots__ = ("topic", "key", "by_key", "start_ms", "end_ms", "limit")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    BY_KEY_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: bytes
    by_key: bool
    start_ms: int
    end_ms: int
    limit: int
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[bytes] = ..., by_key: _Optional[bool] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class QueryMessagesReply(_message.Message):
    __slots__ = ("messages", "truncated", "broker_id")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[GetMessageReply]
    truncated: bool
    broker_id: str
    def __init__(self, messages: _Optional[_Iterable[_Union[GetMessageReply, _Mapping]]] = ..., truncated: _Optional[bool] = ..., broker_id: _Optional[str] = ...) -> None: ...

class ResendDeadLettersRequest(_message.Message):
    __slots__ = ("group", "message_ids", "all")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    group: str
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    def __init__(self, group: _Optional[str] = ..., message_ids: _Optional[_Iterable[str]] = ..., all: _Optional[bool] = ...) -> None: ...

class ResendDeadLettersReply(_message.Message):
    __slots__ = ("resent", "already_resent", "not_found", "new_message_ids")
    RESENT_FIELD_NUMBER: _ClassVar[int]
    ALREADY_RESENT_FIELD_NUMBER: _ClassVar[int]
    NOT_FOUND_FIELD_NUMBER: _ClassVar[int]
    NEW_MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    resent: int
    already_resent: int
    not_found: _containers.RepeatedScalarFieldContainer[str]
    new_message_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, resent: _Optional[int] = ..., already_resent: _Optional[int] = ..., not_found: _Optional[_Iterable[str]] = ..., new_message_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PurgeDeadLettersRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class PurgeDeadLettersReply(_message.Message):
    __slots__ = ("purged",)
    PURGED_FIELD_NUMBER: _ClassVar[int]
    purged: int
    def __init__(self, purged: _Optional[int] = ...) -> None: ...

class SetRoleRequest(_message.Message):
    __slots__ = ("role", "master", "epoch")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MASTER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    role: str
    master: str
    epoch: int
    def __init__(self, role: _Optional[str] = ..., master: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("name", "queue_count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue_count: int
    def __init__(self, name: _Optional[str] = ..., queue_count: _Optional[int] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTopicReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsReply(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ...) -> None: ...

class DescribeTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class AddQueuesRequest(_message.Message):
    __slots__ = ("name", "count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class SetQueueVisibilityRequest(_message.Message):
    __slots__ = ("name", "queue_id", "producer_visible", "consumer_visible")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_VISIBLE_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_VISIBLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue_id: int
    producer_visible: bool
    consumer_visible: bool
    def __init__(self, name: _Optional[str] = ..., queue_id: _Optional[int] = ..., producer_visible: _Optional[bool] = ..., consumer_visible: _Optional[bool] = ...) -> None: ...

class DeleteQueueRequest(_message.Message):
    __slots__ = ("name", "queue_id", "force")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue_id: int
    force: bool
    def __init__(self, name: _Optional[str] = ..., queue_id: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class TopicInfo(_message.Message):
    __slots__ = ("name", "queues", "created_ms", "incarnation", "unreachable_brokers", "delayed_pending", "delayed_next_due_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    DELAYED_PENDING_FIELD_NUMBER: _ClassVar[int]
    DELAYED_NEXT_DUE_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueInfo]
    created_ms: int
    incarnation: int
    unreachable_brokers: _containers.RepeatedScalarFieldContainer[str]
    delayed_pending: int
    delayed_next_due_ms: int
    def __init__(self, name: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueInfo, _Mapping]]] = ..., created_ms: _Optional[int] = ..., incarnation: _Optional[int] = ..., unreachable_brokers: _Optional[_Iterable[str]] = ..., delayed_pending: _Optional[int] = ..., delayed_next_due_ms: _Optional[int] = ...) -> None: ...

class QueueInfo(_message.Message):
    __slots__ = ("queue_id", "earliest_offset", "end_offset", "min_committed_offset", "backlog", "producer_visible", "consumer_visible", "broker")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_VISIBLE_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_VISIBLE_FIELD_NUMBER: _ClassVar[int]
    BROKER_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    earliest_offset: int
    end_offset: int
    min_committed_offset: int
    backlog: int
    producer_visible: bool
    consumer_visible: bool
    broker: str
    def __init__(self, queue_id: _Optional[int] = ..., earliest_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., min_committed_offset: _Optional[int] = ..., backlog: _Optional[int] = ..., producer_visible: _Optional[bool] = ..., consumer_visible: _Optional[bool] = ..., broker: _Optional[str] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGroupsReply(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, groups: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeGroupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("group", "queues", "consumer_ids", "total_lag", "unreachable_brokers", "max_lag_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_IDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LAG_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    queues: _containers.RepeatedCompositeFieldContainer[GroupQueue]
    consumer_ids: _containers.RepeatedScalarFieldContainer[str]
    total_lag: int
    unreachable_brokers: _containers.RepeatedScalarFieldContainer[str]
    max_lag_ms: int
    def __init__(self, group: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[GroupQueue, _Mapping]]] = ..., consumer_ids: _Optional[_Iterable[str]] = ..., total_lag: _Optional[int] = ..., unreachable_brokers: _Optional[_Iterable[str]] = ..., max_lag_ms: _Optional[int] = ...) -> None: ...

class GroupQueue(_message.Message):
    __slots__ = ("topic", "queue_id", "committed_offset", "end_offset", "lag", "consumer_id", "broker", "lag_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_FIELD_NUMBER: _ClassVar[int]
    LAG_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    committed_offset: int
    end_offset: int
    lag: int
    consumer_id: str
    broker: str
    lag_ms: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., committed_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., lag: _Optional[int] = ..., consumer_id: _Optional[str] = ..., broker: _Optional[str] = ..., lag_ms: _Optional[int] = ...) -> None: ...

class ResetOffsetsRequest(_message.Message):
    __slots__ = ("group", "topic", "earliest", "latest", "timestamp_ms", "explicit")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    EXPLICIT_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    earliest: bool
    latest: bool
    timestamp_ms: int
    explicit: ExplicitOffsets
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., earliest: _Optional[bool] = ..., latest: _Optional[bool] = ..., timestamp_ms: _Optional[int] = ..., explicit: _Optional[_Union[ExplicitOffsets, _Mapping]] = ...) -> None: ...

class ExplicitOffsets(_message.Message):
    __slots__ = ("offsets",)
    class OffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.ScalarMap[int, int]
    def __init__(self, offsets: _Optional[_Mapping[int, int]] = ...) -> None: ...

class DeleteGroupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class DeleteGroupReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetMessageRequest(_message.Message):
    __slots__ = ("message_id", "address")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    address: QueueOffset
    def __init__(self, message_id: _Optional[str] = ..., address: _Optional[_Union[QueueOffset, _Mapping]] = ...) -> None: ...

class GetMessageReply(_message.Message):
    __slots__ = ("record", "message_id")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    record: bytes
    message_id: str
    def __init__(self, record: _Optional[bytes] = ..., message_id: _Optional[str] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BrokerStats(_message.Message):
    __slots__ = ("broker_id", "topics", "queues", "groups", "total_backlog", "chunk_count", "bytes_on_disk", "produce_rate", "consume_rate", "produced_total", "consumed_total", "flush_mode", "uptime_s", "queue_counters", "open_transactions", "staged_bytes", "quarantined_chunks", "damaged_metadata", "role", "master", "replicas", "log_end_position", "epoch", "replication", "min_insync_replicas", "in_sync", "high_watermark", "failover", "role_reason", "role_since_ms", "idempotent_producers", "delayed_pending", "delayed_next_due_ms", "records_served", "records_filtered", "features", "transaction_checks_sent", "transaction_checks_answered", "check_streams", "schema_subjects", "fetch_address", "retention_max_age_ms", "retention_max_bytes", "data_dir_free_bytes", "data_dir_size_bytes")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    BYTES_ON_DISK_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_RATE_FIELD_NUMBER: _ClassVar[int]
    CONSUME_RATE_FIELD_NUMBER: _ClassVar[int]
    PRODUCED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FLUSH_MODE_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    OPEN_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    STAGED_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    DAMAGED_METADATA_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MASTER_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LOG_END_POSITION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    FAILOVER_FIELD_NUMBER: _ClassVar[int]
    ROLE_REASON_FIELD_NUMBER: _ClassVar[int]
    ROLE_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    DELAYED_PENDING_FIELD_NUMBER: _ClassVar[int]
    DELAYED_NEXT_DUE_MS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_SERVED_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FILTERED_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_CHECKS_SENT_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_CHECKS_ANSWERED_FIELD_NUMBER: _ClassVar[int]
    CHECK_STREAMS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_SUBJECTS_FIELD_NUMBER: _ClassVar[int]
    FETCH_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MAX_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    topics: int
    queues: int
    groups: int
    total_backlog: int
    chunk_count: int
    bytes_on_disk: int
    produce_rate: float
    consume_rate: float
    produced_total: int
    consumed_total: int
    flush_mode: str
    uptime_s: float
    queue_counters: _containers.RepeatedCompositeFieldContainer[QueueCounters]
    open_transactions: int
    staged_bytes: int
    quarantined_chunks: _containers.RepeatedCompositeFieldContainer[QuarantinedChunk]
    damaged_metadata: _containers.RepeatedScalarFieldContainer[str]
    role: str
    master: str
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    log_end_position: int
    epoch: int
    replication: str
    min_insync_replicas: int
    in_sync: _containers.RepeatedScalarFieldContainer[str]
    high_watermark: int
    failover: str
    role_reason: str
    role_since_ms: int
    idempotent_producers: int
    delayed_pending: int
    delayed_next_due_ms: int
    records_served: int
    records_filtered: int
    features: _containers.RepeatedScalarFieldContainer[str]
    transaction_checks_sent: int
    transaction_checks_answered: int
    check_streams: int
    schema_subjects: int
    fetch_address: str
    retention_max_age_ms: int
    retention_max_bytes: int
    data_dir_free_bytes: int
    data_dir_size_bytes: int
    def __init__(self, broker_id: _Optional[str] = ..., topics: _Optional[int] = ..., queues: _Optional[int] = ..., groups: _Optional[int] = ..., total_backlog: _Optional[int] = ..., chunk_count: _Optional[int] = ..., bytes_on_disk: _Optional[int] = ..., produce_rate: _Optional[float] = ..., consume_rate: _Optional[float] = ..., produced_total: _Optional[int] = ..., consumed_total: _Optional[int] = ..., flush_mode: _Optional[str] = ..., uptime_s: _Optional[float] = ..., queue_counters: _Optional[_Iterable[_Union[QueueCounters, _Mapping]]] = ..., open_transactions: _Optional[int] = ..., staged_bytes: _Optional[int] = ..., quarantined_chunks: _Optional[_Iterable[_Union[QuarantinedChunk, _Mapping]]] = ..., damaged_metadata: _Optional[_Iterable[str]] = ..., role: _Optional[str] = ..., master: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., log_end_position: _Optional[int] = ..., epoch: _Optional[int] = ..., replication: _Optional[str] = ..., min_insync_replicas: _Optional[int] = ..., in_sync: _Optional[_Iterable[str]] = ..., high_watermark: _Optional[int] = ..., failover: _Optional[str] = ..., role_reason: _Optional[str] = ..., role_since_ms: _Optional[int] = ..., idempotent_producers: _Optional[int] = ..., delayed_pending: _Optional[int] = ..., delayed_next_due_ms: _Optional[int] = ..., records_served: _Optional[int] = ..., records_filtered: _Optional[int] = ..., features: _Optional[_Iterable[str]] = ..., transaction_checks_sent: _Optional[int] = ..., transaction_checks_answered: _Optional[int] = ..., check_streams: _Optional[int] = ..., schema_subjects: _Optional[int] = ..., fetch_address: _Optional[str] = ..., retention_max_age_ms: _Optional[int] = ..., retention_max_bytes: _Optional[int] = ..., data_dir_free_bytes: _Optional[int] = ..., data_dir_size_bytes: _Optional[int] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("address", "position", "lag_bytes", "last_seen_s", "connected", "replica_id", "in_sync")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    LAG_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_S_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    address: str
    position: int
    lag_bytes: int
    last_seen_s: float
    connected: bool
    replica_id: str
    in_sync: bool
    def __init__(self, address: _Optional[str] = ..., position: _Optional[int] = ..., lag_bytes: _Optional[int] = ..., last_seen_s: _Optional[float] = ..., connected: _Optional[bool] = ..., replica_id: _Optional[str] = ..., in_sync: _Optional[bool] = ...) -> None: ...

class QuarantinedChunk(_message.Message):
    __slots__ = ("file", "reason", "start_position", "end_position")
    FILE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    END_POSITION_FIELD_NUMBER: _ClassVar[int]
    file: str
    reason: str
    start_position: int
    end_position: int
    def __init__(self, file: _Optional[str] = ..., reason: _Optional[str] = ..., start_position: _Optional[int] = ..., end_position: _Optional[int] = ...) -> None: ...

class QueueCounters(_message.Message):
    __slots__ = ("topic", "queue_id", "produced", "consumed", "filtered")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCED_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    FILTERED_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    produced: int
    consumed: int
    filtered: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., produced: _Optional[int] = ..., consumed: _Optional[int] = ..., filtered: _Optional[int] = ...) -> None: ...

class ListTransactionsRequest(_message.Message):
    __slots__ = ("prefix",)
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    def __init__(self, prefix: _Optional[str] = ...) -> None: ...

class TransactionInfo(_message.Message):
    __slots__ = ("transaction_id", "created_ms", "last_write_ms", "messages", "bytes", "committing", "queues", "group", "checks", "last_check_ms", "next_check_ms")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_WRITE_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    COMMITTING_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECK_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CHECK_MS_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    created_ms: int
    last_write_ms: int
    messages: int
    bytes: int
    committing: bool
    queues: _containers.RepeatedCompositeFieldContainer[CommittedQueue]
    group: str
    checks: int
    last_check_ms: int
    next_check_ms: int
    def __init__(self, transaction_id: _Optional[str] = ..., created_ms: _Optional[int] = ..., last_write_ms: _Optional[int] = ..., messages: _Optional[int] = ..., bytes: _Optional[int] = ..., committing: _Optional[bool] = ..., queues: _Optional[_Iterable[_Union[CommittedQueue, _Mapping]]] = ..., group: _Optional[str] = ..., checks: _Optional[int] = ..., last_check_ms: _Optional[int] = ..., next_check_ms: _Optional[int] = ...) -> None: ...

class SinkInfo(_message.Message):
    __slots__ = ("sink", "batch_id", "updated_ms")
    SINK_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATED_MS_FIELD_NUMBER: _ClassVar[int]
    sink: str
    batch_id: int
    updated_ms: int
    def __init__(self, sink: _Optional[str] = ..., batch_id: _Optional[int] = ..., updated_ms: _Optional[int] = ...) -> None: ...

class ListTransactionsReply(_message.Message):
    __slots__ = ("transactions", "sinks")
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    SINKS_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[TransactionInfo]
    sinks: _containers.RepeatedCompositeFieldContainer[SinkInfo]
    def __init__(self, transactions: _Optional[_Iterable[_Union[TransactionInfo, _Mapping]]] = ..., sinks: _Optional[_Iterable[_Union[SinkInfo, _Mapping]]] = ...) -> None: ...

class RegisteredTopic(_message.Message):
    __slots__ = ("name", "incarnation", "queues", "value_schema_version", "value_schema_fingerprint", "key_schema_version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    VALUE_SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    VALUE_SCHEMA_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    KEY_SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    incarnation: int
    queues: _containers.RepeatedCompositeFieldContainer[RouteQueue]
    value_schema_version: int
    value_schema_fingerprint: str
    key_schema_version: int
    def __init__(self, name: _Optional[str] = ..., incarnation: _Optional[int] = ..., queues: _Optional[_Iterable[_Union[RouteQueue, _Mapping]]] = ..., value_schema_version: _Optional[int] = ..., value_schema_fingerprint: _Optional[str] = ..., key_schema_version: _Optional[int] = ...) -> None: ...

class RouteQueue(_message.Message):
    __slots__ = ("queue_id", "writable", "readable")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    READABLE_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    writable: bool
    readable: bool
    def __init__(self, queue_id: _Optional[int] = ..., writable: _Optional[bool] = ..., readable: _Optional[bool] = ...) -> None: ...

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "replica_id", "address", "topics", "instance_id", "role", "epoch", "master", "fetch_address")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MASTER_FIELD_NUMBER: _ClassVar[int]
    FETCH_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    replica_id: int
    address: str
    topics: _containers.RepeatedCompositeFieldContainer[RegisteredTopic]
    instance_id: str
    role: str
    epoch: int
    master: str
    fetch_address: str
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., replica_id: _Optional[int] = ..., address: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[RegisteredTopic, _Mapping]]] = ..., instance_id: _Optional[str] = ..., role: _Optional[str] = ..., epoch: _Optional[int] = ..., master: _Optional[str] = ..., fetch_address: _Optional[str] = ...) -> None: ...

class RegisterBrokerReply(_message.Message):
    __slots__ = ("expiry_ms", "master", "master_epoch")
    EXPIRY_MS_FIELD_NUMBER: _ClassVar[int]
    MASTER_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    expiry_ms: int
    master: str
    master_epoch: int
    def __init__(self, expiry_ms: _Optional[int] = ..., master: _Optional[str] = ..., master_epoch: _Optional[int] = ...) -> None: ...

class UnregisterBrokerRequest(_message.Message):
    __slots__ = ("broker_name", "replica_id", "address")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    replica_id: int
    address: str
    def __init__(self, broker_name: _Optional[str] = ..., replica_id: _Optional[int] = ..., address: _Optional[str] = ...) -> None: ...

class UnregisterBrokerReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRouteRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class BrokerRoute(_message.Message):
    __slots__ = ("broker_name", "cluster", "address", "incarnation", "queues", "replicas", "epoch", "replica_addresses", "value_schema_version", "value_schema_fingerprint", "key_schema_version", "fetch_addresses")
    class ReplicasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    VALUE_SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    VALUE_SCHEMA_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    KEY_SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    FETCH_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    cluster: str
    address: str
    incarnation: int
    queues: _containers.RepeatedCompositeFieldContainer[RouteQueue]
    replicas: _containers.ScalarMap[int, str]
    epoch: int
    replica_addresses: _containers.RepeatedScalarFieldContainer[str]
    value_schema_version: int
    value_schema_fingerprint: str
    key_schema_version: int
    fetch_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, broker_name: _Optional[str] = ..., cluster: _Optional[str] = ..., address: _Optional[str] = ..., incarnation: _Optional[int] = ..., queues: _Optional[_Iterable[_Union[RouteQueue, _Mapping]]] = ..., replicas: _Optional[_Mapping[int, str]] = ..., epoch: _Optional[int] = ..., replica_addresses: _Optional[_Iterable[str]] = ..., value_schema_version: _Optional[int] = ..., value_schema_fingerprint: _Optional[str] = ..., key_schema_version: _Optional[int] = ..., fetch_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class TopicRoute(_message.Message):
    __slots__ = ("topic", "brokers", "down_brokers")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    DOWN_BROKERS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerRoute]
    down_brokers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topic: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[BrokerRoute, _Mapping]]] = ..., down_brokers: _Optional[_Iterable[str]] = ...) -> None: ...

class ListBrokersRequest(_message.Message):
    __slots__ = ("cluster", "include_down", "with_topic_names")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DOWN_FIELD_NUMBER: _ClassVar[int]
    WITH_TOPIC_NAMES_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    include_down: bool
    with_topic_names: bool
    def __init__(self, cluster: _Optional[str] = ..., include_down: _Optional[bool] = ..., with_topic_names: _Optional[bool] = ...) -> None: ...

class BrokerEntry(_message.Message):
    __slots__ = ("broker_name", "cluster", "replica_id", "address", "last_registration_ms", "topics", "instance_id", "role", "epoch", "master", "routed_master", "state", "silent_ms", "topic_names")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LAST_REGISTRATION_MS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MASTER_FIELD_NUMBER: _ClassVar[int]
    ROUTED_MASTER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SILENT_MS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_NAMES_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    cluster: str
    replica_id: int
    address: str
    last_registration_ms: int
    topics: int
    instance_id: str
    role: str
    epoch: int
    master: str
    routed_master: bool
    state: str
    silent_ms: int
    topic_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, broker_name: _Optional[str] = ..., cluster: _Optional[str] = ..., replica_id: _Optional[int] = ..., address: _Optional[str] = ..., last_registration_ms: _Optional[int] = ..., topics: _Optional[int] = ..., instance_id: _Optional[str] = ..., role: _Optional[str] = ..., epoch: _Optional[int] = ..., master: _Optional[str] = ..., routed_master: _Optional[bool] = ..., state: _Optional[str] = ..., silent_ms: _Optional[int] = ..., topic_names: _Optional[_Iterable[str]] = ...) -> None: ...

class ListBrokersReply(_message.Message):
    __slots__ = ("brokers",)
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerEntry]
    def __init__(self, brokers: _Optional[_Iterable[_Union[BrokerEntry, _Mapping]]] = ...) -> None: ...

class IdentifyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MemberIdentity(_message.Message):
    __slots__ = ("broker_name", "instance_id", "role", "epoch", "master")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MASTER_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    instance_id: str
    role: str
    epoch: int
    master: str
    def __init__(self, broker_name: _Optional[str] = ..., instance_id: _Optional[str] = ..., role: _Optional[str] = ..., epoch: _Optional[int] = ..., master: _Optional[str] = ...) -> None: ...

class ReplicateRequest(_message.Message):
    __slots__ = ("position", "max_bytes", "wait_ms", "replica_address", "chunk_capacity", "replica_id", "epoch", "last_epoch", "metadata_version", "unapplied")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    UNAPPLIED_FIELD_NUMBER: _ClassVar[int]
    position: int
    max_bytes: int
    wait_ms: int
    replica_address: str
    chunk_capacity: int
    replica_id: str
    epoch: int
    last_epoch: int
    metadata_version: int
    unapplied: int
    def __init__(self, position: _Optional[int] = ..., max_bytes: _Optional[int] = ..., wait_ms: _Optional[int] = ..., replica_address: _Optional[str] = ..., chunk_capacity: _Optional[int] = ..., replica_id: _Optional[str] = ..., epoch: _Optional[int] = ..., last_epoch: _Optional[int] = ..., metadata_version: _Optional[int] = ..., unapplied: _Optional[int] = ...) -> None: ...

class ReplicateReply(_message.Message):
    __slots__ = ("position", "data", "master_end", "master_start", "metadata", "chunk_capacity", "epoch", "high_watermark", "metadata_version", "schemas", "schemas_generation")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MASTER_END_FIELD_NUMBER: _ClassVar[int]
    MASTER_START_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CHUNK_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEMAS_FIELD_NUMBER: _ClassVar[int]
    SCHEMAS_GENERATION_FIELD_NUMBER: _ClassVar[int]
    position: int
    data: bytes
    master_end: int
    master_start: int
    metadata: bytes
    chunk_capacity: int
    epoch: int
    high_watermark: int
    metadata_version: int
    schemas: bytes
    schemas_generation: int
    def __init__(self, position: _Optional[int] = ..., data: _Optional[bytes] = ..., master_end: _Optional[int] = ..., master_start: _Optional[int] = ..., metadata: _Optional[bytes] = ..., chunk_capacity: _Optional[int] = ..., epoch: _Optional[int] = ..., high_watermark: _Optional[int] = ..., metadata_version: _Optional[int] = ..., schemas: _Optional[bytes] = ..., schemas_generation: _Optional[int] = ...) -> None: ...
