"""Name-server security (docs/cluster.md, "Security and trust"), on real
processes on 127.0.0.1: tokens (only a ``broker`` token registers; any token
reads routes), TLS between brokers and name servers, and the forged
registration of issue 25 ("claiming group h's master at 127.0.0.1:1, epoch
99") changing no route and no broker's role, with and without tokens. A
member told of a newer master by a name server that lies (an in-process
fake) keeps its role unless that master confirms it."""

from __future__ import annotations

import asyncio
import functools
import re
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import trustme

from equeue_broker.namesrv.claims import ClaimChecker, ClaimRefused
from equeue_broker.testing import BrokerProcess, NameServerProcess, local_cluster
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from tests.support.namesrv_tokens import (
    ADMIN_SECRET,
    BROKER_SECRET,
    CLIENT_SECRET,
    SCOPED_SECRET,
    tokens_toml,
)
from tests.support.raw_client import RawClient
from tests.support.waits import wait_for

TOKENS = tokens_toml("orders-reader", ["consume"])

Start = Callable[..., BrokerProcess]


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Start]:
    started: list[BrokerProcess] = []

    def start(kind: str, *flags: str, env: dict[str, str] | None = None) -> BrokerProcess:
        where = tmp_path / f"{kind}{len(started)}"
        if kind == "namesrv":
            process: BrokerProcess = NameServerProcess(where, *flags, env=env)
        else:
            process = BrokerProcess(where, *flags, env=env)
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.kill()


def bearer(secret: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {secret}"),)


def forged() -> pb.RegisterBrokerRequest:
    """Issue 25's registration: group h's master at 127.0.0.1:1, epoch 99."""
    return pb.RegisterBrokerRequest(
        cluster="DefaultCluster", broker_name="h", address="127.0.0.1:1", role="master",
        epoch=99, instance_id="forged",
        topics=[pb.RegisteredTopic(name="t", incarnation=1,
                                   queues=[pb.RouteQueue(queue_id=0, writable=True,
                                                         readable=True)])],
    )  # fmt: skip


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    code: grpc.StatusCode = refused.value.code()
    return code


def route(stub: pb_grpc.NameServerStub, secret: str = "") -> list[tuple[str, str, int]]:
    reply = stub.GetRoute(
        pb.GetRouteRequest(topic="t"), timeout=10, metadata=bearer(secret) if secret else None
    )
    return [(b.broker_name, b.address, b.epoch) for b in reply.brokers]


def produce_works(broker: BrokerProcess) -> bool:
    client = RawClient(broker.address)
    try:
        return len(client.produce("t", [b"still the master"]).offsets) == 1
    finally:
        client.close()


def assert_master_untouched(master: BrokerProcess) -> None:
    client = RawClient(master.address)
    try:
        stats = client.stats()
    finally:
        client.close()
    assert (stats.role, stats.epoch) == ("master", 0)
    assert "DEPOSED" not in master.log_since_start()
    assert produce_works(master)


@pytest.mark.timeout(180)
def test_tokens_on_a_name_server(processes: Start, tmp_path: Path) -> None:
    tokens = tmp_path / "ns-tokens.toml"
    tokens.write_text(TOKENS)
    ns = processes("namesrv", "--tokens-file", str(tokens))
    stub = pb_grpc.NameServerStub(grpc.insecure_channel(ns.address))
    register = forged()

    # Registration: no token, a client's, an admin's: refused before any check.
    unregister = pb.UnregisterBrokerRequest(broker_name="h", address="127.0.0.1:1")
    for metadata, code in [
        (None, grpc.StatusCode.UNAUTHENTICATED),
        (bearer("not-a-known-secret-at-all"), grpc.StatusCode.UNAUTHENTICATED),
        (bearer(CLIENT_SECRET), grpc.StatusCode.PERMISSION_DENIED),
        (bearer(ADMIN_SECRET), grpc.StatusCode.PERMISSION_DENIED),
    ]:
        assert code_of(functools.partial(stub.RegisterBroker, register, timeout=10,
                                         metadata=metadata)) == code  # fmt: skip
        assert code_of(functools.partial(stub.UnregisterBroker, unregister, timeout=10,
                                         metadata=metadata)) == code  # fmt: skip
    # Reads need a token, any role; a topic-scoped token reads its topics only.
    assert code_of(lambda: stub.ListBrokers(pb.ListBrokersRequest(), timeout=10)) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    assert code_of(lambda: route(stub)) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: route(stub, SCOPED_SECRET)) == grpc.StatusCode.PERMISSION_DENIED

    # A broker without the token is refused (and says why); with it, it registers.
    bare = processes("broker", "--broker-name", "x", "--namesrv", ns.address)
    assert "UNAUTHENTICATED" in bare.log_since_start()
    token_file = tmp_path / "broker-token"
    token_file.write_text(BROKER_SECRET + "\n")
    token_file.chmod(0o600)
    h = processes(
        "broker", "--broker-name", "h", "--namesrv", ns.address,
        "--namesrv-token-file", str(token_file), "--register-interval-ms", "200",
    )  # fmt: skip
    env_broker = processes(
        "broker", "--broker-name", "e", "--namesrv", ns.address,
        env={"EQUEUE_NAMESRV_TOKEN": BROKER_SECRET},
    )  # fmt: skip
    listed = stub.ListBrokers(pb.ListBrokersRequest(), timeout=10, metadata=bearer(CLIENT_SECRET))
    assert sorted((b.broker_name, b.address) for b in listed.brokers) == [
        ("e", env_broker.address), ("h", h.address)
    ]  # fmt: skip
    admin = RawClient(h.address)
    admin.admin.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
    admin.close()
    wait_for("the topic routed", lambda: _routes(stub, CLIENT_SECRET) == [("h", h.address, 0)], 30)

    # The forged registration, even with a broker token: the claim is checked
    # with 127.0.0.1:1, which does not answer; nothing changes.
    refused = code_of(
        lambda: stub.RegisterBroker(register, timeout=10, metadata=bearer(BROKER_SECRET))
    )
    assert refused == grpc.StatusCode.FAILED_PRECONDITION
    assert route(stub, CLIENT_SECRET) == [("h", h.address, 0)]
    listed = stub.ListBrokers(pb.ListBrokersRequest(), timeout=10, metadata=bearer(CLIENT_SECRET))
    assert "127.0.0.1:1" not in [b.address for b in listed.brokers]
    assert_master_untouched(h)
    assert "registration refused: 127.0.0.1:1" in ns.log_since_start()


