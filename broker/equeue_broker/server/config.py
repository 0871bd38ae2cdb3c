"""Broker configuration: the settings table, command-line flags, the TOML file.

Precedence: flags > config file > defaults. Every duration carries its unit.

``BrokerConfig`` holds the server's own settings and nests the store's
``StorageConfig``, which stays the one source of every storage default, unit
and check. ``SETTINGS`` names each setting the way operators do: its TOML key
(``chunk_size`` or ``chunk-size``) and its flag (``--chunk-size``), which are a
documented interface and keep their historical names and units; for a storage
setting the table says which ``StorageConfig`` field it sets and how the unit
converts (``retention_max_age_hours`` sets ``retention.max_age_ms``). Flags,
the file parser, ``--help`` and docs/equeue-broker.toml's test all read it.
"""

from __future__ import annotations

import argparse
import enum
import json
import re
import tomllib
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn, TypeVar, get_type_hints

from equeue_broker.replication.election import parse_hosts
from equeue_broker.storage.config import UNIT, GiB, KiB, MiB, StorageConfig
from equeue_broker.storage.errors import InvalidArgument
from equeue_proto import __version__
from equeue_proto.protocol import broker_name_problem

T = TypeVar("T")

MAX_NAMESRVS = 16
"""Name servers one broker registers with (each gets a registration per interval)."""

DEFAULT_DATA_DIR = Path("equeue-data")
"""The one storage default the server owns: ``StorageConfig.data_dir`` has none."""


