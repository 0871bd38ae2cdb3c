"""The name server process: ``equeue-namesrv`` / ``python -m equeue_broker.namesrv``.

Prints one line, ``equeue namesrv listening on HOST:PORT``, to stdout once it
accepts calls; SIGTERM/SIGINT stop it cleanly. It serves the ``NameServer``
service (broker.proto), the gRPC health service and server reflection. Its
state is soft (routes.py): nothing is written to disk.

Security (docs/cluster.md, "Security and trust"): TLS and tokens as the
broker's (auth.py: only a ``broker`` token registers, unregisters or reports a
role; any token reads routes), and every registration's claim is checked with
the address it names before it is taken (claims.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from equeue_broker.namesrv.auth import (
    NameServerAuth,
    broker_credentials,
    load_tokens,
    may_read_metrics,
    principal_of,
    server_credentials,
)
from equeue_broker.namesrv.claims import ClaimChecker, ClaimRefused
from equeue_broker.namesrv.config import NameServerConfig, parse_args
from equeue_broker.namesrv.counts import Counts
from equeue_broker.namesrv.routes import Limits, NameServerError, RouteTable
from equeue_broker.server.generic_handlers import generic_only
from equeue_broker.server.logs import configure as configure_logging
from equeue_broker.server.metrics_hot import timed
from equeue_broker.server.startup import CannotBind, ExitCode, check_bindable
from equeue_broker.server.tokens import TokenFileError, TokenTable
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from equeue_broker.server.http import HttpListener

log = logging.getLogger("equeue.namesrv")

READY_PREFIX = "equeue namesrv listening on "


class NameServerService(pb_grpc.NameServerServicer):
    def __init__(
        self, table: RouteTable, claims: ClaimChecker, tokens: TokenTable | None = None
    ) -> None:
        self.table = table
        self.claims = claims
        self.tokens = tokens
        self.counts = Counts()
        """Registrations, route requests and RPC durations (the metrics read them)."""

    async def _fail(self, context: Any, exc: NameServerError) -> None:
        await context.abort(exc.code, str(exc))

    async def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: Any
    ) -> pb.RegisterBrokerReply:
        with timed(self.counts.times, "RegisterBroker") as call:
            try:
                role = self.table.validate(request)
                # Only an address that answers as the member claimed registers:
                # a name server's routes, and through its replies the members'
                # roles, follow no unchecked word (claims.py).
                await self.claims.check(request, role)
                new = self.table.register(request)
            except NameServerError as exc:
                self.counts.registrations["refused"] += 1
                call.code = exc.code.name
                await self._fail(context, exc)
                raise  # unreachable: abort raises
            except ClaimRefused as exc:
                self.counts.registrations["refused"] += 1
                call.code = grpc.StatusCode.FAILED_PRECONDITION.name
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc)[:1024])
                raise  # unreachable
            self.counts.registrations["accepted"] += 1
        if new:
            log.info(
                "broker registered",
                extra={"broker": request.broker_name, "role": request.role or request.replica_id,
                       "epoch": request.epoch, "instance_id": request.instance_id,
                       "cluster": request.cluster, "address": request.address,
                       "topics": len(request.topics)},
            )  # fmt: skip
        reply = pb.RegisterBrokerReply(expiry_ms=int(self.table.expiry_s * 1000))
        master = self.table.other_master(request.broker_name, request.address)
        if master is not None:  # a member run without ZooKeeper learns a newer master
            reply.master, reply.master_epoch = master.address, master.epoch
        return reply

    async def UnregisterBroker(
        self, request: pb.UnregisterBrokerRequest, context: Any
    ) -> pb.UnregisterBrokerReply:
        if self.table.unregister(request.broker_name, request.replica_id, request.address):
            log.info("broker unregistered", extra={"broker": request.broker_name})
        return pb.UnregisterBrokerReply()

    async def GetRoute(self, request: pb.GetRouteRequest, context: Any) -> pb.TopicRoute:
        with timed(self.counts.times, "GetRoute") as call:
            principal = principal_of(self.tokens, context.invocation_metadata())
            if principal is not None and not principal.may_use_topic(request.topic):
                self.counts.routes["denied"] += 1
                call.code = grpc.StatusCode.PERMISSION_DENIED.name
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"token {principal.name!r} may not use topic {request.topic[:80]!r}",
                )
            try:
                route = self.table.route(request.topic)
            except NameServerError as exc:
                self.counts.routes["not_found"] += 1
                call.code = exc.code.name
                await self._fail(context, exc)
                raise
            self.counts.routes["ok"] += 1
            return route

    async def ListBrokers(
        self, request: pb.ListBrokersRequest, context: Any
    ) -> pb.ListBrokersReply:
        brokers = self.table.brokers(
            request.cluster, request.include_down, request.with_topic_names
        )
        return pb.ListBrokersReply(brokers=brokers)


async def create_server(
    config: NameServerConfig, tokens: TokenTable | None = None
) -> tuple[grpc.aio.Server, int, RouteTable]:
    """A started name server (``tokens``: None, no authentication); ``OSError``
    if a TLS file cannot be read."""
    server, port, service = await _create_server(config, tokens)
    return server, port, service.table


async def _create_server(
    config: NameServerConfig, tokens: TokenTable | None
) -> tuple[grpc.aio.Server, int, NameServerService]:
    credentials = server_credentials(config)
    claims = ClaimChecker(
        timeout_s=config.member_check_timeout_ms / 1000,
        credentials=broker_credentials(config),
        max_in_flight=config.max_member_checks,
    )
    table = RouteTable(
        expiry_s=config.broker_expiry_ms / 1000,
        down_retention_s=config.down_retention_ms / 1000,
        limits=Limits(config.max_brokers, config.max_topics_per_broker,
                      config.max_queues_per_topic),
    )  # fmt: skip
    options = [
        ("grpc.max_receive_message_length", config.max_request_bytes),
        ("grpc.max_send_message_length", config.max_request_bytes),
        ("grpc.so_reuseport", 0),
        ("grpc.max_allowed_incoming_connections", config.max_connections),
    ]
    interceptors = [NameServerAuth(tokens)] if tokens is not None else []
    server = grpc.aio.server(options=options, interceptors=interceptors)
    service = NameServerService(table, claims, tokens)
    services = generic_only(
        server
    )  # one pending call future, not one per method (generic_handlers.py)
    pb_grpc.add_NameServerServicer_to_server(service, services)
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, services)
    names = [
        pb.DESCRIPTOR.services_by_name["NameServer"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    ]
    reflection.enable_server_reflection(names, server)
    try:
        address = f"{config.host}:{config.port}"
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError:
        port = 0
    if port == 0:
        check_bindable(config.host, config.port)
        raise CannotBind(config.host, config.port, "gRPC could not bind it")
    await server.start()
    for name in ("", names[0]):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port, service


async def _expire_loop(table: RouteTable) -> None:
    interval = max(0.05, min(5.0, table.expiry_s / 4))
    while True:
        await asyncio.sleep(interval)
        for gone in table.expire():
            log.warning(
                "broker expired: not heard from within the expiry",
                extra={"broker": gone.broker_name, "role": gone.role,
                       "address": gone.address, "expiry_s": table.expiry_s},
            )  # fmt: skip


async def serve(config: NameServerConfig, tokens: TokenTable | None) -> None:
    check_bindable(config.host, config.port)
    if config.http_port >= 0:
        check_bindable(config.http_host or config.host, config.http_port)
    server, port, service = await _create_server(config, tokens)
    table = service.table
    http = await start_http(config, port, service, tokens)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    expiry = asyncio.create_task(_expire_loop(table))
    log.info(
        "name server started on %s:%d", config.host, port,
        extra={"port": port, "broker_expiry_ms": config.broker_expiry_ms,
               "tls": bool(config.tls_cert), "auth_tokens": len(tokens or ()),
               "broker_tls": bool(config.broker_tls_ca)},
    )  # fmt: skip
    if http is not None:
        http.readiness.ready()
    sys.stdout.write(f"{READY_PREFIX}{config.host}:{port}\n")
    sys.stdout.flush()
    await stop.wait()
    log.info("shutting down")
    if http is not None:
        http.readiness.stopping()
    expiry.cancel()
    await server.stop(config.shutdown_grace_s)
    if http is not None:
        await http.stop()
    log.info("stopped cleanly")


async def start_http(
    config: NameServerConfig, port: int, service: NameServerService, tokens: TokenTable | None
) -> HttpListener | None:
    """The HTTP listener of ``http_port`` (the broker's server/http.py), started;
    None for -1 (then neither aiohttp nor prometheus_client is imported)."""
    if config.http_port < 0:
        return None
    from equeue_broker.namesrv import metrics
    from equeue_broker.server.http import HttpListener, Readiness, ssl_context

    tls = None
    if config.tls_cert:
        client_ca = Path(config.tls_client_ca) if config.tls_client_ca else None
        tls = ssl_context(Path(config.tls_cert), Path(config.tls_key), client_ca)
    loop = asyncio.get_running_loop()
    name = f"{config.host}:{port}"
    host = config.http_host or config.host
    listener = HttpListener(
        host, config.http_port,
        lambda _scope: metrics.render(loop, name, service.table, service.counts),
        Readiness(), tokens, may_read_metrics, tls,
    )  # fmt: skip
    try:
        bound = await listener.start()
    except OSError as exc:
        raise CannotBind(host, config.http_port, f"the HTTP port: {exc.strerror}") from None
    log.info("http listening on %s:%d", host, bound, extra={"http_port": bound})
    return listener


def main(argv: list[str] | None = None) -> None:
    """The ``equeue-namesrv`` console script."""
    config = parse_args(argv)  # exits with code 2 on a bad flag or file
    configure_logging(config.log_level, config.log_format)
    try:
        tokens = load_tokens(config)
        asyncio.run(serve(config, tokens))
    except TokenFileError as exc:  # a config error like a bad flag
        log.error("cannot start: %s", exc)
        raise SystemExit(ExitCode.USAGE) from None
    except CannotBind as exc:
        log.error("cannot start: %s", exc)
        raise SystemExit(ExitCode.CANNOT_BIND) from None
    except OSError as exc:
        log.error("cannot start: %s", exc)
        raise SystemExit(ExitCode.CANNOT_START) from None
    os._exit(ExitCode.OK)
