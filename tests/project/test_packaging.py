"""What ``pip install`` ships: the data source hook Spark scans for, the C
extension, and a client that works without pyspark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from pkgutil import iter_modules

import pytest

from equeue_proto import __version__
from tests.support.spark_home import shadow_spark_home

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built once for the module (the build compiles the C
    codec): what ``pip install`` of the checkout builds and installs too."""
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(dist), str(ROOT)],
        check=True, capture_output=True, timeout=200,  # under the 300 s default test timeout
    )  # fmt: skip
    (built,) = dist.glob("equeue_mq-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A regular (non-editable) install of the project's wheel into a fresh directory."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True, timeout=60,
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


def test_editable_install_maps_broker_to_equeue_broker() -> None:
    """``make``'s editable install (a link tree) answers to our names only, and
    Spark's scan for ``pyspark_*`` modules (pkgutil) sees the hook."""
    probe = (
        "import importlib.util, json, pkgutil, equeue_broker; print(json.dumps(["
        "equeue_broker.__file__, importlib.util.find_spec('broker') is None, "
        "[m.name for m in pkgutil.iter_modules() if m.name == 'pyspark_equeue']]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, check=True,
        timeout=120,
    )  # fmt: skip
    path, no_broker, hooks = json.loads(out.stdout)
    expected = ROOT / "broker" / "equeue_broker" / "__init__.py"
    assert Path(path).name == "__init__.py" and Path(path).resolve() == expected
    assert no_broker and hooks == ["pyspark_equeue"]


WHEEL_JOB = """
import importlib.util, sys
import equeue_broker, equeue_spark
from equeue_broker.testing import local_broker
from equeue_spark.spark.testing import local_session

assert importlib.util.find_spec("broker") is None, "a top-level broker package is installed"
print("from", equeue_broker.__file__, equeue_spark.__file__)
with local_broker() as broker:
    spark = local_session("wheel-check", master="local[1]")
    rows = spark.createDataFrame([("a",), ("b",)], "value string")
    rows.write.format("equeue").option("broker", broker.address).option("topic", "w").mode(
        "append"
    ).save()
    read = spark.read.format("equeue").option("broker", broker.address).option("topic", "w")
    print("values", sorted(r.value.decode() for r in read.load().collect()))
    spark.stop()
"""


@pytest.mark.slow
@pytest.mark.timeout(200 + 60 + 120 + 300 + 60)  # above the sum of the steps' budgets
def test_wheel_in_a_clean_venv_serves_format_equeue(wheel: Path, tmp_path: Path) -> None:
    """The built wheel, alone in a fresh venv (its dependencies visible, not this
    checkout nor its editable install): no top-level ``broker``, and Spark finds
    ``format("equeue")`` without a register call, in the driver and its workers."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    site = next(venv.glob("lib/python3*/site-packages"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
         str(wheel)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    # Dependencies (pyspark, grpc, ...) from this venv's site-packages, added as a
    # plain path: .pth files in it (the editable install's) are not processed.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # The same Spark with its workers importing pyspark from site-packages (cached
    # bytecode) instead of compiling it from pyspark.zip in each (spark_home.py).
    shadow = shadow_spark_home(tmp_path / "spark")
    if shadow is not None:
        env["SPARK_HOME"] = str(shadow)
    out = subprocess.run(
        [str(python), "-c", WHEEL_JOB], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        check=False, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"from {site}/equeue_broker/__init__.py {site}/equeue_spark/__init__.py" in out.stdout
    assert "values ['a', 'b']" in out.stdout
