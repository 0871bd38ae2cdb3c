"""The decode stage of a read task: raw batches in, the query's batches out.

The read task (read_task.py) yields batches of the raw schema (arrow.py's
columns, ``value``/``key`` binary, plus ``headers``); ``Decoder.batch`` turns
each into a batch of the query's Arrow schema, column-wise:

1. the writer version of every record from its ``equeue.schema`` /
   ``equeue.key-schema`` header (pyarrow.compute over the headers column; no
   Python per record): absent -> null (decoded with the reader's version),
   not a number -> a corrupt record;
2. per distinct version (usually one), the writer schema from the broker
   (cached per worker process: versions are immutable) and one decode call
   over those rows (Avro: ``avro_arrow.decode_avro`` resolving writer to
   reader; JSON: ``json_arrow.decode_json``); rows of several versions are
   put back in order with one ``take``;
3. the mode: FAILFAST raises ``CorruptRecordError`` at the first bad row,
   PERMISSIVE nulls it and fills the corrupt column, DROPMALFORMED drops it
   (``Decoder.finish`` logs how many, once per task).

Pyspark-free.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from equeue_proto.schema_rules import KEY_SCHEMA_HEADER, SCHEMA_HEADER
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.admin import Admin
from equeue_spark.client.connection import ClientConfig
from equeue_spark.client.errors import NotFoundError
from equeue_spark.spark.errors import CorruptRecordError, SchemaChanged
from equeue_spark.spark.format_options import FormatOptions
from equeue_spark.spark.formats import DecodePlan, PartPlan, WriterSchema, raw_schema, resolve_plan
from equeue_spark.spark.json_arrow import decode_json
from equeue_spark.spark.read_task import QueueRange, read_range

log = logging.getLogger("equeue.spark")

ABSENT = -1
MALFORMED = -2
MAX_VERSION = 2**31 - 1
MAX_WRITERS = 4096
MISSING_S = 10.0
_TYPE_NAMES: dict[int, str] = {pb.SCHEMA_TYPE_AVRO: "AVRO", pb.SCHEMA_TYPE_JSON: "JSON"}
HINT = "mode=PERMISSIVE keeps such records in {column}"

WriterLookup = Callable[[str, int, bool], WriterSchema | None]
"""``lookup(topic, version, key)``: the writer schema, None when the broker
has no such version."""


@dataclass
class Bad:
    """A record that did not decode."""

    row: int
    part: str
    version: int | None
    reason: str


class WriterCache:
    """Writer schemas of this worker process, by (target, topic, subject,
    version): versions are immutable, so they are fetched once. At most
    MAX_WRITERS entries (then it starts over)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found: dict[tuple[str, str, bool, int], WriterSchema] = {}

    def get(
        self, target: str, topic: str, version: int, key: bool, fetch: WriterLookup
    ) -> WriterSchema | None:
        ident = (target, topic, key, version)
        with self._lock:
            if ident in self._found:
                return self._found[ident]
        found = fetch(topic, version, key)
        if found is None:  # not cached: a replica may get the version later
            return None
        with self._lock:
            if len(self._found) >= MAX_WRITERS:
                self._found.clear()
            self._found[ident] = found
        return found


WRITERS = WriterCache()


