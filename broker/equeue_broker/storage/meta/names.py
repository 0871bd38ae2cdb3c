"""Validation of topic and consumer-group names.

Topic names become directory names under ``<data_dir>/index/``, so they are
restricted to a charset that can never form a path component such as ``..``
or contain a separator: ASCII letters, digits, ``.``, ``_`` and ``-``, starting
with a letter or digit, at most ``MAX_NAME_LENGTH`` characters (Kafka's charset).
Group names never touch the file system but follow the same rule so that they
can be printed, logged and used in URLs without escaping.
"""

from __future__ import annotations

import re

from equeue_broker.storage.errors import InvalidName
from equeue_proto.retry_topics import DLQ_PREFIX, RESENT_PREFIX, RETRY_PREFIX

MAX_NAME_LENGTH = 128
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
RESERVED_PREFIXES = (RETRY_PREFIX, DLQ_PREFIX, RESENT_PREFIX)
"""A consumer group's retry and dead-letter topics: the prefix and the group's
name (the broker creates them; users cannot, server/retry.py)."""


def validate_name(kind: str, name: object) -> str:
    """Return ``name`` if it is a valid topic/group name, else raise ``InvalidName``.

    ``kind`` ("topic" or "group") is used in the error message.
    """
    if not isinstance(name, str):
        raise InvalidName(f"{kind} name must be a string, got {type(name).__name__}")
    if kind == "topic":
        for prefix in RESERVED_PREFIXES:
            if name.startswith(prefix):  # the group's name follows the group rules
                validate_name("group", name[len(prefix) :])
                return name
    if not name:
        raise InvalidName(f"{kind} name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(
            f"{kind} name {name[:40]!r}... is {len(name)} characters; the limit is "
            f"{MAX_NAME_LENGTH}"
        )
    if not _NAME_RE.fullmatch(name):
        raise InvalidName(
            f"{kind} name {name!r} is invalid: use ASCII letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return name


MAX_TRANSACTION_ID_LENGTH = 255
_TRANSACTION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]*")


def validate_transaction_id(txn_id: object, kind: str = "transaction id") -> str:
    """Validate a transaction id (or, with ``kind``, a sink id or id prefix):
    like a topic name, up to 255 characters, ``:`` and ``@`` also allowed so
    ids can be built from parts. Stage files are named by a hash, never by it."""
    if not isinstance(txn_id, str) or not txn_id:
        raise InvalidName(f"{kind} must be a non-empty string, got {txn_id!r}")
    if len(txn_id) > MAX_TRANSACTION_ID_LENGTH or not _TRANSACTION_ID_RE.fullmatch(txn_id):
        raise InvalidName(
            f"{kind} {txn_id[:80]!r} is invalid: up to {MAX_TRANSACTION_ID_LENGTH} ASCII "
            "letters, digits, '.', '_', '-', ':' and '@', starting with a letter or digit"
        )
    return txn_id


def validate_topic(name: object) -> str:
    """Validate a topic name (see module docstring)."""
    return validate_name("topic", name)


def validate_group(name: object) -> str:
    """Validate a consumer-group name (see module docstring)."""
    return validate_name("group", name)
