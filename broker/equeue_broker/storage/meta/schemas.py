"""Topic schemas: ``<data_dir>/schemas.json`` (docs/schemas.md).

A topic has up to two *subjects*, ``value`` and ``key``, each an ordered list of
immutable versions 1, 2, 3 ... and one compatibility rule (``BACKWARD`` unless
set). Schemas belong to one incarnation of their topic: a topic deleted (or
recreated) starts without any. The rules and the parsing are the contract's
(``equeue_proto.schema_rules``); this module keeps the history and refuses
what breaks a rule or a limit.

Not in ``topics.json``: the topics mapping travels in every replication
metadata reply, and schemas (up to ``max_schema_bytes`` a version) would ride
along. This file has its own ``generation`` (+1 on every change): a master
sends the whole document to a replica only when it changed
(service_replication.py), and the replica ``adopt``s it. Layout (inside
atomic_file's checksummed envelope)::

    {"generation": 17,
     "topics": {"orders": {"incarnation": 5147350139251307010,
                           "value": {"compatibility": "BACKWARD",
                                     "versions": [{"version": 1, "type": "AVRO",
                                                   "fingerprint": "c1162c0bf9cff7e6",
                                                   "created_ms": 1764200000000,
                                                   "schema": "<normalized text>"}]},
                           "key": null}}}

Every change is saved before memory changes: a save that fails (disk full)
changes nothing. When neither copy of the file is intact the store starts
without schemas and says so (``lost``, damage.py): records keep their version
headers, and an operator sets the schemas again.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, overload

from equeue_broker.storage.config import StorageConfig
from equeue_broker.storage.errors import (
    CorruptionError,
    InvalidArgument,
    LimitExceeded,
    PreconditionFailed,
    io_error,
)
from equeue_broker.storage.meta.atomic_file import (
    encode_document,
    keep_damaged,
    load_json,
    save_json,
)
from equeue_proto import schema_rules
from equeue_proto.schema_rules import ParsedSchema

log = logging.getLogger(__name__)

SUBJECTS = ("value", "key")
DEFAULT_RULE = "BACKWARD"
MAX_FILE_BYTES = 16 << 20
"""The file at most: it is read whole at open and sent whole to replicas in one
replication reply, which must stay within gRPC's message limits."""


class SchemaInvalid(InvalidArgument):
    """The schema text does not parse, or its type is not supported."""


class SchemaIncompatible(PreconditionFailed):
    """A schema breaks its subject's compatibility rule; ``problems`` lists why."""

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


class SchemaVersionConflict(PreconditionFailed):
    """An explicit version is neither the next one nor the same schema's version."""


@dataclass(frozen=True)
class SchemaVersion:
    version: int
    type: str
    schema: str
    fingerprint: str
    created_ms: int


@dataclass(frozen=True)
class Subject:
    compatibility: str
    versions: tuple[SchemaVersion, ...] = ()

    @property
    def latest(self) -> SchemaVersion | None:
        return self.versions[-1] if self.versions else None

    def version(self, number: int) -> SchemaVersion | None:
        """Version ``number`` (versions are 1, 2, 3 ... in order)."""
        return self.versions[number - 1] if 0 < number <= len(self.versions) else None


@dataclass(frozen=True)
class TopicSchemas:
    incarnation: int
    value: Subject | None = None
    key: Subject | None = None

    def subject(self, name: str) -> Subject | None:
        return self.value if name == "value" else self.key

    def with_subject(self, name: str, subject: Subject | None) -> TopicSchemas:
        return replace(self, value=subject) if name == "value" else replace(self, key=subject)


@dataclass(frozen=True)
class Registration:
    """What ``register`` did: the version (the new one, the existing equal one, or
    with ``dry_run`` the one it would be), whether it was created, the subject
    after it, and with ``dry_run`` the problems (else they raise)."""

    version: SchemaVersion
    created: bool
    subject: Subject
    problems: tuple[str, ...] = ()


def _label(topic: str, subject: str) -> str:
    return f"topic {topic} ({subject} schema)"


