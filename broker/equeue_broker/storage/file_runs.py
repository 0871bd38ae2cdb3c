"""File runs: log bytes a reply sends straight from their chunk file (``sendfile``).

``Reads.file_runs`` (reads.py) answers a range read with pieces: bytes (a
reply's framing, records a reply changes) and ``FileRun``s, each an open
duplicate of a log chunk's descriptor with the offset and length of records
exactly as stored. The fetch port (server/fetch_port.py) sends those with
``sendfile``, so the records are never copied through the broker's memory.
A duplicate descriptor keeps a chunk readable after retention deletes it:
stored records never change, so a run read under the lock stays valid.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

from equeue_broker.storage.results import Piece


@dataclasses.dataclass(frozen=True)
class FileRun:
    """``length`` bytes at ``offset`` of the open file ``fd`` (the holder closes it)."""

    fd: int
    offset: int
    length: int

    def close(self) -> None:
        os.close(self.fd)


def close_runs(pieces: Iterable[object]) -> None:
    """Close the file runs among ``pieces`` (each once: the caller drops them)."""
    for piece in pieces:
        if isinstance(piece, FileRun):
            piece.close()


def piece_size(piece: Piece | FileRun) -> int:
    return piece.length if isinstance(piece, FileRun) else len(piece)
