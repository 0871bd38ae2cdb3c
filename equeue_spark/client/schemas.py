"""Encoding and checking values with a topic's schemas (client side).

``SchemaCache`` (one per ``Routes``) holds the schema versions a client has
read: (topic, key?, version) -> ``Compiled`` (fastavro's parsed schema, or
fastjsonschema's compiled validator), and each subject's latest version,
read again when the topic's route shows a newer one
(``BrokerRoute.value_schema_version``) or ``REFRESH_S`` after it was read
(one broker's route carries no versions: there the 30 s are the bound).

``Serializer`` encodes, checks and decodes one subject's values;
``ProduceChecks`` is what ``Producer(validate=True)`` runs on each batch: every
value (and key) checked against the latest version before the request is
built, and the version recorded in the ``equeue.schema`` (``equeue.key-schema``)
header. Avro values are checked by decoding them (fastavro's
``schemaless_reader`` must consume exactly the value's bytes); JSON values as
RFC 8259 JSON (strict UTF-8 without a BOM, no NaN/Infinity, no duplicate keys)
and the compiled validator.

A version read from a broker is parsed with the broker's own checks
(``schema_rules.parse``) before it is used: a schema no finite value has, or
whose validator never ends, would otherwise crash or hang this process (an
older broker, a repaired file may hold one).
"""

from __future__ import annotations

import io
import json
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fastavro
import fastavro.validation
import fastjsonschema

from equeue_proto import schema_rules
from equeue_proto.schema_rules import KEY_SCHEMA_HEADER, SCHEMA_HEADER, version_header
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import schema_admin
from equeue_spark.client.errors import InvalidRequest, NotFoundError, SchemaValidationError

if TYPE_CHECKING:
    from equeue_spark.client.batches import Headers
    from equeue_spark.client.routing import Routes

REFRESH_S = 30.0
"""How long a subject's latest version (or its having none) is trusted when
the route does not show a newer one."""


