"""``equeue-broker verify --data-dir DIR``: list every damaged chunk, record and
metadata file of a stopped broker's data directory.

Offline and read-only: nothing is repaired, moved or created. It checks

- every log chunk: header, footer (sealed chunks), and every record's frame
  and checksum (a sealed chunk up to its data size; the last chunk up to the
  end of its written data). After a damaged record whose length prefix still
  leads to a valid frame, checking goes on from there; otherwise the rest of
  the chunk cannot be framed, and the line says how many bytes went unchecked;
- every queue index chunk's header;
- both copies of every metadata file (topics, offsets, checkpoint, broker id,
  sinks, pending commit decisions) against their checksum (atomic_file.py);
- the content of schemas.json: every stored version parses as its type and
  has the fingerprint it claims (meta/schemas.py ``check_versions``).

It prints one line per problem, ``FILE: byte POSITION: WHAT`` (POSITION -1:
the file as a whole), and exits 0 if it found none, 1 if it found some, 2 if it
could not check (no such directory, or a running broker holds it).
"""

from __future__ import annotations

import argparse
import fcntl
import mmap
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from equeue_broker.storage.errors import CorruptionError
from equeue_broker.storage.log.chunk import (
    FOOTER_SIZE,
    HEADER_SIZE,
    ChunkFooter,
    ChunkHeader,
    read_header,
    read_sealed_footer,
)
from equeue_broker.storage.meta.atomic_file import backup_of, check_copy, decode_document
from equeue_broker.storage.meta.schemas import check_versions
from equeue_proto.record import BODY_TO_FRAME, HEADER, body_length, check_frame

METADATA_FILES = ("topics.json", "offsets.json", "schemas.json", "checkpoint.json", "broker.json")
END_OF_DATA = "zero length (end of written data)"


@dataclass(frozen=True)
class Finding:
    path: Path
    position: int
    """Byte offset in the file; -1 for the file as a whole."""
    what: str

    def line(self) -> str:
        return f"{self.path}: byte {self.position}: {self.what}"


def verify(data_dir: Path) -> list[Finding]:
    """Every problem found under ``data_dir``, log first."""
    chunks = sorted((data_dir / "log").glob("*.chunk"))
    findings = [f for i, p in enumerate(chunks) for f in verify_chunk(p, i == len(chunks) - 1)]
    for path in sorted((data_dir / "index").glob("*/*/*.idx")):
        findings += _check_header(path)[1]
    metadata = [data_dir / name for name in METADATA_FILES]
    metadata += [data_dir / "txn" / "sinks.json", *sorted((data_dir / "txn").glob("commit-*.json"))]
    for path in metadata:
        for copy in (path, backup_of(path)):
            problem = check_copy(copy)
            if problem is not None:
                findings.append(Finding(copy, -1, f"damaged metadata file: {problem}"))
            elif copy.exists() and path.name == "schemas.json":
                findings += [Finding(copy, -1, what) for what in _schema_problems(copy)]
    return findings


def _schema_problems(path: Path) -> list[str]:
    """A schemas.json copy whose checksum holds can still name versions that do not
    parse (an operator's edit, another release's master): the broker would serve them."""
    try:
        document, _checked = decode_document(path.read_bytes())  # read-only: no repair
    except (OSError, ValueError) as exc:
        return [str(exc)]
    return check_versions(document)


def verify_chunk(path: Path, last: bool) -> list[Finding]:
    """The problems of one log chunk; ``last``: the active chunk, unsealed."""
    header, findings = _check_header(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data_end = _data_end(f.fileno(), path, header, last, findings)
        if data_end is None or data_end <= HEADER_SIZE:
            return findings
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as buf:
            findings += _check_records(path, buf, min(data_end, size), sealed=not last)
    return findings


def _check_header(path: Path) -> tuple[ChunkHeader | None, list[Finding]]:
    with open(path, "rb") as f:
        try:
            return read_header(f.fileno(), str(path)), []
        except CorruptionError as exc:
            return None, [Finding(path, 0, f"damaged chunk: {_what(exc)}")]


def _data_end(
    fd: int, path: Path, header: ChunkHeader | None, last: bool, findings: list[Finding]
) -> int | None:
    """File offset past the chunk's data, from its footer (None: unknown)."""
    size = os.fstat(fd).st_size
    if header is not None:
        try:
            footer = read_sealed_footer(fd, str(path), header)
        except CorruptionError as exc:
            if last:  # a crash while sealing: the broker scans it as the active chunk
                return HEADER_SIZE + header.capacity
            findings.append(Finding(path, max(exc.position, 0), f"damaged chunk: {_what(exc)}"))
            return None
        return HEADER_SIZE + (header.capacity if footer is None else footer.data_size)
    try:  # header damaged: its footer may still say where the data ends
        footer = ChunkFooter.decode(os.pread(fd, FOOTER_SIZE, size - FOOTER_SIZE), str(path))
    except CorruptionError:
        return None
    return (
        HEADER_SIZE + footer.data_size
        if footer.data_size + HEADER_SIZE + FOOTER_SIZE == size
        else None
    )


def _check_records(path: Path, buf: mmap.mmap, end: int, sealed: bool) -> Iterator[Finding]:
    pos = HEADER_SIZE
    while pos < end:
        verdict = check_frame(buf, pos, end)
        if isinstance(verdict, int):
            pos += verdict
            continue
        if not sealed and (verdict == END_OF_DATA or not buf[pos:end].rstrip(b"\x00")):
            return  # the end of the active chunk's data
        after = _next_frame(buf, pos, end)
        if after is not None:  # its length prefix is sound: the next record is found
            yield Finding(path, pos, f"damaged record: {verdict}")
            pos = after
            continue
        # A damaged length hides where the next record starts: the rest is unchecked.
        yield Finding(
            path, pos, f"damaged record: {verdict} ({end - pos} bytes from here unchecked)"
        )
        return


def _next_frame(buf: mmap.mmap, pos: int, end: int) -> int | None:
    """Where the record after a damaged one at ``pos`` starts, if its length
    prefix leads to the data end or to a valid frame (None: not found)."""
    if pos + HEADER.size > end:
        return None
    after = pos + body_length(buf, pos) + BODY_TO_FRAME
    if after == end or (after < end and isinstance(check_frame(buf, after, end), int)):
        return after
    return None


def _what(exc: CorruptionError) -> str:
    return str(exc).split(f" ({exc.path} at byte")[0]


def main(argv: Sequence[str]) -> int:
    """The ``equeue-broker verify`` command; its exit code."""
    parser = argparse.ArgumentParser(
        prog="equeue-broker verify",
        description="List every damaged chunk, record and metadata file of a stopped "
        "broker's data directory (read-only). Exit 0: none; 1: some; 2: cannot check.",
    )
    parser.add_argument("--data-dir", type=Path, required=True)
    data_dir = parser.parse_args(argv).data_dir
    if not data_dir.is_dir():
        print(f"equeue-broker verify: {data_dir} is not a directory", file=sys.stderr)
        return 2
    if _in_use(data_dir):
        print(f"equeue-broker verify: {data_dir} is in use; stop the broker", file=sys.stderr)
        return 2
    findings = verify(data_dir)
    for finding in findings:
        print(finding.line())
    print(f"equeue-broker verify: {len(findings)} problems in {data_dir}", file=sys.stderr)
    return 1 if findings else 0


def _in_use(data_dir: Path) -> bool:
    """Whether a store holds the directory's lock (tested without creating it)."""
    try:
        fd = os.open(data_dir / "LOCK", os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
