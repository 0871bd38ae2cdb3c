"""Disk faults under a real broker process: full disks, file-size limits, I/O errors.

Three ways to make writes fail, from the most real to the most precise:

- a size-limited tmpfs as the data directory (ENOSPC from the kernel, with
  the short writes a filling file system really produces); needs permission
  to mount, so skipped where that is not allowed;
- ``RLIMIT_FSIZE`` lowered on the running broker with ``prlimit`` (EFBIG
  from the kernel; CPython ignores SIGXFSZ, which is checked too), raised
  again for "space returns";
- the fault-injecting file layer of ``tests/support/faulty_broker.py`` (ENOSPC or EIO
  from ``pwrite``/``write``/``fsync`` on chosen files, switched by a file).

In each case: producers get RESOURCE_EXHAUSTED (disk full) or UNAVAILABLE
(other I/O errors) with a message saying so, the broker keeps serving, nothing
acknowledged is damaged (read back through the broker, then with ``Store``
after a stop: index and log agree), failed appends consume no offsets, and
writes resume once space returns.

A failed fsync is the exception to "writes resume": in sync mode the round
it covered is cut out of the log (its producers were told it failed) and the
broker refuses writes until it is restarted, because after a failed fsync the
kernel may have dropped the pages and report success next time; in async mode
the background fsync logs the failure and retries.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from equeue_broker.storage.log.chunk import HEADER_SIZE
from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_checks import check_store, details_of, pull_queue, status_of
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from tests.support.faulty_broker import FAULT_ENV

pytestmark = pytest.mark.slow  # make test-fast skips it (see pyproject.toml)

REPO = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
CHUNK = 1 * MiB
TOPIC = "disk"
QUEUES = 2
VALUE = 2000
RPC_S = 15.0
MAX_FILL_ROUNDS = 2_000
"""Bound on the produce attempts that fill a disk (each writes about 16 KB)."""


@dataclass
class Client:
    """Raw stubs on one channel, plus every acknowledged message."""

    broker: BrokerProcess
    channel: grpc.Channel
    stub: pb_grpc.BrokerStub
    admin: pb_grpc.AdminStub
    acked: dict[tuple[str, int], dict[int, bytes]] = field(default_factory=dict)
    sent: int = 0

    def produce(self, values: list[bytes], queue_id: int, topic: str = TOPIC) -> pb.ProduceReply:
        """One Produce; acknowledged messages are recorded. Not retried."""
        columns = pb.MessageColumns(
            count=len(values), values=b"".join(values), value_lengths=[len(v) for v in values]
        )
        request = pb.ProduceRequest(
            topic=topic, messages=columns, queue_ids=[queue_id] * len(values)
        )
        reply = self.stub.Produce(request, timeout=RPC_S)
        for q, offset, value in zip(reply.queue_ids, reply.offsets, values, strict=True):
            self.acked.setdefault((topic, q), {})[offset] = value
        return reply

    def next_values(self, n: int = 8, size: int = VALUE) -> list[bytes]:
        out = []
        for _ in range(n):
            self.sent += 1
            head = f"m{self.sent}:".encode()
            out.append(head + bytes([self.sent % 251]) * (size - len(head)))
        return out

    def end(self, queue_id: int, topic: str = TOPIC) -> int:
        reply = self.stub.Pull(
            pb.PullRequest(topic=topic, queue_id=queue_id, offset=0, max_messages=1), timeout=RPC_S
        )
        return reply.end_offset

    def verify(self) -> None:
        """Every acknowledged message reads back identical at its offset, through the
        broker; offsets are contiguous (failed appends left no holes or ghosts)."""
        for (topic, queue_id), expected in self.acked.items():
            messages, first = pull_queue(self.stub, topic, queue_id, timeout_s=RPC_S)
            assert [m.offset for m in messages] == list(range(first.end_offset))
            assert first.end_offset == max(expected) + 1, "records beyond the last ack"
            for m in messages:
                assert m.offset in expected, f"{topic}/{queue_id}@{m.offset} was never acked"
                assert m.value == expected[m.offset], f"{topic}/{queue_id}@{m.offset} differs"

    def fill_until_refused(self, queue_id: int = 0) -> grpc.RpcError:
        """Produce until the broker refuses; the error."""
        for _ in range(MAX_FILL_ROUNDS):
            try:
                self.produce(self.next_values(), queue_id)
            except grpc.RpcError as exc:
                return exc
        raise AssertionError(f"{MAX_FILL_ROUNDS} produce requests and the disk never filled")

    def close(self) -> None:
        self.channel.close()


def connect(broker: BrokerProcess) -> Client:
    channel = grpc.insecure_channel(broker.address)
    return Client(broker, channel, pb_grpc.BrokerStub(channel), pb_grpc.AdminStub(channel))


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[Callable[..., tuple[BrokerProcess, Client]]]:
    """Start a broker (``start(*flags, data_dir=..., faulty=False)``) with topic
    ``disk`` of two queues; every broker is killed at teardown."""
    started: list[tuple[BrokerProcess, Client]] = []

    def start(
        *flags: str, data_dir: Path | None = None, faulty: bool = False
    ) -> tuple[BrokerProcess, Client]:
        env = {FAULT_ENV: str(tmp_path / "fault.json")} if faulty else {}
        broker = BrokerProcess(
            data_dir or tmp_path / "data",
            "--chunk-size", str(CHUNK), "--max-message-bytes", str(CHUNK // 4),
            "--log-level", "WARNING", *flags,
            module="tests.support.faulty_broker" if faulty else "equeue_broker",
            env=env,
            log_path=tmp_path / "broker.log",
            cwd=REPO,  # where ``-m tests.support.faulty_broker`` resolves
        )  # fmt: skip
        broker.start()
        client = connect(broker)
        started.append((broker, client))
        client.admin.CreateTopic(
            pb.CreateTopicRequest(name=TOPIC, queue_count=QUEUES), timeout=RPC_S
        )
        for q in range(QUEUES):  # creates each queue's index chunk while the disk is fine
            client.produce(client.next_values(2), q)
        return broker, client

    yield start
    for broker, client in started:
        client.close()
        broker.kill()


def set_fault(tmp_path: Path, **spec: str) -> None:
    (tmp_path / "fault.json").write_text(json.dumps(spec))


def faults_hit(tmp_path: Path) -> int:
    path = tmp_path / "fault.json.count"
    return len(path.read_text().splitlines()) if path.exists() else 0


def assert_still_serving(client: Client) -> None:
    assert client.broker.alive(), f"the broker died:\n{client.broker.log_tail()}"
    stats = client.admin.GetStats(pb.GetStatsRequest(), timeout=RPC_S)
    assert stats.topics >= 1
    client.verify()


def resume_and_check(client: Client, data_dir: Path) -> None:
    """Space is back: appends continue at the next offsets; then stop and check
    the files with Store (index and log agree, every ack is there)."""
    for q in range(QUEUES):
        end = client.end(q)
        reply = client.produce(client.next_values(4), q)
        assert list(reply.offsets) == list(range(end, end + 4)), "failed appends took offsets"
    client.verify()
    assert client.broker.stop() == 0
    found = check_store(data_dir, [TOPIC])
    assert found.problems == []
    for key, expected in client.acked.items():
        assert dict(found.messages[key]) == expected


# -- the fault-injecting file layer ---------------------------------------------------


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_log_write_enospc_is_resource_exhausted_and_recovers(
    start_broker: Callable[..., tuple[BrokerProcess, Client]], tmp_path: Path, flush: str
) -> None:
    broker, client = start_broker("--flush", flush, faulty=True)
    client.produce(client.next_values(), 0)
    set_fault(tmp_path, pwrite="ENOSPC", under="log")
    for q in range(QUEUES):
        with pytest.raises(grpc.RpcError) as failure:
            client.produce(client.next_values(), q)
        assert status_of(failure.value) is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "disk full" in details_of(failure.value)
        assert "No space left on device" in details_of(failure.value)
    assert faults_hit(tmp_path) >= QUEUES
    assert_still_serving(client)
    set_fault(tmp_path)
    resume_and_check(client, broker.data_dir)


def test_log_write_eio_is_unavailable_and_recovers(
    start_broker: Callable[..., tuple[BrokerProcess, Client]], tmp_path: Path
) -> None:
    broker, client = start_broker("--flush", "sync", faulty=True)
    set_fault(tmp_path, pwrite="EIO", under="log")
    with pytest.raises(grpc.RpcError) as failure:
        client.produce(client.next_values(), 1)
    assert status_of(failure.value) is grpc.StatusCode.UNAVAILABLE
    assert "I/O error" in details_of(failure.value)
    assert_still_serving(client)
    set_fault(tmp_path)
    resume_and_check(client, broker.data_dir)


def test_index_write_enospc_undoes_the_log_write(
    start_broker: Callable[..., tuple[BrokerProcess, Client]], tmp_path: Path
) -> None:
    """The record reached the log but its index entry did not: the append is cut
    out of the log again, so it neither shows up later nor survives a restart."""
    broker, client = start_broker("--flush", "async", faulty=True)
    set_fault(tmp_path, pwrite="ENOSPC", under="index")
    with pytest.raises(grpc.RpcError) as failure:
        client.produce(client.next_values(), 0)
    assert status_of(failure.value) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_still_serving(client)
    set_fault(tmp_path)
    client.produce(client.next_values(), 0)
    broker.kill()
    broker.start()
    client.close()
    restarted = connect(broker)
    restarted.acked = client.acked
    restarted.verify()
    resume_and_check(restarted, broker.data_dir)
    restarted.close()


def test_async_background_fsync_eio_keeps_serving(
    start_broker: Callable[..., tuple[BrokerProcess, Client]], tmp_path: Path
) -> None:
    """Async mode fsyncs in the background: a failing fsync is logged and retried;
    producers and consumers are not affected."""
    broker, client = start_broker("--flush", "async", "--flush-interval-ms", "20", faulty=True)
    set_fault(tmp_path, fsync="EIO")
    for _ in range(5):
        client.produce(client.next_values(), 0)
    hits = faults_hit(tmp_path)
    for _ in range(200):  # bounded: the background thread fsyncs every 20 ms
        if faults_hit(tmp_path) > hits:
            break
        client.produce(client.next_values(1), 1)
    assert faults_hit(tmp_path) > hits, "the background fsync never ran into the fault"
    assert_still_serving(client)
    set_fault(tmp_path)
    resume_and_check(client, broker.data_dir)


def test_sync_fsync_eio_is_unavailable_and_not_applied(
    start_broker: Callable[..., tuple[BrokerProcess, Client]], tmp_path: Path
) -> None:
    broker, client = start_broker("--flush", "sync", faulty=True)
    end = client.end(0)
    set_fault(tmp_path, fsync="EIO", under="log")
    with pytest.raises(grpc.RpcError) as failure:
        client.produce([b"told-it-failed"], 0)
    set_fault(tmp_path)
    assert broker.alive()
    with contextlib.suppress(grpc.RpcError):  # refusing writes until a restart is fine too
        client.produce(client.next_values(1), 0)  # the next fsync succeeds
    messages, _ = pull_queue(client.stub, TOPIC, 0, start=end)
    assert b"told-it-failed" not in [m.value for m in messages], "a failed append was applied"
    broker.kill()
    broker.start()
    restarted = connect(broker)
    try:
        messages, _ = pull_queue(restarted.stub, TOPIC, 0, start=end)
    finally:
        restarted.close()
    assert b"told-it-failed" not in [m.value for m in messages], "applied after a restart"
    assert status_of(failure.value) in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ), details_of(failure.value)


def test_metadata_enospc_is_resource_exhausted(
    start_broker: Callable[..., tuple[BrokerProcess, Client]], tmp_path: Path
) -> None:
    broker, client = start_broker("--flush", "sync", faulty=True)
    set_fault(tmp_path, write="ENOSPC")
    calls: dict[str, Callable[[], object]] = {
        "CreateTopic": lambda: client.admin.CreateTopic(
            pb.CreateTopicRequest(name="new-topic", queue_count=1), timeout=RPC_S
        ),
        "Produce (auto-create)": lambda: client.produce([b"x"], 0, topic="auto-topic"),
        "CommitOffsets": lambda: client.stub.CommitOffsets(
            pb.CommitOffsetsRequest(
                group="g", offsets=[pb.QueueOffset(topic=TOPIC, queue_id=0, offset=1)]
            ),
            timeout=RPC_S,
        ),
    }
    codes = {}
    for name, call in calls.items():
        with pytest.raises(grpc.RpcError) as failure:
            call()
        codes[name] = (status_of(failure.value), details_of(failure.value))
    assert broker.alive()
    assert all(code is grpc.StatusCode.RESOURCE_EXHAUSTED for code, _ in codes.values()), codes


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_delete_topic_on_a_full_disk_is_resource_exhausted(
    start_broker: Callable[..., tuple[BrokerProcess, Client]], tmp_path: Path, flush: str
) -> None:
    """DeleteTopic saves the checkpoint and the offsets first: on a full disk
    those saves fail, and the answer is RESOURCE_EXHAUSTED, as for every write
    (it was INTERNAL). With space back the delete succeeds and a topic created
    under the name starts empty."""
    # No background flush: the delete's own flush has a checkpoint to save.
    broker, client = start_broker("--flush", flush, "--flush-interval-ms", "600000", faulty=True)
    client.produce(client.next_values(4), 0)
    commit = pb.CommitOffsetsRequest(
        group="g", offsets=[pb.QueueOffset(topic=TOPIC, queue_id=0, offset=3)]
    )
    client.stub.CommitOffsets(commit, timeout=RPC_S)
    set_fault(tmp_path, write="ENOSPC")
    with pytest.raises(grpc.RpcError) as failure:
        client.admin.DeleteTopic(pb.DeleteTopicRequest(name=TOPIC), timeout=RPC_S)
    assert status_of(failure.value) is grpc.StatusCode.RESOURCE_EXHAUSTED, details_of(failure.value)
    assert faults_hit(tmp_path) > 0
    assert broker.alive()
    set_fault(tmp_path)
    client.admin.DeleteTopic(pb.DeleteTopicRequest(name=TOPIC), timeout=RPC_S)
    client.admin.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1), timeout=RPC_S)
    assert client.end(0) == 0
    fetched = client.stub.FetchOffsets(pb.FetchOffsetsRequest(group="g"), timeout=RPC_S)
    assert list(fetched.offsets) == []


def test_acked_messages_survive_a_failed_topic_metadata_save(
    start_broker: Callable[..., tuple[BrokerProcess, Client]], tmp_path: Path
) -> None:
    broker, client = start_broker("--flush", "sync", faulty=True)
    set_fault(tmp_path, write="ENOSPC")
    with pytest.raises(grpc.RpcError):
        client.admin.CreateTopic(pb.CreateTopicRequest(name="ghost", queue_count=1), timeout=RPC_S)
    set_fault(tmp_path)
    try:
        client.produce([b"acked-1", b"acked-2"], 0, topic="ghost")
    except grpc.RpcError as exc:  # refusing is fine; acknowledging and losing is not
        assert status_of(exc) is not grpc.StatusCode.INTERNAL
        return
    broker.kill()
    broker.start()
    restarted = connect(broker)
    restarted.acked = client.acked
    try:
        topics = restarted.admin.ListTopics(pb.ListTopicsRequest(), timeout=RPC_S).topics
        assert "ghost" in [t.name for t in topics], "the topic of acknowledged messages is gone"
        restarted.verify()
    finally:
        restarted.close()


# -- real kernel errors ----------------------------------------------------------------


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_file_size_limit_efbig_is_resource_exhausted_and_recovers(
    start_broker: Callable[..., tuple[BrokerProcess, Client]], flush: str
) -> None:
    """RLIMIT_FSIZE lowered on the live broker: log writes past it fail with EFBIG
    (the process ignores SIGXFSZ, so it is not killed); raising it resumes writes."""
    broker, client = start_broker("--flush", flush)
    assert broker.ignores_signal(signal.SIGXFSZ), "SIGXFSZ would kill the broker"
    reply = client.produce(client.next_values(), 0)
    local_end = reply.positions[-1] % CHUNK + VALUE + 200
    limit = HEADER_SIZE + local_end + 64 * 1024
    _soft, hard = resource.prlimit(broker.pid, resource.RLIMIT_FSIZE)
    resource.prlimit(broker.pid, resource.RLIMIT_FSIZE, (limit, hard))
    try:
        failure = client.fill_until_refused()
        assert status_of(failure) is grpc.StatusCode.RESOURCE_EXHAUSTED, details_of(failure)
        assert "disk full" in details_of(failure) and "File too large" in details_of(failure)
        for q in range(QUEUES):  # every queue shares the log: all refused, none damaged
            with pytest.raises(grpc.RpcError) as again:
                client.produce(client.next_values(), q)
            assert status_of(again.value) is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert_still_serving(client)
    finally:
        resource.prlimit(broker.pid, resource.RLIMIT_FSIZE, (hard, hard))
    resume_and_check(client, broker.data_dir)


def _can_mount_tmpfs(where: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    where.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
        capture_output=True,
        timeout=10,
        check=False,
    )
    if result.returncode != 0:
        return False
    subprocess.run(["umount", str(where)], timeout=10, check=True)
    return True


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs mounted at a fresh directory; unmounted at teardown."""
    probe = tmp_path / "probe"
    if not _can_mount_tmpfs(probe):
        pytest.skip("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)")
    where = tmp_path / "fs"
    where.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(where)],
        timeout=10,
        check=True,
    )
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], timeout=30, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], timeout=30, check=False)


def test_full_filesystem_enospc_is_resource_exhausted_and_recovers(
    small_tmpfs: Path, start_broker: Callable[..., tuple[BrokerProcess, Client]]
) -> None:  # small_tmpfs first: torn down last, after the broker is gone
    """A real full file system: ENOSPC, short writes, chunk rolls that cannot
    create the next chunk; growing the file system resumes writes."""
    data_dir = small_tmpfs / "data"
    _broker, client = start_broker("--flush", "sync", data_dir=data_dir)
    failure = client.fill_until_refused()
    assert status_of(failure) is grpc.StatusCode.RESOURCE_EXHAUSTED, details_of(failure)
    assert "No space left on device" in details_of(failure)
    assert_still_serving(client)
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_tmpfs)], timeout=10, check=True)
    resume_and_check(client, data_dir)
