"""The access-token file: its format, the roles, and looking a secret up.

Shared by the broker (auth.py authorizes its calls with it) and the name
server (namesrv/auth.py): one format, one parser. A tokens document is TOML::

    [[tokens]]
    name = "etl"                      # unique; what logs and errors show, never the secret
    sha256 = "9f86d081884c7d65..."    # hex SHA-256 of the secret (or: secret = "...")
    roles = ["produce", "consume"]    # any of admin, produce, consume, monitor, broker
    topics = ["orders*", "audit"]     # optional fnmatch patterns; default: every topic

Callers send the secret as ``authorization: Bearer <secret>`` metadata
(``bearer``). What each role allows is each server's (auth.py,
namesrv/auth.py); ``admin`` has every role but ``broker``. ``monitor`` reads
figures and never message contents nor anything that writes (dashboards,
metrics scrapers, the console's poller).

This module loads neither the storage engine nor the broker's errors (the
name server imports it).
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import tomllib
from dataclasses import dataclass
from typing import Any, Self

ROLES = ("admin", "produce", "consume", "monitor", "broker")
BROKER_ROLE = "broker"
"""A broker's token to its name servers; ``admin`` does not imply it."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""Token names: they prefix the token's transaction ids (auth.py, ``namespace_transactions``)."""
MAX_TOKENS = 10_000


class TokenFileError(ValueError):
    """A tokens document that is not valid: names the source and the entry."""


@dataclass(frozen=True)
class Principal:
    """Who a valid token speaks for."""

    name: str
    roles: frozenset[str]
    topics: tuple[str, ...] | None
    """fnmatch patterns; None = every topic."""

    def may(self, role: str) -> bool:
        """Whether the token has ``role``: ``admin`` has every role but ``broker``
        (an operator's token does not speak for a broker to name servers)."""
        return role in self.roles or ("admin" in self.roles and role != BROKER_ROLE)

    def may_use_topic(self, topic: str) -> bool:
        return self.topics is None or any(fnmatch.fnmatchcase(topic, p) for p in self.topics)

    def check_topic(self, topic: str) -> None:
        """PERMISSION_DENIED (the broker's ``PermissionDenied``) unless the token
        covers ``topic``."""
        if not self.may_use_topic(topic):
            # Imported here: the name server loads this module without the
            # broker's errors (storage's hierarchy); only the broker calls this.
            from equeue_broker.server.errors import PermissionDenied

            raise PermissionDenied(f"token {self.name!r} may not use topic {topic!r}")

    def sees_every_transaction(self) -> bool:
        """Only an admin token for every topic works outside its own transaction
        namespace: a topic-scoped admin could otherwise abort or fence other
        teams' transactions."""
        return "admin" in self.roles and self.topics is None


class TokenTable:
    """Secrets (by SHA-256) to principals."""

    error: type[Exception] = TokenFileError
    """What ``parse`` raises (the broker's table, auth.py: ``TokenFileError``)."""

    def __init__(self, principals: dict[str, Principal]) -> None:
        self._by_digest = principals

    def __len__(self) -> int:
        return len(self._by_digest)

    @classmethod
    def parse(cls, text: str, source: str) -> Self:
        """Parse a tokens document; ``cls.error`` naming ``source`` and the entry."""
        try:
            return cls(_parse(text, source))
        except TokenFileError as exc:
            raise cls.error(str(exc)) from None

    def lookup(self, secret: str) -> Principal | None:
        # Looked up by digest: what an attacker varies (the secret) is not what
        # the dict compares, so response times say nothing about a near miss.
        return self._by_digest.get(hashlib.sha256(secret.encode()).hexdigest())


def _parse(text: str, source: str) -> dict[str, Principal]:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TokenFileError(f"{source}: not valid TOML: {exc}") from None
    entries = document.get("tokens")
    unknown = sorted(set(document) - {"tokens"})
    if unknown or not isinstance(entries, list) or not entries:
        raise TokenFileError(f"{source}: expected one or more [[tokens]] tables only")
    if len(entries) > MAX_TOKENS:
        raise TokenFileError(f"{source}: {len(entries)} tokens; the limit is {MAX_TOKENS}")
    principals: dict[str, Principal] = {}
    names: set[str] = set()
    for n, entry in enumerate(entries):
        digest, principal = _parse_entry(entry, f"{source}: token {n + 1}")
        if digest in principals:
            raise TokenFileError(f"{source}: token {principal.name!r} repeats another's secret")
        # A name is a transaction namespace (``<name>@``) and what logs and
        # errors show: two tokens sharing one could commit each other's work.
        if principal.name in names:
            raise TokenFileError(
                f"{source}: token {n + 1}: the name {principal.name!r} is already taken "
                "by another token; give each token its own name"
            )
        names.add(principal.name)
        principals[digest] = principal
    return principals


def _parse_entry(entry: Any, where: str) -> tuple[str, Principal]:
    if not isinstance(entry, dict):
        raise TokenFileError(f"{where}: not a table")
    unknown = sorted(set(entry) - {"name", "sha256", "secret", "roles", "topics"})
    if unknown:
        raise TokenFileError(f"{where}: unknown keys {', '.join(unknown)}")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise TokenFileError(f"{where}: give a name of 1-64 ASCII letters, digits, '.', '_', '-'")
    secret, digest = entry.get("secret"), entry.get("sha256")
    if (secret is None) == (digest is None):
        raise TokenFileError(f"{where} ({name!r}): give exactly one of secret and sha256")
    if secret is not None:
        if not isinstance(secret, str) or len(secret) < 16:
            raise TokenFileError(f"{where} ({name!r}): a secret needs at least 16 characters")
        digest = hashlib.sha256(secret.encode()).hexdigest()
    elif not isinstance(digest, str) or len(digest) != 64 or not _is_hex(digest):
        raise TokenFileError(f"{where} ({name!r}): sha256 must be 64 hex digits")
    roles = entry.get("roles")
    if not isinstance(roles, list) or not roles or not set(roles) <= set(ROLES):
        raise TokenFileError(f"{where} ({name!r}): roles must be a list from {', '.join(ROLES)}")
    topics = entry.get("topics")
    if topics is not None and (
        not isinstance(topics, list) or not all(isinstance(t, str) and t for t in topics)
    ):
        raise TokenFileError(f"{where} ({name!r}): topics must be a list of patterns")
    return digest.lower(), Principal(
        name, frozenset(roles), None if topics is None else tuple(topics)
    )


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


def bearer(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return None
