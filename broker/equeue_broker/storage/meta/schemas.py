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
                                     "next_version": 2,
                                     "versions": [{"version": 1, "type": "AVRO",
                                                   "fingerprint": "c1162c0bf9cff7e6",
                                                   "created_ms": 1764200000000,
                                                   "schema": "<normalized text>"}]},
                           "key": null}}}

Version numbers are never used twice in one topic incarnation: records carry
their version in a header, so a number given to another schema would make old
records name the wrong writer schema. ``next_version`` (the high-water mark)
survives ``delete``: a deleted subject stays as a tombstone (no versions, its
``next_version``) and the next registration continues from it. Only a topic's
deletion (a new incarnation, an empty log) starts again at 1.

Every change is saved before memory changes: a save that fails (disk full)
changes nothing. When neither copy of the file is intact the store starts
without schemas and says so (``lost``, damage.py): records keep their version
headers, and an operator restores the file from a replica or a backup
(docs/schemas.md, operations).

Concurrency: readers never lock (the state is one immutable pair replaced
whole). Writers take ``_lock`` only to re-check that the subject is unchanged
and to save and swap; the compatibility check, which can parse and compare
many versions, runs before it, against a snapshot.
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
    floor: int = 1
    """The first number ``versions`` may use: after a delete, the numbers below it
    were given before and are never given again."""

    @property
    def latest(self) -> SchemaVersion | None:
        return self.versions[-1] if self.versions else None

    @property
    def latest_version(self) -> int:
        """The latest version's number; 0 when the subject has none."""
        return self.versions[-1].version if self.versions else 0

    @property
    def next_version(self) -> int:
        """The number the next registration gets (never one used before)."""
        return self.versions[-1].version + 1 if self.versions else self.floor

    @property
    def first_version(self) -> int:
        return self.versions[0].version if self.versions else 0

    def version(self, number: int) -> SchemaVersion | None:
        """Version ``number`` (versions are consecutive, in order)."""
        index = number - self.first_version
        return self.versions[index] if self.versions and 0 <= index < len(self.versions) else None

    def tombstone(self) -> Subject | None:
        """What a delete leaves: the numbering only (None when nothing was numbered)."""
        following = self.next_version
        return Subject(DEFAULT_RULE, (), following) if following > 1 else None


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


MAX_TOPIC_BYTES = MAX_FILE_BYTES // 4
"""One topic's schema texts (value and key, every version) at most: a topic with
many large versions must not fill the shared file and block every other topic's
changes (and this bounds a GetSchema history reply)."""
MAX_ATTEMPTS = 5
"""Registrations of one subject that raced another writer are checked again at
most this many times before the caller is asked to retry."""
DRY_RUN_PROBLEMS = 1000
"""A dry run lists this many problems at most (the reply must stay small)."""
REFUSAL_PROBLEMS = 20
"""A refusal stops checking after this many problems (its message shows fewer)."""