@dataclass(frozen=True)
class Compiled:
    """One schema version, ready to encode and check with."""

    version: int
    type: str
    """"AVRO" or "JSON"."""
    text: str
    """The normalized schema text (as the broker stores it)."""
    fingerprint: str
    avro: Any = None
    """fastavro's parsed schema (Avro)."""
    validator: Callable[[Any], Any] | None = None
    """fastjsonschema's compiled validator (JSON Schema)."""

    @classmethod
    def of(cls, version: pb.SchemaVersion) -> Compiled:
        """The version compiled; InvalidRequest naming it when it is not usable."""
        kind = schema_admin.type_name(version.type)
        try:
            schema_rules.parse(kind, version.schema)  # the broker's checks, again
            doc = json.loads(version.schema)
            if kind == "AVRO":
                return cls(version.version, kind, version.schema, version.fingerprint,
                           avro=fastavro.parse_schema(doc))  # fmt: skip
            validator = fastjsonschema.compile(doc, handlers=_NO_REMOTE)
        except Exception as exc:  # SchemaError, fastavro's and fastjsonschema's kinds
            raise InvalidRequest(
                f"schema version {version.version} ({kind}, fingerprint {version.fingerprint})"
                f" cannot be used: {exc}"
            ) from None
        return cls(version.version, kind, version.schema, version.fingerprint,
                   validator=validator)  # fmt: skip

    def problem(self, data: object) -> str:
        """Why ``data`` is not a value of this schema ("" when it is one)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            return (
                f"a {type(data).__name__} is not bytes: send_batch takes encoded values"
                " (encode with Serializer.encode, or use send())"
            )
        raw = bytes(data)
        if self.type == "AVRO":
            stream = io.BytesIO(raw)
            try:
                fastavro.schemaless_reader(stream, self.avro, None)
            except Exception as exc:  # fastavro raises many kinds on bad bytes
                return f"not Avro of this schema ({type(exc).__name__}: {exc})"
            if stream.tell() != len(raw):
                return f"{len(raw) - stream.tell()} bytes left over after the Avro value"
            return ""
        try:
            doc = strict_json(raw)
        except ValueError as exc:
            return f"not JSON ({exc})"
        return self._json_problem(doc)

    def _json_problem(self, doc: object) -> str:
        assert self.validator is not None
        try:
            self.validator(doc)
        except fastjsonschema.JsonSchemaValueException as exc:
            return str(exc.message)
        except fastjsonschema.JsonSchemaException as exc:
            return str(exc)
        except RecursionError:
            return "nested too deeply to validate"
        return ""

    def encode(self, obj: object) -> tuple[bytes, str]:
        """``obj`` encoded (Avro binary, or compact JSON), or (b"", why not)."""
        if self.type == "AVRO":
            out = io.BytesIO()
            try:  # a field the schema lacks is refused, not dropped; a missing one needs a default
                fastavro.schemaless_writer(out, self.avro, obj, strict_allow_default=True)
                # fastavro writes an int out of range unchecked (readers then refuse
                # the record): validated too.
                fastavro.validation.validate(obj, self.avro, raise_errors=True)
            except Exception as exc:  # ValueError, TypeError, KeyError ... by the datum
                return b"", f"cannot be written with this schema ({type(exc).__name__}: {exc})"
            return out.getvalue(), ""
        problem = self._json_problem(obj)
        if problem:
            return b"", problem
        try:  # NaN and Infinity are not JSON: no other reader would take them
            return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode(), ""
        except (TypeError, ValueError, RecursionError) as exc:
            return b"", f"not JSON-serializable ({exc})"


def _refuse_remote(uri: str) -> Any:
    raise ValueError(f"$ref {uri!r} points at another document: not fetched")


_NO_REMOTE = {scheme: _refuse_remote for scheme in ("http", "https", "file", "ftp", "data", "")}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise ValueError(f"the key {name!r} appears twice in an object")
        out[name] = value
    return out


def strict_json(data: bytes) -> Any:
    """``data`` as RFC 8259 JSON: UTF-8 without a BOM, no NaN/Infinity, no key
    twice in an object; ValueError saying what is wrong."""
    if data.startswith(b"\xef\xbb\xbf"):
        raise ValueError("a UTF-8 byte order mark starts it")
    try:
        text = data.decode("utf-8")  # strict: json.loads would guess UTF-16/32
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise ValueError("nested too deeply") from None


class SchemaCache:
    """The schema versions a client has read (thread-safe); ``of(routes)`` is
    the one per ``Routes``."""

    def __init__(self, routes: Routes, refresh_s: float = REFRESH_S) -> None:
        self._routes = routes
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._versions: dict[tuple[str, bool, int], Compiled] = {}
        self._latest: dict[tuple[str, bool], tuple[int, float]] = {}
        """(topic, key) -> (latest version, 0: none; when it was read)."""
        self._incarnations: dict[str, int] = {}
        """The topic incarnation the cached versions belong to: a topic deleted and
        created again numbers from 1 again, so its versions are read anew."""

    @classmethod
    def of(cls, routes: Routes) -> SchemaCache:
        with _CACHES_LOCK:
            cache = _CACHES.get(routes)
            if cache is None:
                cache = _CACHES[routes] = SchemaCache(routes)
            return cache

    def _route_version(self, topic: str, key: bool) -> int:
        """The highest version the topic's (cached) route shows (0: none shown)."""
        try:
            route = self._routes.route(topic)
        except NotFoundError:
            return 0
        return max(
            (b.key_schema_version if key else b.value_schema_version for b in route.brokers),
            default=0,
        )

    def latest(self, topic: str, key: bool = False) -> Compiled | None:
        """The subject's latest version, None when the topic has no such schema."""
        with self._lock:
            known = self._latest.get((topic, key))
        if known is not None:
            version, read_at = known
            fresh = time.monotonic() - read_at < self.refresh_s
            if fresh and self._route_version(topic, key) <= version:
                return self.get(topic, version, key) if version else None
        try:
            info = schema_admin.get_schema(self._routes, topic, key=key)
        except NotFoundError:
            with self._lock:
                self._latest[(topic, key)] = (0, time.monotonic())
            return None
        self._seen(topic, info.incarnation)
        compiled = self._keep(topic, key, info.versions[0])
        with self._lock:
            self._latest[(topic, key)] = (compiled.version, time.monotonic())
        return compiled

    def get(self, topic: str, version: int, key: bool = False) -> Compiled:
        """Version ``version`` of the subject (NotFoundError if the topic has no such version)."""
        with self._lock:
            compiled = self._versions.get((topic, key, version))
        if compiled is not None:
            return compiled
        info = schema_admin.get_schema(self._routes, topic, version, key=key)
        self._seen(topic, info.incarnation)
        return self._keep(topic, key, info.versions[0])

    def _seen(self, topic: str, incarnation: int) -> None:
        """Forget the topic's versions when a reply shows another incarnation."""
        with self._lock:
            held = self._incarnations.get(topic)
            self._incarnations[topic] = incarnation
        if held is not None and held != incarnation:
            self.forget(topic)

    def _keep(self, topic: str, key: bool, version: pb.SchemaVersion) -> Compiled:
        """The compiled version, compiled once per schema text (a topic deleted and
        recreated numbers from 1 again: the new text replaces the old)."""
        where = (topic, key, version.version)
        with self._lock:
            held = self._versions.get(where)
        if held is not None and held.text == version.schema:
            return held
        compiled = Compiled.of(version)
        with self._lock:
            self._versions[where] = compiled
        return compiled

    def forget(self, topic: str) -> None:
        """Read the topic's schemas again at their next use."""
        with self._lock:
            for k in [k for k in self._versions if k[0] == topic]:
                del self._versions[k]
            for k2 in [k for k in self._latest if k[0] == topic]:
                del self._latest[k2]
            self._incarnations.pop(topic, None)


