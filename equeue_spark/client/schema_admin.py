"""A topic's schemas over its broker groups: get, set, compatibility, delete, sync.

Every broker group hosting a topic keeps that topic's schemas, and a version
number must mean the same schema on all of them (a record's header names the
version, and any group's reader decodes it). The broker checks a new version
against its own history; this module keeps the groups' histories equal
(design: the client registers on each group, one broker being a cluster of
one group):

- ``set_schema`` reads every group's history; they must be prefixes of the
  longest one (else ``SchemaConflictError``: ``sync_schemas`` repairs a group
  that lags, not one that differs). The new version is the longest's next
  (or the version that already holds this schema). A complete group is asked
  first, so a refusal (incompatible) comes before anything is written; then
  each other group in broker-name order, given first the versions it lacks.
  Groups that do not answer are named in ``SchemaInfo.unreachable_brokers``:
  the next ``set_schema`` or ``sync_schemas`` completes them.
- reads (``get_schema``) go to one group, the one whose route shows the
  highest version, its replicas allowed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

from equeue_proto import schema_rules
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.errors import (
    BrokerUnavailable,
    DeadlineExceeded,
    EqueueError,
    InvalidRequest,
    NotFoundError,
    SchemaConflictError,
)
from equeue_spark.client.route import name_broker

if TYPE_CHECKING:
    from equeue_spark.client.connection import Connection
    from equeue_spark.client.routing import Routes

T = TypeVar("T")

TYPES: dict[str, pb.SchemaType] = {
    "AVRO": pb.SCHEMA_TYPE_AVRO,
    "JSON": pb.SCHEMA_TYPE_JSON,
}
"""The schema types a client registers, by the names the CLI and ``type=`` use."""

RULES = schema_rules.RULES
"""The compatibility rules, by name."""

UNREACHABLE = (BrokerUnavailable, DeadlineExceeded)
"""A group failing with these did not answer (it is reported, not fatal)."""


def type_name(value: int) -> str:
    """ "AVRO", "JSON" (or the enum's own name) of a ``SchemaType``."""
    for name, number in TYPES.items():
        if number == value:
            return name
    return pb.SchemaType.Name(value).removeprefix("SCHEMA_TYPE_")


def rule_value(rule: str) -> pb.Compatibility:
    """The ``Compatibility`` of a rule's name (any case); InvalidRequest listing the rules."""
    name = rule.strip().upper().replace("-", "_")
    if name not in RULES:
        raise InvalidRequest(
            f"compatibility {rule!r} is not a rule: give one of {', '.join(RULES)}"
        )
    return cast(pb.Compatibility, pb.Compatibility.Value(f"COMPATIBILITY_{name}"))


def rule_name(value: int) -> str:
    """A ``Compatibility``'s rule name ("BACKWARD"); "" for unspecified."""
    if not value:
        return ""
    return pb.Compatibility.Name(value).removeprefix("COMPATIBILITY_")


def schema_text(schema: str | bytes | Mapping[str, object] | Sequence[object]) -> str:
    """The text to register: ``schema`` itself, or a parsed document as JSON."""
    if isinstance(schema, bytes):
        return schema.decode("utf-8")
    if isinstance(schema, str):
        return schema
    return json.dumps(schema)


def schema_type(text: str, given: str) -> pb.SchemaType:
    """The ``SchemaType`` of ``given`` ("avro"/"json", any case), or guessed
    from the text when "" (``schema_rules.guess_type``)."""
    name = given.strip().upper()
    if not name:
        try:
            name = schema_rules.guess_type(text)
        except ValueError as exc:
            raise InvalidRequest(f"{exc}; give the type (avro or json)") from None
    if name not in TYPES:
        raise InvalidRequest(f"schema type {given!r} is not supported: give avro or json")
    return TYPES[name]


def fingerprint(type_: int, text: str) -> str:
    """The broker's identity of a schema (``schema_rules.parse``); InvalidRequest
    naming the problem for text that is not a schema of its type."""
    try:
        return schema_rules.parse(type_name(type_), text).fingerprint
    except ValueError as exc:
        raise InvalidRequest(f"invalid {type_name(type_)} schema: {exc}") from None


def subject(key: bool) -> str:
    return "key" if key else "value"


# -- reading ----------------------------------------------------------------------------


def _latest(entry: pb.BrokerRoute, key: bool) -> int:
    return entry.key_schema_version if key else entry.value_schema_version


def read_order(routes: Routes, topic: str, key: bool) -> list[str]:
    """The topic's broker groups, the one whose route shows the highest
    version of the subject first (a group that lags answers last)."""
    route = routes.route(topic)
    return [b.broker_name for b in sorted(route.brokers, key=lambda b: -_latest(b, key))]


def _read(routes: Routes, topic: str, broker: str, request: pb.GetSchemaRequest) -> pb.SchemaInfo:
    def call(conn: Connection, last: bool) -> pb.SchemaInfo:
        return conn.call(conn.admin.GetSchema, request, retry=last)

    return routes.read_on(topic, broker, call)


def get_schema(
    routes: Routes, topic: str, version: int = 0, *, key: bool = False, history: bool = False
) -> pb.SchemaInfo:
    """A subject's version (0: the latest) or its ``history``, from the group
    whose route shows the highest version (its replicas may answer); the next
    group when one does not answer or lacks it. NotFoundError when none has it."""
    if version < 0:
        raise InvalidRequest(f"version {version} must be 0 (the latest) or a version number")
    request = pb.GetSchemaRequest(topic=topic, key=key, version=version, history=history)
    first: EqueueError | None = None
    unreachable: list[str] = []
    for broker in read_order(routes, topic, key):
        try:
            info = _read(routes, topic, broker, request)
        except NotFoundError as exc:
            first = first or name_broker(exc, broker, "")
            continue
        except UNREACHABLE as exc:
            first = first or name_broker(exc, broker, "")
            unreachable.append(broker)
            continue
        info.unreachable_brokers.extend(sorted(unreachable))
        return info
    assert first is not None  # a route has at least one group
    raise first


# -- histories ----------------------------------------------------------------------------


@dataclass
class Histories:
    """Each reachable group's history of a subject (ascending) and the groups
    that did not answer."""

    topic: str
    key: bool
    versions: dict[str, list[pb.SchemaVersion]]
    unreachable: list[str]

    def longest(self) -> list[pb.SchemaVersion]:
        return max(self.versions.values(), key=len, default=[])

    def complete(self) -> list[str]:
        """Groups holding the whole longest history, in broker-name order."""
        n = len(self.longest())
        return sorted(b for b, h in self.versions.items() if len(h) == n)

    def check(self) -> None:
        """SchemaConflictError unless every history is a prefix of the longest."""
        longest = self.longest()
        differ = {
            b: h
            for b, h in self.versions.items()
            if [v.fingerprint for v in h] != [v.fingerprint for v in longest[: len(h)]]
        }
        if not differ:
            return
        prints = {b: [v.fingerprint for v in h] for b, h in self.versions.items()}
        where = "; ".join(
            f"{b}: " + ", ".join(f"v{v.version} {v.fingerprint}" for v in h)
            for b, h in sorted(self.versions.items())
        )
        raise SchemaConflictError(
            f"{self.topic}: the broker groups' {subject(self.key)} schema histories differ "
            f"({where}); the same version must be the same schema on every group: delete "
            f"the schemas (equeue schema delete) and set the versions again in order",
            prints,
        )


def read_histories(routes: Routes, topic: str, key: bool) -> Histories:
    """Every group's history (a group without the subject: empty). Groups the
    name servers remember as down, or that do not answer, are unreachable;
    BrokerUnavailable when none answers."""
    route = routes.route(topic, refresh=True)
    request = pb.GetSchemaRequest(topic=topic, key=key, history=True)
    found = Histories(topic, key, {}, list(route.down))
    for broker in sorted(route.broker_names()):
        try:
            found.versions[broker] = list(_read(routes, topic, broker, request).versions)
        except NotFoundError:
            found.versions[broker] = []
        except UNREACHABLE:
            found.unreachable.append(broker)
    if not found.versions:
        raise BrokerUnavailable(
            f"{topic}: no broker group answers ({', '.join(sorted(found.unreachable))})"
        )
    found.unreachable.sort()
    return found


# -- writing ------------------------------------------------------------------------------


def on_groups(
    routes: Routes,
    topic: str,
    brokers: Sequence[str],
    call: Callable[[Connection, str], T],
    unreachable: list[str],
) -> list[tuple[str, T]]:
    """``call(master connection, group)`` on each group in turn; a group that
    does not answer is appended to ``unreachable`` and the rest go on. Any
    other error stops there, naming the group (the groups before it stand).
    BrokerUnavailable when none answers."""
    out: list[tuple[str, T]] = []
    for broker in brokers:
        try:
            out.append(
                (broker, routes.on_master(topic, broker, lambda c, _r: call(c, broker)))  # noqa: B023
            )
        except UNREACHABLE:
            unreachable.append(broker)
        except EqueueError as exc:
            raise name_broker(exc, broker, "") from exc
    if brokers and not out:
        raise BrokerUnavailable(f"{topic}: no broker group answers ({', '.join(unreachable)})")
    return out


def _fill(
    conn: Connection, have: int, versions: Sequence[pb.SchemaVersion], request: pb.SetSchemaRequest
) -> None:
    """Give a group the versions ``versions[have:]`` it lacks, with their numbers."""
    for v in versions[have:]:
        fill = pb.SetSchemaRequest(
            topic=request.topic, key=request.key, type=v.type, schema=v.schema, version=v.version
        )
        conn.call(conn.admin.SetSchema, fill, retry=False)


def set_schema(
    routes: Routes,
    topic: str,
    schema: str | bytes | Mapping[str, object],
    *,
    type: str = "",
    key: bool = False,
    compatibility: str | None = None,
    dry_run: bool = False,
) -> pb.SchemaInfo:
    """Register ``schema`` on every group of the topic (module docstring)."""
    text = schema_text(schema)
    kind = schema_type(text, type)
    mine = fingerprint(kind, text)
    found = read_histories(routes, topic, key)
    found.check()
    longest = found.longest()
    existing = next((v.version for v in longest if v.fingerprint == mine), 0)
    version = existing or len(longest) + 1
    request = pb.SetSchemaRequest(
        topic=topic, key=key, type=kind, schema=text, version=version, dry_run=dry_run
    )
    if compatibility is not None:
        request.compatibility = rule_value(compatibility)
    complete = found.complete()
    order = complete[:1] + sorted(b for b in found.versions if b not in complete[:1])
    if dry_run:  # a complete group's check is the check of every group
        order = order[:1]
    unreachable = list(found.unreachable)
    lower = [v for v in longest if v.version < version]

    def register(conn: Connection, broker: str) -> pb.SchemaInfo:
        if not dry_run:
            have = len(found.versions[broker])
            _fill(conn, min(have, len(lower)), lower, request)
        return conn.call(conn.admin.SetSchema, request, retry=False)

    replies = on_groups(routes, topic, order, register, unreachable)
    info = replies[0][1]
    info.created = any(r.created for _, r in replies)
    info.unreachable_brokers.extend(sorted(set(unreachable)))
    routes.invalidate(topic)
    return info


def sync_schemas(routes: Routes, topic: str) -> dict[str, dict[str, list[int]]]:
    """Give every group the value and key versions it lacks of the longest
    history: {"value": {broker group: versions copied}, "key": {...}} (groups
    given nothing left out). SchemaConflictError when histories differ (not
    merely lag); groups that do not answer are left out (``read_histories``)."""
    copied: dict[str, dict[str, list[int]]] = {"value": {}, "key": {}}
    for key in (False, True):
        found = read_histories(routes, topic, key)
        found.check()
        longest = found.longest()
        lagging = sorted(b for b, h in found.versions.items() if len(h) < len(longest))
        request = pb.SetSchemaRequest(topic=topic, key=key)

        def fill(conn: Connection, broker: str) -> None:
            _fill(conn, len(found.versions[broker]), longest, request)  # noqa: B023

        for broker, _ in on_groups(routes, topic, lagging, fill, []):
            have = len(found.versions[broker])
            copied[subject(key)][broker] = [v.version for v in longest[have:]]
    routes.invalidate(topic)
    return copied


def set_compatibility(routes: Routes, topic: str, rule: str, *, key: bool = False) -> pb.SchemaInfo:
    """Change the subject's rule on every group (groups that do not answer:
    ``unreachable_brokers``)."""
    request = pb.SetCompatibilityRequest(topic=topic, key=key, compatibility=rule_value(rule))
    unreachable: list[str] = list(routes.route(topic, refresh=True).down)
    brokers = sorted(routes.route(topic).broker_names())

    def change(conn: Connection, _broker: str) -> pb.SchemaInfo:
        return conn.call(conn.admin.SetCompatibility, request, retry=False)

    replies = on_groups(routes, topic, brokers, change, unreachable)
    info = replies[0][1]
    info.unreachable_brokers.extend(sorted(unreachable))
    return info


def delete_schemas(routes: Routes, topic: str, *, key: bool | None = False) -> list[str]:
    """Forget the value (``key=False``), key (True) or both (None) schemas on
    every group; the groups that did not answer. NotFoundError when no group
    had them (a group without them is passed over)."""
    request = pb.DeleteSchemasRequest(topic=topic, key=bool(key), both=key is None)
    unreachable: list[str] = list(routes.route(topic, refresh=True).down)
    brokers = sorted(routes.route(topic).broker_names())
    missing: list[NotFoundError] = []

    def delete(conn: Connection, broker: str) -> bool:
        try:
            conn.call(conn.admin.DeleteSchemas, request, retry=False)
        except NotFoundError as exc:
            missing.append(exc)
            return False
        return True

    deleted = on_groups(routes, topic, brokers, delete, unreachable)
    routes.invalidate(topic)
    if missing and not any(done for _, done in deleted):
        raise missing[0]
    return sorted(unreachable)