class SchemaStore:
    """The schemas of one data directory; thread-safe. Readers take no lock;
    writers hold ``_lock`` only across the re-check, the save and the swap."""

    def __init__(self, path: Path, config: StorageConfig) -> None:
        self.path = path
        self.max_schema_bytes = config.max_schema_bytes
        self.max_schema_versions = config.max_schema_versions
        self._lock = threading.Lock()
        self._state: tuple[int, dict[str, TopicSchemas]] = (0, {})
        """(generation, topics): replaced whole, never changed in place."""
        self.lost: str | None = None
        """Set when the file had no intact copy at open (damage.py)."""
        self._load()

    @property
    def _generation(self) -> int:
        return self._state[0]

    @property
    def _topics(self) -> dict[str, TopicSchemas]:
        return self._state[1]

    @property
    def generation(self) -> int:
        """Counts changes (saved with them): replication resends the document after one."""
        return self._generation

    # -- reading (no lock: the state is replaced whole) -------------------------------

    def get(self, topic: str, subject: str, incarnation: int = 0) -> Subject | None:
        """The topic's subject (a deleted one: no versions); None if it has none
        (or they belong to another incarnation than a non-zero ``incarnation``)."""
        entry = self._topics.get(topic)
        if entry is None or (incarnation and entry.incarnation != incarnation):
            return None
        return entry.subject(subject)

    def topics(self) -> dict[str, TopicSchemas]:
        return dict(self._topics)

    def subject_count(self) -> int:
        """Subjects with at least one version (BrokerStats.schema_subjects)."""
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
        first). A schema whose normalized text equals an existing version's
        returns that version. ``version``: 0 for the next; else it must be the
        next, or the existing equal one. Raises SchemaIncompatible (unless
        ``dry_run``), SchemaVersionConflict, LimitExceeded.

        The check runs without the lock, against a snapshot of the subject; the
        save happens only if the subject is still that snapshot (else checked again)."""
        size = len(parsed.text.encode())
        if size > self.max_schema_bytes:
            raise LimitExceeded(
                f"the schema for {_label(topic, subject)} is {size} bytes (normalized), "
                f"more than max_schema_bytes={self.max_schema_bytes}"
            )
        for _attempt in range(MAX_ATTEMPTS):
            stored = _entry(self._topics, topic, incarnation).subject(subject)
            done = self._register_on(
                topic, subject, parsed, stored,
                version=version, compatibility=compatibility, dry_run=dry_run,
            )  # fmt: skip
            if done.created is None:
                return done.registration
            if self._swap(topic, incarnation, subject, stored, done.registration.subject):
                return done.registration
        raise PreconditionFailed(
            f"{_label(topic, subject)} kept changing while its schema was checked: try again"
        )

    def _register_on(
        self, topic: str, subject: str, parsed: ParsedSchema, stored: Subject | None, *,
        version: int, compatibility: str | None, dry_run: bool,
    ) -> _Outcome:  # fmt: skip
        """What registering does to ``stored`` (no lock: a snapshot)."""
        current = stored if stored is not None else Subject(DEFAULT_RULE)
        rule = compatibility or current.compatibility
        if rule != current.compatibility:
            current = replace(current, compatibility=rule)
        # Identity is the normalized text: a default or an alias changes how a
        # reader resolves data, so it makes a new version (the fingerprint would not).
        same = next((v for v in current.versions if v.schema == parsed.text), None)
        self._check_version(topic, subject, current, same, version)
        if same is not None:
            changed = not dry_run and current != stored  # a new rule only
            return _Outcome(Registration(same, False, current), True if changed else None)
        limit = DRY_RUN_PROBLEMS if dry_run else REFUSAL_PROBLEMS
        try:
            problems = schema_rules.check(rule, parsed, _History(current.versions), limit=limit)
        except schema_rules.SchemaError as exc:
            # A version an older release accepted that this one refuses (a record
            # that never ends, say), or a repaired file: it cannot be compared with.
            raise PreconditionFailed(
                f"{_label(topic, subject)}: a stored version is not a usable schema ({exc}); "
                "register with the rule NONE (nothing is compared), or delete the subject"
            ) from None
        if problems and not dry_run:
            raise SchemaIncompatible(_refusal(topic, subject, rule, problems, limit), problems)
        if len(current.versions) >= self.max_schema_versions:
            raise LimitExceeded(
                f"{_label(topic, subject)} has {len(current.versions)} versions, "
                f"max_schema_versions={self.max_schema_versions}: version numbers are never "
                "given twice, so raise max_schema_versions (or delete and recreate the topic)"
            )
        self._check_topic_bytes(topic, subject, current, parsed)
        new = SchemaVersion(
            version or current.next_version, parsed.type, parsed.text, parsed.fingerprint,
            int(time.time() * 1000),
        )  # fmt: skip
        after = replace(current, versions=(*current.versions, new))
        if dry_run:
            return _Outcome(Registration(new, False, after, tuple(problems)), None)
        return _Outcome(Registration(new, True, after), True)

    def _check_topic_bytes(
        self, topic: str, subject: str, current: Subject, parsed: ParsedSchema
    ) -> None:
        entry = self._topics.get(topic)
        other = entry.subject("key" if subject == "value" else "value") if entry else None
        held = sum(len(v.schema) for s in (current, other) if s for v in s.versions)
        if held + len(parsed.text) > MAX_TOPIC_BYTES:
            raise LimitExceeded(
                f"topic {topic}'s schemas would be {held + len(parsed.text)} bytes, more than "
                f"{MAX_TOPIC_BYTES} (a topic's share of schemas.json): use the rule NONE less "
                "often, or delete and recreate the topic to start a new history"
            )

    def _swap(
        self, topic: str, incarnation: int, subject: str, before: Subject | None, after: Subject
    ) -> bool:
        """Save ``after`` as the subject if it is still ``before``; False if it changed."""
        with self._lock:
            self._check_incarnation(topic, incarnation)
            entry = _entry(self._topics, topic, incarnation)
            if entry.subject(subject) is not before:
                return False
            self._save_subject(topic, entry, subject, after)
            return True

    def _check_version(
        self, topic: str, subject: str, current: Subject, same: SchemaVersion | None, asked: int
    ) -> None:
        if not asked:
            return
        following = current.next_version
        if same is not None and same.version == asked:
            return
        held = current.version(asked)
        if same is not None:
            why = f"this schema is version {same.version} already"
        elif held is not None:
            why = f"version {asked} exists with another schema (fingerprint {held.fingerprint})"
        elif asked < following:
            why = f"version {asked} was given before (to a schema since deleted)"
        elif asked > following and current.versions:
            why = f"the next version is {following}"
        else:
            # The next, or a higher number for a subject without versions (another
            # group's numbering after a delete, a restore): no number is given twice.
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
            self._check_incarnation(topic, incarnation)
            entry = _entry(self._topics, topic, incarnation)
            current = replace(entry.subject(subject) or Subject(DEFAULT_RULE), compatibility=rule)
            if current != entry.subject(subject):
                self._save_subject(topic, entry, subject, current)
            return current

    def delete(self, topic: str, subjects: tuple[str, ...]) -> bool:
        """Forget these subjects of the topic (each keeps its numbering as a
        tombstone: versions are never given twice); False if it had none of them."""
        with self._lock:
            entry = self._topics.get(topic)
            if entry is None:
                return False
            kept = entry
            for name in subjects:
                held = entry.subject(name)
                kept = kept.with_subject(name, held.tombstone() if held is not None else None)
            if kept == entry:
                return False
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
        """The file's document (what a master sends its replicas); no lock."""
        generation, topics = self._state
        return _document(generation, topics)

    def adopt(self, document: Any) -> bool:
        """Make the schemas the master's ``document``; True if anything changed.
        ``CorruptionError`` naming the problem if it has the wrong shape."""
        generation, topics = _parse_document(document, "replicated schemas")
        with self._lock:
            if generation == self._generation and topics == self._topics:
                return False
            self._save(generation, topics)
            self._state = (generation, topics)
            return True

    # -- internals (lock held) -------------------------------------------------------

    def _check_incarnation(self, topic: str, incarnation: int) -> None:
        """Refuse to replace another incarnation's schemas: the caller read the
        topic's incarnation before this lock, and the topic may have been deleted
        and created again (with schemas) since. A stale entry only lives between a
        topic's deletion and ``forget_topic`` (or until the next open's ``retain``)."""
        held = self._topics.get(topic)
        if held is not None and held.incarnation != incarnation and (held.value or held.key):
            raise PreconditionFailed(
                f"topic {topic} was deleted or created again while its schema was being "
                "changed: try again"
            )

    def _save_subject(self, topic: str, entry: TopicSchemas, subject: str, value: Subject) -> None:
        changed = entry.with_subject(subject, value)
        self._commit({**self._topics, topic: changed})

    def _commit(self, topics: dict[str, TopicSchemas]) -> None:
        generation = self._generation + 1
        self._save(generation, topics)
        self._state = (generation, topics)

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
            self._state = _parse_document(document, str(self.path))
        except CorruptionError as exc:
            kept = keep_damaged(self.path)
            self.lost = (
                f"schemas.json: no intact copy ({exc}): every topic's schemas are lost; "
                "restore schemas.json from a replica or a backup (docs/schemas.md), or "
                "set them again with equeue schema set"
            )
            log.error("SCHEMAS LOST: %s; damaged copies kept as %s", self.lost, kept)
            # Saved at once, in both copies: a later open must not pick a damaged one.
            self._state = (self._generation + 1, {})
            self._save(self._generation, {})
            self._save(self._generation, {})


