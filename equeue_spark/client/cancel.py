"""Cancelling a pending delayed message by its id (docs/client.md, "Delayed delivery").

Apart from delays.py because it reaches a broker through ``Routes``, and
routing.py imports batches.py, which imports delays.py.
"""

from __future__ import annotations

from equeue_proto.protocol import parse_message_id
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.errors import InvalidRequest
from equeue_spark.client.routing import Routes


def cancel_delayed(routes: Routes, message_id: str) -> pb.CancelDelayedReply:
    """``CancelDelayed`` on the master of the broker (group) the id names
    (``Producer.cancel_delayed``, ``Admin.cancel_delayed``)."""
    try:
        parse_message_id(message_id)
    except ValueError as exc:
        raise InvalidRequest(f"{exc}; give the id the delayed send returned") from None
    conn = routes.connection(routes.message_address(message_id))
    request = pb.CancelDelayedRequest(message_id=message_id)
    reply: pb.CancelDelayedReply = conn.call(conn.broker.CancelDelayed, request, retry=True)
    return reply
