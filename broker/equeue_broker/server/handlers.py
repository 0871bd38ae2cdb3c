"""Wrapping gRPC method handlers in interceptors: request decoding that cannot
fail silently (``DecodeGuard``) and rebuilding a handler around new behaviour
(``rebuild``, which the auth interceptor uses too). A rebuilt handler also lets
replies the servicer encoded itself (``bytes``, see wire.py) past the serializer.

grpc decodes a request before any handler runs; when that fails it answers
UNKNOWN (unary calls) or the handler sees an exception of grpc's own. The
guard decodes instead, turning a request that does not parse as its message
type (corrupt wire format, invalid UTF-8 in a string field) into INVALID_ARGUMENT
through ``errors.status_for``, like every other bad value.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from equeue_broker.server.errors import BadRequest, abort

MethodHandler = Any
"""A ``grpc.RpcMethodHandler`` of an aio server (grpc-stubs types only sync ones)."""


class HandlerCache:
    """An interceptor's wrapped handler per method, built once and reused while
    the handler it wraps is the same object (on a master without tokens it
    always is: DecodeGuard caches its own per method). Building one per call
    (closures and a new ``RpcMethodHandler``) was a measurable part of a
    call's cost (issue 31). At most one entry per method the servicers serve."""

    def __init__(self, make: Callable[[MethodHandler], MethodHandler]) -> None:
        self._make = make
        self._cache: dict[str, tuple[MethodHandler, MethodHandler]] = {}

    def wrap(self, method: str, handler: MethodHandler) -> MethodHandler:
        cached = self._cache.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._make(handler)
        self._cache[method] = (handler, wrapped)  # the method's last: another call may differ
        return wrapped


def rebuild(
    handler: MethodHandler,
    unary_response: Any = None,
    streaming_response: Any = None,
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> MethodHandler:
    """A method handler of ``handler``'s kind and serializers running the given
    behaviour (``unary_response`` or ``streaming_response``, as the kind needs)."""
    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(
        streaming_response if handler.response_streaming else unary_response,
        request_deserializer=request_deserializer or handler.request_deserializer,
        response_serializer=_pre_encoded_or(handler.response_serializer),
    )


async def replies(
    behaviour: Callable[[Any, Any], Any], request: Any, context: Any
) -> AsyncIterator[Any]:
    """The replies of a response-streaming behaviour of either style gRPC
    allows: an async generator's, or none from a coroutine that sends its
    own with ``context.write`` (grpc_health's ``Watch``). Interceptors wrap
    streaming methods as async generators and iterate through this."""
    result = behaviour(request, context)
    if inspect.isawaitable(result):
        await result
        return
    async for reply in result:
        yield reply


def _pre_encoded_or(serializer: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """``serializer``, except that ``bytes`` (a reply already in wire format) pass as they are."""
    if serializer is None or getattr(serializer, "passes_bytes", False):
        return serializer

    def serialize(reply: Any) -> bytes:
        return reply if type(reply) is bytes else serializer(reply)

    serialize.passes_bytes = True  # type: ignore[attr-defined]
    return serialize


def wrap_requests(
    handler: MethodHandler,
    check: Callable[[Any], None],
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> MethodHandler:
    """``handler`` with ``check(request)`` run on every request before the
    handler sees it; an exception from ``check`` ends the call with its status."""

    async def checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in requests:
            check(request)  # raised inside the servicer's stream: rpc_stream maps it
            yield request

    if handler.request_streaming:
        inner = handler.stream_unary or handler.stream_stream
        if handler.response_streaming:

            async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
                async for reply in replies(inner, checked(requests), context):
                    yield reply

            return rebuild(handler, None, stream_stream, request_deserializer)

        async def stream_unary(requests: Any, context: Any) -> Any:
            return await inner(checked(requests), context)

        return rebuild(handler, stream_unary, None, request_deserializer)

    inner = handler.unary_unary or handler.unary_stream

    async def refuse(context: grpc.aio.ServicerContext[Any, Any], exc: Exception) -> None:
        await abort(context, exc)

    if handler.response_streaming:

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                check(request)
            except Exception as exc:  # every error becomes a status; see errors.py
                await refuse(context, exc)
            async for reply in replies(inner, request, context):
                yield reply

        return rebuild(handler, None, unary_stream, request_deserializer)

    async def unary_unary(request: Any, context: Any) -> Any:
        try:
            check(request)
        except Exception as exc:  # every error becomes a status; see errors.py
            await refuse(context, exc)
        return await inner(request, context)

    return rebuild(handler, unary_unary, None, request_deserializer)


class Undecodable:
    """What the guard's decoder returns for bytes that do not parse."""

    def __init__(self, why: str) -> None:
        self.why = why


def _safe(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # DecodeError, or anything a decoder may raise
            return Undecodable(f"{type(exc).__name__}: {exc}"[:200])

    return decode


def _reject_undecodable(request: Any) -> None:
    if isinstance(request, Undecodable):
        raise BadRequest(f"request does not parse as its message type ({request.why})")


class DecodeGuard(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Answers requests that do not decode with INVALID_ARGUMENT (module doc).

    ``create_server`` always installs it, innermost, so every servicer method
    goes through ``rebuild`` and may return pre-encoded replies. A method's
    wrapped handler is built once and reused (the call path is hot).
    """

    def __init__(self) -> None:
        self._wrapped: dict[str, MethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[MethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> MethodHandler:
        wrapped = self._wrapped.get(details.method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        wrapped = wrap_requests(handler, _reject_undecodable, _safe(handler.request_deserializer))
        self._wrapped[details.method] = wrapped  # one per registered method: bounded
        return wrapped