class SchemaStore:
    """The schemas of one data directory; thread-safe (its own lock, held across
    saves of its own file only)."""

    def __init__(self, path: Path, config: StorageConfig) -> None:
        self.path = path
        self.max_schema_bytes = config.max_schema_bytes
        self.max_schema_versions = config.max_schema_versions
        self._lock = threading.Lock()
        self._topics: dict[str, TopicSchemas] = {}
        self._generation = 0
        self.lost: str | None = None
        """Set when the file had no intact copy at open (damage.py)."""
        self._load()

    @property
    def generation(self) -> int:
        """Counts changes (saved with them): replication resends the document after one."""
        return self._generation

    # -- reading --------------------------------------------------------------------

    def get(self, topic: str, subject: str, incarnation: int = 0) -> Subject | None:
        """The topic's subject; None if it has none (or they belong to another
        incarnation than a non-zero ``incarnation``)."""
        with self._lock:
            entry = self._topics.get(topic)
        if entry is None or (incarnation and entry.incarnation != incarnation):
            return None
        return entry.subject(subject)

    def topics(self) -> dict[str, TopicSchemas]:
        with self._lock:
            return dict(self._topics)

    def subject_count(self) -> int:
        """Subjects with at least one version (BrokerStats.schema_subjects)."""
        with self._lock:
            entries = list(self._topics.values())
        return sum(1 for e in entries for s in (e.value, e.key) if s is not None and s.versions)

    # -- changes --------------------------------------------------------------------

    def register(
        self,
        topic: str,
        incarnation: int,
        subject: str,
        parsed: ParsedSchema,
        *,
        version: int = 0,
        compatibility: str | None = None,
        dry_run: bool = False,
    ) -> Registration:
        """Register ``parsed`` as the subject's next version, checked against its
        history under its rule (``compatibility``, if given, becomes the rule
        first). A schema equal to an existing version returns that version.
        ``version``: 0 for the next; else it must be the next, or the existing
        equal one. Raises SchemaIncompatible (unless ``dry_run``),
        SchemaVersionConflict, LimitExceeded."""
        size = len(parsed.text.encode())
        if size > self.max_schema_bytes:
            raise LimitExceeded(
                f"the schema for {_label(topic, subject)} is {size} bytes (normalized), "
                f"more than max_schema_bytes={self.max_schema_bytes}"
            )
        with self._lock:
            entry = self._entry(topic, incarnation)
            current = entry.subject(subject) or Subject(DEFAULT_RULE)
            rule = compatibility or current.compatibility
            if rule != current.compatibility:
                current = replace(current, compatibility=rule)
            same = next((v for v in current.versions if v.fingerprint == parsed.fingerprint), None)
            self._check_version(topic, subject, current, same, version)
            if same is not None:
                if not dry_run and current != entry.subject(subject):  # a new rule only
                    self._save_subject(topic, entry, subject, current)
                return Registration(same, False, current)
            history = _History(current.versions)
            problems = schema_rules.check(rule, parsed, history)
            if problems and not dry_run:
                raise SchemaIncompatible(_refusal(topic, subject, rule, problems), problems)
            if len(current.versions) >= self.max_schema_versions:
                raise LimitExceeded(
                    f"{_label(topic, subject)} has {len(current.versions)} versions, "
                    f"max_schema_versions={self.max_schema_versions}: delete the subject "
                    "(equeue schema delete) to start again"
                )
            new = SchemaVersion(
                len(current.versions) + 1, parsed.type, parsed.text, parsed.fingerprint,
                int(time.time() * 1000),
            )  # fmt: skip
            after = replace(current, versions=(*current.versions, new))
            if dry_run:
                return Registration(new, False, after, tuple(problems))
            self._save_subject(topic, entry, subject, after)
            return Registration(new, True, after)

    def _check_version(
        self, topic: str, subject: str, current: Subject, same: SchemaVersion | None, asked: int
    ) -> None:
        if not asked:
            return
        following = len(current.versions) + 1
        if same is not None and same.version == asked:
            return
        if same is not None:
            why = f"this schema is version {same.version} already"
        elif asked < following:
            held = current.versions[asked - 1].fingerprint
            why = f"version {asked} exists with another schema (fingerprint {held})"
        elif asked > following:
            why = f"the next version is {following}"
        else:
            return
        raise SchemaVersionConflict(
            f"cannot register the schema for {_label(topic, subject)} as version {asked}: "
            f"{why}; compare the broker groups' histories (equeue schema get --history) "
            "and repair them with equeue schema sync"
        )

    def set_compatibility(self, topic: str, incarnation: int, subject: str, rule: str) -> Subject:
        """Make ``rule`` the subject's rule (the next registration is checked with it)."""
        if rule not in schema_rules.RULES:
            raise ValueError(f"unknown compatibility rule {rule!r}")
        with self._lock:
            entry = self._entry(topic, incarnation)
            current = replace(entry.subject(subject) or Subject(DEFAULT_RULE), compatibility=rule)
            if current != entry.subject(subject):
                self._save_subject(topic, entry, subject, current)
            return current

    def delete(self, topic: str, subjects: tuple[str, ...]) -> bool:
        """Forget these subjects of the topic; False if it had none of them."""
        with self._lock:
            entry = self._topics.get(topic)
            if entry is None or all(entry.subject(s) is None for s in subjects):
                return False
            kept = entry
            for name in subjects:
                kept = kept.with_subject(name, None)
            topics = dict(self._topics)
            if kept.value is None and kept.key is None:
                del topics[topic]
            else:
                topics[topic] = kept
            self._commit(topics)
            return True

    def forget_topic(self, topic: str) -> None:
        """Drop the schemas of a deleted topic (TopicAdmin.delete_topic, after its save)."""
        with self._lock:
            if topic in self._topics:
                self._commit({k: v for k, v in self._topics.items() if k != topic})

    def retain(self, incarnations: Mapping[str, int]) -> None:
        """At open: drop the schemas of topics gone or recreated (a crash between a
        topic's deletion and ``forget_topic`` leaves such an entry)."""
        with self._lock:
            kept = {
                name: entry
                for name, entry in self._topics.items()
                if incarnations.get(name) == entry.incarnation
            }
            if len(kept) != len(self._topics):
                dropped = sorted(self._topics.keys() - kept.keys())
                log.info("schemas of deleted or recreated topics dropped: %s", dropped)
                self._commit(kept)

    # -- replication ----------------------------------------------------------------

    def document(self) -> dict[str, Any]:
        """The file's document (what a master sends its replicas)."""
        with self._lock:
            return _document(self._generation, self._topics)

    def adopt(self, document: Any) -> bool:
        """Make the schemas the master's ``document``; True if anything changed.
        ``CorruptionError`` naming the problem if it has the wrong shape."""
        generation, topics = _parse_document(document, "replicated schemas")
        with self._lock:
            if generation == self._generation and topics == self._topics:
                return False
            self._save(generation, topics)
            self._generation, self._topics = generation, topics
            return True

    # -- internals (lock held) -------------------------------------------------------

    def _entry(self, topic: str, incarnation: int) -> TopicSchemas:
        """The topic's entry; a fresh one when it has none or an older incarnation's."""
        entry = self._topics.get(topic)
        if entry is None or entry.incarnation != incarnation:
            return TopicSchemas(incarnation)
        return entry

    def _save_subject(self, topic: str, entry: TopicSchemas, subject: str, value: Subject) -> None:
        changed = entry.with_subject(subject, value)
        self._commit({**self._topics, topic: changed})

    def _commit(self, topics: dict[str, TopicSchemas]) -> None:
        generation = self._generation + 1
        self._save(generation, topics)
        self._generation, self._topics = generation, topics

    def _save(self, generation: int, topics: dict[str, TopicSchemas]) -> None:
        document = _document(generation, topics)
        size = len(encode_document(document))
        if size > MAX_FILE_BYTES:
            raise LimitExceeded(
                f"schemas.json would be {size} bytes, more than {MAX_FILE_BYTES}: "
                "delete the schemas of topics no longer used"
            )
        try:
            save_json(self.path, document)
        except OSError as exc:
            raise io_error("schemas.json", exc) from exc

    def _load(self) -> None:
        try:
            document = load_json(self.path)
            if document is None:
                return
            self._generation, self._topics = _parse_document(document, str(self.path))
        except CorruptionError as exc:
            kept = keep_damaged(self.path)
            self.lost = (
                f"schemas.json: no intact copy ({exc}): every topic's schemas are lost; "
                "set them again with equeue schema set"
            )
            log.error("SCHEMAS LOST: %s; damaged copies kept as %s", self.lost, kept)
            # Saved at once, in both copies: a later open must not pick a damaged one.
            self._generation += 1
            self._save(self._generation, {})
            self._save(self._generation, {})


