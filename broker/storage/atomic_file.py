"""Small metadata files written atomically, with a backup copy.

A save writes ``<name>.tmp``, fsyncs it, moves the current ``<name>`` to
``<name>.bak`` and renames the temp file into place, then fsyncs the directory.
A crash at any point leaves at least one complete copy: the new main file, or
the previous one as ``.bak``. ``load`` falls back to the backup when the main
file is missing or unreadable (e.g. truncated by a crash on a file system that
reorders metadata writes).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from equeue_broker.storage.errors import CorruptionError

log = logging.getLogger(__name__)


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename or create inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_json(path: Path, document: Any) -> None:
    """Persist ``document`` to ``path`` atomically, keeping the previous copy as ``.bak``."""
    data = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
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
        os.replace(path, path.with_name(path.name + ".bak"))
    os.replace(tmp, path)
    fsync_dir(path.parent)


def load_json(path: Path) -> Any | None:
    """Load the document saved by ``save_json``; ``None`` if neither copy exists.

    Raises ``CorruptionError`` if copies exist but none is readable.
    """
    backup = path.with_name(path.name + ".bak")
    errors: list[str] = []
    for candidate in (path, backup):
        if not candidate.exists():
            continue
        try:
            document = json.loads(candidate.read_bytes())
        except (OSError, ValueError) as exc:
            errors.append(f"{candidate}: {exc}")
            log.warning("unreadable metadata file %s (%s); trying the backup", candidate, exc)
            continue
        if candidate is backup:
            log.warning("using backup %s because %s is missing or unreadable", backup, path)
        return document
    if errors:
        raise CorruptionError("no readable copy of metadata file: " + "; ".join(errors), str(path))
    return None


def remove_temp_files(directory: Path) -> list[Path]:
    """Delete leftover ``*.tmp`` files of interrupted saves; return what was removed."""
    removed = []
    for tmp in directory.glob("*.tmp"):
        tmp.unlink()
        removed.append(tmp)
    return removed
