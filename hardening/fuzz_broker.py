"""Fuzz every RPC of a live broker with malformed and extreme requests (Hypothesis).

Run ``python hardening/fuzz_broker.py --requests 10000`` (``make fuzz``): starts a
broker on 127.0.0.1 in a temporary directory, sends the requests one at a
time, each with a deadline, and prints the status codes seen per RPC. Exit
code 1 if a request got an undefined status (other than the known bugs listed
in ``KNOWN_BUGS``), the broker died, the round trip afterwards failed, or the
data directory holds anything outside its layout. ``tests/hardening/test_fuzz.py``
runs a few hundred requests of the same strategies, derandomized.

What is sent, to every method of the ``Broker`` and ``Admin`` services (read
from the generated descriptors, so RPCs added later are fuzzed too) and to
the standard health check:

- typed requests, every field drawn at random: strings from a pool of
  existing topic/group names, path tricks (``../x``, ``a/b``, ``/etc``, NUL,
  129 characters, unicode) and random text; bytes at random; integers at and
  around their type's limits (huge counts, negative offsets, deep waits);
  repeated fields empty, long, or mismatched; enum values out of range;
- produce batches that are well-formed and then broken in one place (a count
  off by one, lengths that do not sum, a negative key length, undecodable
  headers, a 5 MiB value, queue ids out of range);
- raw bytes instead of a serialized request: random bytes, a serialized random
  request with bytes flipped, cut or appended, and a string field holding
  invalid UTF-8.

A status is *defined* when it is one the contract names for bad input: OK,
INVALID_ARGUMENT, NOT_FOUND, OUT_OF_RANGE, FAILED_PRECONDITION,
RESOURCE_EXHAUSTED, ALREADY_EXISTS. UNKNOWN, INTERNAL, DATA_LOSS, UNAVAILABLE,
CANCELLED, UNIMPLEMENTED and DEADLINE_EXCEEDED (every call's deadline is far
above the broker's longest park) are not.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `hardening` as a package

from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_checks import details_of, layout_violations, pull_queue, status_of
from equeue_broker.testing_report import table
from equeue_proto.record import encode_headers
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_proto.wire import varint

Code = grpc.StatusCode
DEFINED = frozenset(
    {
        Code.OK,
        Code.INVALID_ARGUMENT,
        Code.NOT_FOUND,
        Code.OUT_OF_RANGE,
        Code.FAILED_PRECONDITION,
        Code.RESOURCE_EXHAUSTED,
        Code.ALREADY_EXISTS,
    }
)
DEADLINE_S = 10.0
MAX_WAIT_MS = 200
"""The fuzzed broker's ``--max-wait-ms``: parked pulls end long before any deadline."""
BROKER_FLAGS = (
    "--max-wait-ms", str(MAX_WAIT_MS), "--chunk-size", str(1 << 20),
    "--max-message-bytes", str(1 << 20), "--default-queues", "2",
    "--consumer-timeout-ms", "2000", "--log-level", "ERROR",
)  # fmt: skip
TOPICS = ("fz0", "fz1", "fz.a", "fz-b_c")
"""Created with data before fuzzing, so reads and commits reach real queues."""
GROUPS = ("g0", "g1")
MAX_STREAM_REPLIES = 1_000

U32, I32, U64, I64 = 2**32 - 1, 2**31 - 1, 2**64 - 1, 2**63 - 1

# -- the RPCs --------------------------------------------------------------------------


@dataclass(frozen=True)
class Rpc:
    name: str
    """``Service/Method``."""
    path: str
    request: Descriptor
    client_streaming: bool
    server_streaming: bool

    @property
    def request_class(self) -> type[Message]:
        return message_factory.GetMessageClass(self.request)


def _rpcs() -> list[Rpc]:
    methods: list[MethodDescriptor] = []
    for service in ("Broker", "Admin"):
        methods += list(pb.DESCRIPTOR.services_by_name[service].methods)
    methods.append(health_pb2.DESCRIPTOR.services_by_name["Health"].methods_by_name["Check"])
    return [
        Rpc(
            f"{m.containing_service.name}/{m.name}",
            f"/{m.containing_service.full_name}/{m.name}",
            m.input_type,
            m.client_streaming,
            m.server_streaming,
        )
        for m in methods
    ]


RPCS = _rpcs()