MAX_MESSAGE = 900
"""A refusal's message at most: it travels as a gRPC status message (the server
cuts those at 1 KiB). Whole problem lines only; a dry run returns every one."""


def _refusal(topic: str, subject: str, rule: str, problems: list[str]) -> str:
    """The incompatibilities, one per line after a first line naming the subject."""
    count = f"{len(problems)} problem{'' if len(problems) == 1 else 's'}"
    lines = [f"the schema for {_label(topic, subject)} is not {rule} compatible ({count}):"]
    size = len(lines[0])
    for shown, problem in enumerate(problems):
        if size + 1 + len(problem) > MAX_MESSAGE - 80 and shown:
            lines.append(f"... and {len(problems) - shown} more (a dry run lists every one)")
            break
        lines.append(problem[: MAX_MESSAGE - 80 - size - 1])
        size += 1 + len(lines[-1])
    return "\n".join(lines)


class _History(Sequence[ParsedSchema]):
    """A subject's versions as the rules take them, each parsed when the rule asks
    for it: BACKWARD looks at the latest only, not at 1,000 versions."""

    def __init__(self, versions: tuple[SchemaVersion, ...]) -> None:
        self._versions = versions

    def __len__(self) -> int:
        return len(self._versions)

    @overload
    def __getitem__(self, index: int) -> ParsedSchema: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[ParsedSchema]: ...
    def __getitem__(self, index: int | slice) -> ParsedSchema | Sequence[ParsedSchema]:
        if isinstance(index, slice):
            return [_parsed(v) for v in self._versions[index]]
        return _parsed(self._versions[index])


