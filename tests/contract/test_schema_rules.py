"""equeue_proto.schema_rules: parsing, fingerprints and Confluent's compatibility rules."""

from __future__ import annotations

import json
from typing import Any

import pytest

from equeue_proto import schema_rules
from equeue_proto.schema_rules import RULES, ParsedSchema, SchemaError, check, parse

# --- Avro --------------------------------------------------------------------------------


def _record(*fields: dict[str, Any]) -> ParsedSchema:
    return parse("AVRO", json.dumps({"type": "record", "name": "Order", "fields": list(fields)}))


ID = {"name": "id", "type": "long"}
NOTE = {"name": "note", "type": ["null", "string"], "default": None}
QTY = {"name": "qty", "type": "int"}
QTY_DEFAULT = {"name": "qty", "type": "int", "default": 0}


def _enum(*symbols: str) -> ParsedSchema:
    kind = {"type": "enum", "name": "Colour", "symbols": list(symbols)}
    return _record(ID, {"name": "colour", "type": kind})


# (change, old, new): old is version 1, new the candidate.
AVRO_CHANGES: dict[str, tuple[ParsedSchema, ParsedSchema]] = {
    "add field with default": (_record(ID), _record(ID, NOTE)),
    "add field without default": (_record(ID), _record(ID, QTY)),
    "remove field with default": (_record(ID, QTY_DEFAULT), _record(ID)),
    "remove field without default": (_record(ID, QTY), _record(ID)),
    "int to long": (_record(ID, QTY), _record(ID, {"name": "qty", "type": "long"})),
    "long to int": (_record(ID), _record({"name": "id", "type": "int"})),
    "enum symbol added": (_enum("RED"), _enum("RED", "BLUE")),
    "enum symbol removed": (_enum("RED", "BLUE"), _enum("RED")),
    "union branch added": (
        _record(ID, NOTE),
        _record(ID, {"name": "note", "type": ["null", "string", "int"], "default": None}),
    ),
    "union branch removed": (
        _record(ID, {"name": "note", "type": ["null", "string", "int"], "default": None}),
        _record(ID, NOTE),
    ),
    "rename with alias": (
        _record(ID, QTY),
        _record(ID, {"name": "amount", "type": "int", "aliases": ["qty"]}),
    ),
}

# Confluent: BACKWARD = the new schema reads the old data; FORWARD = the old schema reads
# the new data; FULL = both.
AVRO_EXPECTED: dict[str, tuple[bool, bool]] = {  # (backward ok, forward ok)
    "add field with default": (True, True),
    "add field without default": (False, True),
    "remove field with default": (True, True),
    "remove field without default": (True, False),
    "int to long": (True, False),
    "long to int": (False, True),
    "enum symbol added": (True, False),
    "enum symbol removed": (False, True),
    "union branch added": (True, False),
    "union branch removed": (False, True),
    "rename with alias": (True, False),
}


def _expected(rule: str, backward: bool, forward: bool) -> bool:
    base = rule.removesuffix("_TRANSITIVE")
    return {
        "NONE": True,
        "BACKWARD": backward,
        "FORWARD": forward,
        "FULL": backward and forward,
    }[base]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("change", sorted(AVRO_CHANGES))
def test_avro_rule_table(rule: str, change: str) -> None:
    old, new = AVRO_CHANGES[change]
    backward, forward = AVRO_EXPECTED[change]
    problems = check(rule, new, [old])
    assert (not problems) == _expected(rule, backward, forward), problems
    for problem in problems:
        assert problem.startswith(f"not {rule} compatible with version 1: ")


def test_avro_problem_names_version_place_and_field() -> None:
    v1, v2 = _record(ID), _record(ID, NOTE)
    v3 = _record(ID, NOTE, QTY, {"name": "size", "type": "int"})
    assert check("BACKWARD", v2, [v1]) == []
    problems = check("BACKWARD", v3, [v1, v2])
    assert problems == [
        "not BACKWARD compatible with version 2: /fields/2 (qty): reader field has no"
        " default, so it cannot read data written without it",
        "not BACKWARD compatible with version 2: /fields/3 (size): reader field has no"
        " default, so it cannot read data written without it",
    ]