# -- values ------------------------------------------------------------------------------

PATH_TRICKS = (
    "", ".", "..", "../x", "../../etc/passwd", "a/b", "/etc", "/", "x/../../y", "a\\b",
    "fz0/../fz1", "\x00", "fz0\x00", "a" * 129, "a" * 128, ".hidden", "-dash", "_u",
    "ü", "a b", " fz0", "fz0 ", "CON", "a..b", "fz0\n", "\u202e", "index", "log",
    "topics.json", "*", "?", "%2e%2e",
)  # fmt: skip


def names() -> st.SearchStrategy[str]:
    """Topic/group names: mostly existing ones (to reach past name checks), else
    path tricks, valid new ones and random text."""
    existing = st.sampled_from(TOPICS + GROUPS)
    others = (
        st.sampled_from(PATH_TRICKS),
        st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
        st.text(max_size=40),
    )
    return st.integers(0, 9).flatmap(lambda i: existing if i < 6 else others[i % 3])


def ints(low: int, high: int) -> st.SearchStrategy[int]:
    """Integers in [low, high], weighted towards the limits and small values."""
    edges = sorted(
        {v for b in (low, high, 0, -1, 1, 2**31, 2**32, 2**63 - 1) for v in (b - 1, b, b + 1)}
    )
    return st.one_of(
        st.sampled_from([v for v in edges if low <= v <= high]),
        st.integers(max(low, 0), min(high, 50)),
        st.integers(low, high),
    )


_INT_RANGES = {
    FieldDescriptor.TYPE_UINT32: (0, U32),
    FieldDescriptor.TYPE_FIXED32: (0, U32),
    FieldDescriptor.TYPE_INT32: (-(2**31), I32),
    FieldDescriptor.TYPE_SINT32: (-(2**31), I32),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), I32),
    FieldDescriptor.TYPE_UINT64: (0, U64),
    FieldDescriptor.TYPE_FIXED64: (0, U64),
    FieldDescriptor.TYPE_INT64: (-(2**63), I64),
    FieldDescriptor.TYPE_SINT64: (-(2**63), I64),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), I64),
}


def scalar(f: FieldDescriptor, tame: bool) -> st.SearchStrategy[Any]:
    """Values for one (non-repeated) field, chosen by type and by name.

    ``tame``: plausible values only (existing names, small numbers), so that a
    request gets past validation and into the store's code paths.
    """
    name = f.name
    if f.type == FieldDescriptor.TYPE_STRING:
        if name in ("topic", "name", "group", "service") or name.endswith("topic"):
            return st.sampled_from(TOPICS + GROUPS) if tame else names()
        if name == "message_id":
            return st.one_of(
                st.builds(
                    lambda b, p: f"{b}-{p:016x}",
                    st.text(max_size=12),
                    st.integers(0, 5000) if tame else st.integers(0, U64),
                ),
                st.text(max_size=40),
            )
        if tame:
            return st.text("abcxyz-_.0123", max_size=12)
        return st.one_of(st.text(max_size=300), st.sampled_from(PATH_TRICKS))
    if f.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=200) if tame else st.binary(max_size=4000)
    if f.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if f.type == FieldDescriptor.TYPE_ENUM:
        return st.integers(0, 3) if tame else st.integers(-3, 10)
    if f.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=not tame, allow_infinity=not tame, width=32)
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        assert f.message_type is not None
        return typed_message(f.message_type, tame)
    low, high = _INT_RANGES[f.type]
    if name == "max_wait_ms":  # a park costs its wait: mostly none, or out of range
        if tame:
            return st.one_of(st.just(0), st.integers(1, 50))
        return st.one_of(st.just(0), st.sampled_from([MAX_WAIT_MS + 1, 60_000, U32]))
    if tame:
        return st.integers(max(low, 0), 40)
    if name in ("queue_count", "count"):
        return st.one_of(st.integers(0, 6), ints(low, high))
    return ints(low, high)


def value_of(f: FieldDescriptor, tame: bool) -> st.SearchStrategy[Any]:
    """Values for a field, repeated or map fields included."""
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        key_field = f.message_type.fields_by_name["key"]
        value_field = f.message_type.fields_by_name["value"]
        return st.dictionaries(
            scalar(key_field, tame), scalar(value_field, tame), max_size=4 if tame else 8
        )
    if f.is_repeated:
        if tame:
            return st.lists(scalar(f, tame), max_size=3)
        return st.one_of(
            st.lists(scalar(f, tame), max_size=4),
            st.lists(scalar(f, tame), min_size=5, max_size=300),
        )
    return scalar(f, tame)