@functools.lru_cache(maxsize=64)
def _parse(kind: str, text: str) -> ParsedSchema:
    return schema_rules.parse(kind, text)


def _parsed(version: SchemaVersion) -> ParsedSchema:
    """A stored version as the rules take it (parsed again: cached, the latest few)."""
    return _parse(version.type, version.schema)


def _document(generation: int, topics: Mapping[str, TopicSchemas]) -> dict[str, Any]:
    return {
        "generation": generation,
        "topics": {
            name: {
                "incarnation": entry.incarnation,
                **{s: _subject_json(entry.subject(s)) for s in SUBJECTS},
            }
            for name, entry in topics.items()
        },
    }


def _subject_json(subject: Subject | None) -> dict[str, Any] | None:
    if subject is None:
        return None
    return {
        "compatibility": subject.compatibility,
        "versions": [
            {
                "version": v.version, "type": v.type, "schema": v.schema,
                "fingerprint": v.fingerprint, "created_ms": v.created_ms,
            }
            for v in subject.versions
        ],
    }  # fmt: skip


def _parse_document(document: Any, where: str) -> tuple[int, dict[str, TopicSchemas]]:
    try:
        topics = {
            str(name): TopicSchemas(
                int(entry["incarnation"]),
                *(_parse_subject(entry.get(s)) for s in SUBJECTS),
            )
            for name, entry in document["topics"].items()
        }
        return int(document["generation"]), topics
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        raise CorruptionError(f"schemas document has an unexpected shape: {exc!r}", where) from exc


def _parse_subject(data: Any) -> Subject | None:
    if data is None:
        return None
    rule = str(data["compatibility"])
    if rule not in schema_rules.RULES:
        raise ValueError(f"unknown compatibility {rule!r}")
    versions = tuple(
        SchemaVersion(
            int(v["version"]), str(v["type"]), str(v["schema"]), str(v["fingerprint"]),
            int(v["created_ms"]),
        )
        for v in data["versions"]
    )  # fmt: skip
    if [v.version for v in versions] != list(range(1, len(versions) + 1)):
        raise ValueError("versions are not 1, 2, 3 ... in order")
    return Subject(rule, versions)