def _routes(stub: pb_grpc.NameServerStub, secret: str) -> list[tuple[str, str, int]]:
    try:
        return route(stub, secret)
    except grpc.RpcError:
        return []


@pytest.mark.timeout(180)
def test_forged_master_claims_change_nothing_without_tokens(processes: Start) -> None:
    ns = processes("namesrv")
    stub = pb_grpc.NameServerStub(grpc.insecure_channel(ns.address))
    flags = ("--namesrv", ns.address, "--register-interval-ms", "200")
    h = processes("broker", "--broker-name", "h", *flags)
    replica = processes("broker", "--broker-name", "h", *flags, "--role", "replica",
                        "--master", h.address)  # fmt: skip
    other = processes("broker", "--broker-name", "other", *flags)
    client = RawClient(h.address)
    client.admin.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
    client.close()
    wait_for("the topic routed", lambda: _routes(stub, "") == [("h", h.address, 0)], 30)
    listed = stub.ListBrokers(pb.ListBrokersRequest(), timeout=10).brokers
    h_id = next(b.instance_id for b in listed if b.address == h.address)

    def claim(
        address: str, instance_id: str = "forged", **fields: object
    ) -> pb.RegisterBrokerRequest:
        request = forged()
        request.address, request.instance_id = address, instance_id
        for name, value in fields.items():
            setattr(request, name, value)
        return request

    attempts = {
        "nothing listens there": claim("127.0.0.1:1"),
        "another group's master": claim(other.address),
        "h's replica": claim(replica.address),
        "h's master, a newer epoch than it has": claim(h.address, h_id),
        "h's master, another instance id": claim(h.address, epoch=0),
        "h's master, as a replica (a demotion)": claim(h.address, h_id, role="replica", epoch=0),
    }
    for what, request in attempts.items():
        code = code_of(functools.partial(stub.RegisterBroker, request, timeout=10))
        assert code == grpc.StatusCode.FAILED_PRECONDITION, what
    assert route(stub) == [("h", h.address, 0)]
    listed = stub.ListBrokers(pb.ListBrokersRequest(), timeout=10).brokers
    assert sorted((b.broker_name, b.address, b.role) for b in listed) == sorted([
        ("h", h.address, "master"), ("h", replica.address, "replica"),
        ("other", other.address, "master"),
    ])  # fmt: skip
    assert_master_untouched(h)
    client = RawClient(replica.address)
    stats = client.stats()
    client.close()
    assert (stats.role, stats.master) == ("replica", h.address)
    # Its own true claim is taken (it re-registers all along).
    assert stub.RegisterBroker(claim(h.address, h_id, epoch=0), timeout=10).expiry_ms > 0