def typed_message(descriptor: Descriptor, tame: bool = False) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor`` with every field set or not, at random."""
    cls = message_factory.GetMessageClass(descriptor)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        message = cls()
        for f in descriptor.fields:
            if draw(st.integers(0, 9)) < 3:  # left unset (the default)
                continue
            assign(message, f, draw(_deferred_value(f, tame)))
        return message

    return build()


def _deferred_value(f: FieldDescriptor, tame: bool) -> st.SearchStrategy[Any]:
    """``value_of`` built on first use (message types may nest themselves)."""
    return st.deferred(lambda: value_of(f, tame))


def assign(message: Message, f: FieldDescriptor, value: Any) -> None:
    target = getattr(message, f.name)
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        if f.message_type.fields_by_name["value"].message_type is None:
            target.update(value)
        else:
            for k, v in value.items():
                target[k].CopyFrom(v)
    elif f.is_repeated:
        if f.message_type is None:
            target.extend(value)
        else:
            for item in value:
                target.add().CopyFrom(item)
    elif f.message_type is not None:
        target.CopyFrom(value)
    else:
        setattr(message, f.name, value)


# -- produce batches, well-formed and then broken ------------------------------------------

MUTATIONS = (
    "none", "count+1", "count-1", "count=0", "count=huge", "value_lengths short",
    "value_lengths long", "values extra byte", "key_lengths -2", "key_lengths short",
    "keys without lengths", "tags short", "headers garbage", "header_lengths short",
    "timestamps short", "queue_ids short", "huge value", "many messages",
)  # fmt: skip


@st.composite
def produce_request(draw: st.DrawFn, tame: bool = False) -> pb.ProduceRequest:
    """Well-formed batches (tame: to existing topics) broken in one place, or not."""
    n = draw(st.integers(1, 12))
    values = draw(st.lists(st.binary(max_size=300), min_size=n, max_size=n))
    columns = pb.MessageColumns(count=n, values=b"".join(values))
    columns.value_lengths.extend(len(v) for v in values)
    if draw(st.booleans()):
        keys = draw(st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=n, max_size=n))
        columns.keys = b"".join(k for k in keys if k is not None)
        columns.key_lengths.extend(-1 if k is None else len(k) for k in keys)
    if draw(st.booleans()):
        tag = st.one_of(st.sampled_from(["", "a", "b", "x" * 255, "y" * 256]), st.text(max_size=20))
        columns.tags.extend(draw(st.lists(tag, min_size=n, max_size=n)))
    if draw(st.booleans()):
        header = st.tuples(st.text(max_size=20), st.binary(max_size=40))
        headers = draw(st.lists(st.lists(header, max_size=3).map(tuple), min_size=n, max_size=n))
        encoded = [encode_headers(h) if h else b"" for h in headers]
        columns.headers = b"".join(encoded)
        columns.header_lengths.extend(len(e) for e in encoded)
    if draw(st.booleans()):
        columns.timestamps_ms.extend(draw(st.lists(ints(-(2**63), I64), min_size=n, max_size=n)))
    topic = st.sampled_from(TOPICS) if tame else names()
    request = pb.ProduceRequest(topic=draw(topic), messages=columns)
    if draw(st.booleans()):
        queue = st.one_of(st.integers(-1, 4), st.sampled_from([-2, 255, 256, 1023, 2**31 - 1]))
        request.queue_ids.extend(draw(st.lists(queue, min_size=n, max_size=n)))
    mutate("none" if tame else draw(st.sampled_from(MUTATIONS)), request, draw)
    return request


def mutate(how: str, request: pb.ProduceRequest, draw: st.DrawFn) -> None:
    c = request.messages
    if how == "count+1":
        c.count += 1
    elif how == "count-1":
        c.count -= 1
    elif how == "count=0":
        c.count = 0
    elif how == "count=huge":
        c.count = draw(st.sampled_from([2**31, U32, 100_001, 10**9]))
    elif how == "value_lengths short" and c.value_lengths:
        del c.value_lengths[-1]
    elif how == "value_lengths long":
        c.value_lengths.append(draw(st.sampled_from([0, 1, U32])))
    elif how == "values extra byte":
        c.values += b"\x00"
    elif how == "key_lengths -2":
        c.key_lengths[:] = [-2] * c.count
    elif how == "key_lengths short" and c.key_lengths:
        del c.key_lengths[-1]
    elif how == "keys without lengths":
        c.keys = b"key"
        del c.key_lengths[:]
    elif how == "tags short" and c.tags:
        del c.tags[-1]
    elif how == "headers garbage":
        garbage = draw(st.binary(min_size=1, max_size=30))
        c.headers = garbage
        c.header_lengths[:] = [len(garbage)] + [0] * (c.count - 1)
    elif how == "header_lengths short" and c.header_lengths:
        del c.header_lengths[-1]
    elif how == "timestamps short" and c.timestamps_ms:
        del c.timestamps_ms[-1]
    elif how == "queue_ids short" and request.queue_ids:
        del request.queue_ids[-1]
    elif how == "huge value":
        big = draw(st.sampled_from([(1 << 20) - 200, (1 << 20) + 1, 5 << 20]))
        c.values = b"v" * big
        c.value_lengths[:] = [big] + [0] * (c.count - 1)
    elif how == "many messages":
        n = draw(st.sampled_from([10_000, 100_001]))
        c.count = n
        c.values = b""
        c.value_lengths[:] = [0] * n
        for name in ("key_lengths", "tags", "header_lengths", "timestamps_ms"):
            del getattr(c, name)[:]
        c.keys = c.headers = b""
        del request.queue_ids[:]


# -- raw payloads --------------------------------------------------------------------------


def invalid_utf8(descriptor: Descriptor) -> st.SearchStrategy[bytes]:
    """A request whose string field (or a string in a nested message) is not UTF-8."""
    strings = [f for f in descriptor.fields if f.type == FieldDescriptor.TYPE_STRING]
    if not strings:
        return st.binary(max_size=50)

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        f = draw(st.sampled_from(strings))
        bad = draw(st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"fz0\xfe", b"\x80"]))
        return varint(f.number << 3 | 2) + varint(len(bad)) + bad

    return build()


def raw_payload(rpc: Rpc) -> st.SearchStrategy[bytes]:
    def damaged(data: bytes, cut: int, flips: list[tuple[int, int]], tail: bytes) -> bytes:
        out = bytearray(data[: max(0, len(data) - cut)])
        for at, bits in flips:
            if out:
                out[at % len(out)] ^= bits or 1
        return bytes(out) + tail

    serialized = typed_message(rpc.request).map(lambda m: m.SerializeToString())
    return st.one_of(
        st.binary(max_size=300),
        st.builds(
            damaged,
            serialized,
            st.integers(0, 8),
            st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
            st.binary(max_size=8),
        ),
        invalid_utf8(rpc.request),
    )


# -- calls and their outcomes ----------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    rpc: Rpc
    payloads: tuple[bytes, ...]
    """Serialized requests (one unless the RPC streams requests)."""
    raw: bool


@dataclass(frozen=True)
class Outcome:
    call: Call
    code: grpc.StatusCode
    details: str
    replies: int


def call_strategy(rpcs: Sequence[Rpc], raw_share: float) -> st.SearchStrategy[Call]:
    """Calls to one of ``rpcs``: raw bytes (a ``raw_share`` of them), or typed
    requests, half of them tame, and for produce half well-formed-then-broken."""

    @st.composite
    def build(draw: st.DrawFn) -> Call:
        rpc = draw(st.sampled_from(list(rpcs)))
        raw = draw(st.floats(0, 1)) < raw_share
        tame = draw(st.booleans())
        count = draw(st.integers(1, 3)) if rpc.client_streaming else 1
        payloads = []
        for _ in range(count):
            if raw:
                payloads.append(draw(raw_payload(rpc)))
            elif rpc.request.full_name == pb.ProduceRequest.DESCRIPTOR.full_name and draw(
                st.booleans()
            ):
                payloads.append(draw(produce_request(tame)).SerializeToString())
            else:
                payloads.append(draw(typed_message(rpc.request, tame)).SerializeToString())
        return Call(rpc, tuple(payloads), raw)

    return build()


class Fuzzer:
    """Sends calls on one channel and tallies what came back."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", 100 << 20),
                ("grpc.max_receive_message_length", 100 << 20),
            ],
        )
        self.seen: collections.Counter[tuple[str, str]] = collections.Counter()
        self.known: collections.Counter[str] = collections.Counter()
        self.undefined: list[Outcome] = []
        self.calls = 0
        self.messages = 0

    def send(self, call: Call) -> Outcome:
        rpc = call.rpc
        replies = 0
        code, details = Code.OK, ""
        try:
            if rpc.client_streaming:
                method = self.channel.stream_stream(rpc.path, None, None)
                for _reply in method(iter(call.payloads), timeout=DEADLINE_S):
                    replies += 1
            elif rpc.server_streaming:
                stream = self.channel.unary_stream(rpc.path, None, None)
                for _reply in stream(call.payloads[0], timeout=DEADLINE_S):
                    replies += 1
                    if replies >= MAX_STREAM_REPLIES:
                        break
            else:
                self.channel.unary_unary(rpc.path, None, None)(call.payloads[0], timeout=DEADLINE_S)
                replies = 1
        except grpc.RpcError as exc:
            code, details = status_of(exc), details_of(exc)
        outcome = Outcome(call, code, details, replies)
        self.calls += 1
        self.messages += len(call.payloads)
        self.seen[(rpc.name, code.name)] += 1
        bug = known_bug(outcome)
        if bug:
            self.known[bug] += 1
        elif code not in DEFINED:
            self.undefined.append(outcome)
        return outcome

    def close(self) -> None:
        self.channel.close()


