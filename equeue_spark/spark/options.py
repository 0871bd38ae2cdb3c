"""The connector's options: parsed once, typed, validated, with defaults and limits.

Spark hands a data source its options with lower-cased keys and string values.
Everything is checked when the query starts (``ReadOptions.parse`` /
``WriteOptions.parse``): an unknown option or a bad value raises
``InvalidOption`` naming the option and the value, instead of failing a task
later. The option table in docs/spark.md documents the same names and defaults
(tests/project/test_docs.py ties the two).

Pyspark-free, so it can be tested without a Spark session.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from equeue_proto.selector import parse
from equeue_spark.client.cluster import routes_type
from equeue_spark.client.connection import (
    NAMESRV_ENV,
    ClientConfig,
    check_address,
    parse_namesrv,
    resolve_address,
)
from equeue_spark.client.errors import InvalidAddress
from equeue_spark.client.routing import Routes
from equeue_spark.spark.errors import InvalidOption
from equeue_spark.spark.format_options import FormatOptions
from equeue_spark.spark.offsets import cluster_key, split_key
from equeue_spark.spark.option_hints import unknown_message

EARLIEST = -2
"""Offset sentinel in ``startingOffsets``/``endingOffsets`` JSON: the earliest retained."""
LATEST = -1
"""Offset sentinel: the queue's end."""

MAX_TOPICS = 1000
MAX_TIMEOUT_MS = 3_600_000
MAX_WRITE_BATCH = 10_000
"""Rows per produce call; the broker's default batch limit."""
MAX_TRIGGER_DELAY_MS = 7 * 24 * 3_600_000

_SPARK_KEYS = frozenset({"path", "checkpointlocation", "queryname"})
"""Keys Spark itself may add to a source's or sink's options; ignored."""

_INTEGER = re.compile(r"[+-]?[0-9]+")
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

log = logging.getLogger("equeue.spark")

MAX_MIN_PARTITIONS = 100_000
MAX_QUEUE_ID = 2**32 - 1
"""Largest queue id (the wire's uint32)."""
MAX_ASSIGNED = 100_000
"""Most queue ids ``assign`` lists per topic."""
MAX_TIME_MS = 2**62
"""Largest time a timestamp option takes (ms since the epoch; the wire's int64 with room)."""
BATCH_ONLY = ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp")
"""Read options (lower-cased) only a batch read takes: given, the read is a batch read."""
STRATEGIES = ("error", "latest")
"""Values of ``startingOffsetsByTimestampStrategy``."""

QueueSpec = dict[str, dict[int, int]]
"""``{topic: {queue: value}}`` (cluster: ``{"BROKER/TOPIC": {queue: value}}``)."""


@dataclass(frozen=True)
class TimestampSpec:
    """``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp``: a store
    time per named queue; the queues it leaves out take ``rest`` (the next
    preference: ``startingOffsets``/``endingOffsets``, or the mode's default)."""

    per_queue: QueueSpec
    """ms since the epoch per queue, keyed as a ``startingOffsets`` JSON."""
    strategy: str = "latest"
    """A starting queue without a record at or after its time: ``latest``
    starts it at its end, ``error`` raises ``NoOffsetForTimestamp``."""
    rest: str | QueueSpec = "latest"
    option: str = "startingOffsetsByTimestamp"
    """The option's name, for messages."""


StartSpec = str | QueueSpec | TimestampSpec
"""``"earliest"``, ``"latest"``, ``"group"``, ``{topic: {queue: offset or sentinel}}``,
or a ``TimestampSpec``."""


def _bad(name: str, value: str, why: str) -> InvalidOption:
    return InvalidOption(f"option {name}={value!r}: {why}")


STORE_TIME = (
    "ms since the epoch, compared with the broker's store time (the storeTimestamp "
    "column, Kafka's LogAppendTime), not the producer's timestamp"
)


def _store_time(o: _Options, key: str) -> int:
    """A timestamp option: its errors say which time it compares."""
    try:
        return o.integer(key, 0, 0, MAX_TIME_MS)
    except InvalidOption as exc:
        raise InvalidOption(f"{exc} ({STORE_TIME})") from None


