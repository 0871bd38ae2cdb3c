"""Checking a registration's claim with the address it names (docs/cluster.md,
"Security and trust").

A registration says "the member ``instance_id`` of group ``broker_name`` at
``address`` is ``role`` (a master: of ``epoch``)". Before the route table
takes it, the name server calls ``Membership.Identify`` on that address
(server/membership.py) and accepts the registration only if the answer backs
the claim: the same group and instance id, the same role, and for a master an
epoch at least the claimed one. Otherwise the registration is refused
(FAILED_PRECONDITION naming what did not match) and changes nothing: a
forged registration claiming group ``h``'s master from an address that is
not ``h``'s master moves no route, and, through the registration replies,
no member's role.

The calls are bounded (``timeout_s``), run on the event loop without
blocking it (grpc.aio), at most ``max_in_flight`` at once, and cached: a
confirmed claim is not checked again for ``CONFIRMED_S`` (a member
re-registers the same claim every few seconds), a refused one for
``REFUSED_S`` (a flood of forged registrations costs a call per claim per
``REFUSED_S``, not one per registration).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from equeue_broker.server.membership import claim_problem, describe, identify
from equeue_proto.v1 import broker_pb2 as pb

log = logging.getLogger("equeue.namesrv")

CONFIRMED_S = 30.0
REFUSED_S = 2.0
MAX_CACHED = 4096

Claim = tuple[str, str, str, str, int]
"""(address, broker name, instance id, role, epoch)."""
Identify = Callable[[str], Awaitable[pb.MemberIdentity]]


class ClaimRefused(Exception):
    """The address a registration names does not answer as the member it claims to be."""


@dataclass
class ClaimChecker:
    timeout_s: float
    credentials: grpc.ChannelCredentials | None = None
    max_in_flight: int = 32
    clock: Callable[[], float] = time.monotonic
    identify: Identify | None = None
    """What asks an address who it is (default: ``Membership.Identify`` over
    ``credentials``); tests of the table give their own."""
    _cache: dict[Claim, tuple[float, str | None]] = field(default_factory=dict)
    _slots: asyncio.Semaphore | None = None
    calls: int = 0
    """Calls made so far (what the cache saves shows here)."""

    async def check(self, request: pb.RegisterBrokerRequest, role: str) -> None:
        """Return if ``request``'s claim (``role``: its role, as the table reads
        it) is confirmed; ``ClaimRefused`` naming why if not."""
        claim: Claim = (
            request.address, request.broker_name, request.instance_id, role, request.epoch
        )  # fmt: skip
        now = self.clock()
        cached = self._cache.get(claim)
        if cached is None or now >= cached[0]:
            problem = await self._ask(claim)
            if problem is not None:  # said once per claim per REFUSED_S
                log.warning(
                    "registration refused: %s does not confirm it is %s of broker group %s "
                    "(epoch %d): %s", request.address, role, request.broker_name,
                    request.epoch, problem,
                    extra={"broker": request.broker_name, "address": request.address,
                           "role": role, "epoch": request.epoch},
                )  # fmt: skip
            if len(self._cache) >= MAX_CACHED:
                self._expire(now)
            ttl = CONFIRMED_S if problem is None else REFUSED_S
            cached = (self.clock() + ttl, problem)
            if len(self._cache) < MAX_CACHED:
                self._cache[claim] = cached
        problem = cached[1]
        if problem is not None:
            epoch = f" of epoch {request.epoch}" if role == "master" else ""
            raise ClaimRefused(
                f"registration of {request.address} as {role}{epoch} of broker group "
                f"{request.broker_name!r} refused: {problem}"
            )

    async def _ask(self, claim: Claim) -> str | None:
        address, group, instance_id, role, epoch = claim
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_in_flight)
        async with self._slots:
            self.calls += 1
            try:
                if self.identify is not None:
                    identity = await asyncio.wait_for(self.identify(address), self.timeout_s)
                else:
                    identity = await identify(address, self.timeout_s, self.credentials)
            except grpc.RpcError as exc:
                return f"{address} does not answer as a broker ({describe(exc)})"
            except TimeoutError:
                return f"{address} does not answer within {self.timeout_s:g} s"
        problem = claim_problem(identity, group, role, epoch, instance_id)
        return None if problem is None else f"{address}: {problem}"

    def _expire(self, now: float) -> None:
        for claim, (until, _) in list(self._cache.items()):
            if now >= until:
                del self._cache[claim]
