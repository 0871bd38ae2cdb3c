"""equeue_proto.allocator: per-reply megabytes are reused, not mapped afresh.

Each case runs in its own interpreter: malloc settings are per process and
``tune_malloc`` applies them once.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Sixteen 1 MiB blocks in flight, then all freed, twenty times: the shape of a
# read task holding its read-ahead replies. Counts the minor page faults.
PROGRAM = """
import resource
from equeue_proto.allocator import tune_malloc

tuned = tune_malloc()

def rounds(n):
    for _ in range(n):
        blocks = [b"x" * (1 << 20) for _ in range(16)]
        del blocks

rounds(2)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds(20)
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
BLOCK_PAGES = (1 << 20) // 4096
ROUNDS = 20
TIMEOUT_S = 60

glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="malloc tuning is for glibc",
)


def _run(switch: str) -> tuple[bool, int]:
    env = {**os.environ, "EQUEUE_MALLOC_TUNING": switch}
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    ).stdout.split()
    return out[0] == "True", int(out[1])


@glibc_only
def test_tuned_process_reuses_freed_megabytes() -> None:
    tuned, faults = _run("1")
    assert tuned
    # Untuned, every round faults in all sixteen blocks again (16 x 256 pages).
    assert faults < BLOCK_PAGES, f"{faults} page faults over {ROUNDS} rounds"


@glibc_only
def test_switch_off_leaves_malloc_alone() -> None:
    tuned, faults = _run("0")
    assert not tuned
    # glibc's defaults give each round's freed top of heap back: the blocks
    # fault in again every round. This is what the tuning is for.
    assert faults > ROUNDS * BLOCK_PAGES