class _Options:
    """Typed access to the raw option map, recording which keys were used."""

    def __init__(self, raw: Mapping[str, str], names: dict[str, str]) -> None:
        self.raw = {k.lower(): v for k, v in raw.items()}
        self.names = names  # lower-case key -> documented spelling
        unknown = sorted(set(self.raw) - set(names) - _SPARK_KEYS)
        if unknown:
            raise InvalidOption(unknown_message(unknown[0], self.raw[unknown[0]], names))

    def text(self, key: str, default: str = "") -> str:
        return self.raw.get(key, default).strip()

    def has(self, key: str) -> bool:
        return key in self.raw and self.raw[key].strip() != ""

    def integer(self, key: str, default: int, low: int, high: int) -> int:
        if not self.has(key):
            return default
        value = self.raw[key]
        if not _INTEGER.fullmatch(value.strip()):  # int() takes 1_0 and non-ASCII digits
            raise _bad(self.names[key], value, "not an integer")
        number = int(value.strip())
        if not low <= number <= high:
            raise _bad(self.names[key], value, f"must be between {low} and {high}")
        return number

    def flag(self, key: str, default: bool) -> bool:
        if not self.has(key):
            return default
        return _flag(self.names[key], self.raw[key])

    def duration_ms(self, key: str, default: int, high: int) -> int:
        if not self.has(key):
            return default
        value = self.raw[key]
        match = _DURATION.match(value)
        if not match:
            raise _bad(self.names[key], value, "not a duration like 500ms, 30s, 15m, 1h")
        millis = int(match.group(1)) * _UNIT_MS[(match.group(2) or "ms").lower()]
        if millis > high:
            raise _bad(self.names[key], value, f"longer than the limit of {high} ms")
        return millis


_READ_NAMES = [
    "broker", "namesrv", "topic", "topicPattern", "group", "startingOffsets", "groupFallback",
    "startingTimestamp", "endingOffsets", "endingTimestamp", "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger", "maxTriggerDelay", "maxBytesPerTrigger",
    "maxRecordsPerPartition", "tags", "includeHeaders", "failOnDataLoss", "timeoutMs",
    "token", "tlsCa", "tlsCert", "tlsKey", "readFromReplicas", "filter", "pushFilters",
    # Spark Kafka source names (issue 29): synonyms and Kafka's per-queue options.
    "subscribe", "subscribePattern", "assign", "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy", "minPartitions",
    # Topic schemas (format_options.py).
    "valueFormat", "keyFormat", "valueSchemaVersion", "keySchemaVersion", "valueSchema",
    "keySchema", "mode", "columnNameOfCorruptRecord", "schemaEvolutionMode",
]  # fmt: skip
_WRITE_NAMES = [
    "broker", "namesrv", "topic", "timeoutMs", "batchSize", "delivery", "transactionalId",
    "enableIdempotence", "token", "tlsCa", "tlsCert", "tlsKey",
    "valueFormat", "keyFormat", "valueSchemaVersion", "keySchemaVersion",
]  # fmt: skip
DELIVERIES = ("exactly_once", "at_least_once")
_SINK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")


@dataclass(frozen=True)
class Security:
    """How to reach brokers and name servers that require TLS or a token (the
    same for reads and writes, brokers and name servers). Unset fields fall
    back to the client's environment variables (``$EQUEUE_TOKEN``,
    ``$EQUEUE_TLS_CA``, ...) where the task runs."""

    token: str | None = field(default=None, repr=False)
    """Option ``token`` (Spark redacts option values named like it in plans and UIs)."""
    tls_ca: str | None = None
    """Option ``tlsCa``: PEM file of the CA that signed the broker's certificate,
    readable at this path on the driver and every executor."""
    tls_cert: str | None = None
    tls_key: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, o: _Options) -> Security:
        def get(key: str) -> str | None:
            return o.text(key) if o.has(key) else None

        if o.has("tlscert") != o.has("tlskey"):
            raise _bad("tlsCert", o.text("tlscert"), "give tlsCert and tlsKey together")
        return cls(get("token"), get("tlsca"), get("tlscert"), get("tlskey"))

    def client(
        self, broker: str, timeout_ms: int, namesrv: tuple[str, ...] = (),
        read_from_replicas: bool = False,
    ) -> ClientConfig:  # fmt: skip
        return ClientConfig(
            broker=broker, namesrv=namesrv, timeout_s=timeout_ms / 1000, token=self.token,
            tls_ca=self.tls_ca, tls_cert=self.tls_cert, tls_key=self.tls_key,
            read_from_replicas=read_from_replicas,
            # timeoutMs bounds a failing call, retries included, not each attempt.
            retries_within_timeout=True,
        )  # fmt: skip


