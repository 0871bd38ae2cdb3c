"""Who may use the console (``--tokens-file``): the brokers' token format
(docs/operations.md, "TLS and tokens"), read here because the client side
never imports the broker. A caller sends ``Authorization: Bearer <secret>``;
the console looks it up to decide what to show and whether an admin action
may be tried; the action itself is then made with that same secret, so the
brokers authorize it again and the console never grants more than the token has.
"""

from __future__ import annotations

import hashlib
import hmac
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROLES = frozenset({"admin", "produce", "consume", "monitor", "broker"})


@dataclass(frozen=True)
class User:
    name: str
    roles: frozenset[str]
    secret: str

    def may(self, role: str) -> bool:
        return role in self.roles or ("admin" in self.roles and role != "broker")


class TokensError(ValueError):
    """A tokens file the console cannot use: names the file and the entry."""


class Tokens:
    """``{sha256 of secret: (name, roles)}`` from a tokens file."""

    def __init__(self, entries: dict[str, tuple[str, frozenset[str]]]) -> None:
        self._by_hash = entries

    @classmethod
    def load(cls, path: str | Path) -> Tokens:
        try:
            document = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise TokensError(f"cannot read --tokens-file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise TokensError(f"--tokens-file {path} is not TOML: {exc}") from None
        entries: dict[str, tuple[str, frozenset[str]]] = {}
        for i, entry in enumerate(document.get("tokens", [])):
            where = f"--tokens-file {path}, tokens[{i}]"
            name = entry.get("name")
            roles = entry.get("roles")
            if not isinstance(name, str) or not name:
                raise TokensError(f"{where}: give a name")
            if not isinstance(roles, list) or not set(roles) <= ROLES or not roles:
                raise TokensError(f"{where} ({name}): roles must be some of {sorted(ROLES)}")
            if isinstance(entry.get("sha256"), str):
                digest = entry["sha256"].lower()
            elif isinstance(entry.get("secret"), str):
                digest = hashlib.sha256(entry["secret"].encode()).hexdigest()
            else:
                raise TokensError(f'{where} ({name}): give sha256 = "..." or secret = "..."')
            entries[digest] = (name, frozenset(roles))
        return cls(entries)

    def lookup(self, secret: str) -> User | None:
        digest = hashlib.sha256(secret.encode()).hexdigest()
        for known, (name, roles) in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return User(name, roles, secret)
        return None


def bearer(header: str | None) -> str | None:
    """The secret of an ``Authorization: Bearer`` header; None without one."""
    if not header:
        return None
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    return secret.strip()
