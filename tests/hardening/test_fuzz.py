"""Fuzzing a live broker: a few hundred malformed and extreme requests, derandomized.

The strategies are those of ``hardening/fuzz_broker.py`` (``make fuzz`` sends
10,000+). Every call has a deadline and must be answered with a defined
status code; the broker must stay up; afterwards a produce/pull round trip
works, the broker stops cleanly, and the data directory holds nothing outside
its documented layout (nor was anything created beside it).

Bugs the fuzzer found (undecodable requests and truncated headers answered
UNKNOWN/INTERNAL) are fixed; their repros below guard against regressions.
A bug found later can be excused precisely with a ``fuzz_broker.KNOWN_BUGS``
entry (so that nothing else hides behind it) plus an xfail(strict=True) repro.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings

from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_checks import details_of, layout_violations, status_of
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from hardening import fuzz_broker
from hardening.fuzz_broker import (
    DEFINED,
    RPCS,
    Call,
    Fuzzer,
    Rpc,
    call_strategy,
    describe,
    known_bug,
)

pytestmark = pytest.mark.slow  # make test-fast skips it (see pyproject.toml)

FUZZ_SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("fuzz")
    broker = BrokerProcess(root / "data", *fuzz_broker.BROKER_FLAGS)
    broker.start()
    fuzz_broker.prepare(broker.address)
    yield broker
    broker.kill()


@pytest.fixture
def fuzzer(broker: BrokerProcess) -> Iterator[Fuzzer]:
    fuzzer = Fuzzer(broker.address)
    yield fuzzer
    fuzzer.close()


def check(fuzzer: Fuzzer, broker: BrokerProcess, call: Call) -> None:
    outcome = fuzzer.send(call)
    assert broker.alive(), f"the broker died on {describe(outcome)}:\n{broker.log_tail()}"
    assert outcome.code in DEFINED or known_bug(outcome), describe(outcome)


def run_fuzz(
    fuzzer: Fuzzer, broker: BrokerProcess, rpc: Rpc, examples: int, raw_share: float
) -> None:
    @settings(FUZZ_SETTINGS, max_examples=examples)
    @given(call_strategy([rpc], raw_share))
    def fuzz(call: Call) -> None:
        check(fuzzer, broker, call)

    fuzz()
    assert fuzzer.calls >= examples * 0.9


@pytest.mark.parametrize("rpc", RPCS, ids=lambda rpc: rpc.name)
def test_typed_requests_get_defined_statuses(
    broker: BrokerProcess, fuzzer: Fuzzer, rpc: Rpc
) -> None:
    run_fuzz(fuzzer, broker, rpc, 15, raw_share=0.0)


@pytest.mark.parametrize("rpc", RPCS, ids=lambda rpc: rpc.name)
def test_raw_bytes_get_defined_statuses(broker: BrokerProcess, fuzzer: Fuzzer, rpc: Rpc) -> None:
    run_fuzz(fuzzer, broker, rpc, 6, raw_share=1.0)


# -- fixed bugs ------------------------------------------------------------------------------


@pytest.fixture
def channel(broker: BrokerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(broker.address) as channel:
        yield channel


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/equeue.v1.Broker/Pull", b"\xff\xff\xff"),  # corrupt wire format
        ("/equeue.v1.Broker/Pull", b"\x0a\x03\xff\xfe\xfd"),  # topic: invalid UTF-8
        ("/equeue.v1.Admin/CreateTopic", b"\x0a\x01\x80"),
        ("/equeue.v1.Broker/ProduceStream", b"\x0a\x03\xff\xfe\xfd"),
    ],
)
def test_undecodable_request_is_invalid_argument(
    channel: grpc.Channel, path: str, payload: bytes
) -> None:
    with pytest.raises(grpc.RpcError) as failure:
        if path.endswith("Stream"):
            list(channel.stream_stream(path, None, None)(iter([payload]), timeout=10))
        else:
            channel.unary_unary(path, None, None)(payload, timeout=10)
    assert status_of(failure.value) is grpc.StatusCode.INVALID_ARGUMENT, details_of(failure.value)


@pytest.mark.parametrize("headers", [b"\x01", b"\x01\x00\x05", b"\x01\x00\x01\x00a\x00"])
def test_truncated_produce_headers_are_invalid_argument(
    channel: grpc.Channel, headers: bytes
) -> None:
    columns = pb.MessageColumns(
        count=1, values=b"x", value_lengths=[1], headers=headers, header_lengths=[len(headers)]
    )
    request = pb.ProduceRequest(topic="fz0", messages=columns)
    with pytest.raises(grpc.RpcError) as failure:
        pb_grpc.BrokerStub(channel).Produce(request, timeout=10)
    assert status_of(failure.value) is grpc.StatusCode.INVALID_ARGUMENT, details_of(failure.value)


# -- afterwards --------------------------------------------------------------------------------


def test_after_the_fuzz_round_trip_works_and_data_dir_is_clean(broker: BrokerProcess) -> None:
    """Runs last (the broker is stopped here), after the fuzz tests above."""
    assert fuzz_broker.check_after(broker) == []
    data_dir: Path = broker.data_dir
    assert (data_dir / "log").is_dir() and (data_dir / "topics.json").is_file()


def test_the_layout_check_flags_what_is_outside_the_layout(tmp_path: Path) -> None:
    """Self-check of ``layout_violations``: every good path passes, every bad one is named."""
    good = [
        "LOCK", "topics.json", "topics.json.bak", "offsets.json", "checkpoint.json.bak",
        "broker.json", "log/000000000.chunk", "log/000000001.chunk",
        "index/fz0/0/000000000.idx", "index/a..b/12/000000003.idx",
        "index/%RETRY%g1/0/000000000.idx", "timer/wheel", "timer/000000002.tlog",
    ]  # fmt: skip
    bad = [
        "x", "log/0.chunk", "log/000000000.chunk.tmp", "index/..x/0/000000000.idx",
        "index/fz0/00/000000000.idx", "index/fz0/0/x", "index/fz0/0/1/000000000.idx",
        "txn/notes.txt", "txn/sinks.json", "topics.json.tmp", "log/sub/000000000.chunk",
        "index/%mine%x/0/000000000.idx", "timer/1.tlog", "timer/sub/wheel",
    ]  # fmt: skip
    for name in good + bad:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    found = {Path(p).relative_to(tmp_path).as_posix() for p in layout_violations(tmp_path)}
    assert found.isdisjoint(good)
    assert set(bad) <= found
    assert layout_violations(tmp_path / "index" / "fz0") != []  # not a data dir at all
