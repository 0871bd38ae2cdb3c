"""Measurement helpers of the bench scripts: labels, progress lines, CPU by component.

- ``size_label`` and ``progress``: how the scripts name value sizes and report
  progress (on stderr, so that stdout holds only the tables).
- ``CpuMeter``: CPU seconds by component (the JVM, the Python workers, the
  broker, the bench process) during a measurement, sampled from /proc (Linux only).

Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


def size_label(size: int) -> str:
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- CPU by component ------------------------------------------------------------------------------

COMPONENTS = ("JVM", "Python workers", "broker", "bench process")


def cpu_sample(broker_pid: int) -> dict[int, tuple[str, float]]:
    """pid -> (component, CPU seconds so far: user + system, own) of this process
    and its descendants; {} without Linux's /proc.

    The JVM is the ``java`` descendant; Python workers are the Python processes
    below it (pyspark daemons, task workers, the streaming sources' planners);
    the broker is ``broker_pid``; the bench process is this one (the client
    baseline, and the driver's py4j calls).
    """
    tick = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, str, float]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            raw = Path("/proc", entry, "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        procs[int(entry)] = (int(fields[1]), comm, cpu)
    me = os.getpid()
    found: dict[int, tuple[str, float]] = {}
    for pid, (_, comm, cpu) in procs.items():
        chain = [pid]
        while chain[-1] in procs and chain[-1] not in (me, 0, 1):
            chain.append(procs[chain[-1]][0])
        if chain[-1] != me:
            continue  # not ours
        if pid == broker_pid:
            found[pid] = ("broker", cpu)
        elif comm == "java":
            found[pid] = ("JVM", cpu)
        elif any(procs[p][1] == "java" for p in chain if p in procs):
            found[pid] = ("Python workers", cpu)
        elif pid == me:
            found[pid] = ("bench process", cpu)
    return found


@dataclass
class CpuUse:
    what: str
    size: int
    walls: list[float] = field(default_factory=list)
    uses: list[dict[str, float]] = field(default_factory=list)


class CpuMeter:
    """``with meter.measure(what, size):`` records CPU seconds by component.

    With ``poll`` the processes are sampled every 100 ms, so that a Python
    worker that exits before the end still counts (up to its last sample).
    """

    def __init__(self, broker_pid: int) -> None:
        self.broker_pid = broker_pid
        self.rows: dict[tuple[str, int], CpuUse] = {}

    @contextlib.contextmanager
    def measure(self, what: str, size: int, *, poll: bool = True) -> Iterator[None]:
        # pid -> (component, CPU at the start (0 if started since), latest CPU)
        seen: dict[int, tuple[str, float, float]] = {
            pid: (kind, cpu, cpu) for pid, (kind, cpu) in cpu_sample(self.broker_pid).items()
        }

        def merge() -> None:
            for pid, (kind, cpu) in cpu_sample(self.broker_pid).items():
                first = seen[pid][1] if pid in seen else 0.0
                seen[pid] = (kind, first, cpu)

        stop = threading.Event()

        def sampler() -> None:
            while not stop.wait(0.1):
                merge()

        thread = threading.Thread(target=sampler, name="cpu-sampler", daemon=True)
        if seen and poll:
            thread.start()
        start = time.perf_counter()
        try:
            yield
        finally:
            wall = time.perf_counter() - start
            stop.set()
            if thread.is_alive():
                thread.join()
        if not seen:
            return
        merge()
        use = dict.fromkeys(COMPONENTS, 0.0)
        for kind, first, last in seen.values():
            use[kind] += last - first
        row = self.rows.setdefault((what, size), CpuUse(what, size))
        row.walls.append(wall)
        row.uses.append(use)

    def last(self, what: str, size: int) -> str:
        """The latest measurement of ``what``, as "component seconds" pairs."""
        row = self.rows.get((what, size))
        if row is None:
            return "not sampled"
        return ", ".join(f"{k} {v:.2f}" for k, v in row.uses[-1].items())

    def table(self) -> str:
        cores = os.cpu_count() or 1
        head = " | ".join(f"{k} s" for k in COMPONENTS)
        lines = [
            f"| measurement | size | wall s | {head} | CPU / ({cores} cores x wall) |",
            "|---|---|---:|" + "---:|" * (len(COMPONENTS) + 1),
        ]
        for row in sorted(self.rows.values(), key=lambda r: r.size):
            wall = statistics.median(row.walls)
            use = {k: statistics.median(u[k] for u in row.uses) for k in COMPONENTS}
            cells = [
                row.what,
                size_label(row.size),
                f"{wall:.2f}",
                *(f"{use[k]:.2f}" for k in COMPONENTS),
                f"{sum(use.values()) / (cores * wall):.0%}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)
