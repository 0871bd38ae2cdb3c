"""Cluster quickstart: two name servers, three brokers, one topic over all of them.

Run with ``.venv/bin/python examples/cluster_quickstart.py``: it starts the
name servers and brokers as real processes on 127.0.0.1 (temporary data
directories, removed at the end), creates a topic with 2 queues on each
broker, produces keyed and keyless messages through the name servers, reads
them back as a consumer group, and shows the route and the lag per (broker,
queue). docs/cluster.md shows the same cluster run by hand.
"""

from __future__ import annotations

import time

from equeue_broker.testing import local_cluster
from equeue_spark.client import Admin, Consumer, Message, NotFoundError, Producer


def main() -> None:
    with local_cluster(namesrvs=2, brokers=("a", "b", "c"), broker_flags=("--flush", "sync")) as cl:
        print(f"name servers {cl.namesrv}")
        with Admin(namesrv=cl.namesrv) as admin:
            admin.create_topic("orders", queues=2)
            for broker in admin.cluster_brokers():
                print(f"  broker {broker.broker_name} at {broker.address}")
            deadline = time.monotonic() + 30  # the brokers register the topic at once
            while True:
                try:
                    route = admin.route("orders")
                    if len(route.queues()) == 6 or time.monotonic() > deadline:
                        break
                except NotFoundError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.05)
            print(f"route of orders: {route.queues()}")

        with Producer(namesrv=cl.namesrv) as producer:
            keys = [f"customer-{i % 5}".encode() for i in range(20)]
            keyed = producer.send_batch("orders", [b"order"] * 20, keys=keys)
            print("keyed:", sorted({(r.broker_id, r.queue_id) for r in keyed}))
            for _ in range(3):
                batch = producer.send_batch("orders", [b"note"] * 5)
                print(f"keyless batch went to broker {batch[0].broker_id}")

        with Consumer(namesrv=cl.namesrv, group="billing", topics=["orders"],
                      start="earliest") as consumer:  # fmt: skip
            received: list[Message] = []
            deadline = time.monotonic() + 30
            while len(received) < 35 and time.monotonic() < deadline:
                received += consumer.poll(timeout_s=0.5)
            consumer.commit()
        print(f"consumed {len(received)} messages from brokers "
              f"{sorted({m.broker_id for m in received})}")  # fmt: skip

        with Admin(namesrv=cl.namesrv) as admin:
            for q in admin.describe_group("billing").queues:
                print(f"  {q.broker}/{q.topic}/{q.queue_id}: committed {q.committed_offset}, "
                      f"lag {q.lag}")  # fmt: skip


if __name__ == "__main__":
    main()