def _entry(topics: Mapping[str, TopicSchemas], topic: str, incarnation: int) -> TopicSchemas:
    """The topic's entry; a fresh one when it has none or an older incarnation's."""
    entry = topics.get(topic)
    if entry is None or entry.incarnation != incarnation:
        return TopicSchemas(incarnation)
    return entry


@dataclass(frozen=True)
class _Outcome:
    registration: Registration
    created: bool | None
    """True: save the registration's subject; None: nothing to save."""


MAX_MESSAGE = 900
"""A refusal's message at most: it travels as a gRPC status message (the server
cuts those at 1 KiB). Whole problem lines only; a dry run returns up to
DRY_RUN_PROBLEMS."""


def _refusal(topic: str, subject: str, rule: str, problems: list[str], limit: int) -> str:
    """The incompatibilities, one per line after a first line naming the subject."""
    more = "+" if len(problems) >= limit else ""
    count = f"{len(problems)}{more} problem{'' if len(problems) == 1 else 's'}"
    lines = [f"the schema for {_label(topic, subject)} is not {rule} compatible ({count}):"]
    size = len(lines[0])
    for shown, problem in enumerate(problems):
        if size + 1 + len(problem) > MAX_MESSAGE - 80 and shown:
            lines.append(f"... and {len(problems) - shown}{more} more (a dry run lists them)")
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