def test_transitive_rules_check_every_version() -> None:
    b_required = {"name": "b", "type": "int"}
    b_default = {"name": "b", "type": "int", "default": 1}
    # Backward: v3 reads v2 (b present) but not v1 (b missing, no default).
    history = [_record(ID), _record(ID, b_default)]
    v3 = _record(ID, b_required)
    assert check("BACKWARD", v3, history) == []
    problems = check("BACKWARD_TRANSITIVE", v3, history)
    assert len(problems) == 1 and "with version 1: /fields/1 (b)" in problems[0]
    # Forward: v2 reads v3 (b has a default) but v1 cannot (b required).
    history = [_record(ID, b_required), _record(ID, b_default)]
    v3 = _record(ID)
    assert check("FORWARD", v3, history) == []
    assert check("FULL", v3, history) == []
    assert check("FORWARD_TRANSITIVE", v3, history)
    problems = check("FULL_TRANSITIVE", v3, history)
    assert problems and all("version 1" in p for p in problems)


def test_enum_problem_lists_symbols() -> None:
    old, new = AVRO_CHANGES["enum symbol added"]
    (problem,) = check("FORWARD", new, [old])
    assert "version 1 cannot read the new schema's data" in problem
    assert problem.endswith(
        "/fields/1/type/symbols (colour): reader enum lacks the writer's symbols BLUE"
    )


def test_type_change_needs_none() -> None:
    avro = _record(ID)
    json_schema = parse("JSON", '{"type": "object"}')
    (problem,) = check("BACKWARD", json_schema, [avro])
    assert "changing the type needs compatibility NONE" in problem
    assert check("NONE", json_schema, [avro]) == []


def test_unknown_rule() -> None:
    with pytest.raises(ValueError, match="BACKWARDS"):
        check("BACKWARDS", _record(ID), [_record(ID)])


def test_equal_schemas_always_compatible() -> None:
    for rule in RULES:
        assert check(rule, _record(ID, QTY), [_record(ID, QTY)]) == []


# --- parsing and identity -----------------------------------------------------------------


def test_avro_normalized_text_and_stable_fingerprint() -> None:
    spaced = '{ "type" : "record", "name": "Order",\n "fields": [{"type": "long", "name": "id"}]}'
    parsed = parse("AVRO", spaced)
    assert parsed.text == '{"fields":[{"name":"id","type":"long"}],"name":"Order","type":"record"}'
    # CRC-64-AVRO of the Parsing Canonical Form: a doc or default does not change it.
    assert parsed.fingerprint == "6b57b91b27ffee9c"
    documented = parse(
        "AVRO",
        json.dumps(
            {"type": "record", "name": "Order", "doc": "x", "fields": [ID | {"doc": "the id"}]}
        ),
    )
    assert documented.fingerprint == parsed.fingerprint
    assert documented.text != parsed.text
    assert parse("AVRO", '"string"').fingerprint == parse("AVRO", '{"type": "string"}').fingerprint


