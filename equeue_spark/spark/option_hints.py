"""The error for an unknown connector option: the nearest known option, or
the equeue counterpart of a Kafka source option (users coming from Spark's
Kafka source write its names), never echoing a value that looks like a secret.

Pyspark-free.
"""

from __future__ import annotations

import difflib
import re

_SECRET_KEY = re.compile(r"(?i)token|secret|password|key")


_KAFKA_NAMES = {
    "kafka.bootstrap.servers": "broker",
    "kafka.group.id": "group",
    "groupIdPrefix": "group",
    "kafkaConsumer.pollTimeoutMs": "timeoutMs",
    "fetchOffset.numRetries": "timeoutMs",
    "fetchOffset.retryIntervalMs": "timeoutMs",
    "kafka.security.protocol": "tlsCa",
    "kafka.batch.size": "batchSize",
    "kafka.enable.idempotence": "enableIdempotence",
    "kafka.transactional.id": "transactionalId",
    "kafka.acks": "delivery",
}
"""Kafka source options with an equeue counterpart under another name (Kafka's
``subscribe``, ``assign`` ... are accepted as they are): a user coming from
Kafka is pointed at ours."""


_KAFKA_FAMILIES = {
    "kafka.ssl.": "tlsCa, tlsCert and tlsKey (PEM files)",
    "kafka.sasl.": "token (a bearer token)",
    "kafka.isolation.level": "none: equeue readers always read committed records",
}
"""Kafka option names (or prefixes) the unknown-option error answers as a whole."""


def _kafka_family(key: str) -> str:
    for prefix, ours in _KAFKA_FAMILIES.items():
        if key.startswith(prefix):
            return f"; equeue's counterpart of Kafka's {prefix.rstrip('.')} options: {ours}"
    return ""


def unknown_message(key: str, value: str, names: dict[str, str]) -> str:
    """The error for an unknown option: the key as Spark handed it over (lower-cased;
    the spelling the user wrote is gone by then), and the nearest known option in
    its documented spelling (or the equeue counterpart of a near Kafka option)
    when one is close, else the list of known options."""
    kafka = {k.lower(): (k, v) for k, v in _KAFKA_NAMES.items() if v.lower() in names}
    nearest = difflib.get_close_matches(key, [*names, *kafka], n=1, cutoff=0.6)
    # A misspelled token must not be echoed: redacted when the name, or the
    # option it is nearest to ('tokn' -> token), looks like a secret.
    secret = _SECRET_KEY.search(key) or (nearest and _SECRET_KEY.search(nearest[0]))
    shown = "<redacted>" if secret else repr(value)
    message = f"unknown option {key!r} (value {shown}; Spark passes option names lower-cased)"
    if _kafka_family(key):
        return message + _kafka_family(key)
    if nearest and nearest[0] in names:
        return f"{message}; did you mean {names[nearest[0]]!r}?"
    if nearest:
        theirs, ours = kafka[nearest[0]]
        return f"{message}; did you mean {ours!r} (equeue's name for Kafka's {theirs!r})?"
    return f"{message}; the equeue source knows: {', '.join(sorted(names.values()))}"