class Decoder:
    """Decodes one task's raw batches into ``schema`` (the query's Arrow schema)."""

    def __init__(
        self,
        plan: DecodePlan,
        schema: pa.Schema,
        where: str,
        lookup: WriterLookup,
    ) -> None:
        self.plan = plan
        self.schema = schema
        self.where = where
        """The queue as errors name it (``QueueRange.queue``)."""
        self.lookup = lookup
        self.dropped = 0
        self.first_dropped: int | None = None
        self.missing: dict[tuple[str, bool, int], float] = {}
        """Versions the broker did not have, and when it said so: asked again
        after MISSING_S (a replica may get a version late), not per batch:
        records with many distinct unknown versions would cost an RPC each."""

    def batch(self, raw: pa.RecordBatch) -> pa.RecordBatch:
        if raw.num_rows == 0:
            return pa.RecordBatch.from_pylist([], schema=self.schema)
        columns = {name: raw.column(name) for name in raw.schema.names}
        bad: list[Bad] = []
        for part in self.plan.parts:
            decoded, versions, part_bad = self._part(part, raw)
            columns[part.part] = decoded
            if versions is not None:
                columns[part.version_column] = versions
            bad.extend(part_bad)
        bad.sort(key=lambda b: (b.row, b.part != "value"))
        if bad and self.plan.mode == "FAILFAST":
            raise self._error(raw, bad[0])
        keep: np.ndarray | None = None
        if bad and self.plan.mode == "DROPMALFORMED":
            keep = np.ones(raw.num_rows, dtype=bool)
            keep[[b.row for b in bad]] = False
            self.dropped += int((~keep).sum())
            if self.first_dropped is None:
                self.first_dropped = int(raw.column("offset")[bad[0].row].as_py())
        if self.plan.permissive:
            name = self.plan.corrupt_column
            columns[name] = _corrupt_column(raw, bad, self.schema.field(name).type)
        out = pa.RecordBatch.from_arrays(
            [_as(columns[f.name], f.type) for f in self.schema], schema=self.schema
        )
        return out if keep is None else out.filter(pa.array(keep))

    def finish(self) -> None:
        """One warning per task for the records DROPMALFORMED dropped."""
        if self.dropped:
            log.warning(
                "equeue read %s: dropped %d records that do not decode (mode=DROPMALFORMED), "
                "the first at offset %s",
                self.where, self.dropped, self.first_dropped,
            )  # fmt: skip

    # -- one column -----------------------------------------------------------

    def _part(
        self, part: PartPlan, raw: pa.RecordBatch
    ) -> tuple[pa.Array, pa.Array | None, list[Bad]]:
        values = raw.column(part.part)
        target = self.schema.field(part.part).type
        if part.format == "string":
            decoded, reasons = _utf8(values)
            return decoded, None, [Bad(r, part.part, None, why) for r, why in reasons]
        versions = header_versions(
            raw.column("headers"), KEY_SCHEMA_HEADER if part.part == "key" else SCHEMA_HEADER
        )
        self._check_evolution(part, versions, raw)
        decoded, bad = self._by_version(part, raw, values, versions, target)
        version_col = pa.array(np.where(versions < 0, 0, versions), type=pa.int32(),
                               mask=versions < 0)  # fmt: skip
        return decoded, version_col, bad

    def _check_evolution(self, part: PartPlan, versions: np.ndarray, raw: pa.RecordBatch) -> None:
        if self.plan.evolution_mode != "restart" or not raw.num_rows:
            return
        mine = part.reader_version(_topic(raw))
        if not mine:  # an explicit reader schema: no newer version
            return
        newer = np.nonzero(versions > mine)[0]
        if len(newer):
            row = int(newer[0])
            raise SchemaChanged(
                f"{self.where} offset {_offset(raw, row)}: {part.part} written with schema "
                f"version {int(versions[row])}, newer than the query's version {mine} "
                f"(schemaEvolutionMode=restart): restart the query to read with version "
                f"{int(versions[row])}"
            )

    def _by_version(
        self,
        part: PartPlan,
        raw: pa.RecordBatch,
        values: pa.Array,
        versions: np.ndarray,
        target: pa.StructType,
    ) -> tuple[pa.Array, list[Bad]]:
        n = len(values)
        distinct = np.unique(versions)
        pieces: list[pa.Array] = []
        rows: list[np.ndarray] = []
        bad: list[Bad] = []
        topic = _topic(raw)
        for version in distinct.tolist():
            idx = np.nonzero(versions == version)[0] if len(distinct) > 1 else np.arange(n)
            subset = values if len(distinct) == 1 else values.take(pa.array(idx))
            decoded, reasons = self._decode(part, topic, int(version), subset, target)
            label = None if version == ABSENT else int(version)
            bad.extend(Bad(int(idx[r]), part.part, label, why) for r, why in reasons)
            pieces.append(decoded)
            rows.append(idx)
        if len(pieces) == 1:
            return pieces[0], bad
        order = np.concatenate(rows)
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = np.arange(n)
        return pa.concat_arrays(pieces).take(pa.array(inverse)), bad

    def _decode(
        self, part: PartPlan, topic: str, version: int, values: pa.Array, target: pa.StructType
    ) -> tuple[pa.Array, list[tuple[int, str]]]:
        everyone = range(len(values))
        if version == MALFORMED:
            header = KEY_SCHEMA_HEADER if part.part == "key" else SCHEMA_HEADER
            return pa.nulls(len(values), target), [(i, f"header {header} is not a version number")
                                                   for i in everyone]  # fmt: skip
        writer = self._writer(part, topic, version)
        if writer is None:
            return pa.nulls(len(values), target), [
                (i, f"the broker has no {part.part} schema version {version} for topic {topic}")
                for i in everyone
            ]
        if part.type == "JSON":
            return decode_json(values, target)
        from equeue_spark.spark.avro_arrow import decode_avro

        try:
            return decode_avro(values, writer.text, part.reader, target)
        except ValueError as exc:  # the writer cannot be resolved to the reader
            reason = f"version {version} cannot be read with the query's schema: {exc}"
            return pa.nulls(len(values), target), [(i, reason) for i in everyone]

    def _writer(self, part: PartPlan, topic: str, version: int) -> WriterSchema | None:
        if version == ABSENT:  # no header: as written with the reader's version
            return WriterSchema(part.version, part.type, part.reader, "")
        if version == part.reader_version(topic):  # this topic's number for the reader
            return WriterSchema(version, part.type, part.reader, "")
        ident = (topic, part.part == "key", version)
        now = time.monotonic()
        if now - self.missing.get(ident, -MISSING_S) < MISSING_S:
            return None
        found = self.lookup(topic, version, part.part == "key")
        if found is None and len(self.missing) < MAX_WRITERS:
            self.missing[ident] = now
        return found

    def _error(self, raw: pa.RecordBatch, bad: Bad) -> CorruptRecordError:
        mid = raw.column("message_id")[bad.row].as_py()
        part = self.plan.part(bad.part)
        kind = "UTF-8" if part is None or part.format == "string" else part.type
        written = (
            "" if part is None or part.format == "string"
            else " without a schema version header" if bad.version is None
            else " with a malformed schema version header" if bad.version == MALFORMED
            else f" with schema version {bad.version}"
        )  # fmt: skip
        hint = HINT.format(column=self.plan.corrupt_column)
        return CorruptRecordError(
            f"{self.where} offset {_offset(raw, bad.row)} (message id {mid}): {bad.part} "
            f"written{written} does not decode as {kind}: {bad.reason}; {hint}"
        )


