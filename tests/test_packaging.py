"""What ``pip install`` ships: the data source hook Spark scans for, the C
extension, and a client that works without pyspark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from pkgutil import iter_modules

import pytest

from equeue_proto import __version__

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A regular (non-editable) install of the project into a fresh directory."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return target


def test_install_ships_the_spark_hook(installed: Path) -> None:
    # Spark registers DefaultSource of every top-level ``pyspark_*`` module it finds.
    assert "pyspark_equeue" in [m.name for m in iter_modules([str(installed)])]
    assert (installed / "equeue_spark" / "spark" / "source.py").is_file()
    assert list((installed / "equeue_proto").glob("_codec*.so"))


def test_install_names_are_our_own(installed: Path) -> None:
    # PyPI's "broker" and "equeue" are other projects: nothing of ours may take their names.
    top_level = sorted(p.name for p in installed.iterdir() if not p.name.endswith(".dist-info"))
    assert "broker" not in top_level and "equeue" not in top_level
    assert {"equeue_broker", "equeue_spark", "equeue_proto", "pyspark_equeue.py"} <= set(top_level)
    assert [p.name for p in installed.glob("*.dist-info")] == [f"equeue_mq-{__version__}.dist-info"]


def test_version_lives_in_one_place(installed: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "equeue_broker", "--version"], env={"PYTHONPATH": str(installed)},
        cwd=installed, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    assert out.stdout.strip() == f"equeue-broker {__version__}"


def test_hook_names_the_source_equeue(installed: Path) -> None:
    probe = "import pyspark_equeue as m; print(m.DefaultSource.name(), m.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", probe], env={"PYTHONPATH": str(installed)}, cwd=installed,
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    name, path = out.stdout.split()
    assert name == "equeue" and Path(path).parent == installed


def test_client_never_imports_pyspark(installed: Path) -> None:
    probe = (
        "import sys, equeue_spark.client, equeue_broker.server.app; "
        "print(sorted(m for m in sys.modules if m.startswith(('pyspark', 'pyarrow'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env={"PYTHONPATH": str(installed)}, cwd=installed,
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    assert out.stdout.strip() == "[]"