@dataclass(frozen=True)
class BrokerConfig:
    """The server's settings; the store's are in ``storage``."""

    storage: StorageConfig = field(default_factory=lambda: StorageConfig(DEFAULT_DATA_DIR))
    host: str = "127.0.0.1"
    port: int = 5000
    """0 picks a free port (printed in the ready line)."""
    auto_create_topics: bool = True
    max_wait_ms: int = field(default=60_000, metadata={UNIT: "ms"})
    """Longest a pull may be parked."""
    max_parked_pulls: int = field(default=10_000, metadata={UNIT: "pulls"})
    max_request_bytes: int = field(default=24 * MiB, metadata={UNIT: "bytes"})
    """Largest request gRPC accepts (the client's 16 MiB batches plus a 4 MiB
    message and framing). gRPC holds a whole request before any handler sees
    it, so this times the requests in flight is memory; replies may be larger
    (``max_pull_bytes`` plus framing)."""
    consumer_timeout_ms: int = field(default=30_000, metadata={UNIT: "ms"})
    """A consumer without a heartbeat for this long leaves its group."""
    max_consumer_groups: int = field(default=1_000, metadata={UNIT: "groups"})
    """Groups with live members at once (each heartbeat may name a new one)."""
    max_consumers: int = field(default=10_000, metadata={UNIT: "consumers"})
    """Live members of all groups together."""
    max_consumers_per_group: int = field(default=1_024, metadata={UNIT: "consumers"})
    max_heartbeat_topics: int = field(default=256, metadata={UNIT: "topics"})
    """Topics one heartbeat may subscribe to (each must exist)."""
    max_queue_locks: int = field(default=262_144, metadata={UNIT: "locks"})
    """Queue locks all groups together may hold."""
    max_pull_streams: int = field(default=256, metadata={UNIT: "streams"})
    """PullStreams open at once."""
    max_reply_bytes: int = field(default=128 * MiB, metadata={UNIT: "bytes"})
    """Record bytes of pull replies being read or sent at once (Pull, woken
    parked pulls, PullStream: a stream holds its reply until gRPC took it)."""
    max_produce_bytes: int = field(default=128 * MiB, metadata={UNIT: "bytes"})
    """Bytes of produce requests being decoded and appended at once."""
    max_produce_streams: int = field(default=32, metadata={UNIT: "streams"})
    """ProduceStreams open at once (a Spark write task holds one). Each has
    at most one message being received, outside ``max_intake_bytes``, so
    this times ``max_request_bytes`` bounds what streams pin."""
    max_intake_bytes: int = field(default=96 * MiB, metadata={UNIT: "bytes"})
    """Unary request bodies being received or handled at once: each receive
    takes ``max_request_bytes`` until its message is in, then the message's
    size until its handler returns (intake.py); the default lets four
    full-size requests arrive together, more wait their turn."""
    request_read_timeout_ms: int = field(default=30_000, metadata={UNIT: "ms"})
    """Longest a request body may take to arrive once its receive started."""
    max_connections: int = field(default=0, metadata={UNIT: "connections"})
    """TCP connections at once; more are closed as they are accepted (each
    holds a descriptor, and storage needs its own: see operations.md). 0: from
    the open-files limit (``connections.auto_max_connections``)."""
    max_connections_per_address: int = field(default=0, metadata={UNIT: "connections"})
    """TCP connections from one client IP address; the newest over it are
    closed within about a second (connections.py). 0: no per-address limit."""
    max_streams_per_connection: int = field(default=256, metadata={UNIT: "streams"})
    """Calls one connection may have in flight; more get RESOURCE_EXHAUSTED
    (connections.py). HTTP/2 admits four times this, then resets streams."""
    max_connection_idle_ms: int = field(default=300_000, metadata={UNIT: "ms"})
    """A connection without a call for this long is closed (clients reconnect)."""
    handshake_timeout_ms: int = field(default=3_000, metadata={UNIT: "ms"})
    """A connection that has not finished its TLS/HTTP/2 handshake by then is closed."""
    stream_send_timeout_ms: int = field(default=30_000, metadata={UNIT: "ms"})
    """A PullStream whose client has not taken a reply for this long is ended
    (RESOURCE_EXHAUSTED) and its connection closed, which frees the reply and
    gives its share of ``max_reply_bytes`` back (budgets.StalledStream)."""
    budget_wait_ms: int = field(default=5_000, metadata={UNIT: "ms"})
    """How long a request waits for max_reply_bytes, max_produce_bytes or max_intake_bytes
    before RESOURCE_EXHAUSTED."""
    store_threads: int = field(default=64, metadata={UNIT: "threads"})
    """Threads for blocking storage calls (sync appends wait for fsync in them)."""
    tls_cert: Path | None = None
    """PEM server certificate (chain): serve TLS instead of plaintext."""
    tls_key: Path | None = None
    """PEM private key of ``tls_cert``."""
    tls_client_ca: Path | None = None
    """PEM CA bundle: require client certificates signed by it (mutual TLS)."""
    tokens_file: Path | None = None
    """TOML token list (auth.py); also ``$EQUEUE_BROKER_TOKENS``. None: no auth."""
    shutdown_grace_s: float = field(default=5.0, metadata={UNIT: "s"})
    """What in-flight requests get to finish after SIGTERM."""
    log_level: str = "INFO"
    log_format: str = "text"
    """"text" or "json" (one JSON object per line)."""
    library_log_level: str = "WARNING"
    """Threshold of gRPC's and asyncio's loggers (never below ``log_level``)."""
    namesrv: str = ""
    """Name servers to register with, ``HOST:PORT[,HOST:PORT...]``; empty: a
    standalone broker (no registration at all)."""
    namesrv_tls_ca: Path | None = None
    """PEM CA bundle: talk to the name servers over TLS, trusting certificates
    it signed; unset: plaintext."""
    namesrv_tls_cert: Path | None = None
    """PEM client certificate for the name servers (mutual TLS)."""
    namesrv_tls_key: Path | None = None
    """PEM private key of ``namesrv_tls_cert``."""
    namesrv_token_file: Path | None = None
    """A file holding the token (a ``broker`` role one) sent to the name
    servers; unset: ``$EQUEUE_NAMESRV_TOKEN``, else none."""
    broker_name: str = ""
    """The broker's name in a cluster: message ids, routes and Spark offsets
    use it, so it must stay the same across restarts. Empty: the data
    directory's random id (a standalone broker)."""
    cluster: str = "DefaultCluster"
    """The cluster the broker registers under (``equeue cluster list`` shows it)."""
    advertise_address: str = ""
    """``HOST:PORT`` the name servers give clients; empty: ``host:port`` (the
    machine's host name if ``host`` is 0.0.0.0, the bound port if ``port`` is 0)."""
    register_interval_ms: int = field(default=5_000, metadata={UNIT: "ms"})
    """How often the broker re-registers with every name server (it also
    registers at once on every topic change)."""
    role: str = "master"
    """"master" (takes writes; replicas may follow it) or "replica" (follows
    ``master``, serves reads only)."""
    master: str = ""
    """A replica's master, ``HOST:PORT``."""
    max_replicas: int = field(default=8, metadata={UNIT: "replicas"})
    """Replication streams a master serves at once."""
    # -- failover (replication/failover.py) --
    zookeeper: str = ""
    """``HOST:PORT[,HOST:PORT...][/chroot]``: elect the group's master through
    ZooKeeper (automatic failover); empty: roles by hand (``role``, ``master``)."""
    zk_session_timeout_ms: int = field(default=10_000, metadata={UNIT: "ms"})
    """ZooKeeper session timeout: how long after a member stops heartbeating
    (crash, hang, partition) an election may replace it. Within [1000, 120000];
    ZooKeeper's own min/max session timeouts (2..20 ticks) bound it too."""
    # -- sync replication (replication/insync.py; docs/replication.md, "Sync replication")
    replication: str = "async"
    """"async": a master acknowledges writes alone; "sync": once they are
    durable on every in-sync replica too (and readers see only those)."""
    min_insync_replicas: int = field(default=1, metadata={UNIT: "members"})
    """In-sync members, the master included, a sync-mode write needs; with
    fewer it is refused (UNAVAILABLE) and nothing is written."""
    replica_lag_max_ms: int = field(default=10_000, metadata={UNIT: "ms"})
    """A replica that has not been caught up with the master's log end for
    this long leaves the in-sync set (a sync write waits at most about this)."""
    max_replication_waits: int = field(default=10_000, metadata={UNIT: "requests"})
    """Sync-mode writes waiting for their replicas at once; more wait up to
    ``budget_wait_ms`` for a slot, then get RESOURCE_EXHAUSTED (unwritten)."""
    origins: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Not a setting: where each given setting came from, as errors name it
    (``--chunk-size``, or ``chunk_size in broker.toml``); ``parse_args`` fills it."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidArgument(f"port must be in [0, 65535], got {self.port}")
        for name in ("max_wait_ms", "max_parked_pulls", "consumer_timeout_ms", "store_threads",
                     "max_request_bytes", "max_consumer_groups", "max_consumers",
                     "max_consumers_per_group", "max_heartbeat_topics", "max_queue_locks",
                     "max_pull_streams", "max_reply_bytes", "max_produce_bytes",
                     "max_produce_streams", "max_intake_bytes", "request_read_timeout_ms",
                     "budget_wait_ms", "max_streams_per_connection",
                     "max_connection_idle_ms", "handshake_timeout_ms", "stream_send_timeout_ms",
                     "register_interval_ms", "max_replicas", "replica_lag_max_ms",
                     "max_replication_waits"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("max_connections", "max_connections_per_address"):  # 0: auto, none
            if getattr(self, name) < 0:
                raise InvalidArgument(f"{name} must be 0 or more, got {getattr(self, name)}")
        for name in ("tls_cert", "tls_key", "tls_client_ca", "tokens_file", "namesrv_tls_ca",
                     "namesrv_tls_cert", "namesrv_tls_key", "namesrv_token_file"):  # fmt: skip
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgument("give both tls_cert and tls_key, or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise InvalidArgument("tls_client_ca needs tls_cert and tls_key")
        if (self.namesrv_tls_cert is None) != (self.namesrv_tls_key is None):
            raise InvalidArgument("give both namesrv_tls_cert and namesrv_tls_key, or neither")
        if self.namesrv_tls_cert is not None and self.namesrv_tls_ca is None:
            raise InvalidArgument("namesrv_tls_cert needs namesrv_tls_ca (TLS to name servers)")
        self._check_cluster()
        self._check_failover()
        self._check_replication()

    def _check_failover(self) -> None:
        if not self.zookeeper:
            return
        try:
            parse_hosts(self.zookeeper)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if not self.broker_name:
            raise InvalidArgument(
                "zookeeper needs broker_name: the group elected through ZooKeeper is the "
                "broker name; give --broker-name NAME"
            )
        if self.role != "master" or self.master:
            raise InvalidArgument(ZK_AND_ROLE)
        if not 1_000 <= self.zk_session_timeout_ms <= 120_000:
            raise InvalidArgument(
                f"zk_session_timeout_ms must be in [1000, 120000], got {self.zk_session_timeout_ms}"
            )

    def _check_replication(self) -> None:
        if self.replication not in ("async", "sync"):
            raise InvalidArgument(f"replication must be async or sync, got {self.replication!r}")
        if not isinstance(self.min_insync_replicas, int) or self.min_insync_replicas < 1:
            raise InvalidArgument(
                f"min_insync_replicas must be at least 1 (the master itself), "
                f"got {self.min_insync_replicas!r}"
            )
        if self.min_insync_replicas > 1 and self.replication != "sync":
            raise InvalidArgument(
                f"min_insync_replicas {self.min_insync_replicas} needs replication sync: "
                "async replication acknowledges writes on the master alone"
            )
        if self.min_insync_replicas > 1 + self.max_replicas:
            raise InvalidArgument(
                f"min_insync_replicas {self.min_insync_replicas} can never be met with "
                f"max_replicas {self.max_replicas} (the master plus its replicas)"
            )

    def _check_cluster(self) -> None:
        for value, kind in ((self.broker_name, "broker_name"), (self.cluster, "cluster")):
            problem = broker_name_problem(value, kind) if value or kind == "cluster" else None
            if problem is not None:
                raise InvalidArgument(problem)
        addresses = self.namesrv_addresses()
        if len(addresses) > MAX_NAMESRVS:
            raise InvalidArgument(
                f"namesrv names {len(addresses)} name servers; the limit is {MAX_NAMESRVS}"
            )
        for address in [*addresses, *filter(None, [self.advertise_address])]:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise InvalidArgument(
                    f"{address!r} is not one HOST:PORT (namesrv, advertise_address)"
                )
        if self.role not in ("master", "replica"):
            raise InvalidArgument(f"role must be master or replica, got {self.role!r}")
        if (self.role == "replica") != bool(self.master):
            raise InvalidArgument(
                f"role {self.role} and master {self.master!r}: a replica needs "
                "--master HOST:PORT, and only a replica takes one"
            )
        if self.master:
            host, sep, port = self.master.rpartition(":")
            if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise InvalidArgument(f"master {self.master!r} is not one HOST:PORT")
        if addresses and not self.broker_name:
            raise InvalidArgument(
                "namesrv needs broker_name: give --broker-name NAME, the broker's name "
                "in the cluster (stable across restarts)"
            )

    def named(self, key: str) -> str:
        """Setting ``key`` as the operator gave it (its flag, or its key in the
        config file); one not given by its flag, else its key."""
        return _shown(BY_KEY[key], self.origins)

    def namesrv_addresses(self) -> list[str]:
        return [a.strip() for a in self.namesrv.split(",") if a.strip()]

    @classmethod
    def from_settings(
        cls, settings: Mapping[str, Any], origins: Mapping[str, str] | None = None
    ) -> BrokerConfig:
        """A config from settings named and measured as in ``SETTINGS``
        (``{"chunk_size": 1 << 20, "retention_max_age_hours": 24}``); the
        rest keep their defaults. ``origins`` says where each came from
        (``{"chunk_size": "--chunk-size"}``), for errors to name it so."""
        origins = dict(origins or {})
        origins.update({key: key for key in settings if key not in origins})
        unknown = sorted(set(settings) - set(BY_KEY))
        if unknown:
            raise InvalidArgument(f"unknown settings: {', '.join(unknown)}")
        server: dict[str, Any] = {}
        storage: dict[tuple[str, ...], Any] = {("data_dir",): DEFAULT_DATA_DIR}
        for key, value in settings.items():
            setting = BY_KEY[key]
            if setting.target:
                storage[setting.path] = setting.to_target(value)
            else:
                server[key] = value
        try:
            built = _build(StorageConfig, storage)
        except InvalidArgument as exc:
            raise InvalidArgument(_name_settings(str(exc), settings, origins)) from None
        return cls(storage=built, origins=origins, **server)

    def setting(self, key: str) -> Any:
        """The value of setting ``key`` as operators give it (its key's unit)."""
        setting = BY_KEY[key]
        if not setting.target:
            return getattr(self, key)
        value: Any = self.storage
        for name in setting.path:
            value = getattr(value, name)
        return setting.from_target(value)


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

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.target.split("."))

    @property
    def flag_name(self) -> str:
        return "--" + self.key.replace("_", "-")

    def _field(self) -> tuple[Any, str]:
        """The dataclass owning the field this setting sets, and the field's name."""
        owner: Any = StorageConfig if self.target else BrokerConfig
        names = self.path if self.target else (self.key,)
        for name in names[:-1]:
            owner = get_type_hints(owner)[name]
        return owner, names[-1]

    def kind(self) -> Any:
        """The type of the field it sets, without ``None``."""
        owner, name = self._field()
        hint = get_type_hints(owner)[name]
        if isinstance(hint, types.UnionType):
            (hint,) = [h for h in hint.__args__ if h is not type(None)]
        return hint

    def unit_name(self) -> str:
        if self.unit:
            return self.unit
        owner, name = self._field()
        (target,) = [f for f in fields(owner) if f.name == name]
        return str(target.metadata.get(UNIT, ""))

    def to_target(self, value: Any) -> Any:
        """A value in the key's unit as the target field takes it."""
        if value is None or (self.minus_one_is_none and value == -1):
            return None
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
        if self.per_unit != 1:
            return value / self.per_unit
        return value

    def default(self) -> Any:
        return BrokerConfig().setting(self.key)

    def describe_default(self) -> str:
        """The default as --help and docs/equeue-broker.toml show it."""
        value = self.default()
        if value is None or value == "":
            return "unset"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return f"{value:g}"
        if self.unit_name() == "bytes" and value >= KiB and value % KiB == 0:
            return f"{value} = {_binary(value)}"
        return str(value)

    def unit_and_default(self) -> str:
        unit = self.unit_name()
        return f"{unit + '; ' if unit else ''}default {self.describe_default()}"

    def help_text(self) -> str:
        return f"{self.help} ({self.unit_and_default()})"


# Flag order is the order --help has always listed them in.
SETTINGS: tuple[Setting, ...] = (
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
)
BY_KEY = {s.key: s for s in SETTINGS}


ZK_AND_ROLE = (
    "zookeeper and role/master together: with --zookeeper the group elects its master "
    "and every member starts as a candidate; drop --role and --master"
)


def parse_args(argv: Sequence[str] | None = None) -> BrokerConfig:
    """The config from flags and the ``--config`` file; a bad flag, file or
    value exits with code 2 and one line on stderr (startup.py)."""
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    settings: dict[str, Any] = {}
    origins: dict[str, str] = {}
    config_file = args.pop("config")
    try:
        if config_file is not None:
            settings.update(_load_file(config_file))
            origins.update({key: f"{key} in {config_file}" for key in settings})
        flags = {k: v for k, v in args.items() if v is not None}
        settings.update(flags)
        origins.update({key: BY_KEY[key].flag_name for key in flags})
        if settings.get("zookeeper") and ("role" in settings or "master" in settings):
            raise InvalidArgument(ZK_AND_ROLE)  # even --role master: one source of roles
        return BrokerConfig.from_settings(settings, origins)
    except InvalidArgument as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line: the broker's usage text is 20 lines long and
    would bury the one that names the problem."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """One flag per setting that has one; the others are listed in the epilog."""
    file_only = [
        f"{s.key.replace('_', '-')} ({s.unit_and_default()})" for s in SETTINGS if not s.flag
    ]
    parser = _Parser(
        prog="equeue-broker",
        description="Run an equeue message broker. (`equeue-broker verify --data-dir DIR` "
        "lists the damaged files of a stopped broker's data directory instead.)",
        epilog="Settings only the --config file takes: " + ", ".join(file_only) + ".",
    )
    parser.add_argument("--version", action="version", version=f"equeue-broker {__version__}")
    parser.add_argument("--config", type=Path, help="TOML file with any of the settings below")
    for setting in SETTINGS:
        if not setting.flag:
            continue
        # Every default stays None here: None means "not given", so the file's
        # value, then BrokerConfig's (the single source), applies.
        options: dict[str, Any] = {"help": setting.help_text()}
        kind = setting.kind()
        if setting.choices:
            options["choices"] = list(setting.choices)
        elif kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif isinstance(kind, type) and issubclass(kind, enum.Enum):
            options["choices"] = [m.value for m in kind]
        elif setting.per_unit != 1:  # a coarser unit than the field's: fractions allowed
            options["type"] = float
        elif kind is not str:
            options["type"] = kind
        parser.add_argument(setting.flag_name, **options)
    return parser


def _load_file(path: Path) -> dict[str, Any]:
    """The settings in a TOML config file; ``InvalidArgument`` naming the file
    (and the key and value) if it cannot be read or holds a bad setting."""
    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except OSError as exc:
        raise InvalidArgument(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"config file {path} is not valid TOML: {exc}") from None
    settings = {key.replace("-", "_"): value for key, value in document.items()}
    unknown = sorted(set(settings) - set(BY_KEY))
    if unknown:
        raise InvalidArgument(f"unknown settings in {path}: {', '.join(unknown)}")
    for key, value in settings.items():
        expected = _expected(BY_KEY[key], value)
        if expected:
            shown = json.dumps(value) if isinstance(value, str | int | float | bool) else value
            raise InvalidArgument(f"config file {path}: {key} = {shown}: expected {expected}")
    return settings


def _expected(setting: Setting, value: Any) -> str:
    """What the setting takes, if ``value`` (as TOML gave it) is not that; else ""."""
    kind = setting.kind()
    choices = setting.choices
    if not choices and isinstance(kind, type) and issubclass(kind, enum.Enum):
        choices = tuple(str(m.value) for m in kind)
    if choices:
        return "" if value in choices else "one of " + ", ".join(f'"{c}"' for c in choices)
    if kind is bool:
        return "" if isinstance(value, bool) else "true or false"
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is float or setting.per_unit != 1:
        return "" if number else "a number"
    if kind is int:
        return "" if number and isinstance(value, int) else "an integer"
    if kind in (str, Path):
        return "" if isinstance(value, str) else "a string"
    return ""


def _build(cls: type[T], values: Mapping[tuple[str, ...], Any]) -> T:
    """``cls`` with the fields at the given paths set; nested dataclasses built
    from their own defaults plus the values under them."""
    kwargs = {path[0]: value for path, value in values.items() if len(path) == 1}
    hints = get_type_hints(cls)
    for head in {path[0] for path in values if len(path) > 1}:
        inner = {path[1:]: v for path, v in values.items() if len(path) > 1 and path[0] == head}
        kwargs[head] = _build(hints[head], inner)
    return cls(**kwargs)


def _shown(setting: Setting, origins: Mapping[str, str]) -> str:
    return origins.get(setting.key) or (setting.flag_name if setting.flag else setting.key)


def _name_settings(message: str, given: Mapping[str, Any], origins: Mapping[str, str]) -> str:
    """A storage error names ``StorageConfig`` fields (``chunk_capacity_bytes``,
    ``retention.max_age_ms``), which are no operator's names: name the settings
    that set them instead, as the operator gave them (``--chunk-size``, or
    ``chunk_size in broker.toml``; one not given by its flag), and a converted
    value in the setting's unit (``got -5``, not ``got -18000000``)."""
    by_name: dict[str, Setting] = {}
    for setting in SETTINGS:
        if setting.target:
            by_name[setting.target] = setting
            by_name[setting.path[-1]] = setting  # _positive names the field alone
    names = "|".join(re.escape(name) for name in sorted(by_name, key=len, reverse=True))
    mentioned = re.compile(rf"(?<![\w.-])(?:{names})(?![\w.])")
    for name in mentioned.findall(message):
        setting = by_name[name]
        if setting.per_unit != 1 and given.get(setting.key) is not None:
            value = given[setting.key]
            message = message.replace(f"got {setting.to_target(value)}", f"got {value:g}")
    return mentioned.sub(lambda match: _shown(by_name[match.group(0)], origins), message)


def _binary(size: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"


def _check_table() -> None:
    """Fail at import, not when a flag is first used, if the table and the
    dataclasses disagree."""
    server = {f.name for f in fields(BrokerConfig)} - {"storage", "origins"}
    missing = server - {s.key for s in SETTINGS if not s.target}
    if missing or len(BY_KEY) != len(SETTINGS):
        raise RuntimeError(f"SETTINGS lacks {sorted(missing)} or repeats a key")
    for setting in SETTINGS:
        setting.kind()  # a KeyError names a target field that does not exist
        if setting.per_unit != 1 and not setting.unit:
            raise RuntimeError(f"{setting.key}: a converted setting needs its own unit")


_check_table()
