"""schemas.json (storage/meta/schemas.py) on a real store: history, limits, damage,
topic deletion and recreation, replication's document."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from equeue_broker.storage.errors import LimitExceeded, PreconditionFailed
from equeue_broker.storage.meta.atomic_file import save_json
from equeue_broker.storage.meta.schemas import (
    REFUSAL_PROBLEMS,
    SchemaIncompatible,
    SchemaVersionConflict,
)
from equeue_broker.storage.store import Store
from equeue_broker.storage.verify import verify
from equeue_proto.schema_rules import ParsedSchema, parse
from tests.conftest import MakeConfig
from tests.support.faults import read_document, write_at
from tests.support.sent import OpenStore, reopen

TOPIC = "orders"
ID = {"name": "id", "type": "long"}
NOTE = {"name": "note", "type": ["null", "string"], "default": None}
QTY = {"name": "qty", "type": "int"}
QTY_DEFAULT = {"name": "qty", "type": "int", "default": 0}


def avro(*fields: dict[str, Any]) -> ParsedSchema:
    return parse("AVRO", json.dumps({"type": "record", "name": "Order", "fields": list(fields)}))


def incarnation(store: Store, topic: str = TOPIC) -> int:
    return store.topic_admin.describe(topic).incarnation


def with_two_versions(open_store: OpenStore) -> Store:
    store = open_store()
    store.create_topic(TOPIC, 1)
    inc = incarnation(store)
    assert store.schemas.register(TOPIC, inc, "value", avro(ID)).created
    assert store.schemas.register(TOPIC, inc, "value", avro(ID, NOTE)).version.version == 2
    return store


def test_register_history_and_reload(open_store: OpenStore) -> None:
    store = with_two_versions(open_store)
    generation = store.schemas.generation
    store = reopen(open_store, store)
    subject = store.schemas.get(TOPIC, "value")
    assert subject is not None and subject.compatibility == "BACKWARD"
    assert [v.version for v in subject.versions] == [1, 2]
    assert subject.versions[1].schema == avro(ID, NOTE).text
    assert subject.versions[1].fingerprint == avro(ID, NOTE).fingerprint
    assert store.schemas.get(TOPIC, "key") is None
    assert store.schemas.generation == generation
    assert store.schemas.subject_count() == 1
    document = read_document(store.config.data_dir / "schemas.json")
    assert document["generation"] == generation
    assert document["topics"][TOPIC]["incarnation"] == incarnation(store)


def test_equal_schema_returns_existing_version(open_store: OpenStore) -> None:
    store = with_two_versions(open_store)
    generation = store.schemas.generation
    again = store.schemas.register(TOPIC, incarnation(store), "value", avro(ID))
    assert (again.version.version, again.created) == (1, False)
    assert store.schemas.generation == generation  # nothing saved


def test_incompatible_refused_with_every_problem(open_store: OpenStore) -> None:
    store = with_two_versions(open_store)
    size = {"name": "size", "type": "int"}
    with pytest.raises(SchemaIncompatible) as caught:
        store.schemas.register(TOPIC, incarnation(store), "value", avro(ID, NOTE, QTY, size))
    message = str(caught.value)
    assert "is not BACKWARD compatible (2 problems)" in message
    assert "version 2: /fields/2 (qty)" in message and "/fields/3 (size)" in message
    assert len(caught.value.problems) == 2
    # dry run: the problems, nothing saved
    dry = store.schemas.register(
        TOPIC, incarnation(store), "value", avro(ID, NOTE, QTY), dry_run=True
    )
    assert not dry.created and len(dry.problems) == 1
    # the rule NONE, given with the schema, lets it in
    done = store.schemas.register(
        TOPIC, incarnation(store), "value", avro(ID, NOTE, QTY), compatibility="NONE"
    )
    assert (done.version.version, done.subject.compatibility) == (3, "NONE")


def test_many_problems_fit_a_status_message(open_store: OpenStore) -> None:
    store = with_two_versions(open_store)
    fields = [{"name": f"field_number_{i:02d}", "type": "int"} for i in range(30)]
    with pytest.raises(SchemaIncompatible) as caught:
        store.schemas.register(TOPIC, incarnation(store), "value", avro(ID, NOTE, *fields))
    message = str(caught.value)
    assert len(message) <= 900 and len(caught.value.problems) == REFUSAL_PROBLEMS
    assert "(20+ problems)" in message and "(a dry run lists them)" in message.splitlines()[-1]
    assert all(line.startswith("not BACKWARD") for line in message.splitlines()[1:-1])


def test_explicit_versions(open_store: OpenStore) -> None:
    store = with_two_versions(open_store)
    inc = incarnation(store)
    same = store.schemas.register(TOPIC, inc, "value", avro(ID, NOTE), version=2)
    assert (same.version.version, same.created) == (2, False)
    with pytest.raises(SchemaVersionConflict, match="version 1 exists with another schema"):
        store.schemas.register(
            TOPIC, inc, "value", avro(ID, NOTE, {**QTY, "default": 0}), version=1
        )
    with pytest.raises(SchemaVersionConflict, match="the next version is 3"):
        store.schemas.register(
            TOPIC, inc, "value", avro(ID, NOTE, {**QTY, "default": 0}), version=5
        )
    with pytest.raises(SchemaVersionConflict, match="is version 1 already"):
        store.schemas.register(TOPIC, inc, "value", avro(ID), version=3)
    made = store.schemas.register(
        TOPIC, inc, "value", avro(ID, NOTE, {**QTY, "default": 0}), version=3
    )
    assert made.created and made.version.version == 3


def test_limits(open_store: OpenStore, make_config: MakeConfig) -> None:
    store = open_store(make_config(max_schema_bytes=200, max_schema_versions=2))
    store.create_topic(TOPIC, 1)
    inc = incarnation(store)
    store.schemas.register(TOPIC, inc, "value", avro(ID))
    store.schemas.register(TOPIC, inc, "value", avro(ID, NOTE))
    extra = {"name": "x", "type": "int", "default": 0}
    with pytest.raises(LimitExceeded, match="max_schema_versions=2"):
        store.schemas.register(TOPIC, inc, "value", avro(ID, NOTE, extra))
    long_doc = {"name": "y", "type": "int", "default": 0, "doc": "d" * 200}
    with pytest.raises(LimitExceeded, match="max_schema_bytes=200"):
        store.schemas.register(TOPIC, inc, "key", avro(ID, long_doc))


def test_topic_delete_forgets_and_recreated_topic_starts_empty(open_store: OpenStore) -> None:
    store = with_two_versions(open_store)
    store.topic_admin.delete_topic(TOPIC)
    assert store.schemas.get(TOPIC, "value") is None
    store.create_topic(TOPIC, 1)
    assert store.schemas.get(TOPIC, "value", incarnation(store)) is None
    store = reopen(open_store, store)
    assert store.schemas.topics() == {}


def test_open_drops_schemas_of_a_recreated_topic(open_store: OpenStore) -> None:
    """A crash between the topics' save and forget_topic: the entry of the old
    incarnation is dropped at the next open."""
    store = with_two_versions(open_store)
    stale = store.schemas.document()
    store.topic_admin.delete_topic(TOPIC)
    store.create_topic(TOPIC, 1)
    assert store.schemas.adopt(stale)  # as if forget_topic never ran
    store = reopen(open_store, store)
    assert store.schemas.topics() == {}
    assert store.schemas.get(TOPIC, "value") is None


def test_main_copy_damaged_uses_backup(open_store: OpenStore) -> None:
    store = with_two_versions(open_store)
    store.close()
    path = store.config.data_dir / "schemas.json"
    write_at(path, 30, b"X")
    store = open_store(store.config)
    subject = store.schemas.get(TOPIC, "value")
    # The backup is the copy before the last save: version 1 only.
    assert subject is not None and [v.version for v in subject.versions] == [1]
    assert store.damage().metadata() == []


def test_both_copies_damaged_start_empty_and_say_so(open_store: OpenStore) -> None:
    store = with_two_versions(open_store)
    store.close()
    data = store.config.data_dir
    write_at(data / "schemas.json", 30, b"X")
    write_at(data / "schemas.json.bak", 30, b"X")
    assert any("schemas.json" in str(f.path) for f in verify(data))
    store = open_store(store.config)
    assert store.schemas.topics() == {}
    (line,) = store.damage().metadata()
    assert line.startswith("schemas.json: no intact copy")
    assert "set them again with equeue schema set" in line
    assert (data / "schemas.json.damaged").exists()
    # Saved at once: a new registration works and the next open is clean.
    store.schemas.register(TOPIC, incarnation(store), "value", avro(ID))
    store = reopen(open_store, store)
    assert store.damage().metadata() == []
    assert store.schemas.get(TOPIC, "value") is not None


def test_compatibility_and_delete(open_store: OpenStore) -> None:
    store = with_two_versions(open_store)
    inc = incarnation(store)
    assert store.schemas.set_compatibility(TOPIC, inc, "key", "FULL").versions == ()
    assert store.schemas.subject_count() == 1  # a rule without versions is no subject
    assert store.schemas.delete(TOPIC, ("value",))
    deleted = store.schemas.get(TOPIC, "value")  # a tombstone: the numbering only
    assert deleted is not None and deleted.versions == () and deleted.next_version == 3
    assert store.schemas.get(TOPIC, "key") is not None
    assert store.schemas.delete(TOPIC, ("value", "key"))
    assert not store.schemas.delete(TOPIC, ("value", "key"))
    assert store.schemas.get(TOPIC, "key") is None  # a rule without versions: nothing kept
    assert store.schemas.subject_count() == 0


def test_versions_are_never_given_twice(open_store: OpenStore) -> None:
    """Review finding 2: records keep their version headers, so a number once given
    stays that schema's: delete + set continues the numbering, across a restart."""
    store = with_two_versions(open_store)
    assert store.schemas.delete(TOPIC, ("value",))
    store = reopen(open_store, store)
    other = parse("AVRO", json.dumps({"type": "record", "name": "Other", "fields": [QTY]}))
    done = store.schemas.register(TOPIC, incarnation(store), "value", other)
    assert (done.created, done.version.version, done.subject.latest_version) == (True, 3, 3)
    subject = store.schemas.get(TOPIC, "value")
    assert subject is not None and subject.version(1) is None and subject.version(3) is not None
    with pytest.raises(SchemaVersionConflict, match="version 1 was given before"):
        store.schemas.register(TOPIC, incarnation(store), "value", avro(ID), version=1)
    document = read_document(store.config.data_dir / "schemas.json")
    assert document["topics"][TOPIC]["value"]["next_version"] == 4
    # A new incarnation of the topic (an empty log) starts again at 1.
    store.topic_admin.delete_topic(TOPIC)
    store.create_topic(TOPIC, 1)
    assert store.schemas.register(TOPIC, incarnation(store), "value", other).version.version == 1


