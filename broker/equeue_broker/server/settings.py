"""The broker's settings table: every setting as operators name it.

``SETTINGS`` names each setting the way operators do: its TOML key
(``chunk_size`` or ``chunk-size``) and its flag (``--chunk-size``), which are a
documented interface and keep their historical names and units; for a storage
setting the table says which ``StorageConfig`` field it sets and how the unit
converts (``retention_max_age_hours`` sets ``retention.max_age_ms``). Flags,
the file parser (config.py), ``--help`` and docs/equeue-broker.toml's test all
read it. The typed settings themselves (``BrokerConfig``) and the parsing are
in config.py, which builds the table for its class (``table``): this module
describes BrokerConfig's fields without importing it.
"""

from __future__ import annotations

import enum
import functools
import types
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, get_type_hints

from equeue_broker.server.durations import format_ms, parse_ms
from equeue_broker.storage.config import MAX_DELAY_LIMIT_MS, UNIT, GiB, KiB, MiB, StorageConfig
from equeue_broker.storage.errors import InvalidArgument


@functools.cache
def _hints(owner: type) -> dict[str, Any]:
    """A config dataclass's resolved field types, once per class: resolving
    them is most of what a broker's start spends checking its settings table."""
    return get_type_hints(owner)


@functools.cache
def _defaults(server: type) -> Any:
    """A default ``BrokerConfig``, built once: --help names every setting's
    default, and a broker's start builds that parser (one config per setting
    was 40-70 ms of every start)."""
    return server()


@dataclass(frozen=True)
class Setting:
    """One setting as operators name it: a TOML key and, mostly, a flag."""

    key: str
    """The TOML key (``-`` or ``_``); the flag is ``--`` and the key with ``-``."""
    help: str
    target: str = ""
    """The ``StorageConfig`` field it sets, dotted (``retention.max_age_ms``);
    empty: the ``BrokerConfig`` field named ``key``."""
    unit: str = ""
    """The key's unit where it differs from the field's (then ``per_unit``
    converts); empty: the field's ``UNIT`` metadata."""
    per_unit: int = 1
    """Target units per unit of the key (3,600,000 ms per hour)."""
    minus_one_is_none: bool = False
    """-1 means None (no limit): TOML has no null."""
    choices: tuple[str, ...] = ()
    flag: bool = True
    """False: only the config file takes it (as before this table existed)."""
    duration: bool = False
    """The key takes durations (``"30s"``, ``"7d"``: durations.py), a list of
    them for a tuple field; the field holds milliseconds."""
    longest_ms: int = 0
    """A duration setting's upper limit, checked here so that the error says
    it as a duration (the target's own check still applies); 0: none here."""
    server: Any = field(default=None, compare=False, repr=False)
    """``BrokerConfig``, whose fields the server settings set: given by
    ``table``, which config.py calls (this module does not import it)."""

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.target.split("."))

    @property
    def flag_name(self) -> str:
        return "--" + self.key.replace("_", "-")

    def _field(self) -> tuple[Any, str]:
        """The dataclass owning the field this setting sets, and the field's name."""
        owner: Any = StorageConfig if self.target else self.server
        names = self.path if self.target else (self.key,)
        for name in names[:-1]:
            owner = _hints(owner)[name]
        return owner, names[-1]

    def kind(self) -> Any:
        """The type of the field it sets, without ``None``."""
        owner, name = self._field()
        hint = _hints(owner)[name]
        if isinstance(hint, types.UnionType):
            (hint,) = [h for h in hint.__args__ if h is not type(None)]
        return hint

    def unit_name(self) -> str:
        if self.unit:
            return self.unit
        if self.duration:  # each value says its unit ("30s")
            return ""
        owner, name = self._field()
        (target,) = [f for f in fields(owner) if f.name == name]
        return str(target.metadata.get(UNIT, ""))

    def to_target(self, value: Any, name: str = "") -> Any:
        """A value in the key's unit as the target field takes it; ``name``:
        the setting as the operator gave it, for a bad duration's error."""
        if value is None or (self.minus_one_is_none and value == -1):
            return None
        if self.duration:
            shown = name or self.key
            if isinstance(value, Mapping):
                return {
                    str(k): tuple(parse_ms(d, f"{shown}: {k}") for d in v) for k, v in value.items()
                }
            if isinstance(value, list | tuple):
                return tuple(parse_ms(v, f"{shown}: entry") for v in value)
            ms = parse_ms(value, shown)
            if self.longest_ms and not 0 < ms <= self.longest_ms:
                raise InvalidArgument(
                    f"{shown} {value!r} is out of range: give more than 0 and at most "
                    f"{format_ms(self.longest_ms)}"
                )
            return ms
        # Enum values ("sync") go through as they are: StorageConfig converts
        # and checks them, and its error then names the setting (_name_settings).
        if self.per_unit != 1:
            return int(value * self.per_unit)
        return value

    def from_target(self, value: Any) -> Any:
        """``to_target`` reversed: the value in the key's unit."""
        if value is None:
            return -1 if self.minus_one_is_none else None
        if isinstance(value, enum.Enum):
            return value.value
        if self.duration:
            if isinstance(value, Mapping):
                return {k: [format_ms(d) for d in v] for k, v in value.items()}
            return [format_ms(v) for v in value] if isinstance(value, tuple) else format_ms(value)
        if self.per_unit != 1:
            return value / self.per_unit
        return value

    def default(self) -> Any:
        return _defaults(self.server).setting(self.key)

    def describe_default(self) -> str:
        """The default as --help and docs/equeue-broker.toml show it."""
        value = self.default()
        if value is None or value in ("", {}):
            return "unset"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return f"{value:g}"
        if isinstance(value, list):
            return " ".join(value)
        if self.unit_name() == "bytes" and value >= KiB and value % KiB == 0:
            return f"{value} = {_binary(value)}"
        return str(value)

    def unit_and_default(self) -> str:
        unit = self.unit_name()
        return f"{unit + '; ' if unit else ''}default {self.describe_default()}"

    def help_text(self) -> str:
        return f"{self.help} ({self.unit_and_default()})"


