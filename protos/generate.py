"""Generate the Python code for the gRPC contract: ``make proto``.

Writes ``equeue_proto/v1/broker_pb2{,_grpc}.py`` and their ``.pyi`` stubs
under ``--out`` (default: the repository root, where they are checked in).
tests/project/test_proto_drift.py runs this into a temp dir and compares, so the
checked-in code can never drift from the ``.proto``. The generator versions
are pinned in setup.cfg's ``dev`` extra, which makes the output reproducible.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PROTOS = ["equeue_proto/v1/broker.proto"]


def generate(out: Path) -> list[Path]:
    """Run protoc; return the files written, relative to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    plugin = shutil.which("protoc-gen-mypy_grpc", path=str(Path(sys.executable).parent))
    if plugin is None:
        raise SystemExit("protoc-gen-mypy_grpc not found: install the dev extra (mypy-protobuf)")
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        f"--plugin=protoc-gen-mypy_grpc={plugin}",
        f"--mypy_grpc_out={out}",
        *PROTOS,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p.relative_to(out) for p in (out / "equeue_proto").rglob("*_pb2*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT)
    args = parser.parse_args()
    for path in generate(args.out):
        print(path)


if __name__ == "__main__":
    main()
