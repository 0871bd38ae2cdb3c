"""What ``Producer(validate=True)`` costs (issue 29): validating vs plain produce.

Run ``python bench/schema_bench.py``. One real ``python -m equeue_broker``
process on 127.0.0.1 (``--flush async``) over a temporary directory that is
removed at the end; the client is this Python process. Two topics with
schemas: ``avro`` (a record of a long, two strings and a double) and ``json``
(the same shape as a JSON Schema object), values of about 100 B each (the
Avro datum and the JSON document), made once before the timed runs. Per
format, ``Producer.send_batch`` of ``--batch`` values (keyless, 4 queues,
idempotent: the defaults) for ``--seconds`` with ``validate=True`` (each
value checked against the latest schema, a version header stamped) and the
same batches with a plain producer, on a fresh topic each run, alternating
which runs first; medians of ``--repeat`` rounds and the ratio
validating / plain of the same run.

Then the slow case of registration: a topic given ``--versions`` Avro
versions (each the base record plus one optional field of its own, so every
version can read every other: registered under rule NONE, quickly), then the
rule BACKWARD_TRANSITIVE (every new version checked against every earlier
one) and ``--timed`` more versions, each ``Admin.set_schema`` timed (the
client reads the history, the broker checks and saves): median and max.

``--quick`` is a smoke run of a few seconds. Tables go to stdout (markdown),
progress to stderr.

Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import fastavro

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` as a package

from bench._measure import progress
from bench._servers import start_equeue
from equeue_spark.client import Admin, Producer

QUEUES = 4
AVRO = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "sensor", "type": "string"},
        {"name": "note", "type": "string"},
        {"name": "value", "type": "double"},
    ],
}
JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "sensor": {"type": "string"},
        "note": {"type": "string"},
        "value": {"type": "number"},
    },
    "required": ["id", "sensor", "value"],
}


def datum(i: int, note: int) -> dict[str, object]:
    return {"id": i, "sensor": f"sensor-{i % 97:03d}", "note": "x" * note, "value": i / 7}


def avro_values(count: int) -> list[bytes]:
    """About 100 B Avro datums."""
    parsed = fastavro.parse_schema(AVRO)
    out = []
    for i in range(count):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, datum(i, 70))
        out.append(buf.getvalue())
    return out


def json_values(count: int) -> list[bytes]:
    """About 100 B JSON documents."""
    return [json.dumps(datum(i, 30), separators=(",", ":")).encode() for i in range(count)]


def produce_for(producer: Producer, topic: str, values: Sequence[bytes], seconds: float) -> float:
    """Messages per second of ``send_batch(values)`` repeated for ``seconds``."""
    producer.send_batch(topic, values)  # warm-up: routes, producer id, schema cache
    sent = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        producer.send_batch(topic, values)
        sent += len(values)
    return sent / (time.perf_counter() - started)


def run(args: argparse.Namespace) -> str:
    values = {"avro": avro_values(args.batch), "json": json_values(args.batch)}
    sizes = {f: statistics.mean(len(v) for v in vs) for f, vs in values.items()}
    rates: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="schema-bench-") as tmp:
        broker, address = start_equeue(Path(tmp) / "data", "async")
        try:
            with Admin(address) as admin, Producer(address) as plain, \
                    Producer(address, validate=True) as checking:  # fmt: skip
                run_id = 0
                for round_ in range(args.repeat):
                    for fmt in args.formats:
                        order = (True, False) if round_ % 2 == 0 else (False, True)
                        for validate in order:
                            run_id += 1
                            topic = f"{fmt}-{run_id}"
                            admin.create_topic(topic, queues=QUEUES)
                            schema = AVRO if fmt == "avro" else JSON_SCHEMA
                            admin.set_schema(topic, schema)
                            producer = checking if validate else plain
                            rate = produce_for(producer, topic, values[fmt], args.seconds)
                            rates.setdefault((fmt, validate), []).append(rate)
                            what = "validate" if validate else "plain   "
                            progress(f"round {round_ + 1} {fmt:4} {what} {rate:10,.0f} msgs/s")
        finally:
            broker.stop()
    lines = [
        f"`send_batch` of {args.batch:,} values, keyless, {QUEUES} queues, idempotent; "
        f"{args.seconds:g} s per run, medians of {args.repeat} round(s)",
        "",
        "| format | value size | plain msgs/s | validate=True msgs/s | validate / plain |",
        "|---|---:|---:|---:|---:|",
    ]
    for fmt in args.formats:
        p = statistics.median(rates[(fmt, False)])
        v = statistics.median(rates[(fmt, True)])
        lines.append(f"| {fmt} | {sizes[fmt]:.0f} B | {p:,.0f} | {v:,.0f} | {v / p:.2f}x |")
    per_round = [
        f"{fmt}: "
        + ", ".join(
            f"{v / p:.2f}x" for p, v in zip(rates[(fmt, False)], rates[(fmt, True)], strict=True)
        )
        for fmt in args.formats
    ]
    return "\n".join([*lines, "", "ratio per round: " + "; ".join(per_round)])


def version_schema(n: int) -> dict[str, object]:
    """The base record plus field ``f<n>`` with a default: any two read each other."""
    extra = {"name": f"f{n}", "type": ["null", "string"], "default": None}
    return {**AVRO, "fields": [*AVRO["fields"], extra]}


def run_registration(args: argparse.Namespace) -> str:
    timings: list[float] = []
    with tempfile.TemporaryDirectory(prefix="schema-bench-") as tmp:
        broker, address = start_equeue(Path(tmp) / "data", "async")
        try:
            with Admin(address) as admin:
                admin.create_topic("history", queues=1)
                for n in range(1, args.versions + 1):
                    admin.set_schema("history", version_schema(n), compatibility="NONE")
                    if n % 200 == 0:
                        progress(f"registered {n} versions")
                admin.set_compatibility("history", "BACKWARD_TRANSITIVE")
                for n in range(args.versions + 1, args.versions + 1 + args.timed):
                    started = time.perf_counter()
                    info = admin.set_schema("history", version_schema(n))
                    timings.append(time.perf_counter() - started)
                    assert info.created and info.versions[0].version == n
        finally:
            broker.stop()
    return (
        f"`set_schema` of version {args.versions + 1} onwards under BACKWARD_TRANSITIVE "
        f"(checked against every earlier version), {args.timed} timed: median "
        f"{statistics.median(timings) * 1000:.0f} ms, max {max(timings) * 1000:.0f} ms"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per run (default 3)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--batch", type=int, default=1000, help="values per batch (default 1000)")
    parser.add_argument(
        "--formats", type=lambda s: s.split(","), default=["avro", "json"],
        help="comma list of avro, json (default both)",
    )  # fmt: skip
    parser.add_argument(
        "--versions", type=int, default=995,
        help="history before the timed ones (default 995: 1,000 in all, the broker's limit)",
    )  # fmt: skip
    parser.add_argument("--timed", type=int, default=5, help="timed registrations (default 5)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 0.2 s runs, one round, 20 versions, 2 timed")  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.repeat, args.versions, args.timed = 0.2, 1, 20, 2
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"# schema_bench {' '.join(sys.argv[1:])}\n\n{run(args)}\n")
    print(run_registration(args))


if __name__ == "__main__":
    main()
