"""The fetch port on real broker processes: the same replies as PullStream
(transactional and delayed records included), tokens, bad requests, the
connection limit, retention during a read, and the TLS rule.

The fetch port's address is chosen here (a free port given to --fetch-port)
so these tests do not depend on GetStats reporting it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from equeue_broker.server.config import parse_args
from equeue_broker.server.fetch_port import (
    _send_reply,
    fetch_port_number,
    fetch_port_refusal,
    fetch_port_warning,
)
from equeue_broker.storage import MessageBatch, RecordsResult, Store
from equeue_broker.storage.file_runs import FileRun, close_runs
from equeue_broker.testing import BrokerProcess
from equeue_proto import fetch
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, ClientConfig, Producer
from equeue_spark.client.connection import Connection
from equeue_spark.client.errors import (
    AuthenticationError,
    InvalidRequest,
    LimitError,
    NotFoundError,
    PermissionDeniedError,
)
from equeue_spark.client.fetch import Pool, fetch_replies
from equeue_spark.client.reader import stream_replies
from equeue_spark.client.records import decode_records
from equeue_spark.client.transactions import commit_transactions
from tests.broker.delayed_support import now_ms, produce, pull_until
from tests.support.raw_client import RawClient

pytestmark = pytest.mark.timeout(120)
SECRET = "reader-secret-0123456789"
WRITER = "writer-secret-0123456789"
TOKENS = f"""
[[tokens]]
name = "reader"
secret = "{SECRET}"
roles = ["consume"]
topics = ["orders*"]

[[tokens]]
name = "writer"
secret = "{WRITER}"
roles = ["produce"]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def with_fetch(factory: Callable[..., BrokerProcess], *flags: str) -> tuple[BrokerProcess, str]:
    port = free_port()
    broker = factory("--fetch-port", str(port), *flags)
    return broker, f"127.0.0.1:{port}"


def replies(address: str, *args: int, **kw: object) -> list[tuple[int, bytes, int, int, int]]:
    pool = Pool()
    try:
        return [
            (r.status, bytes(r.records), r.count, r.next_offset, r.end_offset)
            for r in fetch_replies(address, "orders", *args, pool=pool, **kw)  # type: ignore[arg-type]
        ]
    finally:
        pool.close()


def streamed(
    broker: str, start: int, end: int, batch_messages: int = 1000
) -> list[tuple[int, bytes, int, int, int]]:
    with Connection(ClientConfig(broker=broker)) as conn:
        return [
            (r.status, bytes(r.records), r.count, r.next_offset, r.end_offset)
            for r in stream_replies(conn, "orders", 0, start, end, batch_messages=batch_messages)
        ]


