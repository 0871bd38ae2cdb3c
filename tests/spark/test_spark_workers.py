"""The driver's check that Spark's worker interpreter can import equeue."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")  # the package equeue_spark.spark imports it

from equeue_spark.spark.workers import warn_about_worker_python, worker_python_problem


def test_a_bogus_interpreter_path_is_named(tmp_path: Path) -> None:
    bogus = str(tmp_path / "no-such-python")
    problem = worker_python_problem({"PYSPARK_PYTHON": bogus})
    assert problem is not None
    assert f"PYSPARK_PYTHON={bogus!r} is not an executable" in problem
    assert f"set PYSPARK_PYTHON to an interpreter with equeue installed, e.g. {sys.executable}" in (
        problem
    )


def test_an_interpreter_without_equeue_is_named(tmp_path: Path) -> None:
    python = tmp_path / "python-without-equeue"
    python.write_text("#!/bin/sh\nexit 1\n")  # as `python -c 'import equeue_spark'` would fail
    python.chmod(0o755)
    problem = worker_python_problem({"PYSPARK_PYTHON": str(python)})
    assert problem is not None and "cannot import equeue_spark" in problem


def test_unset_warns_and_this_interpreter_does_not() -> None:
    unset = worker_python_problem({})
    assert unset is not None and "PYSPARK_PYTHON is not set" in unset
    assert worker_python_problem({"PYSPARK_PYTHON": sys.executable}) is None


def test_the_warning_is_logged_once_per_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", str(tmp_path / "missing"))
    warn_about_worker_python.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="equeue.spark"):
            warn_about_worker_python()
            warn_about_worker_python()
    finally:
        warn_about_worker_python.cache_clear()
    warnings = [r.getMessage() for r in caplog.records if "PYSPARK_PYTHON" in r.getMessage()]
    assert len(warnings) == 1 and "is not an executable" in warnings[0]