@functools.lru_cache(maxsize=256)
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
        "next_version": subject.next_version,
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
    for v in versions:
        _check_stored(v)
    numbers = [v.version for v in versions]
    first = numbers[0] if numbers else 1
    if first < 1 or numbers != list(range(first, first + len(numbers))):
        raise ValueError(f"versions {numbers[:5]} ... are not consecutive from 1 or more")
    # Files written before next_version existed: the versions say it.
    following = int(data.get("next_version", first + len(numbers)))
    if following != first + len(numbers) and (numbers or following < 1):
        raise ValueError(f"next_version {following} does not follow versions {numbers[-1:]}")
    return Subject(rule, versions, first if numbers else following)


def _check_stored(version: SchemaVersion) -> None:
    """Cheap checks of a stored version (every open): a known type and normalized
    JSON text. ``verify`` (check_versions) parses each one fully."""
    if version.type not in schema_rules.TYPES:
        raise ValueError(f"version {version.version} has unknown type {version.type!r}")
    try:
        normalized = schema_rules.normalize(version.schema)
    except schema_rules.SchemaError as exc:
        raise ValueError(f"version {version.version}: {exc}") from None
    if normalized != version.schema:
        raise ValueError(f"version {version.version}'s text is not normalized JSON")


def check_versions(document: Any) -> list[str]:
    """Every problem of a schemas document (verify): its shape, and each version
    parsed as its type with the fingerprint it claims."""
    try:
        _generation, topics = _parse_document(document, "schemas.json")
    except CorruptionError as exc:
        return [str(exc)]
    problems: list[str] = []
    for name, entry in sorted(topics.items()):
        for subject_name in SUBJECTS:
            subject = entry.subject(subject_name)
            for v in subject.versions if subject is not None else ():
                where = f"schemas.json: {_label(name, subject_name)} version {v.version}"
                try:
                    parsed = schema_rules.parse(v.type, v.schema)
                except schema_rules.SchemaError as exc:
                    problems.append(f"{where} does not parse: {exc}")
                    continue
                if parsed.fingerprint != v.fingerprint:
                    problems.append(
                        f"{where}: fingerprint {v.fingerprint} stored,"
                        f" {parsed.fingerprint} computed"
                    )
    return problems
