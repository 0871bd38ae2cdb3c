"""A message's extra keys: the ``keys`` header (RocketMQ's KEYS property).

A message's keys are its key (the record's key field) and the keys listed in
its ``keys`` header, separated by one space byte. The broker indexes all of
them for queries by key (broker.proto, "Keys and queries"); filters read them
as the ``keys`` identifier. The client encodes the header here, the broker
splits it here: one definition for both sides.
"""

from __future__ import annotations

from collections.abc import Iterable

KEYS_HEADER = "keys"
"""The header holding a message's extra keys."""
SEPARATOR = b" "
MAX_EXTRA_KEYS = 32
"""Extra keys one message may carry (the broker indexes at most this many)."""


def encode_keys(keys: Iterable[bytes | str]) -> bytes:
    """The ``keys`` header value for these extra keys. ValueError for an empty
    key, a key holding a space (the separator), or more than MAX_EXTRA_KEYS."""
    encoded = [k.encode() if isinstance(k, str) else bytes(k) for k in keys]
    if len(encoded) > MAX_EXTRA_KEYS:
        raise ValueError(
            f"{len(encoded)} extra keys given: a message may carry at most {MAX_EXTRA_KEYS}"
        )
    for key in encoded:
        if not key:
            raise ValueError("an extra key is empty: give non-empty keys")
        if SEPARATOR in key:
            raise ValueError(f"extra key {key!r} holds a space, which separates keys: remove it")
    return SEPARATOR.join(encoded)


def split_keys(value: bytes, limit: int = MAX_EXTRA_KEYS) -> list[bytes]:
    """The extra keys in a ``keys`` header value, at most ``limit`` (empty
    parts, e.g. from two spaces in a row, are skipped)."""
    return [k for k in bytes(value).split(SEPARATOR) if k][:limit]
