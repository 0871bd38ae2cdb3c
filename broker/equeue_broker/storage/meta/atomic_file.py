"""Small metadata files written atomically, with a backup copy and a checksum.

A save writes ``<name>.tmp``, fsyncs it, moves the current ``<name>`` to
``<name>.bak`` and renames the temp file into place, then fsyncs the directory.
A crash at any point leaves at least one complete copy: the new main file, or
the previous one as ``.bak``.

Every copy carries a CRC32C of its document, so that damage which still
parses as JSON (``"0":500`` turned into ``"0":700`` by one flipped bit) is
caught, not believed. The file is one JSON object of a fixed layout::

    {"crc32c":"<8 hex digits>","document":<document>}

where ``<document>`` is the compact, key-sorted JSON of the saved value and
the checksum covers exactly those bytes (so it is checked against the bytes
on disk, never against a re-encoding). ``load`` falls back to the backup when
the main file is missing, unreadable or fails its checksum, and puts the good
copy back in both places. Files written before checksums existed (a bare
document with neither key) load once and are rewritten with a checksum, both
copies, at once.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from crc32c import crc32c

from equeue_broker.storage.errors import CorruptionError

log = logging.getLogger(__name__)

_PREFIX = re.compile(rb'\{"crc32c":"([0-9a-f]{8})","document":')
_ENVELOPE_KEYS = ("crc32c", "document")


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename or create inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_document(document: Any) -> bytes:
    """The bytes of a metadata file holding ``document`` (the layout above)."""
    body = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    return b'{"crc32c":"%08x","document":%s}' % (crc32c(body), body)


def decode_document(data: bytes) -> tuple[Any, bool]:
    """(document, had a checksum) of a metadata file's bytes; ``ValueError``
    saying what is wrong if they are not JSON or fail their checksum."""
    parsed = json.loads(data.decode())  # ValueError if not UTF-8 JSON at all
    # One flipped bit can rename at most one of the two keys: a file with
    # either is a checksummed one, never a document of the old format.
    if not (isinstance(parsed, dict) and any(k in parsed for k in _ENVELOPE_KEYS)):
        return parsed, False
    match = _PREFIX.match(data)
    if match is None or set(parsed) != set(_ENVELOPE_KEYS) or not data.endswith(b"}"):
        raise ValueError("checksummed layout damaged")
    body = data[match.end() : -1]
    if f"{crc32c(body):08x}".encode() != match.group(1):
        raise ValueError("checksum mismatch")
    return parsed["document"], True


def save_json(path: Path, document: Any) -> None:
    """Persist ``document`` to ``path`` atomically, keeping the previous copy as ``.bak``."""
    data = encode_document(document)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if path.exists():
        os.replace(path, backup_of(path))
    os.replace(tmp, path)
    fsync_dir(path.parent)


def backup_of(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


def check_copy(path: Path) -> str | None:
    """What is wrong with one copy of a metadata file (None: intact or absent);
    reads only, for ``equeue-broker verify``."""
    try:
        decode_document(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return str(exc)
    return None


def load_json(path: Path, repair: bool = True) -> Any | None:
    """Load the document saved by ``save_json``; ``None`` if neither copy exists.

    Raises ``CorruptionError`` if copies exist but none is intact. With
    ``repair``, a document loaded from the backup, or from a file without a
    checksum, is saved again (twice: both copies then hold it, checksummed).
    """
    errors: list[str] = []
    for candidate in (path, backup_of(path)):
        try:
            document, checked = decode_document(candidate.read_bytes())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            errors.append(f"{candidate}: {exc}")
            log.error("damaged metadata file %s (%s); trying the backup", candidate, exc)
            continue
        if candidate != path:
            log.warning("using backup %s because %s is missing or damaged", candidate, path)
        if repair and (candidate != path or not checked):
            save_json(path, document)
            save_json(path, document)
        return document
    if errors:
        raise CorruptionError("no intact copy of metadata file: " + "; ".join(errors), str(path))
    return None


def keep_damaged(path: Path) -> list[Path]:
    """Copy both copies of a metadata file to ``<copy>.damaged`` (for an
    operator to inspect) before a save replaces them; return the copies made."""
    kept = []
    for candidate in (path, backup_of(path)):
        if candidate.exists():
            target = candidate.with_name(candidate.name + ".damaged")
            shutil.copyfile(candidate, target)
            kept.append(target)
    return kept


def remove_temp_files(directory: Path) -> list[Path]:
    """Delete leftover ``*.tmp`` files of interrupted saves; return what was removed."""
    removed = []
    for tmp in directory.glob("*.tmp"):
        tmp.unlink()
        removed.append(tmp)
    return removed