@dataclass(frozen=True)
class ReadOptions:
    """Options of ``spark.read`` / ``spark.readStream`` ``.format("equeue")``."""

    broker: str
    """host:port of the broker; default ``$EQUEUE_BROKER`` or 127.0.0.1:5000."""
    namesrv: tuple[str, ...] = ()
    """A cluster's name servers (option ``namesrv``), the alternative to ``broker``."""
    topics: tuple[str, ...] = ()
    """Topics to read (option ``topic``/``subscribe``, comma-separated; with
    ``assign``, the assigned queues' topics)."""
    topic_pattern: re.Pattern[str] | None = None
    """Regex over topic names (option ``topicPattern``), re-evaluated every micro-batch."""
    group: str = ""
    """Consumer group whose progress the query commits on the broker."""
    starting: StartSpec = "latest"
    """Where a new query starts (option ``startingOffsets``); ``group`` when the
    option is not given but ``group`` is."""
    group_fallback: str = "earliest"
    """With ``startingOffsets=group``: where queues the group never committed start."""
    starting_timestamp_ms: int | None = None
    """Option ``startingTimestamp``: compared with the broker's store time
    (``storeTimestamp``, Kafka's LogAppendTime), not the producer's ``timestamp``."""
    ending: StartSpec = "latest"
    """Batch only: where the read stops (exclusive)."""
    ending_timestamp_ms: int | None = None
    """Option ``endingTimestamp``: compared with the broker's store time, too."""
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    max_bytes_per_trigger: int | None = None
    max_records_per_partition: int | None = None
    min_partitions: int | None = None
    """Option ``minPartitions``: split queue ranges (Kafka's algorithm,
    ``offsets.min_partition_ranges``) until there are about this many tasks."""
    topic_option: str = "topic"
    """How the user named the option of ``topics`` (``topic`` or Kafka's ``subscribe``)."""
    assigned: dict[str, frozenset[int]] | None = None
    """Option ``assign``: the only queues read, per topic (cluster:
    ``BROKER/TOPIC``, as offsets.py keys them); ``topics`` holds their topics."""
    timestamp_strategy: str = "latest"
    """Option ``startingOffsetsByTimestampStrategy`` (``error`` | ``latest``):
    for ``startingTimestamp`` and ``startingOffsetsByTimestamp`` alike."""
    tags: tuple[str, ...] = ()
    filter: str = ""
    """Option ``filter``: a broker filter expression (equeue_proto.selector's
    grammar) every record read must pass; checked when the query starts."""
    push_filters: bool = True
    """Option ``pushFilters``: ``false`` never pushes Spark's filters down."""
    include_headers: bool = False
    fail_on_data_loss: bool = True
    timeout_ms: int = 30_000
    """Deadline of every broker call made by the driver and by read tasks."""
    security: Security = field(default_factory=Security)
    streaming: bool = False
    """A ``readStream`` (defaults differ: a stream starts at the latest offsets)."""
    read_from_replicas: bool = False
    """Option ``readFromReplicas`` (cluster only): list offsets and read records
    on a replica of each broker group (the master if none is live); group
    progress is still committed on the master."""
    formats: FormatOptions = field(default_factory=FormatOptions)
    """How ``value`` and ``key`` are decoded (format_options.py)."""

    @property
    def client(self) -> ClientConfig:
        return self.security.client(
            self.broker, self.timeout_ms, self.namesrv, self.read_from_replicas
        )

    @property
    def cluster(self) -> bool:
        """Option ``namesrv`` given (for messages and tests; the connector asks
        its ``Routes``, tests/project/test_one_shape.py)."""
        return bool(self.namesrv)

    @classmethod
    def parse(cls, raw: Mapping[str, str], *, streaming: bool) -> ReadOptions:
        o = _Options(raw, {n.lower(): n for n in _READ_NAMES})
        _fold_synonyms(o)
        namesrv = _namesrv(o)
        broker = "" if namesrv else _broker(o)
        # Queue names in the JSON options are checked now, against the naming
        # of the routes these settings give (Routes.misnamed_why), so that a
        # name that can never match fails at once.
        kind = routes_type(ClientConfig(broker=broker, namesrv=namesrv))
        topics, pattern, assigned = _parse_topics(o, kind)
        scope = _Scope(topics, pattern, assigned, kind)
        kwargs: dict[str, Any] = {"broker": broker, "namesrv": namesrv, "topics": topics}
        kwargs["streaming"] = streaming
        kwargs["topic_pattern"] = pattern
        kwargs["assigned"] = assigned
        kwargs["topic_option"] = o.names.get("topic", "topic")  # subscribe, if so written
        kwargs["group"] = o.text("group")
        strategy = o.text("startingoffsetsbytimestampstrategy", "latest").lower()
        if strategy not in STRATEGIES:
            raise _bad("startingOffsetsByTimestampStrategy", strategy, "must be error or latest")
        kwargs["timestamp_strategy"] = strategy
        for key in BATCH_ONLY:
            if streaming and o.has(key):
                raise _bad(o.names[key], o.text(key), "only batch reads take it")
        kwargs.update(_starting(o, streaming, scope, strategy))
        fallback = o.text("groupfallback", "earliest").lower()
        if fallback not in ("earliest", "latest"):
            raise _bad("groupFallback", fallback, "must be earliest or latest")
        kwargs["group_fallback"] = fallback
        kwargs.update(_ending(o, scope))
        if o.has("minpartitions"):
            kwargs["min_partitions"] = o.integer("minpartitions", 0, 1, MAX_MIN_PARTITIONS)
        for key, attr in (
            ("maxoffsetspertrigger", "max_offsets_per_trigger"),
            ("minoffsetspertrigger", "min_offsets_per_trigger"),
            ("maxbytespertrigger", "max_bytes_per_trigger"),
            ("maxrecordsperpartition", "max_records_per_partition"),
        ):
            if o.has(key):
                kwargs[attr] = o.integer(key, 0, 1, 2**62)
        kwargs["max_trigger_delay_ms"] = o.duration_ms(
            "maxtriggerdelay", 15 * 60_000, MAX_TRIGGER_DELAY_MS
        )
        if o.has("tags"):
            tags = tuple(t.strip() for t in o.text("tags").split("|"))
            if any(not t for t in tags):
                raise _bad("tags", o.text("tags"), "an empty tag; write tags as a|b|c")
            kwargs["tags"] = tags
        kwargs["filter"] = _filter(o)
        kwargs["push_filters"] = o.flag("pushfilters", True)
        kwargs["include_headers"] = o.flag("includeheaders", False)
        kwargs["fail_on_data_loss"] = o.flag("failondataloss", True)
        kwargs["timeout_ms"] = o.integer("timeoutms", 30_000, 1, MAX_TIMEOUT_MS)
        kwargs["security"] = Security.parse(o)
        kwargs["read_from_replicas"] = o.flag("readfromreplicas", False)
        if kwargs["read_from_replicas"] and not namesrv:
            raise _bad(
                "readFromReplicas", o.text("readfromreplicas"),
                "needs a cluster: give the namesrv option (one broker has no replicas)",
            )  # fmt: skip
        kwargs["formats"] = FormatOptions.parse(o.text, o.has, write=False)
        return cls(**kwargs)


