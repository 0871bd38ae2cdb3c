"""Starting and stopping the broker: ``create_server`` and ``serve``.

``serve`` prints exactly one line, ``equeue broker listening on HOST:PORT``, to
stdout once the port accepts requests (scripts and tests wait for it), and
shuts down cleanly on SIGTERM/SIGINT: new requests get UNAVAILABLE, in-flight
ones get ``shutdown_grace_s`` to finish, then the store flushes everything
and persists consumer offsets.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import secrets
import signal
import ssl
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import EllipsisType
from typing import TYPE_CHECKING, NamedTuple

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from equeue_broker.replication.failover import MANUAL, ZOOKEEPER, RoleSwitch, ZkFailover
from equeue_broker.replication.insync import InSyncSet
from equeue_broker.replication.master import LogGrowth
from equeue_broker.replication.replicas import ReplicaTracker
from equeue_broker.replication.role import MASTER, REPLICA, BrokerRole
from equeue_broker.server.auth import AuthInterceptor, TokenTable
from equeue_broker.server.budgets import ByteBudget
from equeue_broker.server.config import BrokerConfig
from equeue_broker.server.connections import (
    STREAMS_BACKSTOP,
    AddressLimit,
    CallsPerConnection,
    auto_max_connections,
    defer_silent_connections,
)
from equeue_broker.server.errors import BadRequest
from equeue_broker.server.fetch_port import start_fetch_server, stop_fetch_server
from equeue_broker.server.generic_handlers import generic_only
from equeue_broker.server.groups import ConsumerRegistry, GroupLimits
from equeue_broker.server.handlers import DecodeGuard
from equeue_broker.server.health import BrokerHealth
from equeue_broker.server.intake import IntakeGate
from equeue_broker.server.logs import configure as configure_logging
from equeue_broker.server.longpoll import PullWaiters
from equeue_broker.server.membership import MembershipService
from equeue_broker.server.registration import MasterCheck, Registrar, advertised
from equeue_broker.server.replica_gate import ReplicaGate
from equeue_broker.server.service_admin import AdminService
from equeue_broker.server.service_base import BrokerState, StoreCalls
from equeue_broker.server.service_data import BrokerService
from equeue_broker.server.service_replication import ReplicationService
from equeue_broker.server.startup import (
    BadConfig,
    CannotBind,
    CannotStart,
    ExitCode,
    check_bindable,
    data_dir_problem,
    os_reason,
    unreadable,
)
from equeue_broker.server.txn_checks import CheckStreams, TransactionChecker
from equeue_broker.storage import StorageError, Store
from equeue_broker.storage.errors import CorruptionError
from equeue_broker.storage.meta.atomic_file import keep_damaged, load_json, save_json
from equeue_proto.allocator import tune_malloc
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from equeue_broker.server.http import HttpListener

log = logging.getLogger("equeue.broker")


def broker_id_for(data_dir: Path) -> str:
    """The broker's identity: random at the first start, then kept in the data dir."""
    path = data_dir / "broker.json"
    try:
        document = load_json(path)
    except CorruptionError as exc:
        kept = keep_damaged(path)
        log.error(
            "BROKER ID LOST: %s; a new id is drawn, so message ids issued before do not "
            "resolve here any more (damaged copies kept as %s)", exc, kept,
        )  # fmt: skip
        document = None
    if isinstance(document, dict) and isinstance(document.get("broker_id"), str):
        return str(document["broker_id"])
    broker_id = secrets.token_hex(4)
    save_json(path, {"broker_id": broker_id})
    return broker_id


async def create_server(
    config: BrokerConfig, store: Store, tokens: TokenTable | EllipsisType | None = ...
) -> tuple[grpc.aio.Server, int, BrokerState]:
    """A started server on ``config.host:config.port`` (0 = any free port),
    accepting ``tokens`` (None: no authentication; by default those the config names)."""
    server, port, state, _ = await _create_server(config, store, tokens)
    return server, port, state


