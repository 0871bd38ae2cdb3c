"""The ``Broker.TransactionChecks`` handler: a producer group's check-back stream.

Mixed into the Broker servicer (service_data.py). The producer sends a
``CheckHello`` first, then a ``CheckAnswer`` for each ``TransactionCheck`` the
broker sends it (txn_checks.py decides what and when). A bad hello, a second
hello or an answer before the hello ends the stream with INVALID_ARGUMENT;
past ``--max-check-streams`` open streams, RESOURCE_EXHAUSTED. A replica keeps
the stream open and idle: it never checks, and a client need not know roles.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from equeue_broker.server.errors import BadRequest
from equeue_broker.server.service_base import BrokerState, rpc_stream
from equeue_broker.server.tokens import bearer
from equeue_broker.server.txn_checks import CheckStream, TransactionChecker
from equeue_broker.storage.errors import InvalidName
from equeue_broker.storage.meta.names import validate_group, validate_transaction_id
from equeue_proto.protocol import consumer_id_problem
from equeue_proto.v1 import broker_pb2 as pb

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 30.0
"""A stream that says nothing this long is ended: it holds a call slot."""


class CheckServiceMixin:
    """``TransactionChecks`` for ``BrokerService``."""

    s: BrokerState

    @rpc_stream
    async def TransactionChecks(
        self, request_iterator: AsyncIterator[pb.CheckStreamRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.TransactionCheck]:  # fmt: skip
        checker = self.s.checker
        try:
            hello = await asyncio.wait_for(_hello(request_iterator), HELLO_TIMEOUT_S)
        except TimeoutError:
            raise BadRequest(
                f"no CheckHello within {HELLO_TIMEOUT_S:.0f} s of opening TransactionChecks"
            ) from None
        stream = checker.streams.open(hello.group, hello.client_id, _namespace(self.s, context))
        log.info("check stream of producer group %s opened (%s)", hello.group, hello.client_id)
        reader = asyncio.ensure_future(_read_answers(checker, stream, request_iterator))
        taken: asyncio.Future[pb.TransactionCheck] | None = None
        try:
            while True:
                taken = asyncio.ensure_future(stream.queue.get())
                done, _ = await asyncio.wait({taken, reader}, return_when=asyncio.FIRST_COMPLETED)
                if taken in done:
                    check, taken = taken.result(), None
                    yield check
                    continue
                reader.result()  # a bad request: its error ends the stream
                return  # the producer closed its side
        finally:
            # Both tasks are awaited: a task left pending when the call is
            # cancelled is destroyed later with an ERROR in the log.
            for task in (reader, taken):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            checker.streams.close(stream)
            log.info("check stream of producer group %s closed (%s)", hello.group, hello.client_id)


async def _hello(requests: AsyncIterator[pb.CheckStreamRequest]) -> pb.CheckHello:
    async for request in requests:
        if request.WhichOneof("kind") != "hello":
            raise BadRequest("a TransactionChecks stream must start with a CheckHello")
        group = request.hello.group
        if not group:
            raise BadRequest("CheckHello.group is empty: name the producer group")
        validate_group(group)
        problem = consumer_id_problem(request.hello.client_id)
        if problem is not None:
            raise BadRequest("CheckHello.client_id: " + problem.replace("consumer_id ", "", 1))
        return request.hello
    raise BadRequest("the TransactionChecks stream ended before its CheckHello")


async def _read_answers(
    checker: TransactionChecker, stream: CheckStream, requests: AsyncIterator[pb.CheckStreamRequest]
) -> None:
    async for request in requests:
        if request.WhichOneof("kind") != "answer":
            raise BadRequest("a second CheckHello on a TransactionChecks stream")
        answer = request.answer
        try:
            validate_transaction_id(answer.transaction_id, "CheckAnswer.transaction_id")
        except InvalidName as exc:
            raise BadRequest(str(exc)) from None
        await checker.answer(stream, answer)


def _namespace(state: BrokerState, context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The transaction namespace of the caller's token (auth.py): "" when it
    sees every transaction (an admin token for every topic, or no auth)."""
    if state.tokens is None:
        return ""
    metadata: Any = context.invocation_metadata()
    secret = bearer(metadata)
    principal = state.tokens.lookup(secret) if secret else None
    if principal is None or principal.sees_every_transaction():
        return ""
    return f"{principal.name}@"