def _flag(name: str, value: str) -> bool:
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise _bad(name, value, "must be true or false")
    return word == "true"


def _filter(o: _Options) -> str:
    """Option ``filter``, parsed now so a bad expression fails the query at
    ``load()`` naming the position, not in a task."""
    text = o.text("filter")
    if text:
        try:
            check_filter(text)
        except ValueError as exc:
            raise _bad("filter", text, str(exc)) from None
    return text


def check_filter(text: str) -> None:
    """``SelectorError`` (a ``ValueError`` naming the position) if ``text`` is
    not a filter expression the broker takes."""
    parse(text)


def and_filters(*expressions: str) -> str:
    """The AND of filter expressions (empty ones left out)."""
    given = [e for e in expressions if e]
    if len(given) <= 1:
        return given[0] if given else ""
    return " AND ".join(f"({e})" for e in given)


def headers_requested(raw: Mapping[str, str]) -> bool:
    """``includeHeaders`` alone, parsed as ``ReadOptions`` parses it: Spark asks
    the source for its schema before it builds a reader."""
    for key, value in raw.items():
        if key.lower() == "includeheaders" and value.strip():
            return _flag("includeHeaders", value)
    return False


_SYNONYMS = (("subscribe", "topic"), ("subscribepattern", "topicpattern"))
"""Kafka's spellings (lower-cased) of our options, folded into ours."""