class LyingNameServer(pb_grpc.NameServerServicer):
    """Answers every registration naming ``master`` of ``epoch`` as the group's master."""

    def __init__(self, master: str, epoch: int) -> None:
        self.master, self.epoch = master, epoch
        self.registrations = 0
        self.lock = threading.Lock()

    def RegisterBroker(  # noqa: N802  (the .proto's name)
        self, request: pb.RegisterBrokerRequest, context: object
    ) -> pb.RegisterBrokerReply:
        with self.lock:
            self.registrations += 1
        return pb.RegisterBrokerReply(expiry_ms=30_000, master=self.master,
                                      master_epoch=self.epoch)  # fmt: skip

    def UnregisterBroker(  # noqa: N802
        self, request: pb.UnregisterBrokerRequest, context: object
    ) -> pb.UnregisterBrokerReply:
        return pb.UnregisterBrokerReply()

    def GetRoute(self, request: pb.GetRouteRequest, context: object) -> pb.TopicRoute:  # noqa: N802
        return pb.TopicRoute()

    def ListBrokers(  # noqa: N802
        self, request: pb.ListBrokersRequest, context: object
    ) -> pb.ListBrokersReply:
        return pb.ListBrokersReply()


def registered(fake: LyingNameServer, times: int) -> bool:
    with fake.lock:
        return fake.registrations >= times