# -- known bugs: recognised precisely, so that nothing else hides behind them ----------------


KNOWN_BUGS: dict[str, tuple[str, Callable[[Outcome], bool]]] = {}
"""name -> (description, recogniser). Remove an entry once the broker is fixed
(``tests/hardening/test_fuzz.py`` pins each with an xfail(strict=True) repro)."""


def known_bug(outcome: Outcome) -> str | None:
    for name, (_description, matches) in KNOWN_BUGS.items():
        if matches(outcome):
            return name
    return None


def describe(outcome: Outcome) -> str:
    payloads = ", ".join(
        p[:80].hex() + ("..." if len(p) > 80 else "") for p in outcome.call.payloads
    )
    kind = "raw bytes" if outcome.call.raw else "request"
    return f"{outcome.call.rpc.path} ({kind} {payloads}) -> {outcome.code.name}: {outcome.details}"


# -- a fuzzed broker ---------------------------------------------------------------------------


def prepare(address: str) -> None:
    """Topics with a few messages and groups with commits, for the fuzzer to hit."""
    with grpc.insecure_channel(address) as channel:
        admin = pb_grpc.AdminStub(channel)
        stub = pb_grpc.BrokerStub(channel)
        for topic in TOPICS:
            admin.CreateTopic(pb.CreateTopicRequest(name=topic, queue_count=2), timeout=DEADLINE_S)
            for q in range(2):
                values = [f"{topic}-{q}-{i}".encode() for i in range(20)]
                columns = pb.MessageColumns(
                    count=20, values=b"".join(values), value_lengths=map(len, values)
                )
                stub.Produce(
                    pb.ProduceRequest(topic=topic, messages=columns, queue_ids=[q] * 20),
                    timeout=DEADLINE_S,
                )
        for group in GROUPS:
            stub.CommitOffsets(
                pb.CommitOffsetsRequest(
                    group=group, offsets=[pb.QueueOffset(topic=TOPICS[0], queue_id=0, offset=5)]
                ),
                timeout=DEADLINE_S,
            )


