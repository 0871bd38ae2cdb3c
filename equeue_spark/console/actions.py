"""Admin actions (design30 2.6): reset a group's offsets, resend or purge its
dead letters, add queues to a topic. Each is one ``Admin`` call made with the
caller's own token (web.py builds that ``Admin``), so the brokers authorize
it again; this module checks the request body and words the result.
Blocking: web.py runs these in a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from equeue_spark.client.admin import Admin

log = logging.getLogger("equeue.console.actions")

Body = dict[str, Any]


class BadAction(ValueError):
    """A request body that does not describe the action: says which field."""


def _str_list(body: Body, name: str) -> list[str]:
    value = body.get(name)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise BadAction(f"{name} must be a list of message ids")
    return value


def reset_offsets(admin: Admin, group: str, body: Body) -> Body:
    """``{"topic": T, "to": "earliest"|"latest"|{"timestamp_ms": N}|{"offsets": {q: o}},
    "broker": B}``."""
    topic = body.get("topic")
    if not isinstance(topic, str) or not topic:
        raise BadAction('give the topic to reset: {"topic": ..., "to": "earliest"}')
    to = body.get("to")
    broker = body.get("broker", "")
    if not isinstance(broker, str):
        raise BadAction("broker must be a string")
    if to in ("earliest", "latest"):
        info = admin.reset_offsets(group, topic, to=str(to), broker=broker)
    elif isinstance(to, dict) and isinstance(to.get("timestamp_ms"), int):
        info = admin.reset_offsets(group, topic, timestamp_ms=to["timestamp_ms"], broker=broker)
    elif isinstance(to, dict) and isinstance(to.get("offsets"), dict):
        try:
            offsets = {int(q): int(o) for q, o in to["offsets"].items()}
        except (TypeError, ValueError):
            raise BadAction("offsets must map queue ids to offsets, integers") from None
        info = admin.reset_offsets(group, topic, offsets=offsets, broker=broker)
    else:
        raise BadAction(
            'to must be "earliest", "latest", {"timestamp_ms": N} or {"offsets": {queue: offset}}'
        )
    return {"group": group, "topic": topic, "total_lag": info.total_lag}


def resend_dead_letters(admin: Admin, group: str, body: Body) -> Body:
    """``{"ids": [...]}`` or ``{"all": true}``."""
    if body.get("all") is True:
        reply = admin.resend_dead_letters(group, all=True)
    else:
        reply = admin.resend_dead_letters(group, _str_list(body, "ids"))
    return {
        "group": group,
        "resent": reply.resent,
        "already_resent": reply.already_resent,
        "not_found": list(reply.not_found),
        "new_message_ids": list(reply.new_message_ids),
    }


def purge_dead_letters(admin: Admin, group: str, body: Body) -> Body:
    """``{"confirm": "<group>"}``: the group's name typed again."""
    if body.get("confirm") != group:
        raise BadAction(f'purging deletes every dead letter: confirm with {{"confirm": "{group}"}}')
    return {"group": group, "purged": admin.purge_dead_letters(group)}


def add_queues(admin: Admin, topic: str, body: Body) -> Body:
    """``{"count": N, "broker": B}`` (broker: one broker group; default every one of the topic)."""
    count = body.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1024:
        raise BadAction("count must be an integer from 1 to 1024")
    broker = body.get("broker")
    if broker is not None and not isinstance(broker, str):
        raise BadAction("broker must be a string")
    info = admin.add_queues(topic, count, [broker] if broker else None)
    return {"topic": topic, "queue_count": len(info.queues)}


Action = Callable[[Admin, str, Body], Body]
ACTIONS: dict[str, Action] = {
    "reset": reset_offsets,
    "dlq_resend": resend_dead_letters,
    "dlq_purge": purge_dead_letters,
    "add_queues": add_queues,
}
