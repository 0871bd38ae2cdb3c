"""The longest test files first (a pytest plugin, loaded by tests/conftest.py).

``make test`` runs pytest-xdist with ``--dist loadfile``: a file's tests run in
one worker, one after the other, and the files are handed out in queue order,
each worker taking the next when it has two tests or fewer left. Left to
itself xdist queues the files with the most tests first (``--loadscope-reorder``),
which put the minutes-long files of one or two tests (the kill tests, the
standalone Spark cluster, the benchmarks' Spark runs) last: their minutes
came after every other worker had finished. Here the files are queued by their
expected seconds instead, longest first, and xdist's reordering is turned off.

The expected seconds come from ``tests/support/durations.py`` (tests that took
several seconds in a measured run; any other test counts ``DEFAULT_S``), summed
over the tests that were selected, so ``make test-fast`` (``-m "not slow"``)
orders its own files by what it runs of them.
"""

from __future__ import annotations

import pytest

from tests.support.durations import DEFAULT_S, SECONDS


def pytest_configure(config: pytest.Config) -> None:
    # The queue order below is the schedule; xdist's reorder by test count would undo it.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def expected_seconds(nodeid: str) -> float:
    """A test's expected seconds: measured, or ``DEFAULT_S``. A parametrised test
    not listed by its own id takes its function's entry (``path::name``)."""
    if nodeid in SECONDS:
        return SECONDS[nodeid]
    return SECONDS.get(nodeid.partition("[")[0], DEFAULT_S)


JVM_HEAVY = ("spark", "tests/bench/test_bench_quick", "test_packaging.py", "test_security.py")
"""Files that run Spark (a JVM or several each): three of them started at once
on 2 cores stretched each (a fresh clone's run: the standalone cluster's set-up
200 s instead of 82 s, the kill test 208 s instead of 147 s)."""


def spread(longest_first: list[str]) -> list[str]:
    """The queue: longest first, but a JVM-heavy file then two others, so that
    xdist's first hand-out (a file to each of three workers, then one more
    each) starts one Spark file beside two lighter ones rather than three."""
    heavy = [p for p in longest_first if any(m in p for m in JVM_HEAVY)]
    light = [p for p in longest_first if p not in heavy]
    queue: list[str] = []
    while heavy or light:
        queue.extend(heavy[:1] + light[:2])
        heavy, light = heavy[1:], light[2:]
    return queue


@pytest.hookimpl(trylast=True)  # after -m/-k deselected what will not run
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    files: dict[str, float] = {}
    for item in items:
        path = item.nodeid.partition("::")[0]
        files[path] = files.get(path, 0.0) + expected_seconds(item.nodeid)
    rank = {path: n for n, path in enumerate(spread(sorted(files, key=lambda p: -files[p])))}
    # A stable sort: a file's tests stay together and in their order.
    items.sort(key=lambda item: rank[item.nodeid.partition("::")[0]])
