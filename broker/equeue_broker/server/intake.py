"""Request intake: how many request bodies are being received at once.

gRPC's aio server receives a unary call's whole request before its handler
runs, for every call that arrives, at once: 24 clients each sending a 20 MiB
produce pinned about 1 GiB before a single handler could refuse anything, and
any unary method (a heartbeat padded to the request limit) would do. HTTP/2
flow control only helps while nobody reads: a stream whose message is not
being received gets a small window (64 KiB) and its sender waits.

So ``IntakeGate`` (the outermost interceptor) serves every unary method as a
request-*streaming* one on the wire - a unary call is a stream of one message
to HTTP/2, so clients notice nothing - and receives each message only after
taking ``max_request_bytes`` (the most it can be) from the
``max_intake_bytes`` budget. Once the message is in, the reservation shrinks
to the message's size, held until the handler returns: a decoded request
waiting for the produce budget still counts, so bodies cannot pile up behind
it. (The one request-streaming method, ProduceStream, is bounded by count:
see ``_gate``.) A sender too
slow to deliver its message within ``request_read_timeout_ms`` gets
DEADLINE_EXCEEDED, so a trickle cannot hold the budget for ever.

Over budget a call waits (``budget_wait_ms``), then gets RESOURCE_EXHAUSTED:
the broker holds at most ``max_intake_bytes`` of unary request bodies being
received or handled, whatever the number of connections and streams. gRPC's
BDP probing must be off (app.py) or the transport widens every stream's
window and reads unrequested bodies anyway.

The gate also applies the per-connection call limit (``CallsPerConnection``,
connections.py) to every call, first: a call over its connection's limit is
refused before it takes any budget.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from equeue_broker.server.budgets import ByteBudget, Held
from equeue_broker.server.connections import CallsPerConnection
from equeue_broker.server.errors import BadRequest, RequestTimeout, abort
from equeue_broker.server.handlers import HandlerCache, MethodHandler, replies

_END = object()


class IntakeGate(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Receives request messages within ``budget`` (module doc)."""

    def __init__(
        self, budget: ByteBudget, max_request_bytes: int, read_timeout_s: float,
        calls: CallsPerConnection,
    ) -> None:  # fmt: skip
        self._budget = budget
        self._max_request = max_request_bytes
        self._timeout_s = read_timeout_s
        self._calls = calls
        """Checked first on every call: one over its connection's limit takes no budget."""
        self._gated = HandlerCache(self._gate)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[MethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> MethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        return self._gated.wrap(details.method, handler)

    async def _receive(self, read: Callable[[], Awaitable[Any]]) -> tuple[Any, Held]:
        """The next message ``read`` returns (``_END`` after the last),
        received within the budget, and the bytes it holds until given back."""
        held = await Held.take(self._budget, self._max_request)
        try:
            # asyncio.timeout, not wait_for: wait_for runs the read as a task of
            # its own, an object and a loop turn more per call (issue 31).
            async with asyncio.timeout(self._timeout_s):
                request = await read()
        except TimeoutError:
            held.release()
            raise RequestTimeout(
                f"the request body did not arrive within {self._timeout_s:g} s"
                " (request_read_timeout_ms); send it faster or in smaller requests"
            ) from None
        except BaseException:
            held.release()
            raise
        if request is grpc.aio.EOF:  # type: ignore[attr-defined]
            request = _END
        held.shrink_to(_size(request))
        return request, held

    async def _only(self, context: Any) -> tuple[Any, Held]:
        """A unary call's one request (the client's stub sends exactly one).
        Read with ``context.read``, not grpc's request iterator: that is a
        generator which, left suspended after one message, keeps it alive
        until the cycle collector runs."""
        request, held = await self._receive(context.read)
        if request is _END:
            held.release()
            raise BadRequest("the call carried no request message")
        return request, held

    def _gate(self, handler: MethodHandler) -> MethodHandler:
        if handler.request_streaming:
            # A stream waits for its client's next message with a read pending:
            # a reservation then would be held while the client is idle (a
            # Spark task between batches), starving every other call. Streams
            # are bounded by count instead (max_produce_streams, one message
            # in receipt each).
            return self._calls.counted(handler)
        return self._gate_unary(handler)

    async def _enter(self, context: Any) -> tuple[str, Any, Held]:
        """A unary call counted in on its connection, then its request received
        (module doc); on failure it is counted out again and ended with its status."""
        try:
            peer = self._calls.enter(context)
        except Exception as exc:  # every error becomes a status; see errors.py
            await abort(context, exc)
        try:
            request, held = await self._only(context)
        except Exception as exc:
            self._calls.leave(peer)
            await abort(context, exc)
        except BaseException:
            self._calls.leave(peer)
            raise
        return peer, request, held

    def _gate_unary(self, handler: MethodHandler) -> MethodHandler:
        """``handler`` served as request-streaming: same wire, gated receive."""
        if handler.response_streaming:
            inner_us = handler.unary_stream

            async def unary_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
                peer, request, held = await self._enter(context)
                held.release()  # a stream's request is small; its replies have their budget
                try:
                    async for reply in replies(inner_us, request, context):
                        yield reply
                finally:
                    self._calls.leave(peer)

            return grpc.stream_stream_rpc_method_handler(
                unary_stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        inner_uu = handler.unary_unary

        async def unary_unary(requests: Any, context: Any) -> Any:
            peer, request, held = await self._enter(context)
            try:
                return await inner_uu(request, context)
            finally:
                held.release()
                self._calls.leave(peer)

        return grpc.stream_unary_rpc_method_handler(
            unary_unary,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _size(request: Any) -> int:
    """The bytes a decoded request pins (its wire size; 0 for the decode
    guard's stand-in for a request that did not parse)."""
    byte_size = getattr(request, "ByteSize", None)
    return int(byte_size()) if byte_size is not None else 0
