"""Storage-engine quickstart: append, read, commit, crash-free reopen.

Run with ``make demo``. It uses a temporary data directory, so it leaves
nothing behind. (The gRPC broker and the Spark connector build on this engine.)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from equeue_broker.storage import FlushMode, MessageBatch, StorageConfig, Store


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="equeue-demo-") as tmp:
        config = StorageConfig(Path(tmp), flush_mode=FlushMode.SYNC)
        with Store(config) as store:
            store.create_topic("orders", queue_count=2)
            result = store.append(
                "orders",
                0,
                MessageBatch(
                    values=[f"order {i}".encode() for i in range(5)],
                    keys=[f"customer-{i % 2}".encode() for i in range(5)],
                    tags=["paid", "new", "paid", "new", "paid"],
                ),
            )
            print(
                f"appended offsets {result.first_offset}..{result.first_offset + result.count - 1}"
            )
            paid = store.read("orders", 0, 0, tags=["paid"])
            for m in paid.messages:
                print(f"  offset {m.queue_offset} key={m.key!r} tag={m.tag} value={m.value!r}")
            print(f"next offset to read: {paid.next_offset}")
            store.commit_offset("billing", "orders", 0, paid.next_offset)

        with Store(config) as store:  # reopen: data and group offsets are back
            info = store.queue_info("orders", 0)
            committed = store.committed_offsets("billing")["orders"][0]
            print(
                f"after reopen: queue 0 holds [{info.earliest}, {info.end}), "
                f"group 'billing' resumes at {committed}, lag {info.end - committed}"
            )


if __name__ == "__main__":
    main()