def round_trip(address: str, topic: str = "after-the-fuzz") -> None:
    """A normal produce and pull still work."""
    with grpc.insecure_channel(address) as channel:
        admin = pb_grpc.AdminStub(channel)
        stub = pb_grpc.BrokerStub(channel)
        admin.CreateTopic(pb.CreateTopicRequest(name=topic, queue_count=1), timeout=DEADLINE_S)
        values = [f"round-trip-{i}".encode() for i in range(50)]
        columns = pb.MessageColumns(
            count=50, values=b"".join(values), value_lengths=map(len, values)
        )
        reply = stub.Produce(pb.ProduceRequest(topic=topic, messages=columns), timeout=DEADLINE_S)
        assert list(reply.offsets) == list(range(50)), reply
        messages, _ = pull_queue(stub, topic, 0, timeout_s=DEADLINE_S)
        assert [m.value for m in messages] == values


def check_after(broker: BrokerProcess) -> list[str]:
    """Alive, round trip, clean stop, nothing outside the layout (or the data dir)."""
    problems: list[str] = []
    if not broker.alive():
        return [f"the broker died:\n{broker.log_tail()}"]
    try:
        round_trip(broker.address)
    except (AssertionError, grpc.RpcError) as exc:
        problems.append(f"round trip after the fuzz failed: {exc}")
    code = broker.stop()
    if code != 0:
        problems.append(f"broker exited with {code} on SIGTERM")
    problems += [f"outside the layout: {p}" for p in layout_violations(broker.data_dir)]
    siblings = {p.name for p in broker.data_dir.parent.iterdir()}
    extra = siblings - {broker.data_dir.name, broker.log_path.name}
    problems += [f"created beside the data dir: {name}" for name in sorted(extra)]
    return problems


