"""Alarm rules and notifiers: read from the TOML rule file (``tomllib``) and the
short ``--alarm-*`` flags. Pure parsing; a bad key or value is a ``RuleError``
naming the file, the rule (index and name) and the key, because a typo must
not silently disable an alarm. The caller exits with code 2 on it.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

RULE_TYPES: dict[str, tuple[str, ...]] = {
    # type -> threshold keys (at least one required)
    "group_lag": ("messages", "seconds"),
    "total_unconsumed": ("messages",),
    "dlq_not_empty": ("min",),
    "replica_out_of_sync": (),
    "disk_free": ("percent",),
    "broker_down": (),
    "transaction_open": ("seconds",),
    "delayed_overdue": ("seconds",),
}
FILTER_KEYS: dict[str, tuple[str, ...]] = {
    "group_lag": ("group", "topic"),
    "total_unconsumed": ("scope", "broker"),
    "dlq_not_empty": ("group",),
    "replica_out_of_sync": ("broker",),
    "disk_free": ("broker",),
    "broker_down": ("broker",),
    "transaction_open": ("broker",),
    "delayed_overdue": ("broker",),
}
COMMON_KEYS = ("for", "resolve_for", "hysteresis", "repeat", "notify")
DEFAULT_TOTAL = 100_000
"""EQueue's default for the unconsumed-messages alarm."""

NOTIFIER_KEYS: dict[str, tuple[str, ...]] = {
    "webhook": ("url", "headers", "timeout"),
    "email": ("to", "from", "smtp", "tls", "username", "password_file", "ca_file"),
}
TLS_MODES = ("auto", "starttls", "tls", "none")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class RuleError(ValueError):
    """A bad rule file or alarm flag; the message is for the user as it is."""


@dataclass(frozen=True)
class Rule:
    name: str
    type: str
    messages: int | None = None
    seconds: float | None = None
    min: int | None = None
    percent: float | None = None
    group: str = "*"
    topic: str = "*"
    broker: str = "*"
    scope: str = "broker"
    for_s: float = 30.0
    resolve_for_s: float = 30.0
    hysteresis: float = 0.1
    repeat_s: float = 3600.0
    notify: tuple[str, ...] | None = None
    """Notifier names; None means every notifier."""

    @property
    def fires_below(self) -> bool:
        """disk_free fires when the value falls under the threshold."""
        return self.type == "disk_free"

    @property
    def binary(self) -> bool:
        """0/1 rules: only the time part of hysteresis applies."""
        return self.type in ("replica_out_of_sync", "broker_down")

    def describe(self) -> str:
        keys = ("messages", "seconds", "min", "percent")
        limits = ", ".join(f"{k}={getattr(self, k)}" for k in keys if getattr(self, k) is not None)
        filters = ", ".join(f"{k}={getattr(self, k)!r}" for k in FILTER_KEYS[self.type])
        parts = [p for p in (limits, filters) if p]
        return (
            f"{self.name} ({self.type}) {'; '.join(parts)}; for {self.for_s:g}s, "
            f"resolve_for {self.resolve_for_s:g}s, hysteresis {self.hysteresis:g}, "
            f"repeat {self.repeat_s:g}s"
        )