_CACHES: weakref.WeakKeyDictionary[Routes, SchemaCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


class Serializer:
    """Encode, check and decode one subject's values::

        serializer = Serializer(producer_routes, "orders")
        data, version = serializer.encode({"id": 7, "name": "x"})

    ``version`` 0 encodes with the latest version (looked up at each call,
    through the cache) and decodes to it; another pins that version."""

    def __init__(self, routes: Routes, topic: str, *, key: bool = False, version: int = 0) -> None:
        self.topic = topic
        self.key = key
        self.version = version
        self._cache = SchemaCache.of(routes)

    def schema(self) -> Compiled:
        """The version this serializer writes (NotFoundError without a schema)."""
        if self.version:
            return self._cache.get(self.topic, self.version, self.key)
        latest = self._cache.latest(self.topic, self.key)
        if latest is None:
            raise NotFoundError(
                f"topic {self.topic!r} has no {schema_admin.subject(self.key)} schema"
            )
        return latest

    def encode(self, obj: object, index: int = 0) -> tuple[bytes, int]:
        """``obj`` as bytes of the schema, and its version; SchemaValidationError
        (naming ``index``) when it does not match."""
        schema = self.schema()
        data, problem = schema.encode(obj)
        if problem:
            raise SchemaValidationError(self.topic, index, schema.version, problem, self.key)
        return data, schema.version

    def validate(self, data: bytes, index: int = 0) -> int:
        """The version ``data`` matches; SchemaValidationError when it does not."""
        schema = self.schema()
        problem = schema.problem(data)
        if problem:
            raise SchemaValidationError(self.topic, index, schema.version, problem, self.key)
        return schema.version

    def decode(self, data: bytes, written_with: int | None = None) -> object:
        """The value of ``data``, written with version ``written_with`` (None:
        this serializer's), as this serializer's version reads it (Avro schema
        resolution; JSON: as written)."""
        reader = self.schema()
        if written_with is not None and written_with < 1:
            raise InvalidRequest(f"{self.topic}: the record's schema version header is malformed")
        writer = reader
        if written_with is not None and written_with != reader.version:
            writer = self._cache.get(self.topic, written_with, self.key)
        if writer.type != reader.type:
            raise InvalidRequest(
                f"{self.topic}: version {writer.version} is {writer.type}, this serializer "
                f"reads {reader.type} (version {reader.version})"
            )
        if reader.type == "JSON":
            return strict_json(bytes(data))
        stream = io.BytesIO(data)
        value = fastavro.schemaless_reader(stream, writer.avro, reader.avro)
        if stream.tell() != len(data):
            raise ValueError(f"{len(data) - stream.tell()} bytes left over after the Avro value")
        return value


class ProduceChecks:
    """What ``Producer(validate=True)`` does to a batch before its request is built."""

    def __init__(self, routes: Routes) -> None:
        self._routes = routes
        self._cache = SchemaCache.of(routes)

    def stamp(
        self,
        topic: str,
        values: Sequence[bytes],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Headers] | None,
    ) -> Sequence[Headers] | None:
        """``headers`` with each message's schema versions added, after every
        value (and key, where the topic has a key schema) is checked against
        the latest version; SchemaValidationError naming the first bad one.
        A topic without schemas: ``headers`` unchanged."""
        value_schema = self._cache.latest(topic)
        key_schema = self._cache.latest(topic, key=True) if keys is not None else None
        if value_schema is None and key_schema is None:
            return headers
        value_version = version_header(value_schema.version) if value_schema else b""
        key_version = version_header(key_schema.version) if key_schema else b""
        out: list[Headers] = []
        for i, value in enumerate(values):
            own = [(n, v) for n, v in (headers[i] if headers else ()) if n not in _STAMPS]
            if value_schema is not None:
                _check(topic, value_schema, value, i, False)
                own.append((SCHEMA_HEADER, value_version))
            key = keys[i] if keys is not None else None
            if key_schema is not None and key is not None:  # no key: no key version
                _check(topic, key_schema, key, i, True)
                own.append((KEY_SCHEMA_HEADER, key_version))
            out.append(own)
        return out

    def one(
        self, topic: str, value: object, key: object, headers: Headers
    ) -> tuple[bytes, bytes | None, Headers]:
        """One ``send``'s value and key, encoded when they are objects (with the
        latest version), checked when bytes; headers stamped."""
        data = self._encoded(topic, value, False)
        key_data = None if key is None else self._encoded(topic, key, True)
        stamped = self.stamp(topic, [data], None if key_data is None else [key_data], [headers])
        return data, key_data, (stamped or [headers])[0]

    def _encoded(self, topic: str, obj: object, key: bool) -> bytes:
        if isinstance(obj, bytes | bytearray | memoryview):
            return bytes(obj)
        schema = self._cache.latest(topic, key)
        if schema is None:
            what = schema_admin.subject(key)
            raise TypeError(
                f"{what} must be bytes: topic {topic!r} has no {what} schema to encode "
                f"a {type(obj).__name__} with"
            )
        data, problem = schema.encode(obj)
        if problem:
            raise SchemaValidationError(topic, 0, schema.version, problem, key)
        return data


_STAMPS = (SCHEMA_HEADER, KEY_SCHEMA_HEADER)


def _check(topic: str, schema: Compiled, data: bytes, index: int, key: bool) -> None:
    problem = schema.problem(data)
    if problem:
        raise SchemaValidationError(topic, index, schema.version, problem, key)


def send_one(
    checks: ProduceChecks | None, topic: str, value: object, key: object, headers: Headers
) -> tuple[bytes, bytes | None, Headers]:
    """``Producer.send``'s value, key and headers: through ``checks`` when the
    producer validates; else bytes only (TypeError naming the type)."""
    if checks is not None:
        return checks.one(topic, value, key, headers)
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"value must be bytes, not {type(value).__name__} (Producer(validate=True) "
            f"encodes objects with the topic's schema)"
        )
    return value, key, headers  # type: ignore[return-value]
