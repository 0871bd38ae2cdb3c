"""Name server configuration: flags, the TOML file, defaults (flags > file > defaults).

Every setting is both a flag (``--broker-expiry-ms``) and a TOML key
(``broker_expiry_ms`` or ``broker-expiry-ms``); ``--config FILE`` names the file.
A bad flag, file or value exits with code 2 and one line on stderr, as the broker does.

Security (docs/cluster.md, "Security and trust"): ``--tls-cert``/``--tls-key``
(and ``--tls-client-ca`` for mutual TLS) and ``--tokens-file`` (or
``$EQUEUE_NAMESRV_TOKENS``) are the broker's flags, with the broker's token
file format; the ``broker_tls_*`` settings are how the name server itself
calls brokers to check their registrations' claims.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NoReturn

from equeue_proto import __version__

DEFAULT_PORT = 9876
"""RocketMQ's name server port."""


@dataclass(frozen=True)
class NameServerConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    """0 picks a free port (printed in the ready line)."""
    broker_expiry_ms: int = 30_000
    """A broker not heard from for this long is dropped from every route
    (brokers re-register every --register-interval-ms, 5 s by default)."""
    down_retention_ms: int = 3_600_000
    """How long a broker whose registration expired is remembered as down
    (clients say which broker groups a view misses)."""
    max_brokers: int = 1024
    """Brokers (name and replica id) kept at once."""
    max_topics_per_broker: int = 100_000
    """Topics one broker's registration may carry."""
    max_queues_per_topic: int = 4096
    """Queues one topic may have on one broker."""
    max_request_bytes: int = 64 << 20
    """Largest request accepted (a registration of many topics is large)."""
    max_connections: int = 4096
    """TCP connections at once (every broker and client holds one)."""
    shutdown_grace_s: float = 2.0
    tls_cert: str = ""
    """PEM server certificate (chain): serve TLS instead of plaintext."""
    tls_key: str = ""
    """PEM private key of ``tls_cert``."""
    tls_client_ca: str = ""
    """PEM CA bundle: require client certificates signed by it (mutual TLS)."""
    tokens_file: str = ""
    """TOML token list (the broker's format, server/tokens.py); also
    ``$EQUEUE_NAMESRV_TOKENS``. Empty: no authentication."""
    broker_tls_ca: str = ""
    """PEM CA bundle: check registrations' claims over TLS, trusting brokers'
    certificates it signed (brokers serving TLS); empty: in plaintext."""
    broker_tls_cert: str = ""
    """PEM client certificate for those calls (brokers requiring mutual TLS)."""
    broker_tls_key: str = ""
    """PEM private key of ``broker_tls_cert``."""
    member_check_timeout_ms: int = 2_000
    """How long the address a registration names has to answer as the member
    it claims to be (keep it under the brokers' 3 s registration timeout)."""
    max_member_checks: int = 32
    """Claim checks (calls to brokers) in flight at once; more wait."""
    http_port: int = -1
    """The HTTP listener (``/metrics``, ``/healthz``, ``/readyz``; the broker's
    server/http.py) with this server's TLS and tokens; 0 any free port; -1
    (the default): none."""
    http_host: str = ""
    """Address of the HTTP listener; empty: ``host``."""
    log_level: str = "INFO"
    log_format: str = "text"

    def __post_init__(self) -> None:
        if not -1 <= self.http_port <= 65535:
            raise ValueError(f"http_port must be -1 (none) or in [0, 65535], got {self.http_port}")
        if self.http_port > 0 and self.http_port == self.port:
            raise ValueError(f"http_port {self.http_port} is the gRPC port; give another")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for name in ("broker_expiry_ms", "down_retention_ms", "max_brokers",
                     "max_topics_per_broker", "max_queues_per_topic", "max_request_bytes",
                     "max_connections",
                     "member_check_timeout_ms", "max_member_checks"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.shutdown_grace_s < 0:
            raise ValueError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("give both tls_cert and tls_key, or neither")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("tls_client_ca needs tls_cert and tls_key")
        if bool(self.broker_tls_cert) != bool(self.broker_tls_key):
            raise ValueError("give both broker_tls_cert and broker_tls_key, or neither")
        if self.broker_tls_cert and not self.broker_tls_ca:
            raise ValueError("broker_tls_cert needs broker_tls_ca (calls to brokers over TLS)")
        if self.log_level not in LEVELS:
            raise ValueError(
                f"log_level must be one of {', '.join(LEVELS)}, got {self.log_level!r}"
            )
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log_format must be text or json, got {self.log_format!r}")


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
HELP = {
    "host": "address to listen on; 0.0.0.0 for every interface",
    "port": "0 = pick a free port",
    "broker_expiry_ms": "drop a broker not heard from for this long",
    "down_retention_ms": "remember a broker whose registration expired as down for this long",
    "max_brokers": "brokers kept at once",
    "max_topics_per_broker": "topics one broker may register",
    "max_queues_per_topic": "queues of one topic on one broker",
    "max_request_bytes": "largest request accepted",
    "max_connections": "TCP connections at once",
    "shutdown_grace_s": "time in-flight requests get on SIGTERM",
    "tls_cert": "PEM certificate: serve TLS",
    "tls_key": "PEM private key of --tls-cert",
    "tls_client_ca": "PEM CA: require client certificates it signed",
    "tokens_file": "TOML list of access tokens (the broker's format; brokers need role "
    "broker); unset: $EQUEUE_NAMESRV_TOKENS, else no auth",
    "broker_tls_ca": "PEM CA: check registrations with brokers over TLS; unset: plaintext",
    "broker_tls_cert": "PEM client certificate for those calls (brokers with mutual TLS)",
    "broker_tls_key": "PEM private key of --broker-tls-cert",
    "member_check_timeout_ms": "how long a registration's address has to confirm its claim",
    "max_member_checks": "claim checks in flight at once",
    "http_port": "HTTP port for /metrics, /healthz and /readyz (TLS and tokens as gRPC; "
    "/metrics needs a monitor or admin token); 0 = any free port, -1 = none",
    "http_host": "address of the HTTP port; unset: --host",
    "log_level": "log threshold",
    "log_format": "json: one JSON object per line",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="equeue-namesrv",
        description="Run an equeue name server: where a cluster's topics live "
        "(soft state from broker registrations).",
    )
    parser.add_argument("--version", action="version", version=f"equeue-namesrv {__version__}")
    parser.add_argument("--config", type=Path, help="TOML file with any of the settings below")
    defaults = NameServerConfig()
    for f in fields(NameServerConfig):
        default = getattr(defaults, f.name)
        shown = f" (default {default})" if default != "" else ""
        options: dict[str, Any] = {"help": f"{HELP[f.name]}{shown}"}
        if f.name == "log_level":
            options["choices"] = list(LEVELS)
        elif f.name == "log_format":
            options["choices"] = ["text", "json"]
        elif f.type in ("int", int):
            options["type"] = int
        elif f.type in ("float", float):
            options["type"] = float
        parser.add_argument("--" + f.name.replace("_", "-"), **options)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> NameServerConfig:
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    config_file = args.pop("config")
    settings: dict[str, Any] = {}
    try:
        if config_file is not None:
            settings.update(_load_file(config_file))
        settings.update({k: v for k, v in args.items() if v is not None})
        return NameServerConfig(**settings)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))


EXPECTED_TYPES: dict[str, type | tuple[type, ...]] = {
    "int": int,
    "float": (int, float),
    "str": str,
}


def _load_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path} is not valid TOML: {exc}") from None
    settings = {key.replace("-", "_"): value for key, value in document.items()}
    known = {f.name: f for f in fields(NameServerConfig)}
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise ValueError(f"unknown settings in {path}: {', '.join(unknown)}")
    for key, value in settings.items():
        expected = EXPECTED_TYPES[str(known[key].type)]
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ValueError(f"config file {path}: {key} = {value!r}: wrong type")
    return settings
