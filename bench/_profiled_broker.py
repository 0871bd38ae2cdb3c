"""``python -m bench._profiled_broker ARGS``: the broker under cProfile.

The profile goes to ``$EQUEUE_PROFILE-$ROLE.prof`` when the broker exits
(SIGTERM stops it cleanly). Only bench/replication_bench.py --profile runs this;
cProfile sees the event loop's thread only (the store's worker threads are not
profiled: their time shows as waits on the loop).
"""

from __future__ import annotations

import cProfile
import os
import runpy
import sys
from typing import NoReturn


def main() -> None:
    target = f"{os.environ['EQUEUE_PROFILE']}-{os.environ.get('ROLE', 'broker')}.prof"
    profiler = cProfile.Profile()
    real_exit = os._exit

    def dump_and_exit(status: int) -> NoReturn:
        # The broker ends with os._exit (app.py: no interpreter teardown), which
        # skips every finally: the profile is written here.
        profiler.disable()
        profiler.dump_stats(target)
        real_exit(status)

    os._exit = dump_and_exit
    sys.argv[0] = "equeue_broker"
    profiler.enable()
    runpy.run_module("equeue_broker", run_name="__main__", alter_sys=True)
    dump_and_exit(0)


if __name__ == "__main__":
    main()
