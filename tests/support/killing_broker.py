"""``python -m tests.support.killing_broker <flags>``: the broker, SIGKILLing itself
at one moment of a transaction's life, named by ``$EQUEUE_KILL_AT``:

    stage          a stage call wrote its begin record, not yet its records
    commit-record  a commit wrote its commit record, not yet any index entry
    abort          an abort wrote its abort record, not yet replied

The kill is the process's own SIGKILL, so nothing after that moment runs:
what the page cache holds survives, as after any process crash. Nothing here
is imported by the broker.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

KILL_ENV = "EQUEUE_KILL_AT"


def _die(*_args: Any, **_kwargs: Any) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: str) -> None:
    from equeue_broker.storage import store
    from equeue_broker.storage.log.log_writer import LogWriter
    from equeue_broker.storage.txn import txn_writes

    if point == "stage":
        LogWriter.write_staged = _die  # type: ignore[method-assign]
    elif point == "commit-record":
        txn_writes.restamp_entries = _die  # type: ignore[attr-defined]  # record, then entries
    elif point == "abort":
        original = store.Store.write_control

        def write_then_die(self: store.Store, prepared: Any) -> None:
            original(self, prepared)
            _die()

        store.Store.write_control = write_then_die  # type: ignore[method-assign]
    else:
        raise SystemExit(f"${KILL_ENV}: unknown point {point!r}")


def main() -> None:
    install(os.environ.get(KILL_ENV, ""))
    from equeue_broker.server.app import main as broker_main

    broker_main(sys.argv[1:])


if __name__ == "__main__":
    main()