def test_identity_is_the_full_text_not_the_canonical_form(open_store: OpenStore) -> None:
    """Review finding 3: a default or an alias is a new version (the Parsing
    Canonical Form, and so the fingerprint, drops them)."""
    store = with_two_versions(open_store)
    inc = incarnation(store)
    with_default = avro({**ID, "default": 0}, NOTE)
    assert with_default.fingerprint == avro(ID, NOTE).fingerprint  # reported only
    done = store.schemas.register(TOPIC, inc, "value", with_default)
    assert (done.created, done.version.version) == (True, 3)
    aliased = avro({**ID, "default": 0, "aliases": ["ident"]}, NOTE)
    assert store.schemas.register(TOPIC, inc, "value", aliased).version.version == 4
    again = store.schemas.register(TOPIC, inc, "value", aliased)
    assert (again.created, again.version.version) == (False, 4)


def test_adopt_takes_the_masters_document(open_store: OpenStore, make_config: MakeConfig) -> None:
    master = with_two_versions(open_store)
    document = master.schemas.document()
    master.close()
    replica = open_store(make_config(data_dir=master.config.data_dir.parent / "replica"))
    assert replica.schemas.adopt(document)
    assert not replica.schemas.adopt(document)
    assert replica.schemas.generation == document["generation"]
    assert replica.schemas.document() == document
    with pytest.raises(Exception, match="unexpected shape"):
        replica.schemas.adopt({"generation": 1, "topics": {"t": {}}})