def test_json_schema_normalized_and_fingerprint() -> None:
    a = parse("JSON", '{"type": "object", "properties": {"id": {"type": "integer"}}}')
    b = parse("JSON", '{"properties":{"id":{"type":"integer"}},"type":"object"}')
    assert a.text == b.text == '{"properties":{"id":{"type":"integer"}},"type":"object"}'
    assert a.fingerprint == b.fingerprint == "96111275b2e08fc0"
    assert a.parsed == {"properties": {"id": {"type": "integer"}}, "type": "object"}


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        ("AVRO", "not json", "not JSON"),
        ("AVRO", '{"type": "recrod", "name": "x"}', "invalid Avro schema"),
        ("AVRO", '{"type": "record", "name": "x"}', "invalid Avro schema"),
        ("JSON", '{"type": "objekt"}', "invalid JSON Schema"),
        ("JSON", "[1, 2]", "is an object"),
        ("JSON", '{"$schema": "https://json-schema.org/draft/2020-12/schema"}', "2020-12"),
        ("JSON", '{"$schema": "https://json-schema.org/draft/2019-09/schema"}', "2019-09"),
        ("JSON", '{"properties": {"a": {"$ref": "https://example.com/a.json"}}}', "/properties/a"),
        ("PROTOBUF", 'syntax = "proto3";', "not supported yet"),
        ("XML", "{}", "unknown schema type"),
    ],
)
def test_invalid_schemas_refused(kind: str, text: str, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        parse(kind, text)


def test_json_schema_drafts_accepted() -> None:
    for draft in (
        "http://json-schema.org/draft-04/schema#",
        "http://json-schema.org/draft-07/schema#",
    ):
        parse("JSON", json.dumps({"$schema": draft, "type": "object"}))
    parse(
        "JSON",
        '{"definitions": {"a": {"type": "string"}},'
        ' "properties": {"x": {"$ref": "#/definitions/a"}}}',
    )


def test_guess_type() -> None:
    assert schema_rules.guess_type(_record(ID).text) == "AVRO"
    assert schema_rules.guess_type('["null", "string"]') == "AVRO"
    assert schema_rules.guess_type('{"type": "object", "properties": {}}') == "JSON"
    assert (
        schema_rules.guess_type('{"$schema": "http://json-schema.org/draft-07/schema#"}') == "JSON"
    )
    with pytest.raises(ValueError, match="give its type"):
        schema_rules.guess_type('{"type": "string"}')
    with pytest.raises(ValueError, match="not JSON"):
        schema_rules.guess_type("nope")


# --- JSON Schema: the conservative checker ----------------------------------------------------


def _obj(properties: dict[str, Any], required: tuple[str, ...] = (), **more: Any) -> ParsedSchema:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return parse("JSON", json.dumps(schema | more))


INT = {"type": "integer"}
NUM = {"type": "number"}
STR = {"type": "string"}

# (old, new, backward ok, forward ok)
JSON_CHANGES: dict[str, tuple[ParsedSchema, ParsedSchema, bool, bool]] = {
    # An open writer may have written any value under "note" (review finding 12).
    "add optional property": (_obj({"id": INT}), _obj({"id": INT, "note": STR}), False, True),
    "add optional property to a closed writer": (
        _obj({"id": INT}, additionalProperties=False),
        _obj({"id": INT, "note": STR}, additionalProperties=False),
        True,
        False,
    ),
    "add an unconstrained property": (_obj({"id": INT}), _obj({"id": INT, "any": {}}), True, True),
    "add property covered by additionalProperties": (
        _obj({"id": INT}, additionalProperties=INT),
        _obj({"id": INT, "n": NUM}, additionalProperties=INT),
        True,
        False,
    ),
    "add required property": (
        _obj({"id": INT}, ("id",)),
        _obj({"id": INT, "q": INT}, ("id", "q")),
        False,
        True,
    ),
    "integer to number": (_obj({"id": INT}), _obj({"id": NUM}), True, False),
    "string to integer": (_obj({"id": STR}), _obj({"id": INT}), False, False),
    "null allowed": (
        _obj({"id": INT}),
        _obj({"id": {"type": ["integer", "null"]}}),
        True,
        False,
    ),
    "enum value added": (
        _obj({"c": {"enum": ["r"]}}),
        _obj({"c": {"enum": ["r", "b"]}}),
        True,
        False,
    ),
    "closed reader gains property": (
        _obj({"id": INT}, additionalProperties=False),
        _obj({"id": INT, "n": STR}, additionalProperties=False),
        True,
        False,
    ),
    "items widened": (
        _obj({"xs": {"type": "array", "items": INT}}),
        _obj({"xs": {"type": "array", "items": NUM}}),
        True,
        False,
    ),
    "pattern added": (_obj({"s": STR}), _obj({"s": STR | {"pattern": "^a"}}), False, False),
    "closed writer, open reader gains property": (
        _obj({"id": INT}, additionalProperties=False),
        _obj({"id": INT, "n": STR}),
        True,
        False,
    ),
    "open writer, reader closes": (
        _obj({"id": INT}),
        _obj({"id": INT}, additionalProperties=False),
        False,
        True,
    ),
    "additionalProperties schema widened": (
        _obj({}, additionalProperties=INT),
        _obj({}, additionalProperties=NUM),
        True,
        False,
    ),
    "property dropped from required": (
        _obj({"id": INT}, ("id",)),
        _obj({"id": INT}),
        True,
        False,
    ),
    "description changed": (
        _obj({"s": STR | {"description": "a"}}),
        _obj({"s": STR | {"description": "b"}}),
        True,
        True,
    ),
}


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("change", sorted(JSON_CHANGES))
def test_json_rule_table(rule: str, change: str) -> None:
    old, new, backward, forward = JSON_CHANGES[change]
    problems = check(rule, new, [old])
    assert (not problems) == _expected(rule, backward, forward), problems


def test_json_open_writer_property_added_message() -> None:
    old, new, _, _ = JSON_CHANGES["add optional property"]
    assert check("BACKWARD", new, [old]) == [
        "not BACKWARD compatible with version 1: /: property 'note' is only in the reader"
        " and the writer is open (its data may hold any value under that name)"
    ]


def test_json_problems_name_place() -> None:
    old, new, _, _ = JSON_CHANGES["pattern added"]
    assert check("BACKWARD", new, [old]) == [
        "not BACKWARD compatible with version 1: /properties/s: cannot decide (pattern differs)"
    ]
    old, new, _, _ = JSON_CHANGES["add required property"]
    assert check("BACKWARD", new, [old]) == [
        "not BACKWARD compatible with version 1: /: property 'q' is required by the reader,"
        " not by the writer",
        "not BACKWARD compatible with version 1: /: property 'q' is only in the reader and"
        " the writer is open (its data may hold any value under that name)",
    ]


# --- the version header -------------------------------------------------------------------


def test_version_header_round_trip() -> None:
    assert schema_rules.SCHEMA_HEADER == "equeue.schema"
    assert schema_rules.KEY_SCHEMA_HEADER == "equeue.key-schema"
    assert schema_rules.version_header(2) == b"2"
    assert schema_rules.parse_version(schema_rules.version_header(1000)) == 1000
    with pytest.raises(ValueError, match="start at 1"):
        schema_rules.version_header(0)


@pytest.mark.parametrize(
    ("value", "version"),
    [
        (None, None),
        (b"3", 3),
        (b"", -1),
        (b"x", -1),
        (b"0", -1),
        (b"-1", -1),
        (b" 3", -1),
        (b"12345678901", -1),
    ],
)
def test_parse_version(value: bytes | None, version: int | None) -> None:
    assert schema_rules.parse_version(value) == version


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"type":"record","name":"N","fields":[{"name":"n","type":"N"}]}',
            "record N can never end",
        ),
        (
            '{"type":"record","name":"A","fields":[{"name":"b","type":{"type":"record",'
            '"name":"B","fields":[{"name":"a","type":"A"}]}}]}',
            "record A can never end",
        ),
        (
            '{"type":"record","name":"A","fields":[{"name":"a","type":"int","default":"x"}]}',
            "must match",
        ),
        ('{"type":"array","items":"null"}', "array of null items"),
        ('{"type":"array","items":{"type":"record","name":"E","fields":[]}}', "record E items"),
        ("[" * 65 + "]" * 65, "nested too deeply"),
    ],
)
def test_avro_schemas_no_client_could_use_are_refused(text: str, message: str) -> None:
    """Review findings 1, 7, 8, 19: refused at parse, before a decoder meets them."""
    with pytest.raises(SchemaError, match=message):
        parse("AVRO", text)


