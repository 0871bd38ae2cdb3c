"""Is Spark's worker interpreter one that has equeue installed?

Spark runs the connector's read and write tasks in Python worker processes
started with ``PYSPARK_PYTHON`` (``python3`` from the PATH when it is unset).
When that interpreter lacks equeue, tasks fail with an import error far from
the cause, typically when the job was started outside the virtualenv. The
driver checks once per process when the data source is created and logs a
warning saying what to set. Pyspark-free.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping

log = logging.getLogger("equeue.spark")

CHECK_TIMEOUT_S = 10.0
"""Bound on starting the worker interpreter once to try the import."""


def worker_python_problem(env: Mapping[str, str] | None = None) -> str | None:
    """Why Spark's Python workers may be unable to import equeue, or None.

    Unset ``PYSPARK_PYTHON``: workers run ``python3`` from each machine's PATH.
    Set to this interpreter: fine, without starting anything. Set to another:
    that interpreter is started once to try ``import equeue_spark``.
    """
    env = os.environ if env is None else env
    fix = f"set PYSPARK_PYTHON to an interpreter with equeue installed, e.g. {sys.executable}"
    configured = env.get("PYSPARK_PYTHON", "")
    if not configured:
        return f"PYSPARK_PYTHON is not set, so Spark's Python workers run python3 from PATH; {fix}"
    found = shutil.which(configured)
    if found is None:
        return f"PYSPARK_PYTHON={configured!r} is not an executable; {fix}"
    if os.path.realpath(found) == os.path.realpath(sys.executable):
        return None
    if not _imports_equeue(found):
        return f"PYSPARK_PYTHON={configured!r} cannot import equeue_spark; {fix}"
    return None


def _imports_equeue(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-c", "import equeue_spark"],
            capture_output=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@functools.cache
def warn_about_worker_python() -> str | None:
    """Log ``worker_python_problem()`` as a warning, once per process (cached)."""
    problem = worker_python_problem()
    if problem:
        log.warning("equeue: %s", problem)
    return problem
