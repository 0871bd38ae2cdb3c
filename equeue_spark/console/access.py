"""Who may use the console (``--tokens-file``): the brokers' token format
(docs/operations.md, "TLS and tokens"), read here because the client side
never imports the broker. A caller sends ``Authorization: Bearer <secret>``;
the console looks it up to decide what to show and whether an admin action
may be tried; the action itself is then made with that same secret, so the
brokers authorize it again and the console never grants more than the token has.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROLES = frozenset({"admin", "produce", "consume", "monitor", "broker"})


@dataclass(frozen=True)
class User:
    name: str
    roles: frozenset[str]
    secret: str
    topics: tuple[str, ...] | None = None
    """fnmatch patterns of the topics the token may use; None = every topic."""

    def may(self, role: str) -> bool:
        return role in self.roles or ("admin" in self.roles and role != "broker")

    def sees(self, topic: str) -> bool:
        """Whether the token's topics include ``topic`` (as the brokers decide)."""
        return self.topics is None or any(fnmatch.fnmatchcase(topic, p) for p in self.topics)


class TokensError(ValueError):
    """A tokens file the console cannot use: names the file and the entry."""


class Tokens:
    """``{sha256 of secret: (name, roles)}`` from a tokens file."""

    def __init__(
        self, entries: dict[str, tuple[str, frozenset[str], tuple[str, ...] | None]]
    ) -> None:
        self._by_hash = entries

    @classmethod
    def load(cls, path: str | Path) -> Tokens:
        try:
            document = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise TokensError(f"cannot read --tokens-file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise TokensError(f"--tokens-file {path} is not TOML: {exc}") from None
        entries: dict[str, tuple[str, frozenset[str], tuple[str, ...] | None]] = {}
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
            topics = entry.get("topics")
            if topics is not None and (
                not isinstance(topics, list) or not all(isinstance(t, str) for t in topics)
            ):
                raise TokensError(f"{where} ({name}): topics must be a list of patterns")
            entries[digest] = (
                name,
                frozenset(roles),
                tuple(topics) if topics is not None else None,
            )
        return cls(entries)

    def lookup(self, secret: str) -> User | None:
        digest = hashlib.sha256(secret.encode()).hexdigest()
        for known, (name, roles, topics) in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return User(name, roles, secret, topics)
        return None


def bearer(header: str | None) -> str | None:
    """The secret of an ``Authorization: Bearer`` header; None without one."""
    if not header:
        return None
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    return secret.strip()


SESSION_COOKIE = "equeue_session"
SESSION_IDLE_S = 8 * 3600.0
MAX_SESSIONS = 10_000
"""Sessions kept at most (the oldest is dropped past it): every resource a
client can make the console hold has a limit."""


class Sessions:
    """Browser sessions made by ``POST /api/v1/login``: a random id (in an
    HttpOnly, SameSite=Strict cookie) for a ``User``, forgotten after
    ``SESSION_IDLE_S`` without use; in memory only."""

    def __init__(self, idle_s: float = SESSION_IDLE_S, limit: int = MAX_SESSIONS) -> None:
        self.idle_s = idle_s
        self.limit = limit
        self._sessions: dict[str, tuple[User, float]] = {}

    def create(self, user: User, now: float) -> str:
        self._expire(now)
        while len(self._sessions) >= self.limit:
            del self._sessions[next(iter(self._sessions))]
        session = secrets.token_urlsafe(32)
        self._sessions[session] = (user, now)
        return session

    def lookup(self, session: str | None, now: float) -> User | None:
        found = self._sessions.get(session or "")
        if found is None or now - found[1] > self.idle_s:
            return None
        assert session is not None
        self._sessions[session] = (found[0], now)
        return found[0]

    def drop(self, session: str | None) -> None:
        self._sessions.pop(session or "", None)

    def _expire(self, now: float) -> None:
        for session in [s for s, (_, used) in self._sessions.items() if now - used > self.idle_s]:
            del self._sessions[session]