def test_ranges_equal_pullstreams_with_transactional_and_delayed_records(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker, address = with_fetch(broker_factory)
    raw = RawClient(broker.address)
    raw.admin.CreateTopic(pb.CreateTopicRequest(name="orders", queue_count=1), timeout=10)
    produce(raw, "orders", [os.urandom(300) for _ in range(50)])
    produce(raw, "orders", [b"staged-1", b"staged-2"], txn="t1")
    produce(raw, "orders", [b"plain"] * 10)
    produce(raw, "orders", [b"due"], deliver_at_ms=[now_ms() + 1_000])
    with Connection(ClientConfig(broker=broker.address)) as conn:
        commit_transactions(conn, [("t1", 2)])
    pull_until(raw, "orders", 0, 63)  # the delayed record has arrived
    for start, end, batch in ((0, 0, 7), (0, 63, 1000), (5, 61, 3), (60, 63, 1)):
        expected = streamed(broker.address, start, end, batch_messages=batch)
        got = replies(address, 0, start, end, batch_messages=batch)
        assert got == expected, (start, end, batch)
        assert sum(r[2] for r in got) == (end or 63) - start
    # Past the end and before the start: what PullStream answers (nothing).
    assert replies(address, 0, 100, 0) == streamed(broker.address, 100, 0) == []


def test_a_connection_serves_one_range_after_another(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker, address = with_fetch(broker_factory)
    with Producer(broker.address) as producer:
        producer.send_batch("orders", [b"x" * 100] * 100)
    pool = Pool()
    first = list(fetch_replies(address, "orders", 0, 0, 50, pool=pool))
    second = list(fetch_replies(address, "orders", 0, 50, 100, pool=pool))
    assert sum(r.count for r in first) == sum(r.count for r in second) == 50
    assert len(pool._idle[address]) == 1  # the one connection went back
    pool.close()


def test_tokens_are_checked_before_anything_is_read(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS)
    broker, address = with_fetch(broker_factory, "--tokens-file", str(path))
    with Producer(config=ClientConfig(broker=broker.address, token=WRITER)) as producer:
        producer.send_batch("orders", [b"secret"] * 10)
        producer.send_batch("audit", [b"secret"] * 10)
    with pytest.raises(AuthenticationError, match="missing or unknown token"):
        replies(address, 0, 0, 0)
    with pytest.raises(AuthenticationError, match="unknown token"):
        replies(address, 0, 0, 0, token="not-a-token-at-all")
    with pytest.raises(PermissionDeniedError, match="lacks role 'consume'"):
        replies(address, 0, 0, 0, token=WRITER)
    with pytest.raises(PermissionDeniedError, match="may not use topic 'audit'"):
        list(fetch_replies(address, "audit", 0, 0, 0, token=SECRET))
    assert sum(r[2] for r in replies(address, 0, 0, 0, token=SECRET)) == 10


def test_bad_requests_get_a_clear_error_frame(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker, address = with_fetch(broker_factory)
    with Admin(broker.address) as admin:
        admin.create_topic("orders", queues=1)
    with pytest.raises(NotFoundError, match="'nope' does not exist"):
        list(fetch_replies(address, "nope", 0, 0, 0))
    with pytest.raises(NotFoundError, match="queue"):
        replies(address, 7, 0, 0)
    with pytest.raises(InvalidRequest, match="batch_messages 200000"):
        replies(address, 0, 0, 0, batch_messages=200_000)
    with pytest.raises(InvalidRequest, match=r"batch_messages 10001 is not in \[0, 10000\]"):
        replies(address, 0, 0, 0, batch_messages=10_001)  # the number sent, not another
    with pytest.raises(InvalidRequest, match="end_offset -5 is negative"):
        replies(address, 0, 0, -5)
    host, port = address.split(":")
    for junk in (b"GET / HTTP/1.1\r\n\r\n", fetch.MAGIC + struct.pack("<I", 1 << 20)):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(junk)
            kind, payload = read_frame(sock)
        assert kind == fetch.ERROR
        code, message, _ = fetch.decode_error(payload)
        assert code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert message.startswith("fetch port: ")


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    head = recv_exactly(sock, fetch.FRAME_HEAD.size)
    kind, length = fetch.read_frame_head(head)
    return kind, recv_exactly(sock, length)


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "connection closed early"
        data += chunk
    return data


def test_connections_over_the_limit_are_refused(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("max_connections = 64\n")
    broker, address = with_fetch(broker_factory, "--config", str(config))
    with Producer(broker.address) as producer:
        producer.send_batch("orders", [b"x"] * 10)
    host, port = address.split(":")
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(64)]
    try:
        # The 65th gets RESOURCE_EXHAUSTED; then one goes and a new one is served.
        with pytest.raises(LimitError, match="fetch connections are open"):
            replies(address, 0, 0, 0)
        held.pop().close()
        deadline = time.monotonic() + 30
        while True:  # the broker notices the close when its loop reads the EOF
            try:
                assert sum(r[2] for r in replies(address, 0, 0, 0)) == 10
                break
            except LimitError:
                assert time.monotonic() < deadline, "the freed slot never came back"
                time.sleep(0.05)
    finally:
        for sock in held:
            sock.close()


def test_retention_during_a_read_answers_as_pullstream(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker, address = with_fetch(
        broker_factory, "--chunk-size", "65536", "--max-message-bytes", "16384",
        "--retention-max-chunks", "2", "--retention-check-interval-ms", "100",
    )  # fmt: skip
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("orders", queues=1)
        producer.send_batch("orders", [b"early"] * 10)
        pool = Pool()
        stream = fetch_replies(address, "orders", 0, 0, 0, batch_messages=5, pool=pool)
        first = next(stream)  # the range [0, 10) is planned; 5 records read
        assert (first.count, first.next_offset) == (5, 5)
        for _ in range(10):  # ~16 chunks: retention removes the first ones
            producer.send_batch("orders", [b"z" * 1000] * 100)
        deadline = time.monotonic() + 60
        while admin.list_offsets("orders")[0].earliest_offset <= 10:
            assert time.monotonic() < deadline, "retention never removed the first chunk"
            time.sleep(0.05)
        rest = list(stream)
    # The rest was either sent before retention ran (the socket buffers it) or
    # answered OFFSET_TOO_SMALL naming the earliest offset: never other bytes.
    offset = 5
    for reply in rest:
        if reply.status == pb.PULL_STATUS_OFFSET_TOO_SMALL:
            assert reply.earliest_offset > 10 and reply.count == 0
            break
        assert decode_records(reply.records, reply.broker_id)[0].offset == offset
        offset = reply.next_offset
    else:
        assert offset == 10
    pool.close()


def test_a_tls_broker_serves_no_fetch_port_unless_insecure_is_given() -> None:
    tls = ["--tls-cert", "c.pem", "--tls-key", "k.pem"]
    assert fetch_port_number(parse_args(tls)) is None
    assert fetch_port_number(parse_args([*tls, "--fetch-port", "7000"])) is None
    assert fetch_port_number(parse_args([*tls, "--fetch-port", "7000", "--fetch-insecure"])) == 7000
    assert fetch_port_number(parse_args(["--fetch-port", "off"])) is None
    assert fetch_port_number(parse_args([])) is None  # off by default
    assert fetch_port_number(parse_args(["--fetch-port", "auto"])) == 0


def test_file_runs_are_closed_after_every_reply(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker, address = with_fetch(broker_factory)
    with Producer(broker.address) as producer:
        for _ in range(5):
            producer.send_batch("orders", [os.urandom(1000)] * 200, queue_ids=[0] * 200)
    assert broker.process is not None
    replies(address, 0, 0, 0, batch_messages=10)  # the first: lazily opened files settle
    # Chunk files only: the broker closes its side of a client's socket a moment
    # after the client did, but a reply's runs are closed before its END is sent.
    before = chunk_fds(broker.process.pid)
    for start in range(0, 1000, 100):
        assert sum(r[2] for r in replies(address, 0, start, start + 100, batch_messages=7)) == 100
    assert chunk_fds(broker.process.pid) <= before  # no duplicated descriptor left open


def chunk_fds(pid: int) -> int:
    """The broker's open descriptors of log chunk files."""
    fds = Path(f"/proc/{pid}/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            count += os.readlink(fd).endswith(".chunk")
    return count


PAIRS = 1000


def test_interleaved_runs_hold_few_descriptors_and_aborted_requests_none(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """Plain records between a transaction's are runs of their own: a reply
    dups each chunk once (not once per run), and aborted requests leave nothing."""
    broker, address = with_fetch(broker_factory)
    raw = RawClient(broker.address)
    raw.admin.CreateTopic(pb.CreateTopicRequest(name="orders", queue_count=1), timeout=10)
    for _ in range(PAIRS):  # ~2 MB: more than the socket buffers take at once
        produce(raw, "orders", [b"p" * 1024])
        produce(raw, "orders", [b"t" * 1024], txn="big")
    with Connection(ClientConfig(broker=broker.address)) as conn:
        commit_transactions(conn, [("big", PAIRS)])
    assert sum(r[2] for r in replies(address, 0, 0, 0)) == 2 * PAIRS  # visible; files settled
    assert broker.process is not None
    pid = broker.process.pid
    baseline = chunk_fds(pid)
    host, port = address.split(":")
    request = fetch.encode_request(fetch.FetchRequest("orders", 0, 0, 0, 10000, 8 << 20, ""))
    stalled = []
    for _ in range(2):  # clients that never read: their replies stay in flight
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.connect((host, int(port)))
        sock.sendall(request)
        stalled.append(sock)
    deadline = time.monotonic() + 30
    while (held := chunk_fds(pid)) < baseline + 2:  # both replies hold their chunk
        assert time.monotonic() < deadline, "the stalled replies never started"
    assert held <= baseline + 2 * 16  # one per chunk, at most MAX_FILE_RUNS per reply
    for sock in stalled:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # RST
    for cut in range(40):  # requests aborted after a part of the reply
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(request[: len(request) - (cut % 2)])
            if cut % 2 == 0:
                sock.recv(cut * 100 + 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert sum(r[2] for r in replies(address, 0, 0, 0)) == 2 * PAIRS  # still served
    deadline = time.monotonic() + 30
    while chunk_fds(pid) > baseline:  # the senders notice the resets
        assert time.monotonic() < deadline, f"{chunk_fds(pid) - baseline} descriptors leaked"
        time.sleep(0.05)


def test_silent_connections_are_closed_after_the_handshake_timeout(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("max_connections = 4\nhandshake_timeout_ms = 500\n")
    broker, address = with_fetch(broker_factory, "--config", str(config))
    with Producer(broker.address) as producer:
        producer.send_batch("orders", [b"x"] * 10)
    host, port = address.split(":")
    silent = [socket.create_connection((host, int(port)), timeout=20) for _ in range(4)]
    try:
        for sock in silent:  # each is closed by the broker, not held for the idle timeout
            assert sock.recv(1) == b""
        assert sum(r[2] for r in replies(address, 0, 0, 0)) == 10
    finally:
        for sock in silent:
            sock.close()


def sockets(pid: int) -> set[str]:
    """The broker's open sockets ("socket:[inode]")."""
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            link = os.readlink(fd)
            if link.startswith("socket:"):
                found.add(link)
    return found


def test_a_client_trickling_a_reply_is_cut_at_the_send_timeout(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """(The kernel wakes a sender only when a third of its buffer is free, so a
    trickle trips a per-wait timeout too: this does not tell the per-reply
    deadline from a per-piece one; _send_reply's code does.)"""
    config = tmp_path / "broker.toml"
    config.write_text("stream_send_timeout_ms = 1000\n")
    broker, address = with_fetch(broker_factory, "--config", str(config))
    with Producer(broker.address) as producer:
        for _ in range(12):  # more than the kernel's socket buffers take at once
            producer.send_batch("orders", [os.urandom(1000)] * 1000, queue_ids=[0] * 1000)
    assert broker.process is not None
    pid = broker.process.pid
    before = sockets(pid)
    host, port = address.split(":")
    request = fetch.encode_request(fetch.FetchRequest("orders", 0, 0, 0, 10000, 4 << 20, ""))
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        sock.sendall(request)
        sock.settimeout(10)
        deadline = time.monotonic() + 60
        sock.recv(1)  # the broker has accepted the connection and is sending
        ours = sockets(pid) - before
        assert ours
        # A client taking a little every 50 ms (never idle for the timeout):
        # the broker closes its side once a whole reply took longer than 1 s.
        while ours & sockets(pid):
            assert sock.recv(2048), "the broker closed before the reader had everything"
            assert time.monotonic() < deadline, "the trickling reader was never cut"
            time.sleep(0.05)


def test_the_fetch_port_beside_tls_is_served_only_when_insecure_is_given_and_warned() -> None:
    tls = ["--tls-cert", "c.pem", "--tls-key", "k.pem"]
    mutual = [*tls, "--tls-client-ca", "ca.pem"]
    plain = parse_args(["--fetch-port", "7000"])
    assert fetch_port_number(plain) == 7000  # no TLS, no tokens: as exposed as gRPC
    assert fetch_port_warning(plain, tokens=False) is None
    assert fetch_port_number(parse_args([*mutual, "--fetch-port", "7000"])) is None
    insecure_mutual = parse_args([*mutual, "--fetch-port", "7000", "--fetch-insecure"])
    assert fetch_port_number(insecure_mutual) == 7000
    # Certificates as the only authentication: the fetch port, which checks
    # none, is not served even with fetch_insecure.
    refusal = fetch_port_refusal(insecure_mutual, tokens=False)
    assert refusal is not None and "--tokens-file" in refusal
    assert fetch_port_warning(insecure_mutual, tokens=False) is None
    assert fetch_port_refusal(insecure_mutual, tokens=True) is None
    assert "plain text" in str(fetch_port_warning(insecure_mutual, tokens=True))
    insecure_tls = parse_args([*tls, "--fetch-port", "7000", "--fetch-insecure"])
    assert fetch_port_refusal(insecure_tls, tokens=False) is None


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_file_runs_close_their_descriptors_when_the_read_fails_part_way(
    open_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Storage in process (64 KiB chunks): a read over several chunks dups one
    descriptor per chunk; an error after the first dup (EMFILE on the next,
    a framer that raises) closes those made so far."""
    store = open_store()
    store.create_topic("orders", 1)
    for _ in range(20):
        store.append("orders", 0, MessageBatch([os.urandom(1000)] * 10))
    result, pieces = store.reads.file_runs("orders", 0, 0, max_messages=200, max_bytes=1 << 20)
    runs = [p for p in pieces if isinstance(p, FileRun)]
    assert result.count == 200 and 1 < len({r.fd for r in runs}) <= len(runs)  # one per chunk
    close_runs(pieces)
    before = open_fds()
    real_dup, calls = os.dup, []

    def failing_dup(fd: int) -> int:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_dup(fd)

    monkeypatch.setattr(os, "dup", failing_dup)
    with pytest.raises(OSError, match="Too many open files"):
        store.reads.file_runs("orders", 0, 0, max_messages=200, max_bytes=1 << 20)
    monkeypatch.setattr(os, "dup", real_dup)
    assert len(calls) == 2 and open_fds() == before

    def failing_frame(result: RecordsResult) -> tuple[bytes, bytes]:
        raise ValueError("no frame")

    with pytest.raises(ValueError, match="no frame"):
        store.reads.file_runs("orders", 0, 0, max_messages=200, max_bytes=1 << 20,
                              frame=failing_frame)  # fmt: skip
    assert open_fds() == before


def test_a_request_head_dribbled_is_cut_at_the_request_read_timeout(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("handshake_timeout_ms = 60000\nrequest_read_timeout_ms = 500\n")
    _, address = with_fetch(broker_factory, "--config", str(config))
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(fetch.MAGIC[:1])  # a request started, never finished
        assert sock.recv(1) == b""  # closed long before the handshake timeout


def test_a_reply_to_a_socket_past_descriptor_1023_waits_with_its_deadline() -> None:
    """A busy broker's sockets have descriptors past select()'s 1024: the sender
    waits for them with poll (a stalled client times out, nothing else fails)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 2048")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    ours, theirs = socket.socketpair()
    try:
        high = socket.socket(fileno=os.dup2(ours.fileno(), 2000))
        high.setblocking(False)
        started = time.monotonic()
        with high, pytest.raises(TimeoutError):  # the peer never reads
            _send_reply(high, [b"x" * (32 << 20)], time.monotonic() + 0.3)
        assert time.monotonic() - started < 10
    finally:
        ours.close()
        theirs.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_reply_taken_slowly_but_steadily_times_out_as_a_whole() -> None:
    """A client that takes a little all the time (no single wait is long) still
    has to take the whole reply by its deadline (StalledStream's rule)."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # small: wakes often
    ours.setblocking(False)
    taken, done = [0], threading.Event()

    def trickle() -> None:
        with contextlib.suppress(OSError):
            while not done.is_set():
                data = theirs.recv(1024)
                if not data:
                    return
                taken[0] += len(data)
                time.sleep(0.01)

    reader = threading.Thread(target=trickle)
    reader.start()
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            _send_reply(ours, [b"x" * (8 << 20)], time.monotonic() + 0.5)
        assert time.monotonic() - started < 10 and 0 < taken[0] < 8 << 20
    finally:
        done.set()
        ours.close()
        reader.join(10)
        theirs.close()
