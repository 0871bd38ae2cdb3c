"""One tokens file for the name-server security tests: a broker token, a
client token, an admin token and one limited to ``orders*`` topics (its name
and roles given by each test file)."""

from __future__ import annotations

BROKER_SECRET = "broker-secret-0123456789"
CLIENT_SECRET = "client-secret-0123456789"
ADMIN_SECRET = "admin-secret-01234567890"
SCOPED_SECRET = "scoped-secret-0123456789"


def tokens_toml(scoped_name: str, scoped_roles: list[str]) -> str:
    """The tokens file (server/tokens.py's format) with these four tokens."""
    roles = ", ".join(f'"{role}"' for role in scoped_roles)
    return f"""
[[tokens]]
name = "brokers"
secret = "{BROKER_SECRET}"
roles = ["broker"]

[[tokens]]
name = "app"
secret = "{CLIENT_SECRET}"
roles = ["produce", "consume"]

[[tokens]]
name = "ops"
secret = "{ADMIN_SECRET}"
roles = ["admin"]

[[tokens]]
name = "{scoped_name}"
secret = "{SCOPED_SECRET}"
roles = [{roles}]
topics = ["orders*"]
"""
