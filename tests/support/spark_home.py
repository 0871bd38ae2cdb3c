"""A ``SPARK_HOME`` for the tests whose Python workers import pyspark with cached bytecode.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on the
``PYTHONPATH`` of every Python worker it starts (``PythonUtils.sparkPythonPath``).
Python never caches the bytecode of modules imported from a zip, so each worker
compiles pyspark's SQL modules again: 1.7 s of CPU before it can connect back,
against 0.75 s importing the same modules from site-packages. The runner of a
Python streaming source is a worker Spark starts without its daemon, and Spark
gives it a fixed 10 s to connect back (``PythonWorkerFactory.createSimpleWorker``;
no setting changes it): on a loaded 2-core machine the zip import alone took
13 to 21 s, and the query failed with ``Python worker failed to connect back``.

With pip's pyspark, ``SPARK_HOME`` is pyspark's own package directory, so the zip
holds the very modules site-packages has. ``shadow_spark_home`` builds a
directory of links to that one, without ``python/lib``: the workers find pyspark
in site-packages, with its bytecode cached. Nothing else changes (``bin``,
``jars``, ``sbin`` are the same files).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path


def pip_spark_home() -> Path | None:
    """pyspark's package directory when it is a pip install with its zips (without
    importing pyspark, which takes half a second), else None."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    home = Path(spec.origin).parent
    if not (home / "bin" / "spark-submit").is_file() or not (home / "jars").is_dir():
        return None
    return home


def shadow_spark_home(into: Path) -> Path | None:
    """Build the linked ``SPARK_HOME`` under ``into``; None when there is nothing
    to do (no pip pyspark, or ``SPARK_HOME`` set to another Spark by the user)."""
    home = pip_spark_home()
    if home is None:
        return None
    given = os.environ.get("SPARK_HOME")
    if given and Path(given).resolve() != home.resolve():
        return None  # another Spark: its zip may not match site-packages' pyspark
    shadow = into / "spark-home"
    if (shadow / "python").is_dir():
        return shadow  # built by an earlier driver over the same directory
    into.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".spark-home-", dir=into))
    for entry in home.iterdir():
        if entry.name != "python":
            (building / entry.name).symlink_to(entry)
    python = building / "python"
    python.mkdir()
    for entry in (home / "python").iterdir():
        if entry.name != "lib":
            (python / entry.name).symlink_to(entry)
    try:
        building.rename(shadow)  # whole or not at all: drivers may start side by side
    except OSError:
        shutil.rmtree(building)
    return shadow


def use_shadow_spark_home(into: Path) -> None:
    """For a Spark driver process of its own (not yet started): its JVM starts
    with the linked ``SPARK_HOME`` built under ``into`` (kept for the next driver)."""
    shadow = shadow_spark_home(into)
    if shadow is not None:
        os.environ["SPARK_HOME"] = str(shadow)
