"""Broker configuration: the typed settings (``BrokerConfig``), command-line
flags and the TOML file.

Precedence: flags > config file > defaults. Every duration carries its unit.

``BrokerConfig`` holds the server's own settings and nests the store's
``StorageConfig``, which stays the one source of every storage default, unit
and check. How operators name each setting (its TOML key, flag, unit and help)
is the table in settings.py; this module parses flags and files with it.
"""

from __future__ import annotations

import argparse
import enum
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn, TypeVar, get_origin, get_type_hints

from equeue_broker.replication.zk_hosts import parse_hosts
from equeue_broker.server.durations import EXAMPLE, format_ms
from equeue_broker.server.retry import reserved_problem
from equeue_broker.server.settings import Setting, table
from equeue_broker.storage.config import UNIT, MiB, StorageConfig
from equeue_broker.storage.errors import InvalidArgument
from equeue_broker.storage.meta.names import validate_group
from equeue_proto import __version__
from equeue_proto.protocol import broker_name_problem

__all__ = [
    "BY_KEY", "DEFAULT_DATA_DIR", "MAX_NAMESRVS", "SETTINGS", "BrokerConfig", "Setting",
    "build_parser", "parse_args",
]  # fmt: skip

T = TypeVar("T")

MAX_NAMESRVS = 16
"""Name servers one broker registers with (each gets a registration per interval)."""

DEFAULT_DATA_DIR = Path("equeue-data")
"""The one storage default the server owns: ``StorageConfig.data_dir`` has none."""

_S, _M, _H = 1_000, 60_000, 3_600_000
DEFAULT_RETRY_BACKOFF_MS = (
    10 * _S, 30 * _S, *(n * _M for n in range(1, 11)), 20 * _M, 30 * _M, _H, 2 * _H,
)  # fmt: skip
"""RocketMQ 5's delay levels from 10s on (10s 30s 1m 2m ... 10m 20m 30m 1h 2h)."""
MAX_RETRY_STEPS = 64
MAX_BACKOFF_GROUPS = 1_000
MAX_RECONSUME_TIMES = 10_000


