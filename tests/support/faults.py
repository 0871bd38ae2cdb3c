"""Fault-injection helpers: byte surgery on data files and simulated crashes.

A *process* crash (SIGKILL) loses nothing the process wrote: the bytes sit in
the OS page cache. A *machine* crash loses whatever was not fsynced. These
helpers model the machine crash by dropping exactly what the store had not
synced, which is the worst case recovery must handle.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from equeue_broker.storage import StorageConfig, Store
from equeue_broker.storage.index.queue_index import ENTRY, ENTRY_SIZE, INDEX_SUFFIX
from equeue_broker.storage.log.chunk import FOOTER_SIZE, HEADER_SIZE, chunk_file_name
from equeue_broker.storage.log.message_log import LOG_SUFFIX
from equeue_broker.storage.meta.atomic_file import decode_document
from tests.support.sent import TOPIC, Sent

TRAILER_SIZE = 8
"""crc u32 | body_length u32 at the end of every frame (record.py)."""


def simulate_machine_crash(store: Store, *, drop_unsynced_index: bool = True) -> None:
    """Abandon ``store`` and erase every byte it had not fsynced.

    - Log: bytes of the active chunk at or after the group-commit durable
      position are zeroed (sealed chunks were fsynced when sealed).
    - Index: entries for records at or after the checkpoint position (the
      last position whose index entries were fsynced) are zeroed.
    - Offsets/topics/checkpoint files: written atomically with fsync, so what
      is on disk is what survives.
    """
    log = store._state.log
    durable = store._state.commit.durable
    checkpoint = store._state.checkpoint
    active = log.active
    start = log.start_of(active)
    path, capacity = active.path, active.capacity
    index_dirs = [q.index.directory for q in store._state.queues.values()]
    store.abandon()
    keep = max(durable - start, 0)
    with open(path, "r+b") as f:
        f.truncate(HEADER_SIZE + keep)
        f.truncate(HEADER_SIZE + capacity + FOOTER_SIZE)  # an active chunk's size
    if drop_unsynced_index:
        for directory in index_dirs:
            for index_file in directory.glob("*.idx"):
                _zero_entries_from(index_file, checkpoint)


def _zero_entries_from(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    for at in range(HEADER_SIZE, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
        position_plus_one = ENTRY.unpack_from(data, at)[0]
        if position_plus_one and position_plus_one - 1 >= position:
            data[at : at + ENTRY_SIZE] = bytes(ENTRY_SIZE)
    path.write_bytes(bytes(data))


def flip_byte(path: Path, offset: int) -> None:
    """Invert every bit of the byte at ``offset``."""
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 0xFF]))


def write_at(path: Path, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def log_chunks(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "log").glob("*.chunk"))


def index_files(data_dir: Path, topic: str, queue_id: int) -> list[Path]:
    return sorted((data_dir / "index" / topic / str(queue_id)).glob("*.idx"))


# -- byte surgery on a store's files (messages from tests/support/sent.py) ----------


def chunk_path(config: StorageConfig, position: int) -> Path:
    """The log chunk file that holds global ``position``."""
    number = position // config.chunk_capacity_bytes
    return config.data_dir / "log" / chunk_file_name(number, LOG_SUFFIX)


def file_offset(config: StorageConfig, position: int) -> int:
    """Byte offset, inside its chunk file, of the log byte at global ``position``."""
    return HEADER_SIZE + position % config.chunk_capacity_bytes


def value_offset(config: StorageConfig, message: Sent) -> int:
    """Byte offset of the first value byte of ``message`` in its chunk file."""
    frame_end = file_offset(config, message.position) + message.frame_size
    return frame_end - TRAILER_SIZE - len(message.value)


def end_offset(config: StorageConfig, message: Sent) -> int:
    """Byte offset just past the frame of ``message`` in its chunk file."""
    return file_offset(config, message.position) + message.frame_size


def read_at(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def zero_from(path: Path, offset: int) -> None:
    """Zero ``path`` from ``offset`` to its end, keeping its size: what a machine
    crash leaves of a pre-sized file whose last pages never reached the disk."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(offset)
        f.truncate(size)


def garble(path: Path) -> None:
    """Overwrite a small file with zeros of the same length (a crash on a file
    system that persisted the size but not the data)."""
    path.write_bytes(bytes(path.stat().st_size))


def read_document(path: Path) -> Any:
    """The document of a metadata file (atomic_file.py), checksum verified."""
    return decode_document(path.read_bytes())[0]


def index_entry(config: StorageConfig, queue_id: int, offset: int) -> bytes:
    """The index entry of ``offset`` in queue ``queue_id`` of ``TOPIC``, from its file."""
    number, slot = divmod(offset, config.index_entries_per_chunk)
    path = index_files(config.data_dir, TOPIC, queue_id)[number]
    assert path.name == chunk_file_name(number, INDEX_SUFFIX)
    return read_at(path, HEADER_SIZE + slot * ENTRY_SIZE, ENTRY_SIZE)


def zero_index_entry(config: StorageConfig, queue_id: int, offset: int) -> None:
    """Zero the index entry of ``offset`` in queue ``queue_id`` of ``TOPIC``, in its file."""
    number, slot = divmod(offset, config.index_entries_per_chunk)
    path = index_files(config.data_dir, TOPIC, queue_id)[number]
    write_at(path, HEADER_SIZE + slot * ENTRY_SIZE, bytes(ENTRY_SIZE))


def flip_index_byte(config: StorageConfig, queue_id: int, offset: int, byte: int) -> None:
    """Flip byte ``byte`` (0..31) of the index entry of ``offset`` in queue
    ``queue_id`` of ``TOPIC``: 0..7 the position (7 its high byte), 8..11 the
    record size, 12..15 the tag hash, 24..31 the checksum trailer."""
    number, slot = divmod(offset, config.index_entries_per_chunk)
    path = index_files(config.data_dir, TOPIC, queue_id)[number]
    flip_byte(path, HEADER_SIZE + slot * ENTRY_SIZE + byte)
