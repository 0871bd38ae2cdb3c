"""File runs: log bytes a reply sends straight from their chunk file (``sendfile``).

``Reads.file_runs`` (reads.py) answers a range read with pieces: bytes (a
reply's framing, records a reply changes) and ``FileRun``s, each an open
duplicate of a log chunk's descriptor with the offset and length of records
exactly as stored. The fetch port (server/fetch_port.py) sends those with
``sendfile``, so the records are never copied through the broker's memory.
A duplicate descriptor keeps a chunk readable after retention deletes it:
stored records never change, so a run read under the lock stays valid.

Descriptors are bounded: a reply dups each chunk it sends from once (its runs
of that chunk share the descriptor), and at most ``MAX_FILE_RUNS`` runs of a
reply are sent from files, the rest as bytes (many small runs - plain records
between a transaction's - gain nothing from ``sendfile``). With one reply in
flight per fetch connection, the fetch port holds at most
``MAX_FILE_RUNS x max_connections`` descriptors.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

from equeue_broker.storage.results import Piece


@dataclasses.dataclass(frozen=True)
class FileRun:
    """``length`` bytes at ``offset`` of the open file ``fd`` (``close_runs`` closes
    it; other runs of the same reply may share it)."""

    fd: int
    offset: int
    length: int


MAX_FILE_RUNS = 16
"""File runs in one reply at most (so at most as many descriptors)."""


def close_runs(pieces: Iterable[object]) -> None:
    """Close the descriptors of the file runs among ``pieces``, each once (runs
    of one chunk share theirs; the caller drops the pieces)."""
    fds = {piece.fd for piece in pieces if isinstance(piece, FileRun)}
    for fd in fds:
        os.close(fd)


def piece_size(piece: Piece | FileRun) -> int:
    return piece.length if isinstance(piece, FileRun) else len(piece)


class RunFiles:
    """The descriptors one reply's file runs use: one dup per chunk, at most
    ``MAX_FILE_RUNS`` runs (``run`` answers None beyond: send those as bytes).
    Whoever collects closes them all with ``close`` if the reply is dropped."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # the chunk's descriptor -> our duplicate
        self._runs = 0

    def run(self, chunk_fd: int, offset: int, length: int) -> FileRun | None:
        if self._runs >= MAX_FILE_RUNS:
            return None
        fd = self._fds.get(chunk_fd)
        if fd is None:
            fd = self._fds[chunk_fd] = os.dup(chunk_fd)
        self._runs += 1
        return FileRun(fd, offset, length)

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)