def _topic(raw: pa.RecordBatch) -> str:
    """The topic of a raw batch (a read task reads one queue of one topic)."""
    return str(raw.column("topic")[0].as_py()) if raw.num_rows else ""


def _offset(raw: pa.RecordBatch, row: int) -> int:
    return int(raw.column("offset")[row].as_py())


def header_versions(headers: pa.Array, name: str) -> np.ndarray:
    """Each row's version from header ``name`` as int64: ABSENT when it has
    none, MALFORMED when it is not 1-10 ASCII digits in range; the last such
    header of a row counts."""
    n = len(headers)
    versions = np.full(n, ABSENT, dtype=np.int64)
    if n == 0:
        return versions
    entries = pc.list_flatten(headers)
    parents = pc.list_parent_indices(headers)
    if len(entries) == 0:
        return versions
    mask = pc.equal(entries.field("key"), name)
    mask = pc.fill_null(mask, False)
    if not pc.any(mask).as_py():
        return versions
    rows = parents.filter(mask).to_numpy(zero_copy_only=False)
    texts = entries.field("value").filter(mask)
    # A batch holds a few distinct header values: each parsed once.
    distinct = pc.unique(texts)
    numbers = np.array([_version(v) for v in distinct.to_pylist()], dtype=np.int64)
    parsed = numbers[pc.index_in(texts, value_set=distinct).to_numpy(zero_copy_only=False)]
    versions[rows] = parsed
    return versions


