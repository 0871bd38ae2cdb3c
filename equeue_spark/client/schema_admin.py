"""A topic's schemas over its broker groups: get, set, compatibility, delete, sync.

Every broker group hosting a topic keeps that topic's schemas, and a version
number must mean the same schema on all of them (a record's header names the
version, and any group's reader decodes it). The broker checks a new version
against its own history; this module keeps the groups' histories equal
(design: the client registers on each group, one broker being a cluster of
one group):

- ``set_schema`` reads every group's history; a version number must hold the
  same schema text (its identity) wherever it exists (else
  ``SchemaConflictError``: ``sync_schemas`` repairs a group that lags, not one
  that differs). The new version is the next after the highest one (or the
  version that already holds this schema text); after a delete, when no group
  holds a version, the first group answering numbers it (brokers never give a
  number twice) and the others are given that number. The groups must agree
  on the compatibility rule, unless the call sets one (``SchemaConflictError``
  naming each group's rule; ``set_compatibility`` goes to every group, and
  ``sync_schemas`` copies the rule of the group with the longest history). A complete group is asked
  first, so a refusal (incompatible) comes before anything is written; then
  each other group in broker-name order, given first the versions it lacks.
  Groups that do not answer are named in ``SchemaInfo.unreachable_brokers``:
  the next ``set_schema`` or ``sync_schemas`` completes them; one whose
  registration shows a version beyond the answering groups' refuses the call.
- reads (``get_schema``) go to one group, the one whose route shows the
  highest version, its replicas allowed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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
        except schema_rules.SchemaError as exc:  # not JSON, too deep: a type would not help
            raise InvalidRequest(str(exc)) from None
        except ValueError as exc:
            raise InvalidRequest(f"{exc}; give the type (avro or json)") from None
    if name not in TYPES:
        raise InvalidRequest(f"schema type {given!r} is not supported: give avro or json")
    return TYPES[name]


def fingerprint(type_: int, text: str) -> str:
    """The schema's fingerprint (reported only: identity is ``identity``)."""
    return _parsed(type_, text).fingerprint


def identity(type_: int, text: str) -> str:
    """The broker's identity of a schema: its normalized text (``schema_rules.parse``);
    InvalidRequest naming the problem for text that is not a schema of its type."""
    return _parsed(type_, text).text


def _parsed(type_: int, text: str) -> schema_rules.ParsedSchema:
    try:
        return schema_rules.parse(type_name(type_), text)
    except ValueError as exc:  # SchemaError: its message says what is wrong already
        said = str(exc)  # "invalid Avro schema: ..." says the type already
        prefix = "" if said.startswith("invalid ") else f"not a usable {type_name(type_)} schema: "
        raise InvalidRequest(prefix + said) from None


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
    """Each reachable group's history of a subject (ascending), rule and the
    groups that did not answer."""

    topic: str
    key: bool
    versions: dict[str, list[pb.SchemaVersion]]
    unreachable: list[str]
    registered: dict[str, int]
    """Each group's latest version as its registration shows (the route)."""
    rules: dict[str, int] = field(default_factory=dict)
    """Each group's rule (``Compatibility``), for the groups holding versions."""

    @staticmethod
    def latest(history: Sequence[pb.SchemaVersion]) -> int:
        return history[-1].version if history else 0

    def longest(self) -> list[pb.SchemaVersion]:
        """The history reaching the highest version (then the longest)."""
        return max(self.versions.values(), key=lambda h: (self.latest(h), len(h)), default=[])

    def longest_group(self) -> str:
        top = self.longest()
        return min((b for b, h in self.versions.items() if h == top), default="")

    def complete(self) -> list[str]:
        """Groups holding the highest version, in broker-name order."""
        top = self.latest(self.longest())
        return sorted(b for b, h in self.versions.items() if h and self.latest(h) == top)

    def lacking(self, broker: str, below: int) -> list[pb.SchemaVersion]:
        """The longest history's versions above the group's latest and below ``below``."""
        have = self.latest(self.versions[broker])
        return [v for v in self.longest() if have < v.version < below]

    def check(self) -> None:
        """SchemaConflictError unless every version number holds one schema text."""
        texts = {v.version: v.schema for v in self.longest()}
        differ = {
            b: h
            for b, h in self.versions.items()
            if any(texts.get(v.version) != v.schema for v in h)
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
            f"({where}); the same version must be the same schema on every group: compare "
            "them (equeue schema get --history on each group) and repair the one that differs",
            prints,
        )

    def check_rules(self) -> None:
        """SchemaConflictError when the groups holding versions have other rules:
        each checks with its own, so a version could pass on one and not another."""
        if len(set(self.rules.values())) <= 1:
            return
        where = ", ".join(f"{b}: {rule_name(r)}" for b, r in sorted(self.rules.items()))
        raise SchemaConflictError(
            f"{self.topic}: the broker groups' {subject(self.key)} compatibility rules differ "
            f"({where}): set one on every group with equeue schema compatibility "
            f"{self.topic} RULE{' --key' if self.key else ''} (or equeue schema sync, which "
            "copies the rule of the group with the longest history), or give --compatibility",
            {},
        )

    def check_ahead(self) -> None:
        """SchemaConflictError when a group that does not answer registered a
        version beyond the answering groups' longest history: a new version
        now would give its number two meanings."""
        have = self.latest(self.longest())
        ahead = {b: v for b, v in self.registered.items() if b in self.unreachable and v > have}
        if not ahead:
            return
        where = ", ".join(f"{b} holds version {v}" for b, v in sorted(ahead.items()))
        raise SchemaConflictError(
            f"{self.topic}: broker groups that do not answer hold newer {subject(self.key)} "
            f"schema versions than the {have} the others hold ({where}, by their "
            "registrations): registering now would give a number two meanings; retry once "
            "they answer",
            {},
        )


