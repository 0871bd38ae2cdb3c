"""Broker quickstart: the Python client alone: produce, consume as a group, show lag.

Run with ``.venv/bin/python examples/broker_quickstart.py``: it starts a local
broker (a real process on a free port, sync flush, temporary data directory)
and stops and removes it at the end; add ``--broker HOST:PORT`` to use a
running broker instead.
"""

from __future__ import annotations

import time

from _local_broker import example_broker

from equeue_spark.client import Admin, Consumer, Message, Producer


def main() -> None:
    with example_broker(__doc__, "--flush", "sync") as broker:
        address, topic, billing = broker.address, broker.name("orders"), broker.name("billing")
        with Admin(address) as admin, Producer(address) as producer:
            admin.create_topic(topic, queues=4)
            customers = [f"customer-{i % 5}".encode() for i in range(20)]
            values = [f"order {i}".encode() for i in range(20)]
            results = producer.send_batch(topic, values, keys=customers)
            queues = sorted({r.queue_id for r in results})
            print(f"produced {len(results)} orders into queues {queues}")

            with Consumer(address, group=billing, topics=[topic], start="earliest") as c:
                received: list[Message] = []
                deadline = time.monotonic() + 30
                while len(received) < 20 and time.monotonic() < deadline:
                    received += c.poll(timeout_s=1.0)
                    c.commit()
            for m in sorted(received, key=lambda m: (m.queue_id, m.offset))[:6]:
                print(f"  queue {m.queue_id} offset {m.offset} key={m.key!r} {m.value!r}")
            print(f"  ... {len(received)} messages consumed by group {billing!r}")
            group = admin.describe_group(billing)
            print(f"group {billing!r} lag: {group.total_lag}")
            stats = admin.stats()
            print(
                f"broker stats: {stats.topics} topic, {stats.queues} queues, "
                f"{stats.produced_total} produced, {stats.consumed_total} pulled"
            )


if __name__ == "__main__":
    main()
