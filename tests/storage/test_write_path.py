"""The append hot path allocates no Python object per message.

Measured with tracemalloc: records are encoded straight into the log's memory
map, so the peak Python memory of an append is its index entries (32 bytes a
message, the one output kept in memory) plus a constant, whatever the batch
size. A per-message object (a list of lengths, a tuple per record, a bytes per
header, a staging copy of the batch) would add tens to thousands of bytes per
message and fail the bound at 10,000.
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from equeue_broker.storage import MessageBatch, StorageConfig, Store
from equeue_broker.storage.index.queue_index import ENTRY_SIZE
from equeue_proto import accel


@pytest.mark.skipif(accel.IMPLEMENTATION != "c", reason="the bound holds for the C encoder only")
@pytest.mark.parametrize("count", [1_000, 10_000])
def test_append_peak_memory_is_outputs_plus_a_constant(tmp_path: Path, count: int) -> None:
    store = Store(StorageConfig(tmp_path, chunk_capacity_bytes=64 << 20), background=False)
    try:
        store.create_topic("t", 1)
        batch = MessageBatch([os.urandom(1024) for _ in range(count)], keys=[b"key"] * count)
        store.append("t", 0, batch)  # warm up caches and the first chunk
        tracemalloc.start()
        try:
            store.append("t", 0, batch)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # the queue index entries, and the key index entries (32 B per key) the
        # append builds for its keyed records
        outputs = count * ENTRY_SIZE * 2
        overhead = peak - outputs
        assert overhead < 16 * 1024, (
            f"{overhead} bytes beyond the outputs ({overhead / count:.1f}/msg)"
        )
    finally:
        store.close()
