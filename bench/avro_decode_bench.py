"""Avro decoding benchmark: records/s of the C decoder and of the fastavro reference.

Run ``python bench/avro_decode_bench.py`` (a minute; ``--records N``, ``--repeat R``;
``--quick`` for a smoke run of a few seconds).
In one process: N datums of design fact 5's shape (~30 B: long, string, double,
timestamp-millis, enum, ["null","string"]) written with fastavro, as one Arrow binary
array, decoded by ``spark.avro_arrow.decode_avro`` into Spark's struct type: the C path
(``equeue_proto._avro``) and the pure-Python reference (fastavro per value, on the
first ``--reference-records`` only: it is ~100x slower). Also the v1 -> v2 resolution
(a reader with one more field with a default). Best of ``--repeat`` runs, one thread;
wall and CPU time (the decoder is single-threaded, so CPU time is its cost).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from fastavro import parse_schema, schemaless_writer

from equeue_spark.client.avro_reference import decode_reference
from equeue_spark.spark import avro_arrow

V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "status",
            "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]},
        },
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
V2: dict[str, Any] = {
    **V1,
    "fields": [*V1["fields"], {"name": "qty", "type": "int", "default": 1}],
}


def _values(n: int) -> pa.Array:
    schema = parse_schema(V1)
    now = datetime.datetime(2026, 11, 27, tzinfo=datetime.UTC)
    out = []
    for i in range(n):
        buf = io.BytesIO()
        datum = {
            "id": i,
            "customer": f"cust-{i % 1000:05d}",
            "amount": i * 0.5,
            "ts": now,
            "status": "PAID",
            "note": None if i % 3 else "x",
        }
        schemaless_writer(buf, schema, datum)
        out.append(buf.getvalue())
    return pa.array(out, pa.binary())


def _best(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """The best wall and CPU seconds of ``repeat`` runs (CPU: this process's, so a
    machine busy with other work inflates the wall figure more than this one)."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--reference-records", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 20,000 records (reference 2,000), one round",
    )
    args = parser.parse_args()
    if args.quick:
        args.records, args.reference_records, args.repeat = 20_000, 2_000, 1
    if avro_arrow.IMPLEMENTATION != "c":
        raise SystemExit("equeue_proto._avro is not built (or EQUEUE_PURE_PYTHON is set)")
    values = _values(args.records)
    small = values.slice(0, args.reference_records)
    avg = values.nbytes / len(values)
    print(f"{len(values):,} datums, {avg:.1f} B each incl. offsets")
    head = ("path", "records", "wall s", "cpu s", "rec/s wall", "rec/s cpu")
    print(f"{head[0]:<34}{head[1]:>11}{head[2]:>9}{head[3]:>9}{head[4]:>13}{head[5]:>13}")
    for name, reader in (("v1 -> v1", V1), ("v1 -> v2 (added field)", V2)):
        _measure(name, json.dumps(V1), json.dumps(reader), values, small, repeat=args.repeat)


def _measure(name: str, w: str, r: str, values: pa.Array, small: pa.Array, *, repeat: int) -> None:
    t = avro_arrow.avro_arrow_type(r)
    rows: list[tuple[str, pa.Array, Callable[[], object]]] = [
        ("C " + name, values, lambda: avro_arrow.decode_avro(values, w, r, t)),
        ("reference " + name, small, lambda: decode_reference(small.to_pylist(), w, r)),
    ]
    for label, batch, fn in rows:
        wall, cpu = _best(fn, repeat)
        n = len(batch)
        print(f"{label:<34}{n:>11,}{wall:>9.3f}{cpu:>9.3f}{n / wall:>13,.0f}{n / cpu:>13,.0f}")


if __name__ == "__main__":
    main()