def max_delay_ms(storage: StorageConfig) -> int:
    """The longest delay the store accepts (``--max-delay``)."""
    return storage.timer.max_delay_ms


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
    max_check_streams: int = field(default=1_024, metadata={UNIT: "streams"})
    """Producers' TransactionChecks streams open at once (each an idle call
    holding a small queue of checks)."""
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
    fetch_port: str = "off"
    """The fetch port (fetch_port.py): ``auto`` any free port, ``off`` (the
    default: docs/benchmarks.md, issue 29), or a port number. Plain TCP: with
    ``tls_cert`` it is served only if ``fetch_insecure``."""
    fetch_insecure: bool = False
    """Serve the fetch port (plain text, token-checked) beside TLS."""
    http_port: int | None = None
    """The HTTP listener (server/http.py: /metrics, /healthz, /readyz), TLS
    and tokens as gRPC; 0 any free port; None (the default): none, and
    neither aiohttp nor prometheus_client is imported."""
    http_host: str = ""
    """Address of the HTTP listener; empty: ``host`` (a separate key so that
    metrics can stay on an internal interface while gRPC is on 0.0.0.0)."""
    metrics_max_topics: int = field(default=1_000, metadata={UNIT: "topics"})
    """Topic label values in /metrics (by name order); the rest are summed
    into ``topic="%other"`` (docs/metrics.md "Cardinality")."""
    metrics_max_groups: int = field(default=1_000, metadata={UNIT: "groups"})
    """Group label values in /metrics; the rest: ``group="%other"``."""
    metrics_max_series: int = field(default=10_000, metadata={UNIT: "series"})
    """Per-queue and per-(group, topic) series together; whole topics past it
    are left out (aggregates stay complete)."""
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
    zk_fast_failover: bool = True
    """A replica whose stream to its master breaks, and whose new connection to
    it is refused (no process listens there: the master died, its machine is
    up), has the master's candidate znode removed and an election held at
    once, instead of one session timeout later. A paused master (connections
    accepted) or a lost machine (no answer) still waits for the session
    timeout (docs/replication.md, "How a dead master is detected")."""
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
    # -- retries and dead letters (retry.py; docs/operations.md, "Retry and dead letters")
    max_reconsume_times: int = field(default=16, metadata={UNIT: "retries"})
    """Retries a Nacked message gets (a NackRequest may ask for another
    count); the failure after the last goes to the group's dead-letter topic."""
    retry_backoff: tuple[int, ...] = DEFAULT_RETRY_BACKOFF_MS
    """The delay before each retry, in order (ms); past the end, the last again."""
    retry_backoff_groups: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Groups with their own ``retry_backoff`` (ms)."""
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
                     "max_replication_waits", "max_check_streams"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("max_connections", "max_connections_per_address"):  # 0: auto, none
            if getattr(self, name) < 0:
                raise InvalidArgument(f"{name} must be 0 or more, got {getattr(self, name)}")
        for name in ("tls_cert", "tls_key", "tls_client_ca", "tokens_file", "namesrv_tls_ca",
                     "namesrv_tls_cert", "namesrv_tls_key", "namesrv_token_file"):  # fmt: skip
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        self._check_fetch_port()
        self._check_http()
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
        self._check_retries()

    def _check_fetch_port(self) -> None:
        value = self.fetch_port.strip().lower()
        if value not in ("auto", "off") and not (value.isdigit() and 1 <= int(value) <= 65535):
            raise InvalidArgument(
                f"{self.named('fetch_port')} must be auto, off or a port in [1, 65535], "
                f"got {self.fetch_port!r}"
            )
        if value.isdigit() and int(value) == self.port:
            raise InvalidArgument(
                f"{self.named('fetch_port')} {value} is the gRPC port; give another, or auto"
            )
        object.__setattr__(self, "fetch_port", value)

    def _check_http(self) -> None:
        if self.http_port is not None:
            if not 0 <= self.http_port <= 65535:
                raise InvalidArgument(
                    f"{self.named('http_port')} must be in [0, 65535], got {self.http_port}"
                )
            if self.http_port and self.http_port == self.port:
                raise InvalidArgument(
                    f"{self.named('http_port')} {self.http_port} is the gRPC port; give another"
                )
        for name in ("metrics_max_topics", "metrics_max_groups", "metrics_max_series"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, got {getattr(self, name)}")

    def _check_retries(self) -> None:
        if not 0 <= self.max_reconsume_times <= MAX_RECONSUME_TIMES:
            raise InvalidArgument(
                f"{self.named('max_reconsume_times')} must be in [0, {MAX_RECONSUME_TIMES}], "
                f"got {self.max_reconsume_times}"
            )
        if "retry_backoff" in self.origins:  # the default steps are cut to --max-delay
            self._check_steps(self.named("retry_backoff"), self.retry_backoff)
        groups = self.retry_backoff_groups
        if len(groups) > MAX_BACKOFF_GROUPS:
            raise InvalidArgument(
                f"{self.named('retry_backoff_groups')} names {len(groups)} groups; the limit "
                f"is {MAX_BACKOFF_GROUPS}"
            )
        for group, steps in groups.items():
            name = f"{self.named('retry_backoff_groups')}: group {group!r}"
            problem = reserved_problem("group", group)
            try:
                validate_group(group)
            except InvalidArgument as exc:
                problem = problem or str(exc)
            if problem:
                raise InvalidArgument(f"{name}: {problem}")
            self._check_steps(name, steps)

    def _check_steps(self, name: str, steps: tuple[int, ...]) -> None:
        if not 1 <= len(steps) <= MAX_RETRY_STEPS:
            raise InvalidArgument(
                f"{name} has {len(steps)} steps; give 1 to {MAX_RETRY_STEPS} durations"
            )
        longest = max_delay_ms(self.storage)
        for step in steps:
            if not 0 < step <= longest:
                raise InvalidArgument(
                    f"{name} step {format_ms(step)} must be more than 0 and at most the "
                    f"longest delay, {format_ms(longest)} ({self.named('max_delay')}): "
                    "shorten the step or raise the longest delay"
                )

    def backoff_steps(self) -> tuple[int, ...]:
        """``retry_backoff`` as Nack uses it: the default steps (RocketMQ's,
        up to 2 h) no longer than ``--max-delay`` when that is shorter."""
        if "retry_backoff" in self.origins:
            return self.retry_backoff
        longest = max_delay_ms(self.storage)
        return tuple(min(step, longest) for step in self.retry_backoff)

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
                storage[setting.path] = setting.to_target(value, origins[key])
            else:
                server[key] = setting.to_target(value, origins[key])
        try:
            built = _build(StorageConfig, storage)
        except InvalidArgument as exc:
            raise InvalidArgument(_name_settings(str(exc), settings, origins)) from None
        return cls(storage=built, origins=origins, **server)

    def setting(self, key: str) -> Any:
        """The value of setting ``key`` as operators give it (its key's unit)."""
        setting = BY_KEY[key]
        if not setting.target:
            return setting.from_target(getattr(self, key))
        value: Any = self.storage
        for name in setting.path:
            value = getattr(value, name)
        return setting.from_target(value)


SETTINGS = table(BrokerConfig)
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
        elif setting.duration:  # a string: BrokerConfig.from_settings parses it
            pass
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
    if setting.duration:
        if get_origin(kind) in (Mapping, dict):
            fine = isinstance(value, dict) and all(
                isinstance(v, list) and all(isinstance(d, str) for d in v) for v in value.values()
            )
            return "" if fine else 'a table of groups and durations like {billing = ["1s", "1m"]}'
        many = get_origin(kind) is tuple
        if many:
            fine = isinstance(value, list) and all(isinstance(v, str) for v in value)
            return "" if fine else 'a list of durations like ["10s", "1m", "2h"]'
        return "" if isinstance(value, str) else f"{EXAMPLE} (a string)"
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