@pytest.mark.parametrize(
    "doc",
    [
        {
            "type": "record",
            "name": "N",
            "fields": [{"name": "n", "type": ["null", "N"], "default": None}],
        },
        {
            "type": "record",
            "name": "T",
            "fields": [{"name": "kids", "type": {"type": "array", "items": "T"}}],
        },
        {"type": "map", "values": "null"},
    ],
)
def test_avro_schemas_that_end_are_accepted(doc: dict[str, Any]) -> None:
    assert parse("AVRO", json.dumps(doc)).type == "AVRO"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"$ref": "#"}, "cycle"),
        (
            {
                "definitions": {"a": {"$ref": "#/definitions/b"}, "b": {"$ref": "#/definitions/a"}},
                "$ref": "#/definitions/a",
            },
            "/definitions/a -> /definitions/b -> /definitions/a",
        ),
        ({"anyOf": [{"$ref": "#"}]}, "refers to itself"),
        ({"$ref": "http://example.com/s.json"}, "points at another document"),
    ],
)
def test_json_schemas_whose_validation_never_ends_are_refused(doc: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        parse("JSON", json.dumps(doc))


def test_identity_is_the_text_and_limits_come_before_parsing() -> None:
    """Review findings 3 and 4: a default changes the text (the version), not the
    fingerprint; the size limit refuses before any compile."""
    plain = _record(ID)
    with_default = _record({**ID, "default": 0})
    assert plain.fingerprint == with_default.fingerprint and plain.text != with_default.text
    props = {f"p{i}": {"type": "string", "pattern": "^a+$"} for i in range(20_000)}
    big = json.dumps({"type": "object", "properties": props})
    with pytest.raises(schema_rules.SchemaTooLarge, match="max_schema_bytes=262144"):
        parse("JSON", big, max_bytes=256 << 10)
    assert schema_rules.MAX_DEPTH == 64
    assert parse("JSON", json.dumps({"type": "object"})).type == "JSON"


@pytest.mark.timeout(30)
def test_depth_check_is_linear_on_hostile_text() -> None:
    """A text of escaped quotes with no closing one must not make the depth check
    quadratic (a scan per quote): json.loads refuses it at once."""
    with pytest.raises(SchemaError, match="not JSON"):
        parse("JSON", '"' + 'a\\"' * 300_000)
    with pytest.raises(SchemaError, match="nested too deeply"):
        parse("AVRO", "[" * 100_000 + "]" * 100_000)
    assert schema_rules.normalize("[" * 64 + "]" * 64) == "[" * 64 + "]" * 64


@pytest.mark.timeout(30)
def test_long_ref_chains_are_walked_once() -> None:
    """The $ref cycle check remembers chains that end (no walk per reference);
    a chain deeper than Python can validate is refused, not a RecursionError later."""
    n = 5000
    defs: dict[str, Any] = {f"a{i}": {"$ref": f"#/definitions/a{i + 1}"} for i in range(n)}
    defs[f"a{n}"] = {"type": "string"}
    with pytest.raises(SchemaError, match="deeper than Python allows"):
        parse("JSON", json.dumps({"definitions": defs, "$ref": "#/definitions/a0"}))
    short = {f"a{i}": {"$ref": f"#/definitions/a{i + 1}"} for i in range(50)}
    short["a50"] = {"type": "string"}
    assert parse("JSON", json.dumps({"definitions": short, "$ref": "#/definitions/a0"}))


def _chain(n: int, first: dict[str, Any]) -> str:
    """A union of records R0 ... Rn-1, each holding the one before."""
    branches = [{"type": "record", "name": "R0", "fields": [first]}]
    branches += [
        {"type": "record", "name": f"R{i}", "fields": [{"name": "p", "type": f"R{i - 1}"}]}
        for i in range(1, n)
    ]
    return json.dumps(branches)


@pytest.mark.timeout(30)
def test_record_chains_end_and_their_expansion_is_bounded() -> None:
    """The endless-record check resolves a chain in one pass; a schema whose named
    types expand past MAX_EXPANDED_NODES is refused (Apache Avro's checker walks
    the expansion: a record used twice in one used twice ... 40 deep never ends)."""
    assert parse("AVRO", _chain(400, {"name": "v", "type": "int"})).type == "AVRO"
    with pytest.raises(SchemaError, match="can never end"):
        parse("AVRO", _chain(400, {"name": "v", "type": "R0"}))
    with pytest.raises(SchemaError, match="more than 100000 types"):
        parse("AVRO", _chain(3000, {"name": "v", "type": "int"}))
    doubling: list[dict[str, Any]] = [{"type": "record", "name": "D0", "fields": []}]
    doubling += [
        {"type": "record", "name": f"D{i}",
         "fields": [{"name": "a", "type": f"D{i - 1}"}, {"name": "b", "type": f"D{i - 1}"}]}
        for i in range(1, 41)
    ]  # fmt: skip
    with pytest.raises(SchemaError, match="more than 100000 types"):
        parse("AVRO", json.dumps(doubling))
