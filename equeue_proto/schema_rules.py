"""Topic schemas: parsing, identity and the compatibility rules (Confluent's, per topic).

Shared by the broker (the authoritative check at SetSchema), the client and the Spark
connector. A schema is Avro or JSON Schema (drafts 4, 6, 7). Its stored text is the
normalized JSON (keys sorted, no spaces) and that text is its identity: two schemas are the
same version only when their normalized texts are equal (an Avro default, alias or doc
matters to a reader). The fingerprint (CRC-64-AVRO of Avro's Parsing Canonical Form, or the
first 8 bytes of SHA-256 of the normalized JSON Schema) is reported, never compared.

Before anything parses or compiles a schema its text is held to a nesting depth
(`MAX_DEPTH`) and, when the caller gives one, a size: the broker parses what any client
sends, and fastjsonschema/avro work is unbounded otherwise.

"Can read" for Avro is Apache Avro's own ReaderWriterCompatibilityChecker. For JSON Schema it
is a deliberately conservative checker of its own: whatever it cannot decide counts as
incompatible (the rule NONE registers such a schema anyway).

`avro` and `fastjsonschema` are imported inside the functions: importing this module (for the
header names, say) costs nothing.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

SCHEMA_HEADER = "equeue.schema"
KEY_SCHEMA_HEADER = "equeue.key-schema"
TYPES = ("AVRO", "JSON")
RULES = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
_MAX_VERSION_DIGITS = 10
MAX_DEPTH = 64
"""A schema's JSON nests at most this deep (objects and arrays): deeper texts are refused
before any parser or compiler sees them (Python's recursion and the generated validator's
indentation have limits far below what a megabyte of brackets can ask for)."""

# Error kinds (protocol.ERROR_KIND_KEY trailer) of the schema RPCs' refusals.
SCHEMA_INVALID = "schema-invalid"
"""INVALID_ARGUMENT: the schema text does not parse (or its type is not supported)."""
SCHEMA_INCOMPATIBLE = "schema-incompatible"
"""FAILED_PRECONDITION: the schema breaks the subject's compatibility rule (every
incompatibility is listed in the message, one per line)."""
SCHEMA_VERSION_CONFLICT = "schema-version-conflict"
"""FAILED_PRECONDITION: an explicit version is neither the next one nor an existing
version with the same fingerprint (a cluster's broker groups disagree)."""


@dataclass(frozen=True)
class ParsedSchema:
    """A parsed schema: `text` is the normalized JSON, `parsed` an avro Schema or the dict."""

    type: str
    text: str
    fingerprint: str
    parsed: object


class SchemaError(ValueError):
    """The schema text is not a usable schema; the message names the place."""


class SchemaTooLarge(SchemaError):
    """The normalized schema is larger than the caller's limit (``max_bytes``)."""


def normalize(text: str) -> str:
    """The JSON text with sorted keys and no spaces (raises SchemaError when not JSON)."""
    return _dump(_load_json(text))


def _dump(document: Any) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def parse(type: str, text: str, *, max_bytes: int = 0) -> ParsedSchema:
    """Parse `text` as a schema of `type` ("AVRO" or "JSON"). With `max_bytes`, a
    normalized text larger than that raises SchemaTooLarge before any parsing."""
    kind = type.upper()
    if kind == "PROTOBUF":
        raise SchemaError("schema type PROTOBUF is not supported yet: use AVRO or JSON")
    if kind not in TYPES:
        raise SchemaError(f"unknown schema type {type!r}: use one of {', '.join(TYPES)}")
    document = _load_json(text)
    normalized = _dump(document)
    size = len(normalized.encode())
    if max_bytes and size > max_bytes:
        raise SchemaTooLarge(
            f"the schema is {size} bytes (normalized), more than max_schema_bytes={max_bytes}"
        )
    try:
        if kind == "AVRO":
            return _parse_avro(normalized)
        return _parse_json_schema(document, normalized)
    except RecursionError:
        raise SchemaError(f"the schema is nested too deeply to parse (max {MAX_DEPTH})") from None


def guess_type(text: str) -> str:
    """ "AVRO" or "JSON" for a schema text; ValueError when it cannot tell (give the type)."""
    document = _load_json(text)
    if isinstance(document, str | list):
        return "AVRO"  # a named primitive ("string") or a union
    if isinstance(document, bool):
        return "JSON"
    if isinstance(document, dict):
        if _JSON_ONLY_KEYS & document.keys():
            return "JSON"
        if _AVRO_ONLY_KEYS & document.keys() or document.get("type") in _AVRO_ONLY_TYPES:
            return "AVRO"
    fits = [kind for kind in TYPES if _parses(kind, text)]
    if len(fits) == 1:
        return fits[0]
    if not fits:
        raise ValueError("the text is neither an Avro schema nor a JSON Schema")
    raise ValueError("cannot tell whether the schema is Avro or JSON Schema: give its type")


_JSON_ONLY_KEYS = frozenset(
    {"$schema", "$ref", "$id", "properties", "required", "additionalProperties", "definitions"}
)
_AVRO_ONLY_KEYS = frozenset({"fields", "symbols", "values", "size", "logicalType"})
_AVRO_ONLY_TYPES = frozenset(
    {"record", "enum", "fixed", "map", "int", "long", "float", "double", "bytes"}
)


def _parses(kind: str, text: str) -> bool:
    try:
        parse(kind, text)
    except SchemaError:
        return False
    return True


def can_read(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    """What keeps `reader` from reading data written with `writer`: [] when nothing does."""
    if reader.type != writer.type:
        return [f"a {reader.type} schema cannot read data written with a {writer.type} schema"]
    if reader.fingerprint == writer.fingerprint:
        return []
    if reader.type == "AVRO":
        return _avro_can_read(reader.parsed, writer.parsed)
    return list(_json_can_read(reader.parsed, writer.parsed, ""))


def check(
    rule: str, new: ParsedSchema, history: Sequence[ParsedSchema], *, limit: int = 0
) -> list[str]:
    """The problems of registering `new` after `history` (oldest first, version 1 first)
    under `rule`; [] when it may be registered. Each problem names the version. With
    `limit`, checking stops once that many problems are found (a refusal needs one)."""
    if rule not in RULES:
        raise ValueError(f"unknown compatibility rule {rule!r}: use one of {', '.join(RULES)}")
    if rule == "NONE" or not history:
        return []
    transitive = rule.endswith("_TRANSITIVE")
    base = rule.removesuffix("_TRANSITIVE")
    # Newest first; only the versions the rule needs are touched (a lazy history
    # parses no other).
    against = range(len(history), 0, -1) if transitive else (len(history),)
    problems: list[str] = []
    for version in against:
        old = history[version - 1]
        head = f"not {rule} compatible with version {version}"
        if old.type != new.type:
            problems.append(
                f"{head}: version {version} is {old.type} and the new schema {new.type};"
                " changing the type needs compatibility NONE"
            )
            continue
        if base in ("BACKWARD", "FULL"):
            problems.extend(f"{head}: {p}" for p in can_read(new, old))
        if base in ("FORWARD", "FULL"):
            problems.extend(
                f"{head}: version {version} cannot read the new schema's data: {p}"
                for p in can_read(old, new)
            )
        if limit and len(problems) >= limit:
            return problems[:limit]
    return problems


def version_header(version: int) -> bytes:
    """The header value naming a schema version: ASCII decimal, e.g. b"2"."""
    if version < 1:
        raise ValueError(f"schema version {version} is not a version: versions start at 1")
    return str(version).encode("ascii")


def parse_version(value: bytes | None) -> int | None:
    """The version a header value names: None when absent, -1 when malformed."""
    if value is None:
        return None
    if not value or len(value) > _MAX_VERSION_DIGITS or not value.isdigit():
        return -1
    version = int(value)
    return version if version >= 1 else -1


# --- Avro -------------------------------------------------------------------------------


def _load_json(text: str) -> Any:
    """The JSON document of `text`, refused when deeper than MAX_DEPTH. json.loads
    itself stops at Python's recursion limit (RecursionError, caught); the depth is
    then counted on the document without recursion."""
    try:
        document = json.loads(text)
    except RecursionError:
        raise SchemaError(f"the schema is nested too deeply (max {MAX_DEPTH} levels)") from None
    except ValueError as exc:
        raise SchemaError(f"the schema is not JSON: {exc}") from None
    _check_depth(document)
    return document


def _check_depth(document: Any) -> None:
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= MAX_DEPTH:
                raise SchemaError(
                    f"the schema is nested too deeply: more than {MAX_DEPTH} levels of"
                    " objects and arrays"
                )
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)


def _parse_avro(normalized: str) -> ParsedSchema:
    import avro.errors
    import avro.schema
    import fastavro

    try:
        schema = avro.schema.parse(normalized)
    except (avro.errors.AvroException, TypeError, ValueError, AttributeError) as exc:
        raise SchemaError(f"invalid Avro schema: {exc}") from None
    _check_finite(schema)
    _check_array_items(schema)
    _check_expanded_size(schema)
    # Apache avro does not check defaults; fastavro (what clients and the Spark
    # connector encode and decode with) does: a schema either refuses is refused.
    try:
        fastavro.parse_schema(json.loads(normalized))
    except Exception as exc:  # fastavro raises several kinds (SchemaParseException, ...)
        raise SchemaError(f"invalid Avro schema: {exc}") from None
    fingerprint = schema.fingerprint("CRC-64-AVRO").hex()
    return ParsedSchema("AVRO", normalized, fingerprint, schema)


def _check_finite(schema: Any) -> None:
    """Refuse a record no finite datum has (it always contains itself): decoders
    recurse without end on it (fastavro's C reader overflows the stack). A record is
    finite when every field's type is: a union when any branch is, arrays and maps
    always (they may be empty), a record when it is. Solved as Horn clauses (each
    field waits for any one of the records it needs), linear in the schema's size."""
    records = {r.fullname: r for r in _avro_records(schema)}
    waiting: dict[str, list[int]] = {}  # record -> fields that one satisfies
    owner: list[tuple[str, str]] = []  # field id -> (record, field name)
    missing: dict[str, int] = {}  # record -> fields not yet satisfied
    ready: list[str] = []
    for name, record in records.items():
        missing[name] = 0
        for f in record.fields:
            needs = _needs(f.type)
            if needs is None:
                continue
            for wanted in needs:
                waiting.setdefault(wanted, []).append(len(owner))
            owner.append((name, f.name))
            missing[name] += 1
        if not missing[name]:
            ready.append(name)
    satisfied: set[int] = set()
    finite: set[str] = set()
    while ready:
        name = ready.pop()
        if name in finite:
            continue
        finite.add(name)
        for field_id in waiting.get(name, ()):
            if field_id not in satisfied:
                satisfied.add(field_id)
                holder = owner[field_id][0]
                missing[holder] -= 1
                if not missing[holder]:
                    ready.append(holder)
    for field_id, (name, field) in enumerate(owner):
        if field_id not in satisfied:
            raise SchemaError(
                f"record {name} can never end: field {field} always holds a record"
                ' again, with no way out (make it nullable: ["null", ...] with default null)'
            )


def _needs(schema: Any) -> set[str] | None:
    """The records any one of which lets a field of this type end; None: it ends."""
    kind = schema.type
    if kind in ("record", "error", "request"):
        return {schema.fullname}
    if kind == "union":
        names: set[str] = set()
        for branch in schema.schemas:
            if branch.type not in ("record", "error", "request"):
                return None
            names.add(branch.fullname)
        return names
    return None


MAX_EXPANDED_NODES = 100_000
"""An Avro schema's types counted as if every use of a named type were written out
in full, at most: Apache Avro's compatibility checker walks them so (a record used
twice in a record used twice ... 40 deep would take it days)."""


def _children(node: Any) -> list[Any]:
    kind = node.type
    if kind in ("record", "error", "request"):
        return [f.type for f in node.fields]
    if kind == "union":
        return list(node.schemas)
    if kind == "array":
        return [node.items]
    if kind == "map":
        return [node.values]
    return []


def _check_expanded_size(schema: Any) -> None:
    """Refuse a schema whose expansion passes MAX_EXPANDED_NODES (computed once per
    type, without recursion; a use of a type inside itself counts 1)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(schema, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        if not children_done:
            if key in open_:
                continue  # used inside itself: counted as 1 where it is used
            open_.add(key)
            stack.append((node, True))
            stack.extend((kid, False) for kid in _children(node))
            continue
        total = 1 + sum(sizes.get(id(kid), 1) for kid in _children(node))
        sizes[key] = min(total, MAX_EXPANDED_NODES + 1)
        open_.discard(key)
    if sizes.get(id(schema), 1) > MAX_EXPANDED_NODES:
        raise SchemaError(
            f"the schema has more than {MAX_EXPANDED_NODES} types when every use of a"
            " named type is counted (records used many times inside records used many"
            " times): compatibility checks would not end; use fewer nested shared records"
        )


def _check_array_items(schema: Any) -> None:
    """Refuse arrays whose items encode in 0 bytes (null, an empty record, fixed
    size 0): a 5-byte value could then claim billions of items, and a decoder
    spends time and memory on each (the Spark decoder refuses them as well)."""
    stack, seen = [schema], set()
    sizes: dict[str, bool] = {}
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        kind = node.type
        if kind == "array":
            if _zero_size(node.items, sizes):
                raise SchemaError(
                    f"an array of {_type_label(node.items)} items: each item takes 0 bytes,"
                    " so a few bytes could claim any number of them; use a count field"
                )
            stack.append(node.items)
        elif kind in ("record", "error", "request"):
            stack.extend(f.type for f in node.fields)
        elif kind == "union":
            stack.extend(node.schemas)
        elif kind == "map":
            stack.append(node.values)


def _zero_size(schema: Any, known: dict[str, bool]) -> bool:
    """Whether the type encodes in 0 bytes; ``known`` memoizes records by name (a
    record used many times is looked at once: no blow-up over shared records)."""
    kind = schema.type
    if kind == "null":
        return True
    if kind == "fixed":
        return bool(schema.size == 0)
    if kind in ("record", "error", "request"):
        name = schema.fullname
        if name not in known:
            known[name] = False  # a cycle back to it holds a non-record step: not 0 bytes
            known[name] = all(_zero_size(f.type, known) for f in schema.fields)
        return known[name]
    return False


def _type_label(schema: Any) -> str:
    if schema.type in ("record", "error", "fixed", "enum"):
        return f"{schema.type} {schema.fullname}"
    return str(schema.type)


def _avro_records(schema: Any) -> list[Any]:
    """Every record type a schema names (each once), walked without recursion."""
    found: dict[str, Any] = {}
    stack = [schema]
    while stack:
        node = stack.pop()
        kind = node.type
        if kind in ("record", "error", "request"):
            if node.fullname in found:
                continue
            found[node.fullname] = node
            stack.extend(f.type for f in node.fields)
        elif kind == "union":
            stack.extend(node.schemas)
        elif kind == "array":
            stack.append(node.items)
        elif kind == "map":
            stack.append(node.values)
    return list(found.values())


# Apache Avro's checker merges what it finds into sets of messages and of locations that
# no longer say which message belongs where. To report every incompatibility with its
# place, the one function that creates each finding is wrapped (once, behaviour unchanged)
# to also append it to a per-thread list while one of our checks runs.
_findings = threading.local()
_wrap_lock = threading.Lock()


def _install_recorder() -> None:
    import avro.compatibility as compat

    with _wrap_lock:
        if getattr(compat.incompatible, "equeue_recorder", False):
            return
        original: Callable[..., Any] = compat.incompatible

        def recording(kind: Any, message: str, location: list[str]) -> Any:
            result = original(kind, message, location)
            sink: list[tuple[str, str, str]] | None = getattr(_findings, "sink", None)
            if sink is not None:
                sink.append((str(kind.value), message, next(iter(result.locations))))
            return result

        recording.equeue_recorder = True  # type: ignore[attr-defined]
        compat.incompatible = recording  # type: ignore[assignment]


def _avro_can_read(reader: Any, writer: Any) -> list[str]:
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

    _install_recorder()
    sink: list[tuple[str, str, str]] = []
    _findings.sink = sink
    try:
        checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
        result = checker.get_compatibility(reader, writer)
    finally:
        _findings.sink = None
    if result.compatibility is not SchemaCompatibilityType.incompatible:
        return []
    if not sink:  # never expected: say what the checker said
        return [f"{', '.join(sorted(result.locations))}: {'; '.join(sorted(result.messages))}"]
    # The checker also tries union branches that do not match before one that does; their
    # findings were dropped from the result, so only findings the result kept count.
    seen: dict[str, None] = {}
    for kind, message, location in sink:
        if message in result.messages and location in result.locations:
            seen.setdefault(_avro_problem(reader, kind, message, location), None)
    return list(seen)


def _avro_problem(reader: Any, kind: str, message: str, location: str) -> str:
    names = _avro_field_names(reader, location)
    place = f"{location} ({names})" if names else location
    if kind == "reader_field_missing_default_value":
        reason = "reader field has no default, so it cannot read data written without it"
    elif kind == "missing_enum_symbols":
        symbols = message.strip("{}").replace("'", "")
        reason = f"reader enum lacks the writer's symbols {symbols}"
    else:
        reason = message
    return f"{place}: {reason}"


def _avro_field_names(schema: Any, location: str) -> str:
    """The dotted field names along a checker location such as /fields/2/type/items."""
    names: list[str] = []
    node = schema
    steps = iter(part for part in location.split("/") if part)
    try:
        for step in steps:
            if step == "fields":
                field = node.fields[int(next(steps))]
                names.append(field.name)
                node = field.type
            elif step in ("type", "name", "symbols", "size"):
                continue
            elif step == "items":
                node = node.items
            elif step == "values":
                node = node.values
            elif step.isdigit():
                node = node.schemas[int(step)]
    except (AttributeError, IndexError, ValueError, StopIteration):
        pass
    return ".".join(names)


# --- JSON Schema ------------------------------------------------------------------------

_NEWER_DRAFTS = ("2019-09", "2020-12")
_ANNOTATIONS = frozenset(
    {"title", "description", "$schema", "$id", "id", "default", "examples", "$comment"}
)
_CHECKED = frozenset({"type", "properties", "required", "additionalProperties", "enum", "items"})


def _parse_json_schema(document: Any, normalized: str) -> ParsedSchema:
    import fastjsonschema

    if not isinstance(document, dict | bool):
        raise SchemaError("a JSON Schema is an object (or true/false)")
    if isinstance(document, dict):
        draft = document.get("$schema")
        if isinstance(draft, str) and any(name in draft for name in _NEWER_DRAFTS):
            raise SchemaError(
                f"$schema {draft} is not supported: use draft 4, 6 or 7"
                " (draft-07: http://json-schema.org/draft-07/schema#)"
            )
        for where, ref in _refs(document, ""):
            if not ref.startswith("#"):
                raise SchemaError(
                    f"{where or '/'}: $ref {ref!r} points at another document:"
                    " only references inside the schema (#/...) are supported"
                )
        _check_ref_cycles(document)
    try:
        validate = fastjsonschema.compile(document, handlers=_NO_REMOTE)
    except fastjsonschema.JsonSchemaDefinitionException as exc:
        raise SchemaError(f"invalid JSON Schema: {exc}") from None
    except (SyntaxError, MemoryError, RecursionError):
        # The generated validator nests one block per schema level: too deep for Python.
        raise SchemaError(
            "the JSON Schema is nested too deeply to compile a validator for it:"
            " nest fewer schemas (use definitions and $ref)"
        ) from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise SchemaError(f"invalid JSON Schema: {type(exc).__name__}: {exc}") from None
    _smoke_test(validate)
    fingerprint = hashlib.sha256(normalized.encode()).digest()[:8].hex()
    return ParsedSchema("JSON", normalized, fingerprint, document)


def _refuse_remote(uri: str) -> Any:
    raise SchemaError(f"$ref {uri!r} points at another document: not fetched")


# fastjsonschema fetches any scheme it has no handler for with urlopen: every usual
# scheme gets one that refuses (defence behind the `_refs` check above).
_NO_REMOTE = {scheme: _refuse_remote for scheme in ("http", "https", "file", "ftp", "data", "")}


def _check_ref_cycles(document: dict[str, Any]) -> None:
    """Refuse a `$ref` chain that comes back to itself with no schema in between
    (`{"$ref": "#"}`, a -> b -> a): validation would recurse without end on any value.
    In drafts 4-7 a `$ref` replaces its siblings, so a node with one is only a hop."""
    ends: set[str] = set()  # pointers whose chain is known to end: each walked once
    for where, ref in _refs(document, ""):
        seen = [where or "#"]
        target: str | None = ref
        while target is not None:
            pointer = target.removeprefix("#") or "#"
            if pointer in ends:
                break
            if pointer in seen:
                raise SchemaError(
                    f"a $ref cycle with no schema in between: {' -> '.join([*seen, pointer])}"
                )
            seen.append(pointer)
            node = _resolve(document, target)
            target = node.get("$ref") if isinstance(node, dict) else None
            if not isinstance(target, str):
                target = None
        ends.update(seen)


def _resolve(document: Any, ref: str) -> Any:
    node = document
    for raw in ref.removeprefix("#").split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _smoke_test(validate: Callable[[Any], Any]) -> None:
    """Run the validator once per JSON type: cycles through allOf/anyOf/not that no
    value ends show as RecursionError here, not in every producer later."""
    import fastjsonschema

    samples: tuple[Any, ...] = (None, True, 0, 0.5, "", [], {})
    for value in samples:
        try:
            validate(value)
        except fastjsonschema.JsonSchemaException:
            pass
        except RecursionError:
            raise SchemaError(
                "the JSON Schema's validation recurses without end: it refers to itself with"
                " no value in between (a $ref cycle through allOf/anyOf/oneOf/not), or its"
                " $ref chains are deeper than Python allows"
            ) from None
        except Exception as exc:  # a bad pattern, say: the validator cannot run
            raise SchemaError(f"invalid JSON Schema: {type(exc).__name__}: {exc}") from None


def _refs(node: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield where, value
            else:
                yield from _refs(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _refs(value, f"{where}/{index}")


def _json_can_read(reader: Any, writer: Any, where: str) -> Iterator[str]:
    """Conservative: a reader R reads what a writer W allows only when it can show it."""
    place = where or "/"
    if reader == writer or reader is True or reader == {} or writer is False:
        return
    if isinstance(reader, bool) or isinstance(writer, bool):
        yield f"{place}: cannot decide (a boolean schema beside an object schema)"
        return
    for key in sorted((reader.keys() | writer.keys()) - _ANNOTATIONS - _CHECKED):
        if reader.get(key) != writer.get(key):
            yield f"{place}: cannot decide ({key} differs)"
    yield from _json_types(reader, writer, place)
    yield from _json_enum(reader, writer, place)
    yield from _json_object(reader, writer, where)
    yield from _json_items(reader, writer, where)


def _types(schema: dict[str, Any]) -> set[str] | None:
    declared = schema.get("type")
    if declared is None:
        return None
    return {declared} if isinstance(declared, str) else set(declared)


def _json_types(reader: dict[str, Any], writer: dict[str, Any], place: str) -> Iterator[str]:
    read, written = _types(reader), _types(writer)
    if read is None:
        return
    if written is None:
        yield f"{place}: reader allows only {_names(read)}, writer any type"
        return
    accepted = set(read) | ({"integer"} if "number" in read else set())
    missing = written - accepted
    if missing:
        yield f"{place}: reader allows {_names(read)}, writer also {_names(missing)}"


def _names(types: set[str]) -> str:
    return "/".join(sorted(types))


def _json_enum(reader: dict[str, Any], writer: dict[str, Any], place: str) -> Iterator[str]:
    if "enum" not in reader:
        return
    if "enum" not in writer:
        yield f"{place}: reader allows only its enum values, writer any"
        return
    # Compared as normalized JSON in a set: linear (a list scan per value is quadratic
    # on large enums), and conservative (1 and 1.0 count as different).
    allowed = (
        {_dump(value) for value in reader["enum"]} if isinstance(reader["enum"], list) else set()
    )
    extra = [value for value in writer["enum"] if _dump(value) not in allowed]
    if extra:
        yield f"{place}: reader enum lacks the writer's values {json.dumps(extra)}"


def _json_object(reader: dict[str, Any], writer: dict[str, Any], where: str) -> Iterator[str]:
    place = where or "/"
    required = set(writer.get("required", ()))
    for name in reader.get("required", ()):
        if name not in required:
            yield f"{place}: property {name!r} is required by the reader, not by the writer"
    read_props: dict[str, Any] = reader.get("properties", {})
    written_props: dict[str, Any] = writer.get("properties", {})
    read_extra = reader.get("additionalProperties", True)
    written_extra = writer.get("additionalProperties", True)
    for name in sorted(written_props):
        if name in read_props:
            yield from _json_can_read(
                read_props[name], written_props[name], f"{where}/properties/{name}"
            )
        elif read_extra is False:
            yield f"{place}: reader is closed (additionalProperties: false) without {name!r}"
        elif read_extra is not True:
            yield from _json_can_read(read_extra, written_props[name], f"{where}/properties/{name}")
    # A property only the reader has: an open writer may have written anything under
    # that name (Confluent: PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL).
    for name in sorted(read_props.keys() - written_props.keys()):
        wanted = read_props[name]
        if written_extra is False or wanted is True or wanted == {}:
            continue
        if written_extra is True:
            yield (
                f"{place}: property {name!r} is only in the reader and the writer is open"
                " (its data may hold any value under that name)"
            )
        else:
            yield from _json_can_read(wanted, written_extra, f"{where}/properties/{name}")
    if written_extra is False or read_extra == written_extra or read_extra in (True, {}):
        return
    if read_extra is False:
        yield f"{place}: reader is closed (additionalProperties: false), writer open"
    elif written_extra is True:
        yield f"{place}: cannot decide (reader limits additionalProperties, writer does not)"
    else:
        yield from _json_can_read(read_extra, written_extra, f"{where}/additionalProperties")


def _json_items(reader: dict[str, Any], writer: dict[str, Any], where: str) -> Iterator[str]:
    read, written = reader.get("items"), writer.get("items")
    if read is None or read == written:
        return
    place = f"{where}/items"
    if written is None:
        yield f"{place}: reader limits the array items, writer does not"
    elif isinstance(read, list) or isinstance(written, list):
        yield f"{place}: cannot decide (tuple items differ)"
    else:
        yield from _json_can_read(read, written, place)