def _version(text: bytes | None) -> int:
    if text is None or not 1 <= len(text) <= 10 or not text.isdigit():
        return MALFORMED
    number = int(text)
    return number if 1 <= number <= MAX_VERSION else MALFORMED


def _utf8(values: pa.Array) -> tuple[pa.Array, list[tuple[int, str]]]:
    """``values`` as strings; invalid UTF-8 rows null and reported."""
    try:
        return values.cast(pa.string()), []
    except pa.ArrowInvalid:
        pass
    rows: list[str | None] = []
    bad: list[tuple[int, str]] = []
    for i, value in enumerate(values.to_pylist()):
        try:
            rows.append(None if value is None else value.decode("utf-8"))
        except UnicodeDecodeError as exc:
            rows.append(None)
            bad.append((i, f"not UTF-8 at byte {exc.start}"))
    return pa.array(rows, type=pa.string()), bad


def _corrupt_column(raw: pa.RecordBatch, bad: list[Bad], kind: pa.DataType) -> pa.Array:
    """One entry per bad row (its first bad part), null elsewhere."""
    first: dict[int, Bad] = {}
    for b in bad:
        first.setdefault(b.row, b)
    if not first:
        return pa.nulls(raw.num_rows, kind)
    entries: list[dict[str, object] | None] = [None] * raw.num_rows
    for row, b in first.items():
        value = raw.column(b.part)[row].as_py()
        entries[row] = {"part": b.part, "bytes": value, "error": b.reason}
    return pa.array(entries, type=kind)


def _as(array: pa.Array, kind: pa.DataType) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return array if array.type == kind else array.cast(kind)


def decode_batches(batches: Iterator[pa.RecordBatch], decoder: Decoder) -> Iterator[pa.RecordBatch]:
    """``decoder`` over a task's raw batches, with its warning at the end."""
    try:
        for raw in batches:
            out = decoder.batch(raw)
            if out.num_rows:
                yield out
    finally:
        decoder.finish()


class SchemaSource:
    """Schemas from the broker (or cluster) of a query, through one ``Admin``
    opened on first use; ``close`` when done."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.target = f"{config.broker}|{','.join(config.namesrv)}"
        self._admin: Admin | None = None

    def fetch(self, topic: str, version: int, key: bool) -> WriterSchema:
        """``version`` (0: latest) of the topic's value or key schema;
        the client's ``NotFoundError`` when there is none."""
        if self._admin is None:
            self._admin = Admin(config=self.config)
        info = self._admin.get_schema(topic, version, key=key)
        if not info.versions:
            raise NotFoundError(f"topic {topic} has no {'key' if key else 'value'} schema")
        found = info.versions[-1]
        return WriterSchema(
            int(found.version), _TYPE_NAMES.get(int(found.type), "?"), found.schema,
            found.fingerprint,
        )  # fmt: skip

    def lookup(self, topic: str, version: int, key: bool) -> WriterSchema | None:
        """The writer schema of a record (cached per process), None when unknown."""

        def fetch(t: str, v: int, k: bool) -> WriterSchema | None:
            try:
                return self.fetch(t, v, k)
            except NotFoundError:
                return None

        return WRITERS.get(self.target, topic, version, key, fetch)

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None


def read_decoded(
    part: QueueRange, schema: pa.Schema, config: ClientConfig, plan: DecodePlan
) -> Iterator[pa.RecordBatch]:
    """The records of ``part`` read raw (binary value/key, headers) and
    decoded into ``schema`` (the query's Arrow schema)."""
    schemas = SchemaSource(config)
    decoder = Decoder(plan, schema, part.queue, schemas.lookup)
    try:
        yield from decode_batches(read_range(part, raw_schema()), decoder)
    finally:
        schemas.close()


def driver_plan(
    formats: FormatOptions, topics: tuple[str, ...], config: ClientConfig, include_headers: bool
) -> DecodePlan | None:
    """The query's decode plan (formats.resolve_plan), reader schemas
    fetched from the broker now; None for binary both."""
    if formats.value_format == "binary" and formats.key_format == "binary":
        return None
    schemas = SchemaSource(config)
    try:
        return resolve_plan(formats, topics or None, schemas.fetch, include_headers=include_headers)
    finally:
        schemas.close()