@dataclass(frozen=True)
class Notifier:
    name: str
    type: str
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AlarmConfig:
    rules: tuple[Rule, ...] = ()
    notifiers: tuple[Notifier, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """The file's [defaults], converted (``for_s``, ...): flag rules take them too."""

    def notifiers_for(self, rule: Rule) -> tuple[Notifier, ...]:
        if rule.notify is None:
            return self.notifiers
        return tuple(n for n in self.notifiers if n.name in rule.notify)


def parse_duration(value: object, where: str) -> float:
    """``"30s"``, ``"2m"``, ``"1h"``, ``"500ms"`` or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise RuleError(f"{where} must be a duration like 30s, 2m or 1h, not {value!r}")
    if isinstance(value, int | float) and math.isfinite(value) and value >= 0:
        return float(value)
    if value == "0":  # "0 = never" for --alarm-repeat reads naturally without a unit
        return 0.0
    match = _DURATION.match(value) if isinstance(value, str) else None
    if match is None:
        raise RuleError(f"{where} must be a duration like 30s, 2m or 1h, not {value!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def _positive_int(value: object, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise RuleError(f"{where} must be {kind}, not {value!r}")
    return value


def _number(value: object, where: str, low: float, high: float) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not low <= float(value) <= high:  # type: ignore[arg-type]
        raise RuleError(f"{where} must be a number from {low:g} to {high:g}, not {value!r}")
    return float(value)  # type: ignore[arg-type]


def _string(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise RuleError(f"{where} must be a non-empty string, not {value!r}")
    return value


def _names(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RuleError(f"{where} must be a list of notifier names, not {value!r}")
    return tuple(value)


def _check_keys(table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise RuleError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(allowed)})")


def _common(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The keys [defaults] and each rule share, converted."""
    out: dict[str, Any] = {}
    if "for" in table:
        out["for_s"] = parse_duration(table["for"], f"{where}: for")
    if "resolve_for" in table:
        out["resolve_for_s"] = parse_duration(table["resolve_for"], f"{where}: resolve_for")
    if "hysteresis" in table:
        out["hysteresis"] = _number(table["hysteresis"], f"{where}: hysteresis", 0.0, 0.99)
    if "repeat" in table:
        out["repeat_s"] = parse_duration(table["repeat"], f"{where}: repeat")
    if "notify" in table:
        out["notify"] = _names(table["notify"], f"{where}: notify")
    return out


def _thresholds(rule_type: str, table: Mapping[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "messages" in table:
        out["messages"] = _positive_int(table["messages"], f"{where}: messages")
    if "seconds" in table:
        out["seconds"] = _number(table["seconds"], f"{where}: seconds", 0.001, 1e9)
    if "min" in table:
        out["min"] = _positive_int(table["min"], f"{where}: min")
    if "percent" in table:
        out["percent"] = _number(table["percent"], f"{where}: percent", 0.001, 99.999)
    needed = RULE_TYPES[rule_type]
    if rule_type == "dlq_not_empty":
        out.setdefault("min", 1)  # "not empty" is its own threshold
    elif needed and not out:
        raise RuleError(f"{where}: a {rule_type} rule needs a threshold ({' or '.join(needed)})")
    return out


def _filters(rule_type: str, table: Mapping[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in FILTER_KEYS[rule_type]:
        if key in table:
            out[key] = _string(table[key], f"{where}: {key}")
    if out.get("scope", "broker") not in ("broker", "cluster"):
        raise RuleError(f'{where}: scope must be "broker" or "cluster", not {out["scope"]!r}')
    return out


def parse_rule(table: object, defaults: Mapping[str, Any], where: str) -> Rule:
    if not isinstance(table, dict):
        raise RuleError(f"{where} must be a table")
    name = table.get("name")
    if name is not None:
        where = f'{where} ("{name}")'
    rule_type = table.get("type")
    if rule_type not in RULE_TYPES:
        raise RuleError(f"{where}: type must be one of {', '.join(RULE_TYPES)}, not {rule_type!r}")
    allowed = ("name", "type", *RULE_TYPES[rule_type], *FILTER_KEYS[rule_type], *COMMON_KEYS)
    if rule_type == "dlq_not_empty":
        allowed = (*allowed, "min")
    _check_keys(table, allowed, where)
    return Rule(
        name=_string(name, f"{where}: name"),
        type=rule_type,
        **_thresholds(rule_type, table, where),
        **_filters(rule_type, table, where),
        **{**defaults, **_common(table, where)},
    )


def parse_notifier(table: object, where: str) -> Notifier:
    if not isinstance(table, dict):
        raise RuleError(f"{where} must be a table")
    if "name" in table:
        where = f'{where} ("{table["name"]}")'
    kind = table.get("type")
    if kind not in NOTIFIER_KEYS:
        raise RuleError(f"{where}: type must be webhook or email, not {kind!r}")
    _check_keys(table, ("name", "type", *NOTIFIER_KEYS[kind]), where)
    name = _string(table.get("name"), f"{where}: name")
    settings = {k: v for k, v in table.items() if k not in ("name", "type")}
    if kind == "webhook":
        settings["url"] = _url(table.get("url"), f"{where}: url")
        headers = settings.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise RuleError(f"{where}: headers must be a table of strings")
        settings["headers"] = {k: _expand(v, f"{where}: headers.{k}") for k, v in headers.items()}
        settings["timeout"] = parse_duration(settings.get("timeout", "5s"), f"{where}: timeout")
    else:
        settings["to"] = _names(table.get("to"), f"{where}: to")
        smtp_host_port(_string(table.get("smtp"), f"{where}: smtp"), f"{where}: smtp")
        if settings.get("tls", "auto") not in TLS_MODES:
            raise RuleError(f"{where}: tls must be one of {', '.join(TLS_MODES)}")
    return Notifier(name=name, type=kind, settings=settings)


def _url(value: object, where: str) -> str:
    url = _string(value, where)
    if not url.startswith(("http://", "https://")):
        raise RuleError(f"{where} must start with http:// or https://, not {url!r}")
    return url


def _expand(value: str, where: str) -> str:
    """${VAR} from the environment, so secrets stay out of the file."""

    def one(match: re.Match[str]) -> str:
        if match.group(1) not in os.environ:
            raise RuleError(f"{where}: environment variable {match.group(1)} is not set")
        return os.environ[match.group(1)]

    return _ENV.sub(one, value)


def is_loopback(host: str) -> bool:
    """A local relay may take a password without TLS; nothing else may."""
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def smtp_host_port(value: str, where: str = "--smtp") -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RuleError(f"{where} must be HOST:PORT, not {value!r}")
    return host, int(port)


def parse_config(data: Mapping[str, Any], source: str) -> AlarmConfig:
    """The rule file's content (as tomllib returns it) -> rules and notifiers."""
    _check_keys(data, ("defaults", "notifier", "rule"), source)
    raw_defaults = data.get("defaults", {})
    if not isinstance(raw_defaults, dict):
        raise RuleError(f"{source}: [defaults] must be a table")
    _check_keys(raw_defaults, COMMON_KEYS, f"{source}: defaults")
    defaults = _common(raw_defaults, f"{source}: defaults")
    notifiers = tuple(
        parse_notifier(t, f"{source}: notifier {i}")
        for i, t in enumerate(_array(data, "notifier", source), 1)
    )
    rules = tuple(
        parse_rule(t, defaults, f"{source}: rule {i}")
        for i, t in enumerate(_array(data, "rule", source), 1)
    )
    config = AlarmConfig(rules=rules, notifiers=notifiers, defaults=defaults)
    _check_unique(config, source)
    return config


def _array(data: Mapping[str, Any], key: str, source: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise RuleError(f"{source}: {key} must be an array of tables ([[{key}]])")
    return value


def _check_unique(config: AlarmConfig, source: str) -> None:
    known = [n.name for n in config.notifiers]
    for names, what in (([r.name for r in config.rules], "rule"), (known, "notifier")):
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise RuleError(f"{source}: two {what}s are named {dupes[0]!r}")
    for i, rule in enumerate(config.rules, 1):
        for name in rule.notify or ():
            if name not in known:
                raise RuleError(
                    f'{source}: rule {i} ("{rule.name}"): notify names unknown notifier {name!r}'
                )


def load_file(path: str) -> AlarmConfig:
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise RuleError(f"{path}: cannot read the rule file ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise RuleError(f"{name}: not valid TOML ({e})") from None
    return parse_config(data, name)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The short alarm flags (design 30, 3.2); docs/console.md lists them."""
    g = parser.add_argument_group("alarms")
    g.add_argument("--alarm-rules", metavar="FILE", help="TOML rule file")
    g.add_argument("--alarm-lag", type=int, metavar="N", help="any group lagging > N messages")
    g.add_argument(
        "--alarm-lag-seconds",
        type=float,
        metavar="T",
        help="... or whose oldest unconsumed message is older than T seconds",
    )
    g.add_argument(
        "--alarm-total",
        type=int,
        metavar="N",
        help=f"unconsumed messages per broker group (default {DEFAULT_TOTAL:,} "
        "when a notifier is set and no rule is given)",
    )
    g.add_argument(
        "--alarm-for", metavar="D", help="how long a breach must hold before it fires (30s)"
    )
    g.add_argument(
        "--alarm-resolve-for",
        metavar="D",
        help="how long it must be cleared before it resolves (30s)",
    )
    g.add_argument("--alarm-repeat", metavar="D", help="repeat while firing; 0 = never (1h)")
    g.add_argument("--alarm-webhook", action="append", default=[], metavar="URL")
    g.add_argument("--alarm-email", action="append", default=[], metavar="ADDRESS")
    g.add_argument("--smtp", metavar="HOST:PORT")
    g.add_argument("--smtp-tls", choices=TLS_MODES, default="auto")
    g.add_argument("--smtp-user")
    g.add_argument("--smtp-password-file", metavar="FILE")
    g.add_argument("--smtp-from", metavar="ADDRESS")
    g.add_argument("--smtp-ca", metavar="FILE")


def from_args(args: argparse.Namespace) -> AlarmConfig:
    """The rule file (if any) plus the flag rules and notifiers."""
    base = load_file(args.alarm_rules) if args.alarm_rules else AlarmConfig()
    timing = _flag_timing(args, base.defaults)
    rules = list(base.rules)
    if args.alarm_lag is not None or args.alarm_lag_seconds is not None:
        lag: dict[str, Any] = {}
        if args.alarm_lag is not None:
            lag["messages"] = _positive_int(args.alarm_lag, "--alarm-lag")
        if args.alarm_lag_seconds is not None:
            lag["seconds"] = _number(args.alarm_lag_seconds, "--alarm-lag-seconds", 0.001, 1e9)
        rules.append(Rule(name="flag-lag", type="group_lag", **lag, **timing))
    notifiers = list(base.notifiers) + _flag_notifiers(args)
    total = args.alarm_total
    if total is None and notifiers and not rules:
        total = DEFAULT_TOTAL  # EQueue's alarm is on by default once someone listens
    if total is not None:
        messages = _positive_int(total, "--alarm-total")
        rules.append(Rule(name="flag-total", type="total_unconsumed", messages=messages, **timing))
    config = AlarmConfig(rules=tuple(rules), notifiers=tuple(notifiers), defaults=base.defaults)
    _check_unique(config, "alarm flags")
    return config


def _flag_timing(args: argparse.Namespace, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The flag rules' common settings: a flag given wins, else the rule
    file's [defaults], else the built-in defaults (those of ``Rule``)."""
    timing = dict(defaults)
    for flag, key in (
        ("alarm_for", "for_s"),
        ("alarm_resolve_for", "resolve_for_s"),
        ("alarm_repeat", "repeat_s"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            timing[key] = parse_duration(value, "--" + flag.replace("_", "-"))
    return timing


def _flag_notifiers(args: argparse.Namespace) -> list[Notifier]:
    out = [
        Notifier(
            f"webhook-{i}",
            "webhook",
            {"url": _url(url, "--alarm-webhook"), "headers": {}, "timeout": 5.0},
        )
        for i, url in enumerate(args.alarm_webhook, 1)
    ]
    if args.alarm_email and not args.smtp:
        raise RuleError("--alarm-email needs --smtp HOST:PORT (the mail server to send through)")
    if args.alarm_email:
        host, _ = smtp_host_port(args.smtp)
        if args.smtp_user and args.smtp_tls == "none" and not is_loopback(host):
            raise RuleError(
                "--smtp-user with --smtp-tls none would send the password in clear; "
                "use starttls or tls (only a loopback relay may skip it)"
            )
        settings: dict[str, Any] = {
            "to": tuple(args.alarm_email),
            "smtp": args.smtp,
            "tls": args.smtp_tls,
        }
        optional = {
            "from": args.smtp_from,
            "username": args.smtp_user,
            "password_file": args.smtp_password_file,
            "ca_file": args.smtp_ca,
        }
        settings.update({k: v for k, v in optional.items() if v})
        out.append(Notifier("email", "email", settings))
    return out
