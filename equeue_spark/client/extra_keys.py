"""A message's extra keys, sent in its ``keys`` header (``equeue_proto.message_keys``).

The broker indexes a message's key and its extra keys for queries by key
(docs/client.md); ``Producer.send``/``send_batch`` take them as ``extra_keys``.
"""

from __future__ import annotations

from collections.abc import Sequence

from equeue_proto.message_keys import KEYS_HEADER, encode_keys
from equeue_spark.client.batches import Headers


def keyed_headers(
    count: int,
    headers: Sequence[Headers] | None,
    extra_keys: Sequence[Sequence[str | bytes] | None] | None,
) -> Sequence[Headers]:
    """``headers`` with each message's ``keys`` header (message_keys.py) added."""
    if extra_keys is None:
        return headers if headers is not None else [()] * count
    if len(extra_keys) != count or (headers is not None and len(headers) != count):
        raise ValueError(f"give extra_keys (and headers) for each of the {count} messages")
    merged: list[Headers] = []
    for i, extra in enumerate(extra_keys):
        own = list(headers[i]) if headers is not None else []
        if extra:
            if any(name == KEYS_HEADER for name, _ in own):
                raise ValueError(
                    f"message {i} has a {KEYS_HEADER!r} header and extra_keys: give one of them"
                )
            own.append((KEYS_HEADER, encode_keys(extra)))
        merged.append(own)
    return merged
