"""The schema options of reads and writes: how ``value`` and ``key`` are encoded.

Parsed by ``options.ReadOptions`` / ``options.WriteOptions`` (which list the
names) into one ``FormatOptions``; what each option does is in
docs/spark-formats.md. Pyspark-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from equeue_spark.spark.errors import InvalidOption

FORMATS = ("binary", "string", "avro", "json")
"""``valueFormat``/``keyFormat`` values: bytes as stored, UTF-8 text, or a
struct decoded with the topic's schema."""
SCHEMA_FORMATS = ("avro", "json")
MODES = ("FAILFAST", "PERMISSIVE", "DROPMALFORMED")
EVOLUTION_MODES = ("none", "restart")
MAX_SCHEMA_TEXT = 16 * 1024 * 1024
"""Longest ``valueSchema``/``keySchema`` text accepted."""


@dataclass(frozen=True)
class FormatOptions:
    """How the ``value`` and ``key`` columns are encoded."""

    value_format: str = "binary"
    key_format: str = "binary"
    value_schema_version: int = 0
    """0: the topic's latest version when the query starts."""
    key_schema_version: int = 0
    value_schema: str = ""
    """Option ``valueSchema``: an explicit reader schema (reads only)."""
    key_schema: str = ""
    mode: str = "FAILFAST"
    corrupt_column: str = "_corrupt_record"
    evolution_mode: str = "none"

    @property
    def decodes(self) -> bool:
        """Whether ``value`` or ``key`` is decoded (or encoded) with a schema."""
        return self.value_format in SCHEMA_FORMATS or self.key_format in SCHEMA_FORMATS

    @classmethod
    def parse(
        cls, text: Callable[[str], str], has: Callable[[str], bool], *, write: bool
    ) -> FormatOptions:
        """``text(key)``/``has(key)`` read the lower-cased raw options."""
        value_format = _choice(text, "valueformat", "valueFormat", FORMATS, "binary")
        key_format = _choice(text, "keyformat", "keyFormat", FORMATS, "binary")
        found = cls(
            value_format=value_format,
            key_format=key_format,
            value_schema_version=_version(text, "valueschemaversion", "valueSchemaVersion"),
            key_schema_version=_version(text, "keyschemaversion", "keySchemaVersion"),
        )
        if write:
            return found
        mode = _choice(text, "mode", "mode", MODES, "FAILFAST", upper=True)
        corrupt = text("columnnameofcorruptrecord") or "_corrupt_record"
        if not corrupt.replace("_", "a").isalnum():
            raise _bad("columnNameOfCorruptRecord", corrupt, "use letters, digits and '_'")
        evolution = _choice(text, "schemaevolutionmode", "schemaEvolutionMode",
                            EVOLUTION_MODES, "none")  # fmt: skip
        for key, name in (("valueschema", "valueSchema"), ("keyschema", "keySchema")):
            if len(text(key)) > MAX_SCHEMA_TEXT:
                raise InvalidOption(f"option {name}: longer than {MAX_SCHEMA_TEXT} characters")
        return cls(
            value_format=found.value_format,
            key_format=found.key_format,
            value_schema_version=found.value_schema_version,
            key_schema_version=found.key_schema_version,
            value_schema=text("valueschema"),
            key_schema=text("keyschema"),
            mode=mode,
            corrupt_column=corrupt,
            evolution_mode=evolution,
        )


def _bad(name: str, value: str, why: str) -> InvalidOption:
    return InvalidOption(f"option {name}={value!r}: {why}")


def _choice(
    text: Callable[[str], str],
    key: str,
    name: str,
    allowed: tuple[str, ...],
    default: str,
    *,
    upper: bool = False,
) -> str:
    value = text(key) or default
    word = value.upper() if upper else value.lower()
    if word not in allowed:
        raise _bad(name, value, f"must be one of {', '.join(allowed)}")
    return word


def _version(text: Callable[[str], str], key: str, name: str) -> int:
    value = text(key)
    if not value or value.lower() == "latest":
        return 0
    if not value.isdigit() or not 1 <= int(value) <= 2**31 - 1:
        raise _bad(name, value, "must be latest or a schema version (1, 2, ...)")
    return int(value)
