"""The log and index writes of a transaction commit (lock held).

transactions.py decides what a commit is; the store runs it (``Store.commit_staged``)
under its lock, and this module does the writing: the commit record first
(txn_records.py), then, for each queue, the index entries of the staged records
it makes visible, stamped with the commit's store time. Entries point at the
staged records where they already lie in the log (possibly in older chunks,
out of log order): nothing is copied.

If an index write fails, the entries written so far are cut off again and the
commit record is cut out of the log (``LogWriter.undo``): the commit did not
happen. A crash between the commit record and its entries is safe the other
way: recovery re-derives the entries of every commit record after the
checkpoint (txn_recovery.py).
"""

from __future__ import annotations

import contextlib

from equeue_broker.storage.errors import io_error
from equeue_broker.storage.index.queue_state import QueueKey, QueueState
from equeue_broker.storage.log.log_writer import LogWriter
from equeue_broker.storage.log.record import PreparedBatch, restamp_entries


def write_commit(
    writer: LogWriter,
    targets: dict[QueueKey, QueueState],
    record: PreparedBatch,
    entries: dict[QueueKey, bytearray],
    store_ms: int,
) -> None:
    """Append the commit ``record``, then each queue's ``entries`` at its end
    (store lock held); all or nothing."""
    position = writer.write_control(record, store_ms)
    written: list[tuple[QueueState, int]] = []
    try:
        for key, queue in targets.items():
            restamp_entries(entries[key], store_ms)
            end = queue.index.end
            queue.index.write(end, entries[key])
            written.append((queue, end))
    except OSError as exc:
        for queue, end in written:
            with contextlib.suppress(OSError):
                queue.index.truncate(end)
        writer.undo(position, exc)
        raise io_error("a queue index (transaction commit)", exc) from exc