class Budgets(NamedTuple):
    """Budgets the server makes that ``BrokerState`` does not hold (metrics read them)."""

    intake: ByteBudget
    replication_slots: ByteBudget
    calls: CallsPerConnection
    port: int
    """The gRPC port bound."""


async def _create_server(
    config: BrokerConfig, store: Store, tokens: TokenTable | EllipsisType | None
) -> tuple[grpc.aio.Server, int, BrokerState, Budgets]:
    options = [
        ("grpc.max_receive_message_length", config.max_request_bytes),
        # A reply carries up to max_pull_bytes of records plus a few fields.
        ("grpc.max_send_message_length", max(config.max_request_bytes, reply_limit(config))),
        # gRPC sets SO_REUSEPORT by default: a second broker on a live broker's
        # port would start, and clients would reach either at random.
        ("grpc.so_reuseport", 0),
        # Connections cost descriptors and memory whether or not they call:
        # cap them, and close the idle and the never-set-up ones.
        ("grpc.max_allowed_incoming_connections", max_connections(config)),
        # Calls per connection are limited by CallsPerConnection (RESOURCE_EXHAUSTED);
        # HTTP/2's own limit, whose excess streams are reset, is only a backstop.
        ("grpc.max_concurrent_streams", STREAMS_BACKSTOP * config.max_streams_per_connection),
        ("grpc.max_connection_idle_ms", config.max_connection_idle_ms),
        ("grpc.server_handshake_timeout_ms", config.handshake_timeout_ms),
        # Request intake (intake.py): with BDP probing on, gRPC widens every
        # stream's window and reads bodies nobody asked for; off, a stream
        # whose message is not being received buffers at most the lookahead,
        # 256 KiB so that a 1,000-message batch of 100 B still arrives in one go.
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", 256 * 1024),
    ]
    if isinstance(tokens, EllipsisType):
        tokens = load_tokens(config)
    # Outermost first: receive within the intake budget, authenticate, then
    # decode (auth checks decoded requests).
    interceptors: list[grpc.aio.ServerInterceptor] = [DecodeGuard()]  # type: ignore[type-arg]
    if tokens is not None:
        interceptors.insert(0, AuthInterceptor(tokens))
    wait_s = config.budget_wait_ms / 1000
    intake = ByteBudget("max_intake_bytes", config.max_intake_bytes, wait_s)
    # Outermost of all, and first in it: a call over its connection's limit
    # takes no other budget (intake.py).
    calls_per_connection = CallsPerConnection(config.max_streams_per_connection)
    read_timeout_s = config.request_read_timeout_ms / 1000
    gate = IntakeGate(intake, config.max_request_bytes, read_timeout_s, calls_per_connection)
    interceptors.insert(0, gate)
    # The epoch starts at the newest marker in the log (epochs.py); with ZooKeeper
    # every member starts as a replica with no master, until the election says.
    start_role = REPLICA if config.zookeeper else config.role
    why = "started; elections through ZooKeeper decide" if config.zookeeper else "--role at start"
    role = BrokerRole(start_role, config.master, store.epochs.last_epoch, why)
    deliver_on_master(store, role)
    if start_role == REPLICA and store.held_high_watermark is not None:
        # Until its master's first reply: what the replicated high watermark
        # held back before the restart stays hidden (a failover may lose it).
        store.hold_back(store.held_high_watermark)
    # After authentication: an unknown caller learns nothing. Always installed:
    # failover can make a master a replica at any time (role.py). Before
    # DecodeGuard, which caches its handler per method and so would ask the
    # interceptors after it only on a method's first call.
    interceptors.insert(len(interceptors) - 1, ReplicaGate(config.broker_name, role))
    server = grpc.aio.server(options=options, interceptors=interceptors)
    port = bind(server, config)  # first: the role switch and the name servers need the address
    address = advertised(config.host, port, config.advertise_address)
    instance_id = broker_id_for(config.storage.data_dir)
    calls = StoreCalls(ThreadPoolExecutor(config.store_threads, thread_name_prefix="equeue-store"))
    slots = ByteBudget(
        "max_replication_waits", config.max_replication_waits, config.budget_wait_ms / 1000,
        "slots",
    )  # fmt: skip
    insync = in_sync_set(config, store, instance_id, role, slots)
    registrar = None
    if config.namesrv_addresses():
        registrar = Registrar(
            store, config.namesrv_addresses(), cluster=config.cluster,
            broker_name=config.broker_name, address=address, instance_id=instance_id,
            interval_s=config.register_interval_ms / 1000, role=role,
            credentials=namesrv_credentials(config), token=namesrv_token(config),
        )  # fmt: skip
    stream_half = max(1, config.max_reply_bytes // 2)
    state = BrokerState(
        config=config,
        store=store,
        broker_id=config.broker_name or instance_id,
        instance_id=instance_id,
        calls=calls,
        waiters=PullWaiters(asyncio.get_running_loop(), config.max_parked_pulls),
        consumers=ConsumerRegistry(config.consumer_timeout_ms / 1000, limits=group_limits(config)),
        # Two halves, so that streams nobody reads never hold up a pull.
        reply_bytes=ByteBudget(
            "max_reply_bytes (the pulls' half)",
            max(1, config.max_reply_bytes - stream_half),
            wait_s,
        ),
        stream_reply_bytes=ByteBudget("max_reply_bytes (the streams' half)", stream_half, wait_s),
        produce_bytes=ByteBudget("max_produce_bytes", config.max_produce_bytes, wait_s),
        tokens=tokens,
        role=role,
        insync=insync,
        replicas=ReplicaTracker(config.max_replicas),
        role_switch=RoleSwitch(
            store,
            role,
            insync,
            calls,
            address=address,
            mode=ZOOKEEPER if config.zookeeper else MANUAL,
            group=config.broker_name,
            instance_id=instance_id,
        ),
        registrar=registrar,
        health=BrokerHealth(role),
        checker=TransactionChecker(
            store,
            CheckStreams(config.max_check_streams),
            config.broker_name or instance_id,
            calls.call,
        ),
    )
    state.checker.counted = lambda t, q, n: state.counters.add(t, q, produced=n)
    check_on_master(state.checker, role)
    state.checker.start()
    store.add_listener(state.waiters.notify_threadsafe)
    growth = LogGrowth(asyncio.get_running_loop())
    store.add_listener(growth.notify_threadsafe)
    state.insync.wake_streams = growth.wake
    state.insync.start()
    services = generic_only(
        server
    )  # one pending call future, not one per method (generic_handlers.py)
    pb_grpc.add_BrokerServicer_to_server(BrokerService(state), services)
    pb_grpc.add_AdminServicer_to_server(AdminService(state), services)
    pb_grpc.add_ReplicationServicer_to_server(ReplicationService(state, growth), services)
    pb_grpc.add_MembershipServicer_to_server(
        MembershipService(config.broker_name, instance_id, role), services
    )
    health_pb2_grpc.add_HealthServicer_to_server(state.health.servicer, services)
    names = [
        pb.DESCRIPTOR.services_by_name["Broker"].full_name,
        pb.DESCRIPTOR.services_by_name["Admin"].full_name,
        pb.DESCRIPTOR.services_by_name["Replication"].full_name,
        pb.DESCRIPTOR.services_by_name["Membership"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    ]
    reflection.enable_server_reflection(names, services)
    await server.start()
    # Before the first registration (serve), which advertises state.fetch_address.
    await start_fetch_server(state, max_connections(config))
    # Connections that say nothing wait in the kernel, not in a connection slot.
    defer_silent_connections(port, -(-config.handshake_timeout_ms // 1000))
    await state.health.start()  # SERVING; writes only on a master (health.py)
    return server, port, state, Budgets(intake, slots, calls_per_connection, port)


def deliver_on_master(store: Store, role: BrokerRole) -> None:
    """Only a master delivers due delayed messages (a replica's log is a byte
    copy of its master's, deliveries included); a promotion starts delivering
    what is due, a demotion stops it (storage/timer)."""
    store.set_delivering(role.is_master)
    role.add_listener(lambda _old, new: store.set_delivering(new.is_master))


def check_on_master(checker: TransactionChecker, role: BrokerRole) -> None:
    """Only a master checks transactions with their producer groups (a
    promoted replica continues the counts its log holds), as it delivers."""
    checker.set_active(role.is_master)
    role.add_listener(lambda _old, new: checker.set_active(new.is_master))


def bind(server: grpc.aio.Server, config: BrokerConfig) -> int:
    """Bind ``config.host:config.port`` (0: any free port); the port bound."""
    address = f"{config.host}:{config.port}"
    credentials = server_credentials(config)
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError:  # grpc >= 1.50: "Failed to bind"; older versions return 0
        port = 0
    if port == 0:  # serve() checked the address: something took it meanwhile
        check_bindable(config.host, config.port)
        raise CannotBind(config.host, config.port, "gRPC could not bind it")
    return port


def in_sync_set(
    config: BrokerConfig, store: Store, instance_id: str, role: BrokerRole, slots: ByteBudget
) -> InSyncSet:
    return InSyncSet(
        store, instance_id, config.broker_name or instance_id,
        sync=config.replication == "sync", min_insync=config.min_insync_replicas,
        lag_max_s=config.replica_lag_max_ms / 1000, role=role, slots=slots,
    )  # fmt: skip


def max_connections(config: BrokerConfig) -> int:
    """``max_connections``, or for 0 the limit the open-files limit allows."""
    if config.max_connections:
        return config.max_connections
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_files = soft if soft != resource.RLIM_INFINITY else 1 << 20
    return auto_max_connections(open_files, config.storage.max_open_index_files)


def reply_limit(config: BrokerConfig) -> int:
    return config.storage.max_read_bytes + (1 << 20)


def group_limits(config: BrokerConfig) -> GroupLimits:
    return GroupLimits(
        max_groups=config.max_consumer_groups,
        max_consumers=config.max_consumers,
        max_consumers_per_group=config.max_consumers_per_group,
        max_queue_locks=config.max_queue_locks,
    )


TOKENS_ENV = "EQUEUE_BROKER_TOKENS"


def load_tokens(config: BrokerConfig) -> TokenTable | None:
    """The token table from ``tokens_file`` or ``$EQUEUE_BROKER_TOKENS``; None: no auth."""
    if config.tokens_file is not None:
        try:
            text = config.tokens_file.read_text()
        except OSError as exc:
            raise unreadable(config.named("tokens_file"), config.tokens_file, exc) from None
        source = str(config.tokens_file)
    else:
        text, source = os.environ.get(TOKENS_ENV, ""), f"${TOKENS_ENV}"
        if not text:
            return None
    try:
        return TokenTable.parse(text, source)
    except BadRequest as exc:  # a config error like a bad flag: exit code 2
        raise BadConfig(str(exc)) from None


NAMESRV_TOKEN_ENV = "EQUEUE_NAMESRV_TOKEN"


def namesrv_token(config: BrokerConfig) -> str:
    """The token sent to the name servers: ``namesrv_token_file``'s content
    (stripped), else ``$EQUEUE_NAMESRV_TOKEN``; "" for none."""
    if config.namesrv_token_file is None:
        return os.environ.get(NAMESRV_TOKEN_ENV, "").strip()
    try:
        token = config.namesrv_token_file.read_text().strip()
    except OSError as exc:
        name = config.named("namesrv_token_file")
        raise unreadable(name, config.namesrv_token_file, exc) from None
    if not token:
        raise BadConfig(f"namesrv_token_file {config.namesrv_token_file} is empty")
    return token


def namesrv_credentials(config: BrokerConfig) -> grpc.ChannelCredentials | None:
    """TLS to the name servers (None: plaintext)."""
    if config.namesrv_tls_ca is None:
        return None
    ca = _read(config, "namesrv_tls_ca")
    cert = _read(config, "namesrv_tls_cert")
    key = _read(config, "namesrv_tls_key")
    return grpc.ssl_channel_credentials(ca, key, cert)


def server_credentials(config: BrokerConfig) -> grpc.ServerCredentials | None:
    if config.tls_cert is None or config.tls_key is None:
        return None
    chain = _read(config, "tls_cert")
    key = _read(config, "tls_key")
    client_ca = _read(config, "tls_client_ca")
    assert chain is not None and key is not None  # both set: checked above
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _read(config: BrokerConfig, key: str) -> bytes | None:
    """The content of the file setting ``key`` names (None: not set);
    ``CannotStart`` naming the setting and the file if it cannot be read."""
    path: Path | None = getattr(config, key)
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise unreadable(config.named(key), path, exc) from None


async def serve(config: BrokerConfig) -> None:
    # Before opening the store: recovery may take a while, and a second broker
    # on a live one's port must not touch anything.
    check_bindable(config.host, config.port)
    tokens = load_tokens(config)  # a bad tokens file is a config error: the data stays untouched
    server_credentials(config)  # unreadable TLS files too
    if config.http_port is not None:  # the HTTP port too, before the store opens
        check_bindable(config.http_host or config.host, config.http_port)
        http_ssl_context(config)
    try:
        # A replica (and, with ZooKeeper, every member until elected) never
        # delivers, not even in the moment before create_server says so.
        store = Store(config.storage, delivering=config.role == MASTER and not config.zookeeper)
    except OSError as exc:  # the data directory: said in words, not Python's errno line
        data_dir = config.storage.data_dir
        raise CannotStart(data_dir_problem(data_dir, config.named("data_dir"), exc)) from None
    try:
        server, port, state, budgets = await _create_server(config, store, tokens)
        http = await start_http(config, state, budgets)
    except BaseException:
        store.close()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    state.role_switch.start()
    election = None
    if config.zookeeper:
        election = ZkFailover(
            state.role_switch,
            config.zookeeper,
            config.zk_session_timeout_ms / 1000,
            fast=config.zk_fast_failover,
        )
        election.start()
    registering: asyncio.Task[None] | None = None
    if state.registrar is not None:
        state.registrar.follow()  # a role change registers at once
        if election is None:  # without ZooKeeper: learn a promotion this broker missed,
            # once the master a name server names has confirmed it itself
            state.registrar.on_master = MasterCheck(state.role_switch)
        # The first registration before the ready line: a test (or script) that
        # waited for it finds the broker's topics on every live name server.
        await state.registrar.register_once(state.registrar.request())
        registering = asyncio.create_task(state.registrar.run())
    per_address = None
    if config.max_connections_per_address:
        per_address = AddressLimit(port, config.max_connections_per_address)
        per_address.start()
    log.info(
        "broker %s started on %s:%d", state.broker_id, config.host, port,
        extra={"broker_id": state.broker_id, "port": port,
               "data_dir": str(config.storage.data_dir),
               "flush": config.storage.flush_mode.value,
               "recovery_s": round(store.recovery.seconds, 3),
               "broker_name": config.broker_name, "namesrv": config.namesrv,
               "tls": config.tls_cert is not None, "auth_tokens": state.auth_tokens,
               "rebuilt_index_entries": store.recovery.index_entries_rebuilt,
               "max_connections": max_connections(config),
               "fetch_address": state.fetch_address,
               "http_port": None if http is None else http.port,
               "http_loaded": "aiohttp" in sys.modules},
    )  # fmt: skip
    if http is not None:
        http.readiness.ready()
    sys.stdout.write(f"equeue broker listening on {config.host}:{port}\n")
    sys.stdout.flush()
    await stop.wait()
    log.info("shutting down")
    await state.health.stop()  # NOT_SERVING: load balancers stop sending calls here
    if http is not None:
        http.readiness.stopping()  # /readyz says 503 during the drain
    if state.registrar is not None and registering is not None:
        registering.cancel()
        await state.registrar.unregister()  # clients stop routing here at once
        await state.registrar.close()
    if election is not None:
        await election.close()  # first: the group elects another master now
    await state.role_switch.stop()
    if per_address is not None:
        await per_address.stop()
    await state.checker.stop()
    state.calls.shutting_down = True
    state.insync.stop()
    await stop_fetch_server(state)
    await server.stop(config.shutdown_grace_s)
    if http is not None:
        await http.stop()
    state.calls.executor.shutdown(wait=True)
    store.close()
    log.info("stopped cleanly")


def http_ssl_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """HTTPS for the HTTP port with the gRPC port's files (None: plaintext,
    as gRPC); ``CannotStart`` naming the setting if a file cannot be used."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    for key in ("tls_cert", "tls_key", "tls_client_ca"):
        _read(config, key)  # unreadable: the same CannotStart as for gRPC
    from equeue_broker.server.http import ssl_context

    try:
        return ssl_context(config.tls_cert, config.tls_key, config.tls_client_ca)
    except ssl.SSLError as exc:
        raise CannotStart(f"tls_cert/tls_key cannot serve HTTPS: {exc}") from None


async def start_http(
    config: BrokerConfig, state: BrokerState, budgets: Budgets
) -> HttpListener | None:
    """The HTTP listener of ``http_port`` (http.py), started; None without
    ``http_port`` (then neither aiohttp nor prometheus_client is imported)."""
    if config.http_port is None:
        return None
    from equeue_broker.server import metrics
    from equeue_broker.server.group_view import StoreTimes
    from equeue_broker.server.http import HttpListener, Readiness

    def writes() -> str:
        view = state.role.view
        return "" if view.is_master else f"replica: writes go to {view.master or 'no master now'}"

    changes = metrics.RoleChanges()
    state.role.add_listener(changes)
    extra = metrics.Budgets(
        budgets.intake, budgets.replication_slots, changes, budgets.calls, budgets.port,
        max_connections(config), StoreTimes(),
    )  # fmt: skip
    host = config.http_host or config.host
    listener = HttpListener(
        host, config.http_port, lambda scope: metrics.render(state, extra, scope),
        Readiness(writes), state.tokens, lambda p: p.may("monitor"), http_ssl_context(config),
    )  # fmt: skip
    try:
        port = await listener.start()
    except OSError as exc:
        raise CannotBind(host, config.http_port, f"the HTTP port: {os_reason(exc)}") from None
    log.info(
        "http listening on %s:%d", host, port,
        extra={"http_port": port, "scheme": listener.scheme},
    )  # fmt: skip
    return listener


def _raise_file_limit() -> None:
    """Raise the soft open-files limit to the hard one: every queue keeps its
    index files open and every open transaction its stage file, and the usual
    soft default of 1,024 would make appends fail with EMFILE long before the
    configured limits (max_topics, max_open_transactions) are reached."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit from %d: %s", soft, exc)


def main(argv: list[str] | None = None) -> None:
    """The ``equeue-broker`` console script (``equeue-broker verify``: verify.py)."""
    from equeue_broker.server.config import parse_args

    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["verify"]:
        from equeue_broker.storage.verify import main as verify

        raise SystemExit(verify(args[1:]))

    config = parse_args(argv)  # exits with ExitCode.USAGE on a bad flag or file
    configure_logging(config.log_level, config.log_format, config.library_log_level)
    _raise_file_limit()
    tune_malloc()
    try:
        asyncio.run(serve(config))
    except CannotBind as exc:
        log.error("cannot start: %s", exc)
        raise SystemExit(ExitCode.CANNOT_BIND) from None
    except BadConfig as exc:
        log.error("cannot start: %s", exc)
        raise SystemExit(ExitCode.USAGE) from None
    except CannotStart as exc:
        log.error("cannot start: %s", exc)
        raise SystemExit(ExitCode.CANNOT_START) from None
    except OSError as exc:  # said as the OS says it, without Python's "[Errno N]"
        where = f"{exc.filename}: " if exc.filename is not None else ""
        log.error("cannot start: %s%s", where, os_reason(exc))
        raise SystemExit(ExitCode.CANNOT_START) from None
    except StorageError as exc:
        log.error("cannot start: %s", exc)
        raise SystemExit(ExitCode.CANNOT_START) from None
    os._exit(ExitCode.OK)  # grpc's threads are done; skip interpreter teardown races
