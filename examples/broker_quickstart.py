"""Broker quickstart: start a local broker, produce, consume as a group, show lag.

Run with ``make demo``. The broker runs as a real process on a free port with
a temporary data directory; everything is stopped and removed at the end.
"""

from __future__ import annotations

import selectors
import subprocess
import sys
import tempfile
import time

from equeue_spark.client import Admin, Consumer, Message, Producer

READY = "equeue broker listening on "


def start_broker(data_dir: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "broker", "--data-dir", data_dir, "--port", "0", "--flush", "sync"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=30):
            process.kill()
            raise SystemExit("the broker did not start within 30 s")
    line = process.stdout.readline()
    if not line.startswith(READY):
        process.kill()
        raise SystemExit(f"unexpected broker output: {line!r}")
    return process, line[len(READY) :].strip()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="equeue-demo-") as data_dir:
        broker, address = start_broker(data_dir)
        print(f"broker running at {address} (sync flush, data in {data_dir})")
        try:
            with Admin(address) as admin, Producer(address) as producer:
                admin.create_topic("orders", queues=4)
                customers = [f"customer-{i % 5}".encode() for i in range(20)]
                values = [f"order {i}".encode() for i in range(20)]
                results = producer.send_batch("orders", values, keys=customers)
                queues = sorted({r.queue_id for r in results})
                print(f"produced {len(results)} orders into queues {queues}")

                with Consumer(address, group="billing", topics=["orders"], start="earliest") as c:
                    received: list[Message] = []
                    deadline = time.monotonic() + 30
                    while len(received) < 20 and time.monotonic() < deadline:
                        received += c.poll(timeout_s=1.0)
                        c.commit()
                for m in sorted(received, key=lambda m: (m.queue_id, m.offset))[:6]:
                    print(f"  queue {m.queue_id} offset {m.offset} key={m.key!r} {m.value!r}")
                print(f"  ... {len(received)} messages consumed by group 'billing'")
                group = admin.describe_group("billing")
                print(f"group 'billing' lag: {group.total_lag}")
                stats = admin.stats()
                print(
                    f"broker stats: {stats.topics} topic, {stats.queues} queues, "
                    f"{stats.produced_total} produced, {stats.consumed_total} pulled"
                )
        finally:
            broker.terminate()
            code = broker.wait(30)
            print(f"broker stopped cleanly (exit {code})")


if __name__ == "__main__":
    main()
