"""The broker benchmark's idempotence scenario (``bench/broker_bench.py --scenario idempotence``).

Produce with ``Producer(enable_idempotence=True)`` (the default) beside
``enable_idempotence=False``, on one broker, same run: values of 100 B and
1 KiB, batches of 1,000, unary (``send_batch``, one batch per round trip)
and streaming (``send_batches``, pipelined on one ``ProduceStream``), each
keyless (a batch goes whole to one of the 4 queues: one producer record per
batch) and keyed (1,000 keys over the 4 queues: a batch writes every queue,
one producer record per queue). Each measurement gets a fresh topic and runs
``plan.produce_s`` seconds after a warm-up batch (which makes the
idempotent producer's ``InitProducer`` call); the two settings alternate
which runs first from round to round, and the table gives the medians of
the rounds and the ratio on / off. The broker's CPU seconds per million
messages (``/proc``, user + system) say where a difference comes from.

Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench._broker_measure import BATCH, QUEUES, RPC_TIMEOUT_S, SIZES, Plan, values_for
from bench._measure import progress, size_label
from bench._servers import start_equeue
from equeue_spark.client import Admin, ClientConfig, Producer

TARGET = 0.9
"""Issue 25: idempotent produce at >= 0.9x of produce without it."""
PATHS = ("unary", "stream")


@dataclass
class Cell:
    rates: list[float] = field(default_factory=list)
    broker_cpu_s_per_m: list[float] = field(default_factory=list)

    def rate(self) -> float:
        return statistics.median(self.rates)

    def cpu(self) -> float:
        return statistics.median(self.broker_cpu_s_per_m)


Key = tuple[int, str, bool, bool]
"""(size, path, keyed, idempotent)."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(producer: Producer, topic: str, size: int, path: str, *, keyed: bool, plan: Plan,
            broker_pid: int) -> tuple[float, float]:  # fmt: skip
    """(msgs/s, broker CPU s per million messages) of one run."""
    values = values_for(size)
    keys: list[bytes | None] | None = [b"key-%d" % i for i in range(BATCH)] if keyed else None
    producer.send_batch(topic, values, keys=keys)  # warm-up: InitProducer, channel, chunk
    max_batches = max(1, plan.produce_max_bytes // (size * BATCH))
    cpu_before = cpu_seconds(broker_pid)
    start = time.perf_counter()
    deadline = start + plan.produce_s
    sent = 0
    if path == "unary":
        for _ in range(max_batches):
            if time.perf_counter() >= deadline:
                break
            sent += len(producer.send_batch(topic, values, keys=keys))
    else:

        def batches() -> Iterator[list[bytes]]:
            for _ in range(max_batches):
                if time.perf_counter() >= deadline:
                    return
                yield values

        key_columns = None if keys is None else iter(lambda: keys, None)
        sent = sum(len(r) for r in producer.send_batches(topic, batches(), keys=key_columns))
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds(broker_pid) - cpu_before
    return sent / elapsed, cpu / sent * 1e6


def run_idempotence(root: Path, plan: Plan, repeat: int, flush: str = "async") -> str:
    """Measure every cell ``repeat`` times on one broker; the table (markdown)."""
    broker, address = start_equeue(root / "idempotence" / "data", flush)
    cells: dict[Key, Cell] = {}
    config = ClientConfig(broker=address, timeout_s=RPC_TIMEOUT_S)
    topics = iter(range(1_000_000))
    try:
        with Admin(config=config) as admin, Producer(config=config) as on, \
                Producer(config=config, enable_idempotence=False) as off:  # fmt: skip
            producers = {True: on, False: off}
            for round_ in range(repeat):
                for size in SIZES:
                    for path in PATHS:
                        for keyed in (False, True):
                            order = (True, False) if round_ % 2 == 0 else (False, True)
                            for idempotent in order:
                                topic = f"idem-{next(topics)}"
                                admin.create_topic(topic, queues=QUEUES)
                                rate, cpu = measure(producers[idempotent], topic, size, path,
                                                    keyed=keyed, plan=plan,
                                                    broker_pid=broker.pid)  # fmt: skip
                                cell = cells.setdefault((size, path, keyed, idempotent), Cell())
                                cell.rates.append(rate)
                                cell.broker_cpu_s_per_m.append(cpu)
                                progress(
                                    f"round {round_ + 1} {size_label(size):6} {path:6} "
                                    f"{'keyed' if keyed else 'keyless':7} idempotence "
                                    f"{'on ' if idempotent else 'off'} {rate:12,.0f} msgs/s, "
                                    f"broker {cpu:.2f} CPU s per M"
                                )
    finally:
        broker.stop()
    return table(cells, flush, repeat)


def table(cells: dict[Key, Cell], flush: str, repeat: int) -> str:
    lines = [
        f"flush {flush}; medians of {repeat} round(s); target on/off >= {TARGET:g}x",
        "",
        "| size | path | keys | control records per batch | off msgs/s | on msgs/s | on / off "
        "| broker CPU s per M msgs, off / on |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for size in SIZES:
        for path in PATHS:
            for keyed in (False, True):
                off, on = (
                    cells.get((size, path, keyed, False)),
                    cells.get((size, path, keyed, True)),
                )
                if off is None or on is None:
                    continue
                ratio = on.rate() / off.rate()
                verdict = "" if ratio >= TARGET else " (below target)"
                method = "send_batch" if path == "unary" else "send_batches (ProduceStream)"
                lines.append(
                    f"| {size_label(size)} | {method} | {'1,000 keys' if keyed else 'none'} | "
                    f"{QUEUES if keyed else 1} | {off.rate():,.0f} | {on.rate():,.0f} | "
                    f"{ratio:.2f}x{verdict} | {off.cpu():.2f} / {on.cpu():.2f} |"
                )
    return "\n".join(lines)


__all__ = ["run_idempotence", "table"]
