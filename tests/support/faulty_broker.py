"""``python -m tests.support.faulty_broker <flags>``: the broker behind a fault-injecting
file layer.

The broker runs unchanged; before it starts, ``os.pwrite``, ``os.write``,
``os.fsync`` and ``os.ftruncate`` are wrapped so that calls on files inside the
data directory fail with a chosen errno while a *fault file* says so. The
fault file (path in ``$EQUEUE_FAULT_FILE``) holds one JSON object, read on
every wrapped call, so a test switches faults on and off between requests
without signals or timing::

    {"pwrite": "ENOSPC", "under": "log"}     # log chunk writes fail with ENOSPC
    {"fsync": "EIO"}                         # every fsync in the data dir fails
    {"write": "ENOSPC"}                      # metadata (JSON) saves fail
    {}  or no file                           # no faults

``under`` (optional) limits the faults to one sub-path of the data directory
(``log``, ``index``, a file name such as ``topics.json.tmp``). Each injected
failure is counted in the fault file's sibling ``<fault file>.count`` (one
line per failure: ``op path``) so a test can tell that the fault was hit.
Nothing here is imported by the broker.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Callable
from typing import Any

FAULT_ENV = "EQUEUE_FAULT_FILE"
OPS = ("pwrite", "write", "fsync", "ftruncate")


def _data_dir(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg == "--data-dir" and i + 1 < len(argv):
            return os.path.realpath(argv[i + 1])
        if arg.startswith("--data-dir="):
            return os.path.realpath(arg.split("=", 1)[1])
    raise SystemExit("tests.support.faulty_broker needs --data-dir")


def install(fault_file: str, data_dir: str) -> None:
    """Wrap the ``os`` functions the storage engine writes with."""
    count_path = fault_file + ".count"
    real_open, real_close, real_write = os.open, os.close, os.write

    def active_fault(op: str, fd: int) -> int | None:
        try:
            with open(fault_file, "rb") as f:
                spec: dict[str, Any] = json.loads(f.read() or b"{}")
        except (FileNotFoundError, ValueError):
            return None
        name = spec.get(op)
        if not name:
            return None
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
        root = os.path.join(data_dir, str(spec.get("under", "")))
        if not (path == root.rstrip("/") or path.startswith(root)):
            return None
        line = f"{op} {path}\n".encode()
        count_fd = real_open(count_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            real_write(count_fd, line)
        finally:
            real_close(count_fd)
        return int(getattr(errno, str(name)))

    def wrap(op: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def faulty(fd: int, *args: Any) -> Any:
            code = active_fault(op, fd)
            if code is not None:
                raise OSError(code, f"{os.strerror(code)} (injected)")
            return real(fd, *args)

        faulty.__name__ = real.__name__
        return faulty

    for op in OPS:
        setattr(os, op, wrap(op, getattr(os, op)))
    # The log's group commit syncs with fdatasync: an "fsync" fault covers both.
    os.fdatasync = wrap("fsync", os.fdatasync)


def main() -> None:
    fault_file = os.environ.get(FAULT_ENV)
    if not fault_file:
        raise SystemExit(f"set ${FAULT_ENV} to the fault file's path")
    argv = sys.argv[1:]
    install(os.path.realpath(fault_file), _data_dir(argv))
    from equeue_broker.server.app import main as broker_main

    broker_main(argv)


if __name__ == "__main__":
    main()