def test_verify_checks_the_schemas_content(open_store: OpenStore) -> None:
    """Review finding 11: a checksummed file whose versions do not parse (or claim
    another fingerprint) is listed by verify, and not served at open."""
    store = with_two_versions(open_store)
    store.close()
    data = store.config.data_dir
    assert verify(data) == []
    path = data / "schemas.json"
    document = read_document(path)
    document["topics"][TOPIC]["value"]["versions"][0]["fingerprint"] = "0000000000000000"
    document["topics"][TOPIC]["value"]["versions"][1]["schema"] = '"nosuchtype"'
    save_json(path, document)
    save_json(path, document)
    lines = [f.what for f in verify(data)]
    assert any("version 1: fingerprint 0000000000000000 stored" in line for line in lines)
    assert any("version 2 does not parse" in line for line in lines)
    document["topics"][TOPIC]["value"]["versions"][1]["type"] = "PROTO"
    save_json(path, document)
    save_json(path, document)
    store = open_store(store.config)
    assert store.schemas.get(TOPIC, "value") is None  # not served
    (line,) = store.damage().metadata()
    assert "unknown type 'PROTO'" in line and "restore schemas.json" in line


def test_reads_and_dry_runs_never_wait_for_the_writers_lock(open_store: OpenStore) -> None:
    """Review finding 5: the store's lock is held only across a writer's re-check,
    save and swap; reads and the compatibility check (a dry run) do not take it."""
    store = with_two_versions(open_store)
    inc = incarnation(store)
    results: list[object] = []

    def work() -> None:
        results.append(store.schemas.get(TOPIC, "value"))
        results.append(store.schemas.subject_count())
        results.append(store.schemas.document()["generation"])
        dry = store.schemas.register(TOPIC, inc, "value", avro(ID, NOTE, QTY), dry_run=True)
        results.append(dry.problems)

    with store.schemas._lock:  # a writer saving a large file, say
        worker = threading.Thread(target=work)
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive() and len(results) == 4
    assert results[1] == 1 and results[3]