@pytest.mark.timeout(180)
def test_a_master_named_by_a_name_server_is_followed_only_if_it_confirms(
    processes: Start,
) -> None:
    other = processes("broker", "--broker-name", "other")
    for lie in [("127.0.0.1:1", 99), (other.address, 99)]:
        fake = LyingNameServer(*lie)
        server = grpc.server(futures.ThreadPoolExecutor(4))
        pb_grpc.add_NameServerServicer_to_server(fake, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            h = processes("broker", "--broker-name", "h", "--namesrv", f"127.0.0.1:{port}",
                          "--register-interval-ms", "200")  # fmt: skip
            # Registered (before the ready line), told of the "master" every
            # time, and still master after several replies.
            wait_for("a few registrations", functools.partial(registered, fake, 5), 30)
            assert_master_untouched(h)
            assert f"a name server routes group h to {lie[0]}, master of epoch 99, but" in (
                h.log_since_start()
            )
            h.stop()
        finally:
            server.stop(None)


@pytest.mark.timeout(180)
def test_tls_between_brokers_and_name_servers(processes: Start, tmp_path: Path) -> None:
    ca = trustme.CA()
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key", "ccert", "ckey")}
    server = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("broker@example.org")
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    client.cert_chain_pems[0].write_to_path(str(files["ccert"]))
    client.private_key_pem.write_to_path(str(files["ckey"]))
    # A name server with mutual TLS, which checks claims over TLS too.
    ns = processes(
        "namesrv", "--tls-cert", str(files["cert"]), "--tls-key", str(files["key"]),
        "--tls-client-ca", str(files["ca"]), "--broker-tls-ca", str(files["ca"]),
    )  # fmt: skip
    broker = processes(
        "broker", "--broker-name", "h", "--namesrv", ns.address,
        "--tls-cert", str(files["cert"]), "--tls-key", str(files["key"]),
        "--namesrv-tls-ca", str(files["ca"]), "--namesrv-tls-cert", str(files["ccert"]),
        "--namesrv-tls-key", str(files["ckey"]),
    )  # fmt: skip
    credentials = grpc.ssl_channel_credentials(
        files["ca"].read_bytes(), files["ckey"].read_bytes(), files["ccert"].read_bytes()
    )
    stub = pb_grpc.NameServerStub(grpc.secure_channel(ns.address, credentials))
    listed = stub.ListBrokers(pb.ListBrokersRequest(), timeout=10).brokers
    assert [(b.broker_name, b.address, b.role) for b in listed] == [("h", broker.address, "master")]
    # Plaintext, or TLS without a client certificate, reaches nothing.
    plain = pb_grpc.NameServerStub(grpc.insecure_channel(ns.address))
    assert code_of(lambda: plain.ListBrokers(pb.ListBrokersRequest(), timeout=5)) == (
        grpc.StatusCode.UNAVAILABLE
    )
    no_cert = pb_grpc.NameServerStub(
        grpc.secure_channel(ns.address, grpc.ssl_channel_credentials(files["ca"].read_bytes()))
    )
    assert code_of(lambda: no_cert.ListBrokers(pb.ListBrokersRequest(), timeout=5)) == (
        grpc.StatusCode.UNAVAILABLE
    )


def test_claim_checks_are_bounded_and_cached() -> None:
    asked: list[str] = []
    answers = {
        "127.0.0.1:5": pb.MemberIdentity(broker_name="h", instance_id="i", role="master", epoch=3)
    }

    async def identify(address: str) -> pb.MemberIdentity:
        asked.append(address)
        if address == "127.0.0.1:9":
            await asyncio.sleep(60)  # never answers: the timeout ends it
        if address not in answers:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down", None
            )
        return answers[address]

    def claim(address: str, epoch: int, role: str = "master") -> pb.RegisterBrokerRequest:
        return pb.RegisterBrokerRequest(broker_name="h", address=address, instance_id="i",
                                        role=role, epoch=epoch)  # fmt: skip

    async def run() -> None:
        now = [0.0]
        checker = ClaimChecker(timeout_s=0.2, identify=identify, clock=lambda: now[0])
        await checker.check(claim("127.0.0.1:5", 3), "master")
        await checker.check(claim("127.0.0.1:5", 2), "master")  # an older claim: still backed
        await checker.check(claim("127.0.0.1:5", 3), "master")  # cached
        assert asked == ["127.0.0.1:5", "127.0.0.1:5"]
        for request, role, why in [
            (claim("127.0.0.1:5", 4), "master", "master of epoch 3, older than the claimed 4"),
            (claim("127.0.0.1:5", 3, "replica"), "replica", "answers as master, not replica"),
            (claim("127.0.0.1:6", 1), "master", "does not answer as a broker (UNAVAILABLE"),
            (claim("127.0.0.1:9", 1), "master", "does not answer within 0.2 s"),
        ]:
            with pytest.raises(ClaimRefused, match=re.escape(why)):
                await checker.check(request, role)
        before = len(asked)
        with pytest.raises(ClaimRefused):  # refused a moment ago: not asked again
            await checker.check(claim("127.0.0.1:6", 1), "master")
        assert len(asked) == before
        now[0] += 60  # both expire: asked again
        with pytest.raises(ClaimRefused):
            await checker.check(claim("127.0.0.1:6", 1), "master")
        await checker.check(claim("127.0.0.1:5", 3), "master")
        assert len(asked) == before + 2

    asyncio.run(run())


@pytest.mark.timeout(120)
def test_a_secured_local_cluster(tmp_path: Path) -> None:
    """The harness starts a cluster whose name servers require tokens."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    with local_cluster(
        namesrvs=1, brokers=("a",), namesrv_flags=("--tokens-file", str(tokens)),
        broker_env={"EQUEUE_NAMESRV_TOKEN": BROKER_SECRET},
    ) as cluster:  # fmt: skip
        stub = pb_grpc.NameServerStub(grpc.insecure_channel(cluster.namesrv))
        listed = stub.ListBrokers(
            pb.ListBrokersRequest(), timeout=10, metadata=bearer(CLIENT_SECRET)
        ).brokers
        assert [(b.broker_name, b.address) for b in listed] == [("a", cluster.brokers["a"].address)]