def _fold_synonyms(o: _Options) -> None:
    """Kafka's ``subscribe``/``subscribePattern`` become ``topic``/``topicPattern``;
    messages then name the spelling the user wrote."""
    for kafka, ours in _SYNONYMS:
        if not o.has(kafka):
            o.raw.pop(kafka, None)
            continue
        if o.has(ours):
            raise InvalidOption(
                f"options {o.names[ours]}={o.raw[ours]!r} and {o.names[kafka]}="
                f"{o.raw[kafka]!r}: give {o.names[ours]} or {o.names[kafka]}, not both "
                "(the second is Kafka's name for the first)"
            )
        o.raw[ours] = o.raw.pop(kafka)
        o.names[ours] = o.names[kafka]


Assigned = dict[str, frozenset[int]]


def _parse_topics(
    o: _Options, kind: type[Routes]
) -> tuple[tuple[str, ...], re.Pattern[str] | None, Assigned | None]:
    """Exactly one of ``topic``, ``topicPattern`` and ``assign`` (or Kafka's spellings)."""
    given = [k for k in ("topic", "topicpattern", "assign") if o.has(k)]
    if len(given) != 1:
        shown = ", ".join(f"{o.names[k]}={o.raw[k]!r}" for k in given) or "none"
        raise InvalidOption(
            "give exactly one of the options topic or subscribe (a name or a comma list), "
            "topicPattern or subscribePattern (a regex) and assign (a JSON of queues, "
            f'{{"orders": [0, 1]}}); got {shown}'
        )
    if given == ["assign"]:
        assigned = _parse_assign(o.text("assign"), kind)
        return tuple(dict.fromkeys(split_key(n)[1] for n in assigned)), None, assigned
    if given == ["topicpattern"]:
        text = o.text("topicpattern")
        try:
            return (), re.compile(text), None
        except re.error as exc:
            raise _bad(o.names["topicpattern"], text, f"not a regular expression ({exc})") from None
    name, text = o.names["topic"], o.text("topic")
    topics = tuple(t.strip() for t in text.split(","))
    if any(not t for t in topics):
        raise _bad(name, text, "an empty topic name in the list")
    if len(set(topics)) != len(topics) or len(topics) > MAX_TOPICS:
        raise _bad(name, text, f"names must be distinct, at most {MAX_TOPICS}")
    return topics, None, None


def _queue_ref(named: object) -> tuple[str, int] | None:
    """(broker, queue id) of a queue as a JSON names it: ``"3"`` or ``3``, or a
    cluster's ``"BROKER/3"``; None if it is neither."""
    if isinstance(named, int) and not isinstance(named, bool):
        return ("", named) if 0 <= named <= MAX_QUEUE_ID else None
    if not isinstance(named, str):
        return None
    broker, sep, queue = named.partition("/")
    if not sep:
        broker, queue = "", named
    elif not broker:
        return None
    if not (queue.isdigit() and queue.isascii()) or int(queue) > MAX_QUEUE_ID:
        return None
    return broker, int(queue)


def _queue_kind(
    name: str, text: str, topic: str, named: object, *, ref: tuple[str, int], kind: type[Routes]
) -> None:
    """Refuse a queue named for the other kind of routes (``kind``'s rule):
    such a name could never match a queue, and a stream would wait for it
    forever."""
    why = kind.misnamed_why(json.dumps(named), topic, ref)
    if why is not None:
        raise _bad(name, text, why)


