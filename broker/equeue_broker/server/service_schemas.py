"""The Admin service's schema calls: SetSchema, GetSchema, SetCompatibility, DeleteSchemas.

A topic's value and key schemas (docs/schemas.md) are kept by the store
(storage/meta/schemas.py); the rules are the contract's
(equeue_proto/schema_rules.py). ``SchemaServiceMixin`` is mixed into the Admin
servicer (service_admin.py). Writes are refused on replicas (replica_gate.py)
and need the admin role; GetSchema is served by replicas too and needs the
produce or consume role of the topic (auth.py). With ``--replication sync``
a change returns once the in-sync replicas applied it (the schemas travel in
the replication stream when their generation moves: service_replication.py),
as a sync offset commit does. After a change the name servers are told (the
registration carries each topic's latest versions: registration.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from equeue_broker.server.errors import BadRequest
from equeue_broker.server.service_base import BrokerState, rpc
from equeue_broker.storage.errors import LimitExceeded, NotFound
from equeue_broker.storage.meta.schemas import SchemaInvalid, SchemaVersion, Subject
from equeue_proto import schema_rules
from equeue_proto.v1 import broker_pb2 as pb

log = logging.getLogger("equeue.broker")

T = TypeVar("T")
RAW_TEXT_FACTOR = 4
"""A schema's text (UTF-8 bytes) may be this many times ``max_schema_bytes``
before it is normalized (spaces and indentation go); the normalized text is held
to the limit before anything parses or compiles it (schema_rules.parse)."""


def subject_of(key: bool) -> str:
    return "key" if key else "value"


def rule_name(value: int) -> str | None:
    """The rule a Compatibility enum value names; None for UNSPECIFIED."""
    if value == pb.COMPATIBILITY_UNSPECIFIED:
        return None
    try:
        return pb.Compatibility.Name(value).removeprefix("COMPATIBILITY_")
    except ValueError:
        raise BadRequest(f"unknown compatibility {value}: use one of the rules") from None


def version_pb(version: SchemaVersion) -> pb.SchemaVersion:
    return pb.SchemaVersion(
        version=version.version,
        type="SCHEMA_TYPE_" + version.type,
        schema=version.schema,
        fingerprint=version.fingerprint,
        created_ms=version.created_ms,
    )


def no_schema(topic: str, subject: str) -> NotFound:
    return NotFound(
        f"topic {topic} has no {subject} schema: set one with equeue schema set"
        f"{' --key' if subject == 'key' else ''} {topic} FILE"
    )


class SchemaServiceMixin:
    """The schema handlers of the Admin servicer."""

    s: BrokerState

    def _info(
        self, topic: str, key: bool, incarnation: int, subject: Subject,
        versions: list[SchemaVersion],
    ) -> pb.SchemaInfo:  # fmt: skip
        return pb.SchemaInfo(
            topic=topic, key=key, incarnation=incarnation,
            compatibility="COMPATIBILITY_" + subject.compatibility,
            versions=[version_pb(v) for v in versions],
            latest_version=subject.latest_version, broker_id=self.s.broker_id,
        )  # fmt: skip

    async def _change(self, change: Callable[[], T]) -> T:
        """Run a schema change on the thread pool; with sync replication, return
        once every in-sync replica applied it (their metadata version moved)."""

        async def write() -> T:
            return await self.s.call(change)

        insync = self.s.insync
        try:
            return await (insync.replicated(write, metadata=True) if insync.sync else write())
        finally:
            self.s.topology_changed()

    @rpc
    async def SetSchema(self, request: pb.SetSchemaRequest, context: Any) -> pb.SchemaInfo:
        topic, subject = request.topic, subject_of(request.key)
        store = self.s.store
        compatibility = rule_name(request.compatibility)

        # Parsed first: a bad text is refused as such, before sync replication's
        # checks of the in-sync set (and parsing a large schema takes a thread).
        parsed = await self.s.call(self._parse, request, subject)

        def register() -> pb.SchemaInfo:
            incarnation = store.topic_admin.describe(topic).incarnation
            done = store.schemas.register(
                topic, incarnation, subject, parsed, version=request.version,
                compatibility=compatibility, dry_run=request.dry_run,
            )  # fmt: skip
            # A dry run's subject is the hypothetical one: the latest version it
            # reports is the one that exists (versions[0] is the would-be number).
            shown = done.subject
            if request.dry_run:
                held = store.schemas.get(topic, subject, incarnation) or Subject(
                    shown.compatibility
                )
                shown = replace(held, compatibility=shown.compatibility)
            info = self._info(topic, request.key, incarnation, shown, [done.version])
            info.created, info.problems[:] = done.created, list(done.problems)
            if done.created:
                fields = {"topic": topic, "subject": subject, "version": done.version.version}
                log.info("schema registered", extra=fields)
            return info

        if request.dry_run:
            return await self.s.call(register)
        return await self._change(register)

    def _parse(self, request: pb.SetSchemaRequest, subject: str) -> schema_rules.ParsedSchema:
        where = f"topic {request.topic} ({subject} schema)"
        limit = self.s.store.schemas.max_schema_bytes
        if not request.schema.strip():
            raise SchemaInvalid(f"the schema for {where} is empty: give the schema text")
        size = len(request.schema.encode())
        if size > RAW_TEXT_FACTOR * limit:
            raise LimitExceeded(
                f"the schema for {where} is {size} bytes, more than "
                f"{RAW_TEXT_FACTOR} x max_schema_bytes={limit}"
            )
        try:
            kind = self._type(request)
            return schema_rules.parse(kind, request.schema, max_bytes=limit)
        except schema_rules.SchemaTooLarge as exc:
            raise LimitExceeded(f"the schema for {where} is too large: {exc}") from None
        except (ValueError, RecursionError, MemoryError) as exc:  # SchemaError too
            if not isinstance(exc, ValueError):  # never expected: the depth is checked first
                exc = ValueError(f"the schema is too complex to parse ({type(exc).__name__})")
            raise SchemaInvalid(f"invalid schema for {where}: {exc}") from None

    @staticmethod
    def _type(request: pb.SetSchemaRequest) -> str:
        if request.type == pb.SCHEMA_TYPE_UNSPECIFIED:
            return schema_rules.guess_type(request.schema)  # depth-checked first too
        if request.type == pb.SCHEMA_TYPE_PROTOBUF:
            raise ValueError("schema type PROTOBUF is not supported yet: use AVRO or JSON")
        try:
            return pb.SchemaType.Name(request.type).removeprefix("SCHEMA_TYPE_")
        except ValueError:
            raise ValueError(f"unknown schema type {request.type}: use AVRO or JSON") from None

    @rpc
    async def GetSchema(self, request: pb.GetSchemaRequest, context: Any) -> pb.SchemaInfo:
        topic, subject_name = request.topic, subject_of(request.key)
        store = self.s.store

        def get() -> pb.SchemaInfo:
            incarnation = store.topic_admin.describe(topic).incarnation
            subject = store.schemas.get(topic, subject_name, incarnation)
            if subject is None or not subject.versions:
                raise no_schema(topic, subject_name)
            if request.history:
                versions = list(subject.versions)
            elif request.version:
                found = subject.version(request.version)
                if found is None:
                    raise NotFound(
                        f"topic {topic} has no {subject_name} schema version {request.version}"
                        f" (its versions are {subject.first_version} to {subject.latest_version})"
                    )
                versions = [found]
            else:
                versions = [subject.versions[-1]]
            return self._info(topic, request.key, incarnation, subject, versions)

        return await self.s.call(get)

    @rpc
    async def SetCompatibility(
        self, request: pb.SetCompatibilityRequest, context: Any
    ) -> pb.SchemaInfo:
        topic, subject_name = request.topic, subject_of(request.key)
        rule = rule_name(request.compatibility)
        if rule is None:
            raise BadRequest(f"give the compatibility rule: one of {', '.join(schema_rules.RULES)}")
        store = self.s.store

        def set_() -> pb.SchemaInfo:
            incarnation = store.topic_admin.describe(topic).incarnation
            subject = store.schemas.set_compatibility(topic, incarnation, subject_name, rule)
            log.info(
                "schema compatibility set",
                extra={"topic": topic, "subject": subject_name, "compatibility": rule},
            )
            latest = [subject.versions[-1]] if subject.versions else []
            return self._info(topic, request.key, incarnation, subject, latest)

        return await self._change(set_)

    @rpc
    async def DeleteSchemas(
        self, request: pb.DeleteSchemasRequest, context: Any
    ) -> pb.DeleteSchemasReply:
        topic = request.topic
        subjects = ("value", "key") if request.both else (subject_of(request.key),)
        store = self.s.store

        def delete() -> None:
            store.topic_admin.describe(topic)  # NotFound for an unknown topic
            if not store.schemas.delete(topic, subjects):
                raise no_schema(topic, " or ".join(subjects))
            log.info("schemas deleted", extra={"topic": topic, "subjects": list(subjects)})

        await self._change(delete)
        return pb.DeleteSchemasReply()