def test_a_registration_that_raced_another_is_checked_again(open_store: OpenStore) -> None:
    """The check runs against a snapshot: a version registered meanwhile is seen by
    the second attempt (the subject changed, so the first result is not saved)."""
    store = with_two_versions(open_store)
    inc = incarnation(store)
    schemas = store.schemas
    swap = schemas._swap
    raced: list[int] = []

    def racing_swap(*args: Any) -> bool:
        if not raced:  # another writer gets in first, once
            raced.append(0)
            done = schemas.register(TOPIC, inc, "value", avro(ID, NOTE, QTY_DEFAULT))
            raced.append(done.version.version)
        return swap(*args)

    schemas._swap = racing_swap  # type: ignore[method-assign,assignment]
    other = avro(ID, NOTE, {"name": "size", "type": "int", "default": 1})
    done = schemas.register(TOPIC, inc, "value", other)
    assert raced == [0, 3] and done.version.version == 4
    subject = schemas.get(TOPIC, "value")
    assert subject is not None and [v.version for v in subject.versions] == [1, 2, 3, 4]


def test_another_incarnations_schemas_are_never_replaced(open_store: OpenStore) -> None:
    """Review finding 14: a caller holding an old incarnation (the topic deleted and
    created again, with schemas, since it looked) is refused, not allowed to wipe them."""
    store = with_two_versions(open_store)
    old = incarnation(store)
    store.topic_admin.delete_topic(TOPIC)
    store.create_topic(TOPIC, 1)
    assert store.schemas.register(TOPIC, incarnation(store), "value", avro(ID)).created
    with pytest.raises(PreconditionFailed, match="created again"):
        store.schemas.register(TOPIC, old, "value", avro(ID, NOTE))
    with pytest.raises(PreconditionFailed, match="created again"):
        store.schemas.set_compatibility(TOPIC, old, "value", "NONE")
    subject = store.schemas.get(TOPIC, "value", incarnation(store))
    assert subject is not None and [v.version for v in subject.versions] == [1]


def test_one_topic_cannot_fill_the_shared_file(open_store: OpenStore) -> None:
    """Review finding 13: a topic's schemas have a share of schemas.json, so other
    topics can still change theirs."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    store.create_topic("other", 1)
    inc = incarnation(store)
    filler = [{"name": f"f{i:05d}_" + "x" * 40, "type": "string"} for i in range(3000)]
    version = 0
    with pytest.raises(LimitExceeded, match=r"a topic's share of schemas\.json"):
        while True:
            version += 1
            doc = {"type": "record", "name": f"R{version}", "fields": filler}
            store.schemas.register(
                TOPIC, inc, "value", parse("AVRO", json.dumps(doc)), compatibility="NONE"
            )
    assert version > 2
    assert store.schemas.register("other", incarnation(store, "other"), "value", avro(ID)).created


def test_a_stored_version_this_release_refuses_is_a_clear_refusal(open_store: OpenStore) -> None:
    """A version an older release accepted (a record that never ends) cannot be
    compared with: FAILED_PRECONDITION saying what to do, never INTERNAL."""
    store = with_two_versions(open_store)
    store.close()
    path = store.config.data_dir / "schemas.json"
    document = read_document(path)
    endless = {"type": "record", "name": "Order", "fields": [{"name": "n", "type": "Order"}]}
    text = json.dumps(endless, sort_keys=True, separators=(",", ":"))
    document["topics"][TOPIC]["value"]["versions"][1]["schema"] = text
    save_json(path, document)
    save_json(path, document)
    store = open_store(store.config)
    inc = incarnation(store)
    with pytest.raises(PreconditionFailed, match=r"not a usable schema .* rule NONE"):
        store.schemas.register(TOPIC, inc, "value", avro(ID, NOTE, QTY_DEFAULT))
    done = store.schemas.register(TOPIC, inc, "value", avro(ID, QTY_DEFAULT), compatibility="NONE")
    assert done.version.version == 3
