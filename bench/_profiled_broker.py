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
import signal
import sys


def main() -> None:
    target = f"{os.environ['EQUEUE_PROFILE']}-{os.environ.get('ROLE', 'broker')}.prof"
    profiler = cProfile.Profile()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.argv[0] = "equeue_broker"
    profiler.enable()
    try:
        runpy.run_module("equeue_broker", run_name="__main__", alter_sys=True)
    finally:
        profiler.disable()
        profiler.dump_stats(target)


if __name__ == "__main__":
    main()
