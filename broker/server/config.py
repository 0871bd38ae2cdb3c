"""Broker configuration: command-line flags, an optional TOML file, defaults, limits.

Precedence: flags > config file > defaults. Every duration carries its unit.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from equeue_broker.storage.config import (
    FlushMode,
    MessageLimits,
    RetentionConfig,
    StorageConfig,
    TransactionConfig,
)
from equeue_broker.storage.errors import InvalidArgument
from equeue_proto import __version__

MiB = 1024 * 1024


@dataclass(frozen=True)
class BrokerConfig:
    data_dir: Path = Path("equeue-data")
    host: str = "127.0.0.1"
    port: int = 5000
    """0 picks a free port (printed in the ready line)."""
    flush: str = "async"
    flush_interval_ms: int = 100
    chunk_size: int = 256 * MiB
    max_message_bytes: int = 4 * MiB
    retention_max_chunks: int | None = 100
    retention_max_age_hours: float | None = 168.0
    retention_keep_unconsumed: bool = False
    retention_check_interval_ms: int = 60_000
    auto_create_topics: bool = True
    default_queues: int = 4
    max_queues_per_topic: int = 256
    max_wait_ms: int = 60_000
    """Longest a pull may be parked."""
    max_parked_pulls: int = 10_000
    max_pull_messages: int = 10_000
    max_pull_bytes: int = 64 * MiB
    max_request_bytes: int = 80 * MiB
    """gRPC message size limit, both directions (a full batch plus framing)."""
    transaction_timeout_ms: int = 15 * 60_000
    """An open transaction without a write for this long is aborted."""
    max_open_transactions: int = 10_000
    max_transaction_bytes: int = 1024 * MiB
    """Staged bytes per transaction."""
    consumer_timeout_ms: int = 30_000
    """A consumer without a heartbeat for this long leaves its group."""
    store_threads: int = 64
    """Threads for blocking storage calls (sync appends wait for fsync in them)."""
    tls_cert: Path | None = None
    """PEM server certificate (chain): serve TLS instead of plaintext."""
    tls_key: Path | None = None
    """PEM private key of ``tls_cert``."""
    tls_client_ca: Path | None = None
    """PEM CA bundle: require client certificates signed by it (mutual TLS)."""
    tokens_file: Path | None = None
    """TOML token list (auth.py); also ``$EQUEUE_BROKER_TOKENS``. None: no auth."""
    shutdown_grace_s: float = 5.0
    log_level: str = "INFO"
    log_format: str = "text"
    """"text" or "json" (one JSON object per line)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if not 0 <= self.port <= 65535:
            raise InvalidArgument(f"port must be in [0, 65535], got {self.port}")
        if self.flush not in ("sync", "async"):
            raise InvalidArgument(f"flush must be 'sync' or 'async', got {self.flush!r}")
        for name in ("max_wait_ms", "max_parked_pulls", "max_pull_messages", "max_pull_bytes",
                     "consumer_timeout_ms", "store_threads", "max_request_bytes"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("tls_cert", "tls_key", "tls_client_ca", "tokens_file"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgument("give both tls_cert and tls_key, or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise InvalidArgument("tls_client_ca needs tls_cert and tls_key")
        self.storage()  # validates the storage settings too

    def storage(self) -> StorageConfig:
        age = self.retention_max_age_hours
        return StorageConfig(
            data_dir=self.data_dir,
            chunk_capacity_bytes=self.chunk_size,
            flush_mode=FlushMode(self.flush),
            flush_interval_ms=self.flush_interval_ms,
            default_queue_count=self.default_queues,
            max_queues_per_topic=self.max_queues_per_topic,
            max_read_messages=self.max_pull_messages,
            max_read_bytes=self.max_pull_bytes,
            limits=MessageLimits(max_message_bytes=self.max_message_bytes),
            transactions=TransactionConfig(
                timeout_ms=self.transaction_timeout_ms,
                max_open=self.max_open_transactions,
                max_bytes=self.max_transaction_bytes,
            ),
            retention=RetentionConfig(
                max_chunks=self.retention_max_chunks,
                max_age_ms=None if age is None else int(age * 3_600_000),
                keep_unconsumed=self.retention_keep_unconsumed,
                check_interval_ms=self.retention_check_interval_ms,
            ),
        )


def parse_args(argv: Sequence[str] | None = None) -> BrokerConfig:
    parser = argparse.ArgumentParser(
        prog="equeue-broker", description="Run an equeue message broker."
    )
    parser.add_argument("--version", action="version", version=f"equeue-broker {__version__}")
    parser.add_argument("--config", type=Path, help="TOML file with any of the settings below")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--host")
    parser.add_argument("--port", type=int, help="0 = pick a free port (default 5000)")
    parser.add_argument("--flush", choices=["sync", "async"])
    parser.add_argument("--flush-interval-ms", type=int)
    parser.add_argument("--chunk-size", type=int, help="message log chunk capacity, bytes")
    parser.add_argument("--max-message-bytes", type=int)
    parser.add_argument("--retention-max-chunks", type=int, help="-1 = no count limit")
    parser.add_argument("--retention-max-age-hours", type=float, help="-1 = no age limit")
    parser.add_argument(
        "--retention-keep-unconsumed",
        action=argparse.BooleanOptionalAction,
        help="keep chunks a consumer group has not consumed yet",
    )
    parser.add_argument("--retention-check-interval-ms", type=int, help="how often to apply it")
    parser.add_argument("--auto-create-topics", action=argparse.BooleanOptionalAction)
    parser.add_argument("--default-queues", type=int)
    parser.add_argument("--max-wait-ms", type=int, help="longest a pull may be parked")
    parser.add_argument("--max-parked-pulls", type=int)
    parser.add_argument("--consumer-timeout-ms", type=int)
    parser.add_argument(
        "--transaction-timeout-ms", type=int, help="abort transactions idle this long"
    )
    parser.add_argument("--max-open-transactions", type=int)
    parser.add_argument("--max-transaction-bytes", type=int, help="staged bytes per transaction")
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate: serve TLS")
    parser.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    parser.add_argument(
        "--tls-client-ca", type=Path, help="PEM CA: require client certificates it signed"
    )
    parser.add_argument(
        "--tokens-file", type=Path,
        help="TOML list of access tokens (else $EQUEUE_BROKER_TOKENS; neither: no auth)",
    )  # fmt: skip
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--log-format", choices=["text", "json"])
    args = vars(parser.parse_args(argv))
    settings: dict[str, Any] = {}
    config_file = args.pop("config")
    if config_file is not None:
        settings.update(_load_file(config_file))
    settings.update({k: v for k, v in args.items() if v is not None})
    for name in ("retention_max_chunks", "retention_max_age_hours"):
        if settings.get(name) == -1:
            settings[name] = None
    try:
        return replace(BrokerConfig(), **settings)
    except InvalidArgument as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def _load_file(path: Path) -> dict[str, Any]:
    known = {f.name for f in fields(BrokerConfig)}
    with open(path, "rb") as f:
        document = tomllib.load(f)
    settings = {key.replace("-", "_"): value for key, value in document.items()}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise SystemExit(f"equeue-broker: unknown settings in {path}: {', '.join(unknown)}")
    return settings