def fuzz(
    fuzzer: Fuzzer, rpcs: Sequence[Rpc], requests: int, *, seed: int, raw_share: float = 0.25
) -> None:
    """Send about ``requests`` calls to ``rpcs``, drawn by Hypothesis from ``seed``
    (generation only, no shrinking: every outcome is tallied instead of raised)."""

    @hypothesis_seed(seed)
    @settings(
        max_examples=requests,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(call_strategy(rpcs, raw_share))
    def run(call: Call) -> None:
        fuzzer.send(call)

    run()


def report(fuzzer: Fuzzer) -> str:
    """Statuses seen per RPC, then the known bugs hit."""
    codes = sorted({code for _rpc, code in fuzzer.seen})
    rows = []
    for rpc in RPCS:
        counts = [fuzzer.seen.get((rpc.name, code), 0) for code in codes]
        rows.append([rpc.name, sum(counts), *counts])
    totals = [sum(fuzzer.seen.get((r.name, code), 0) for r in RPCS) for code in codes]
    rows.append(["all", sum(totals), *totals])
    out = [table(["rpc", "calls", *codes], rows)]
    if fuzzer.known:
        out.append("")
        out.append(
            table(
                ["known bug", "calls", "what"],
                [[name, n, KNOWN_BUGS[name][0]] for name, n in sorted(fuzzer.known.items())],
            )
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--raw-share", type=float, default=0.25, help="share of raw-byte calls")
    parser.add_argument("--flush", choices=["sync", "async"], default="async")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="equeue-fuzz-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", "--flush", args.flush, *BROKER_FLAGS)
        broker.start()
        try:
            prepare(broker.address)
            fuzzer = Fuzzer(broker.address)
            per_rpc = -(-args.requests // len(RPCS))
            for round_number in range(10):  # bounded: more rounds only if Hypothesis ran short
                for i, rpc in enumerate(RPCS):
                    if not broker.alive():
                        break
                    fuzz(
                        fuzzer, [rpc], per_rpc,
                        seed=(args.seed * 10 + round_number) * 1_000 + i,
                        raw_share=args.raw_share,
                    )  # fmt: skip
                    elapsed = time.monotonic() - started
                    print(f"{rpc.name}: {fuzzer.calls:,} calls, {elapsed:.0f} s", flush=True)
                if fuzzer.calls >= args.requests or not broker.alive():
                    break
            fuzzer.close()
            peak = broker.peak_rss_bytes()
            problems = check_after(broker)
        finally:
            broker.kill()
    elapsed = time.monotonic() - started
    print(
        f"\n## Fuzz: {fuzzer.calls:,} calls ({fuzzer.messages:,} request messages) "
        f"in {elapsed:.0f} s, seed {args.seed}, {args.flush} flush\n"
    )
    print(report(fuzzer))
    print(f"\nbroker peak RSS: {peak / 2**20:.1f} MiB" if peak else "")
    print(f"undefined statuses (new bugs): {len(fuzzer.undefined)}")
    for outcome in fuzzer.undefined[:30]:
        print(f"UNDEFINED: {describe(outcome)}")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return 1 if fuzzer.undefined or problems else 0


if __name__ == "__main__":
    sys.exit(main())