def table(server: type) -> tuple[Setting, ...]:
    """The settings, their server ones setting fields of ``server`` (BrokerConfig)."""
    return tuple(replace(s, server=server) for s in _ENTRIES)


# Flag order is the order --help has always listed them in.
_ENTRIES: tuple[Setting, ...] = (
    Setting(
        "data_dir",
        "directory of the message log, queue indexes, consumer offsets and staged"
        " transactions; created if missing; a relative path is taken from the working"
        " directory; one broker per directory",
        target="data_dir",
    ),
    Setting("host", "address to listen on; 0.0.0.0 for every interface"),
    Setting("port", "0 = pick a free port"),
    Setting(
        "flush",
        "sync: fsync before acking an append; async: every flush interval",
        target="flush_mode",
    ),
    Setting(
        "flush_interval_ms",
        "async fsync period; index and checkpoint sync period",
        target="flush_interval_ms",
    ),
    Setting("chunk_size", "message log chunk capacity", target="chunk_capacity_bytes"),
    Setting("max_message_bytes", "largest encoded record", target="limits.max_message_bytes"),
    Setting(
        "retention_max_chunks",
        "completed chunks to keep; -1 = no count limit",
        target="retention.max_chunks",
        minus_one_is_none=True,
    ),
    Setting(
        "retention_max_age_hours",
        "delete chunks sealed longer ago; -1 = no age limit",
        target="retention.max_age_ms",
        unit="hours",
        per_unit=3_600_000,
        minus_one_is_none=True,
    ),
    Setting(
        "retention_keep_unconsumed",
        "keep chunks a consumer group has not consumed yet",
        target="retention.keep_unconsumed",
    ),
    Setting(
        "retention_check_interval_ms", "how often to apply it", target="retention.check_interval_ms"
    ),
    Setting("auto_create_topics", "create a topic on its first produce"),
    Setting(
        "default_queues", "queues of a topic created without a count", target="default_queue_count"
    ),
    Setting(
        "max_queues_per_topic",
        "most queues a topic may have",
        target="max_queues_per_topic",
        flag=False,
    ),
    Setting("max_wait_ms", "longest a pull may be parked"),
    Setting("max_parked_pulls", "pulls parked at once"),
    Setting(
        "max_pull_messages",
        "most messages one pull returns",
        target="max_read_messages",
        flag=False,
    ),
    Setting(
        "max_pull_bytes", "most record bytes one pull returns", target="max_read_bytes", flag=False
    ),
    Setting("max_request_bytes", "largest request gRPC accepts", flag=False),
    Setting(
        "consumer_timeout_ms",
        "a consumer without a heartbeat this long leaves its group",
    ),
    Setting(
        "transaction_timeout_ms",
        "abort transactions idle this long",
        target="transactions.timeout_ms",
    ),
    Setting("max_consumer_groups", "consumer groups with live members at once", flag=False),
    Setting("max_consumers", "live members of all consumer groups together", flag=False),
    Setting("max_consumers_per_group", "live members of one consumer group", flag=False),
    Setting("max_heartbeat_topics", "topics one heartbeat may subscribe to", flag=False),
    Setting("max_queue_locks", "queue locks all consumer groups may hold", flag=False),
    Setting("max_pull_streams", "PullStreams open at once", flag=False),
    Setting(
        "max_reply_bytes",
        "record bytes of pull and stream replies being read or sent at once",
        flag=False,
    ),
    Setting("max_produce_bytes", "bytes of produce requests being handled at once", flag=False),
    Setting("max_produce_streams", "ProduceStreams open at once", flag=False),
    Setting("max_intake_bytes", "unary request bodies being received at once", flag=False),
    Setting("request_read_timeout_ms", "longest a request body may take to arrive", flag=False),
    Setting(
        "max_open_index_files",
        "index files kept open, least recently used closed first",
        target="max_open_index_files",
        flag=False,
    ),
    Setting(
        "max_schema_bytes",
        "longest schema text one version of a topic's schema may have",
        target="max_schema_bytes",
        flag=False,
    ),
    Setting(
        "max_schema_versions",
        "versions one topic's value (or key) schema keeps at most",
        target="max_schema_versions",
        flag=False,
    ),
    Setting(
        "max_connections",
        "TCP connections at once, more are closed; 0 = from the open-files limit",
        flag=False,
    ),
    Setting(
        "max_connections_per_address",
        "TCP connections from one client address, the newest over it are closed; 0 = no limit",
    ),
    Setting(
        "max_streams_per_connection",
        "calls in flight on one connection; more get RESOURCE_EXHAUSTED",
        flag=False,
    ),
    Setting("max_connection_idle_ms", "close connections without a call this long", flag=False),
    Setting("handshake_timeout_ms", "close connections not set up by then", flag=False),
    Setting(
        "stream_send_timeout_ms",
        "end a PullStream whose client has not taken a reply this long",
        flag=False,
    ),
    Setting(
        "budget_wait_ms",
        "longest a request waits for a byte budget (reply, produce, intake)",
        flag=False,
    ),
    Setting("max_open_transactions", "open transactions at once", target="transactions.max_open"),
    Setting(
        "txn_check_after",
        "check a producer group's open transaction with a producer of the group this long"
        " after its last staged write",
        target="transactions.check_after_ms",
        duration=True,
    ),
    Setting(
        "txn_check_interval",
        "check it again this often while the answer is unknown or nobody answers",
        target="transactions.check_every_ms",
        duration=True,
    ),
    Setting("txn_check_max", "checks of one transaction at most", target="transactions.check_max"),
    Setting(
        "txn_check_exhausted",
        "after the last check: rollback, or keep it until --transaction-timeout-ms",
        target="transactions.check_exhausted",
        choices=("rollback", "keep"),
    ),
    Setting("max_check_streams", "producers' TransactionChecks streams open at once"),
    Setting(
        "key_index",
        "index messages' keys for queries by key (--no-key-index: write no key index)",
        target="key_index.enabled",
    ),
    Setting(
        "key_index_slots",
        "hash slots per key index file (4 bytes each; the active file's are in memory)",
        target="key_index.slot_count",
    ),
    Setting(
        "key_index_capacity",
        "entries per key index file (32 bytes each)",
        target="key_index.entries_per_file",
    ),
    Setting(
        "key_index_window",
        "store time one key index file covers at most",
        target="key_index.window_ms",
        duration=True,
    ),
    Setting(
        "max_key_scan",
        "key index entries one query walks at most (then the reply says truncated)",
        target="key_index.max_scan",
        flag=False,
    ),
    Setting(
        "max_transaction_bytes", "staged bytes per transaction", target="transactions.max_bytes"
    ),
    Setting(
        "max_producers",
        "idempotent producer ids remembered; the least recently written forgotten first",
        target="producers.max_producers",
        flag=False,
    ),
    Setting(
        "producer_window",
        "batches per idempotent producer and queue remembered (a retry of an older is refused)",
        target="producers.window",
        flag=False,
    ),
    Setting(
        "max_queues_per_producer",
        "queues one idempotent producer id may write",
        target="producers.max_queues_per_producer",
        flag=False,
    ),
    Setting(
        "producer_idle_expiry_ms",
        "forget an idempotent producer that wrote nothing this long",
        target="producers.idle_expiry_ms",
        flag=False,
    ),
    Setting("store_threads", "threads for blocking storage calls", flag=False),
    Setting("tls_cert", "PEM certificate: serve TLS"),
    Setting("tls_key", "PEM private key of --tls-cert"),
    Setting("tls_client_ca", "PEM CA: require client certificates it signed"),
    Setting(
        "tokens_file", "TOML list of access tokens; unset: $EQUEUE_BROKER_TOKENS, else no auth"
    ),
    Setting(
        "fetch_port",
        "plain-TCP port for bulk range reads (Spark): off (default), auto = any free port, "
        "or a number",
    ),
    Setting("fetch_insecure", "serve the fetch port (plain text) even though --tls-cert is set"),
    Setting(
        "http_port",
        "HTTP port for /metrics, /healthz and /readyz (TLS and tokens as gRPC); 0 = any free "
        "port; unset: no HTTP listener",
    ),
    Setting("http_host", "address of the HTTP port; unset: --host"),
    Setting("metrics_max_topics", "topic label values in /metrics; the rest: %other", flag=False),
    Setting("metrics_max_groups", "group label values in /metrics; the rest: %other", flag=False),
    Setting(
        "metrics_max_series",
        "per-queue and per-(group, topic) series in /metrics together",
        flag=False,
    ),
    Setting("shutdown_grace_s", "time in-flight requests get on SIGTERM", flag=False),
    Setting("log_level", "log threshold", choices=("DEBUG", "INFO", "WARNING", "ERROR")),
    Setting("log_format", "json: one JSON object per line", choices=("text", "json")),
    Setting(
        "library_log_level",
        "log threshold of gRPC and asyncio, never below --log-level",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
    ),
    Setting(
        "namesrv",
        "name servers to register with, HOST:PORT[,HOST:PORT...]; unset: a standalone broker",
    ),
    Setting("namesrv_tls_ca", "PEM CA: talk TLS to the name servers; unset: plaintext"),
    Setting("namesrv_tls_cert", "PEM client certificate for name servers with mutual TLS"),
    Setting("namesrv_tls_key", "PEM private key of --namesrv-tls-cert"),
    Setting(
        "namesrv_token_file",
        "file holding the token (role broker) sent to the name servers;"
        " unset: $EQUEUE_NAMESRV_TOKEN, else none",
    ),
    Setting("broker_name", "the broker's name in a cluster (message ids, routes); keep it stable"),
    Setting("cluster", "the cluster the broker registers under"),
    Setting("advertise_address", "HOST:PORT the name servers give clients; unset: host:port"),
    Setting("register_interval_ms", "how often to re-register with the name servers"),
    Setting(
        "role",
        "master: takes writes, replicas may follow it; replica: copies --master's log"
        " and serves reads only (docs/replication.md)",
        choices=("master", "replica"),
    ),
    Setting("master", "a replica's master, HOST:PORT"),
    Setting("max_replicas", "replication streams a master serves at once"),
    Setting(
        "zookeeper",
        "HOST:PORT[,HOST:PORT...][/chroot]: elect the group's master through ZooKeeper"
        " (automatic failover; not with --role/--master; needs --broker-name)",
    ),
    Setting("zk_session_timeout_ms", "ZooKeeper session timeout (failover detection time)"),
    Setting(
        "zk_fast_failover",
        "elect at once when the master's replicas find its process gone (connections"
        " refused), not one session timeout later",
    ),
    Setting(
        "replication",
        "sync: acknowledge a write once it is durable on every in-sync replica too;"
        " async: on the master alone (docs/replication.md)",
        choices=("async", "sync"),
    ),
    Setting(
        "min_insync_replicas",
        "in-sync members, the master included, a sync-mode write needs; fewer: UNAVAILABLE",
    ),
    Setting(
        "replica_lag_max_ms",
        "a replica not caught up with the master's log end this long leaves the in-sync set",
    ),
    Setting(
        "max_replication_waits", "sync-mode writes waiting for their replicas at once", flag=False
    ),
    Setting(
        "max_delay",
        "longest delay of a delayed message (a produce's delivery time, a Nack's delay)",
        target="timer.max_delay_ms",
        duration=True,
        longest_ms=MAX_DELAY_LIMIT_MS,
    ),
    Setting(
        "max_reconsume_times",
        "retries a Nacked message gets before it goes to the group's dead-letter topic",
    ),
    Setting(
        "retry_backoff",
        "delay before each retry of a Nacked message, in order; past the end the last repeats",
        flag=False,
        duration=True,
    ),
    Setting(
        "retry_backoff_groups",
        "groups with their own retry_backoff: a table of group names and lists of durations",
        flag=False,
        duration=True,
    ),
)


def _binary(size: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"