def read_histories(routes: Routes, topic: str, key: bool) -> Histories:
    """Every group's history (a group without the subject: empty). Groups the
    name servers remember as down, or that do not answer, are unreachable;
    BrokerUnavailable when none answers."""
    route = routes.route(topic, refresh=True)
    request = pb.GetSchemaRequest(topic=topic, key=key, history=True)
    registered = {b.broker_name: _latest(b, key) for b in route.brokers}
    found = Histories(topic, key, {}, list(route.down), registered)
    for broker in sorted(route.broker_names()):
        try:
            info = _read(routes, topic, broker, request)
        except NotFoundError:
            found.versions[broker] = []
        except UNREACHABLE:
            found.unreachable.append(broker)
        else:
            found.versions[broker] = list(info.versions)
            found.rules[broker] = info.compatibility
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
            raise name_broker(exc, broker, _address(routes, topic, broker)) from exc
    if brokers and not out:
        raise BrokerUnavailable(f"{topic}: no broker group answers ({', '.join(unreachable)})")
    return out


def _address(routes: Routes, topic: str, broker: str) -> str:
    """The group's master address as the (cached) route shows it ("" unknown)."""
    try:
        found = routes.route(topic).brokers
    except EqueueError:
        return ""
    return next((b.address for b in found if b.broker_name == broker), "")


def _fill(
    conn: Connection, versions: Sequence[pb.SchemaVersion], request: pb.SetSchemaRequest
) -> None:
    """Give a group the ``versions`` it lacks, with their numbers."""
    for v in versions:
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
    mine = identity(kind, text)
    found = read_histories(routes, topic, key)
    found.check()
    found.check_ahead()
    if compatibility is None:
        found.check_rules()
    longest = found.longest()
    existing = next((v.version for v in longest if v.schema == mine), 0)
    # 0: no group holds a version (a new or deleted subject): the first group
    # numbers it (never a number it gave before) and the others get that number.
    version = existing or (Histories.latest(longest) + 1 if longest else 0)
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

    def register(conn: Connection, broker: str) -> pb.SchemaInfo:
        if not dry_run and request.version:
            _fill(conn, found.lacking(broker, request.version), request)
        info = conn.call(conn.admin.SetSchema, request, retry=False)
        if not request.version and not dry_run and info.versions:
            request.version = info.versions[0].version
        return info

    replies = on_groups(routes, topic, order, register, unreachable)
    info = replies[0][1]
    info.created = any(r.created for _, r in replies)
    info.unreachable_brokers.extend(sorted(set(unreachable)))
    routes.invalidate(topic)
    return info


def sync_schemas(routes: Routes, topic: str) -> dict[str, dict[str, list[int]]]:
    """Give every group the value and key versions it lacks of the longest
    history, and that history's group's rule: {"value": {broker group: versions
    copied}, "key": {...}, "value_rule": {broker group: [Compatibility set]},
    "key_rule": {...}} (groups given nothing left out). SchemaConflictError when
    histories differ (not merely lag); groups that do not answer are left out
    (``read_histories``)."""
    copied: dict[str, dict[str, list[int]]] = {
        "value": {}, "key": {}, "value_rule": {}, "key_rule": {},
    }  # fmt: skip
    for key in (False, True):
        _sync_subject(routes, topic, key, copied)
    routes.invalidate(topic)
    return copied


def _sync_subject(
    routes: Routes, topic: str, key: bool, copied: dict[str, dict[str, list[int]]]
) -> None:
    found = read_histories(routes, topic, key)
    found.check()
    top = Histories.latest(found.longest())
    rule = found.rules.get(found.longest_group(), 0)
    request = pb.SetSchemaRequest(topic=topic, key=key)
    name = subject(key)

    def fill(conn: Connection, broker: str) -> None:
        if rule and found.rules.get(broker) != rule:
            # The rule first: the versions given next are checked with the group's rule.
            change = pb.SetCompatibilityRequest(
                topic=topic, key=key, compatibility=cast("pb.Compatibility", rule)
            )
            conn.call(conn.admin.SetCompatibility, change, retry=False)
            copied[f"{name}_rule"][broker] = [rule]
        lacking = found.lacking(broker, top + 1)
        _fill(conn, lacking, request)
        if lacking:
            copied[name][broker] = [v.version for v in lacking]

    on_groups(routes, topic, sorted(found.versions), fill, [])


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
