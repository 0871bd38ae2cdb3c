"""The checked-in generated gRPC code equals a fresh generation from the .proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "protos" / "generate.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*_pb2*.py*"))
    assert fresh, "protoc generated nothing"
    # Source files only: imports leave __pycache__/*.pyc beside them.
    checked_in = sorted(
        p.relative_to(ROOT)
        for p in (ROOT / "equeue_proto").rglob("*_pb2*.py*")
        if p.suffix in (".py", ".pyi")
    )
    assert fresh == checked_in
    stale = [str(p) for p in fresh if (tmp_path / p).read_bytes() != (ROOT / p).read_bytes()]
    assert not stale, f"generated code is stale, run `make proto`: {stale}"