class _Duplicate(ValueError):
    pass


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are distinct (json.loads keeps the last of a
    repeated key silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _json(name: str, text: str, why: str) -> Any:
    """An option's JSON (``why``: the error when it is not JSON)."""
    try:
        return json.loads(text, object_pairs_hook=_object)
    except _Duplicate as exc:
        raise _bad(name, text, f"{str(exc)!r} is given twice") from None
    except ValueError:
        raise _bad(name, text, why) from None


def _parse_assign(text: str, kind: type[Routes]) -> Assigned:
    """Option ``assign``: ``{"orders": [0, 1]}``, over a cluster ``{"orders": ["a/0", "b/1"]}``
    (each queue named as ``kind``'s routes name queues)."""
    example = 'must be a JSON object like {"orders": [0, 1]} (a cluster\'s {"orders": ["a/0"]})'
    parsed = _json("assign", text, example)
    if not isinstance(parsed, dict) or not parsed:
        raise _bad("assign", text, example)
    if len(parsed) > MAX_TOPICS:
        raise _bad("assign", text, f"at most {MAX_TOPICS} topics")
    assigned: dict[str, set[int]] = {}
    for topic, queues in parsed.items():
        if not topic or "/" in topic or topic != topic.strip():
            raise _bad("assign", text, f"{topic!r} is not a topic name")
        if not isinstance(queues, list) or not queues:
            raise _bad("assign", text, f"topic {topic!r} must map to a list of queue ids")
        if len(queues) > MAX_ASSIGNED:
            raise _bad("assign", text, f"topic {topic!r}: at most {MAX_ASSIGNED} queues")
        for named in queues:
            ref = _queue_ref(named)
            if ref is None:
                why = "is not a queue id (a number, or BROKER/NUMBER over a cluster)"
                raise _bad("assign", text, f"queue {named!r} of {topic!r} {why}")
            _queue_kind("assign", text, topic, named, ref=ref, kind=kind)
            assigned.setdefault(cluster_key(ref[0], topic), set()).add(ref[1])
    return {name: frozenset(ids) for name, ids in assigned.items()}


_PRECEDENCE = {
    "starting": ("startingtimestamp", "startingoffsetsbytimestamp", "startingoffsets"),
    "ending": ("endingtimestamp", "endingoffsetsbytimestamp", "endingoffsets"),
}
"""Kafka's precedence among the options saying where a read starts (ends): the first given wins."""


def _warn_precedence(o: _Options, which: str) -> None:
    """One warning when a lower-precedence option is also given (Kafka's rule,
    where a lower one is silently ignored)."""
    given = [k for k in _PRECEDENCE[which] if o.has(k)]
    if len(given) < 2:
        return
    winner, lower = o.names[given[0]], [o.names[k] for k in given[1:]]
    if given[0].endswith("bytimestamp"):
        what = f"{lower[0]} applies only to the queues {winner} leaves out"
    else:
        what = f"{' and '.join(lower)} {'is' if len(lower) == 1 else 'are'} ignored"
    log.warning("options %s and %s both given: %s wins (Kafka's precedence: %s); %s",
                winner, " and ".join(lower), winner,
                " > ".join(o.names[k] for k in _PRECEDENCE[which]), what)  # fmt: skip


@dataclass(frozen=True)
class _Scope:
    """What a query reads, as its options say: offset JSONs may name only that."""

    topics: tuple[str, ...]
    pattern: re.Pattern[str] | None
    assigned: Assigned | None
    kind: type[Routes]
    """The routes the options give: how their queues are named."""

    def reads(self, topic: str) -> bool:
        return topic in self.topics or bool(self.pattern and self.pattern.fullmatch(topic))


def _starting(o: _Options, streaming: bool, scope: _Scope, strategy: str) -> dict[str, Any]:
    """``starting`` and ``starting_timestamp_ms`` of ``ReadOptions``."""
    _warn_precedence(o, "starting")
    out: dict[str, Any] = {}
    starting: StartSpec = _parse_offsets(o, "startingoffsets", streaming, scope)
    if o.text("group") and not o.has("startingoffsets") and not o.has("startingtimestamp"):
        # As a Kafka consumer with a group.id: resume where the group left off,
        # and read from groupFallback (earliest) where it never committed.
        starting = "group"
    if starting == "group" and not o.text("group"):
        raise _bad("startingOffsets", "group", "needs the group option")
    # Every given option is checked, the ones Kafka's precedence ignores too.
    times = None
    if o.has("startingoffsetsbytimestamp"):
        times = _queue_json(o, "startingoffsetsbytimestamp", scope, 0)
    elif o.has("startingoffsetsbytimestampstrategy") and not o.has("startingtimestamp"):
        log.warning("option startingOffsetsByTimestampStrategy=%s has no effect without "
                    "startingTimestamp or startingOffsetsByTimestamp", strategy)  # fmt: skip
    if o.has("startingtimestamp"):
        out["starting_timestamp_ms"] = _store_time(o, "startingtimestamp")
    elif times is not None:
        assert not isinstance(starting, TimestampSpec)
        starting = TimestampSpec(times, strategy, starting)
    out["starting"] = starting
    return out


def _ending(o: _Options, scope: _Scope) -> dict[str, Any]:
    """``ending`` and ``ending_timestamp_ms`` of ``ReadOptions`` (batch reads)."""
    _warn_precedence(o, "ending")
    out: dict[str, Any] = {}
    ending: StartSpec = _parse_offsets(o, "endingoffsets", False, scope, end=True)
    times = None
    if o.has("endingoffsetsbytimestamp"):
        times = _queue_json(o, "endingoffsetsbytimestamp", scope, 0)
    if o.has("endingtimestamp"):
        out["ending_timestamp_ms"] = _store_time(o, "endingtimestamp")
    elif times is not None:
        assert not isinstance(ending, TimestampSpec)
        ending = TimestampSpec(times, "latest", ending, "endingOffsetsByTimestamp")
    out["ending"] = ending
    return out


def _parse_offsets(
    o: _Options, key: str, streaming: bool, scope: _Scope, *, end: bool = False
) -> str | QueueSpec:
    """``earliest`` | ``latest`` | ``group`` | JSON ``{"topic": {"0": 12, "1": -2}}``."""
    default = "latest" if (streaming or end) else "earliest"
    text = o.text(key, default)
    words = ("latest",) if end else ("earliest", "latest", "group")
    if text.lower() in words:
        return text.lower()
    return _queue_json(o, key, scope, LATEST if end else EARLIEST, words)


def _queue_json(
    o: _Options, key: str, scope: _Scope, lowest: int, words: tuple[str, ...] = ()
) -> QueueSpec:
    """A JSON ``{"topic": {"QUEUE": number}}`` option (cluster queues ``"BROKER/QUEUE"``):
    every topic one the query reads, every queue an assigned one (with ``assign``),
    every number at least ``lowest``."""
    name, text = o.names[key], o.text(key)
    timed = key.endswith("bytimestamp")
    why = f"must be {', '.join(words)} or a JSON object" if words else "must be a JSON object"
    parsed = _json(name, text, why)
    if not isinstance(parsed, dict) or not parsed:
        example = '{"topic": {"0": 1767225600000}}' if timed else '{"topic": {"0": 12, "1": -2}}'
        raise _bad(name, text, f"must be a JSON object like {example}")
    spec: QueueSpec = {}
    for topic, queues in parsed.items():
        if not scope.reads(topic):
            raise _bad(name, text, f"topic {topic!r} is not one the query reads")
        if not isinstance(queues, dict) or not queues:
            what = "times (ms)" if timed else "offsets"
            raise _bad(name, text, f"topic {topic!r} must map queue ids to {what}")
        for named, value in queues.items():
            ref = _queue_ref(named)
            if ref is None:
                raise _bad(name, text, f"queue id {named!r} of {topic!r} is not a number")
            _queue_kind(name, text, topic, named, ref=ref, kind=scope.kind)
            spec_key = cluster_key(ref[0], topic)
            if scope.assigned is not None and ref[1] not in scope.assigned.get(spec_key, ()):
                raise _bad(name, text, f"queue {named} of {topic!r} is not among the assigned "
                                       "queues (option assign)")  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                what = "time" if timed else "offset"
                raise _bad(name, text, f"{what} {value!r} of {topic}/{named} must be an "
                                       f"integer >= {lowest}")  # fmt: skip
            if timed and value > MAX_TIME_MS:  # as startingTimestamp's bound
                raise _bad(name, text, f"time {value} of {topic}/{named} must be between 0 "
                                       f"and {MAX_TIME_MS} ({STORE_TIME})")  # fmt: skip
            spec.setdefault(spec_key, {})[ref[1]] = value
    return spec


@dataclass(frozen=True)
class WriteOptions:
    """Options of ``df.write`` / ``df.writeStream`` ``.format("equeue")``."""

    broker: str
    namesrv: tuple[str, ...] = ()
    """A cluster's name servers (option ``namesrv``): rows route like the producer's."""
    topic: str = ""
    """Overrides the ``topic`` column; one of the two is required."""
    batch_size: int = 5000
    """Rows per produce call (1 to 10,000)."""
    timeout_ms: int = 30_000
    delivery: str = "exactly_once"
    """``exactly_once``: rows are staged in broker transactions and committed
    with the batch/job; ``at_least_once``: appended directly (task retries
    may duplicate)."""
    transactional_id: str = ""
    """Sink identity for exactly-once streaming writes; default: the query id."""
    enable_idempotence: bool = True
    """Option ``enableIdempotence``: at-least-once writes go through an
    idempotent producer (a retry within a task appends nothing twice); false
    for brokers without ``InitProducer``."""
    security: Security = field(default_factory=Security)
    formats: FormatOptions = field(default_factory=FormatOptions)
    """How a struct ``value``/``key`` column is encoded (format_options.py)."""

    @property
    def client(self) -> ClientConfig:
        return self.security.client(self.broker, self.timeout_ms, self.namesrv)

    @property
    def cluster(self) -> bool:
        """Option ``namesrv`` given (for messages and tests; the connector asks
        its ``Routes``, tests/project/test_one_shape.py)."""
        return bool(self.namesrv)

    @property
    def exactly_once(self) -> bool:
        return self.delivery == "exactly_once"

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> WriteOptions:
        o = _Options(raw, {n.lower(): n for n in _WRITE_NAMES})
        namesrv = _namesrv(o)
        return cls(
            broker="" if namesrv else _broker(o),
            namesrv=namesrv,
            topic=o.text("topic"),
            batch_size=o.integer("batchsize", 5000, 1, MAX_WRITE_BATCH),
            timeout_ms=o.integer("timeoutms", 30_000, 1, MAX_TIMEOUT_MS),
            delivery=_delivery(o),
            transactional_id=_transactional_id(o),
            enable_idempotence=o.flag("enableidempotence", True),
            security=Security.parse(o),
            formats=FormatOptions.parse(o.text, o.has, write=True),
        )


def _broker(o: _Options) -> str:
    """Option ``broker``, checked now (else the driver's ``$EQUEUE_BROKER`` or
    the default, checked too): one ``HOST:PORT``."""
    address, source = resolve_address(o.text("broker"))
    try:
        check_address(address, source)
    except InvalidAddress as exc:
        if source == "broker address":
            raise _bad("broker", address, exc.reason) from None
        raise InvalidOption(f"no broker option, and {exc}") from None
    return o.text("broker")


def _driver_namesrv(o: _Options) -> str:
    """The driver's ``$EQUEUE_NAMESRV`` where neither ``broker`` nor ``namesrv``
    is given (what ``ClientConfig`` would fall back to), else ``""``."""
    if o.has("namesrv") or o.has("broker"):
        return ""
    return os.environ.get(NAMESRV_ENV, "").strip()


def _namesrv(o: _Options) -> tuple[str, ...]:
    """Option ``namesrv``: ``HOST:PORT[,HOST:PORT...]``, checked now; not with
    ``broker``. Neither given: the driver's ``$EQUEUE_NAMESRV``, resolved here
    and carried in the options, so that the tasks read the same cluster as
    the driver planned (their own environment may say otherwise) and the
    queues are named as the driver named them."""
    env = _driver_namesrv(o)
    if env:
        try:
            return parse_namesrv(env, f"${NAMESRV_ENV}")
        except InvalidAddress as exc:
            raise InvalidOption(f"no broker or namesrv option, and {exc}") from None
    if not o.has("namesrv"):
        return ()
    if o.has("broker"):
        raise _bad("namesrv", o.text("namesrv"), "give broker or namesrv, not both")
    try:
        return parse_namesrv(o.text("namesrv"), "namesrv")
    except InvalidAddress as exc:
        raise _bad("namesrv", o.text("namesrv"), exc.reason) from None


def _delivery(o: _Options) -> str:
    value = o.text("delivery", "exactly_once").lower()
    if value not in DELIVERIES:
        raise _bad("delivery", o.raw["delivery"], f"must be one of {', '.join(DELIVERIES)}")
    return value


def _transactional_id(o: _Options) -> str:
    value = o.text("transactionalid")
    if value and not _SINK_ID.fullmatch(value):
        raise _bad(
            "transactionalId", value,
            "use up to 128 ASCII letters, digits, '.', '_', '-' and '@', "
            "starting with a letter or digit",
        )  # fmt: skip
    return value
