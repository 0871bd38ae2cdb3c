"""The package layout's promises: dependencies point one way, and nothing imports in a circle.

Layers, lowest first (``A <- B``: B may import A, never the reverse)::

    contract (equeue_proto) <- storage <- server          (the broker, equeue_broker)
    contract, storage <- cluster <- server                 (elections, replication)
    contract (equeue_proto) <- namesrv                    (the name server, equeue_broker.namesrv;
                                                           it uses the server's start-up and log
                                                           helpers, never storage)
    contract (equeue_proto) <- client <- cli, spark       (equeue_spark)

Two checks, because each misses what the other sees:
- static: every ``import`` in every module, parsed from the source, including
  imports under ``if TYPE_CHECKING:`` and inside functions, against the layer
  table; and a module-level cycle check over the same graph;
- dynamic: each layer imported in a fresh interpreter, then ``sys.modules``
  checked, which also catches what the layer's third-party imports drag in.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = {name: ROOT / name for name in ("equeue_spark", "equeue_proto")}
PACKAGE_DIRS["equeue_broker"] = ROOT / "broker" / "equeue_broker"  # broker/ is a source root
"""Import name -> folder: every package folder has its import name."""

LAYERS: dict[str, tuple[str, ...]] = {
    # layer: module prefixes (longest match wins)
    "contract": ("equeue_proto",),
    "storage": ("equeue_broker.storage",),
    "cluster": ("equeue_broker.cluster",),
    "server": ("equeue_broker.server", "equeue_broker.__main__"),
    "namesrv": ("equeue_broker.namesrv",),
    "broker": ("equeue_broker", "equeue_broker.testing", "equeue_broker.testing_zk"),
    "client": ("equeue_spark", "equeue_spark.client"),
    "cli": ("equeue_spark.cli",),
    "spark": ("equeue_spark.spark", "pyspark_equeue"),
}
ALLOWED: dict[str, set[str]] = {
    "contract": {"contract"},
    "storage": {"contract", "storage"},
    "cluster": {"contract", "storage", "cluster"},
    "server": {"contract", "storage", "cluster", "server", "broker"},
    "broker": {"contract"},
    "namesrv": {"contract", "namesrv", "server"},
    "client": {"contract", "client"},
    "cli": {"contract", "client", "cli"},
    "spark": {"contract", "client", "spark"},
}
FOLDERS_ALLOWED = {
    # folder: top-level names of ours it may import
    "bench": {"equeue_broker", "equeue_spark", "equeue_proto", "bench"},
    "examples": {"equeue_broker", "equeue_spark", "equeue_proto"},
    "tests": {"equeue_broker", "equeue_spark", "equeue_proto", "pyspark_equeue", "tests", "bench"},
}
OURS = (*PACKAGE_DIRS, "pyspark_equeue", "tests", "bench")


def module_files() -> dict[str, Path]:
    """Every module of ours by import name."""
    found = {"pyspark_equeue": ROOT / "pyspark_equeue.py"}
    for package, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The modules of ours that ``path`` (module ``name``) imports, anywhere in it."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = name.split(".") if is_package else name.split(".")[:-1]
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # "from pkg import mod" imports the module pkg.mod
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in modules else base)
    return {m for m in out if m.split(".")[0] in OURS}


def layer_of(module: str) -> str:
    best = max(
        ((layer, prefix) for layer, prefixes in LAYERS.items() for prefix in prefixes
         if module == prefix or module.startswith(prefix + ".")),
        key=lambda item: len(item[1]),
    )  # fmt: skip
    return best[0]


GRAPH = {
    name: imports_of(path, name, set(module_files()))
    for name, path in sorted(module_files().items())
}


def test_every_import_follows_the_layers() -> None:
    wrong = [
        f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for module, targets in GRAPH.items()
        for target in sorted(targets)
        if target.split(".")[0] not in ("tests", "bench")
        and layer_of(target) not in ALLOWED[layer_of(module)]
    ]
    shipped_importing_tests = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if target.split(".")[0] in ("tests", "bench")
    ]
    assert wrong + shipped_importing_tests == []


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components with more than one module
    (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    cycles.append(sorted(component))
    return cycles


def test_the_cycle_check_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["e"]]


def test_no_module_imports_in_a_circle() -> None:
    # A package importing its own submodules (its __init__ re-exporting them) is
    # not a cycle: the submodules import the package's siblings, not its __init__.
    assert strongly_connected(GRAPH) == []


def folder_imports(folder: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
        out[str(path.relative_to(ROOT))] = names
    return out


@pytest.mark.parametrize("folder", sorted(FOLDERS_ALLOWED))
def test_folders_import_one_way(folder: str) -> None:
    """tests may use bench's harnesses (they test them); bench and examples
    use only the shipped packages, so no folder cycle."""
    ours = {"equeue_broker", "equeue_spark", "equeue_proto", "pyspark_equeue", "tests", "bench",
            "examples", "broker"}  # fmt: skip
    wrong = {
        path: sorted((names & ours) - FOLDERS_ALLOWED[folder])
        for path, names in folder_imports(folder).items()
        if (names & ours) - FOLDERS_ALLOWED[folder]
    }
    assert wrong == {}


PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(set(sys.modules) | {m.split(".")[0] for m in sys.modules})))
"""

RUNTIME_CASES = {
    # what is imported: what must not be loaded as a result
    "contract": (["equeue_proto.record", "equeue_proto.accel", "equeue_proto.protocol",
                  "equeue_proto.v1.broker_pb2_grpc"],
                 ["equeue_broker", "equeue_spark", "pyspark", "pyarrow"]),
    "storage": (["equeue_broker.storage"],
                ["equeue_broker.server", "equeue_spark", "grpc", "pyspark", "pyarrow"]),
    "cluster": (["equeue_broker.cluster"],
                ["equeue_broker.server", "equeue_spark", "grpc", "pyspark", "pyarrow"]),
    "server": (["equeue_broker.server.app"], ["equeue_spark", "pyspark", "pyarrow"]),
    "namesrv": (["equeue_broker.namesrv.app"],
                ["equeue_broker.storage", "equeue_spark", "pyspark", "pyarrow"]),
    "client": (["equeue_spark.client", "equeue_spark.client.columns", "equeue_spark.cli"],
               ["equeue_broker", "pyspark", "pyarrow", "pandas"]),
    "spark": (["pyspark_equeue"], ["equeue_broker"]),
}  # fmt: skip


@pytest.mark.parametrize("layer", sorted(RUNTIME_CASES))
def test_a_layer_loads_nothing_above_it(layer: str) -> None:
    modules, forbidden = RUNTIME_CASES[layer]
    if layer == "spark":
        pytest.importorskip("pyspark")
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, timeout=120,
        check=False,
        cwd="/",  # not the checkout: only what is installed
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout))
    assert (
        sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in forbidden)) == []
    )
    assert "broker" not in loaded  # PyPI's broker package is not ours to shadow
