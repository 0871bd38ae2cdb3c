"""The package layout's promises: dependencies point one way, and nothing imports in a circle.

Layers, lowest first (``A <- B``: B may import A, never the reverse)::

    contract (equeue_proto) <- storage <- server          (the broker, equeue_broker)
    contract, storage <- replication <- server             (replicas, failover, elections)
    contract (equeue_proto) <- namesrv                    (the name server, equeue_broker.namesrv;
                                                           it uses the server's start-up and log
                                                           helpers, never storage)
    contract (equeue_proto) <- client <- cli, spark       (equeue_spark)
    contract, client, cli <- console                      (equeue_spark.console, the web console:
                                                           a client of the cluster; it shares the
                                                           CLI's connection flags)
    contract, storage, replication, broker <- harness     (equeue_broker.testing_checks,
                                                           testing_group, testing_report: the
                                                           shipped test harness; never the client)

Outside the packages, folders import one way: tests -> hardening -> the packages,
bench -> the packages, examples -> the packages; and no module of the
repository (packages, bench, hardening, tests, examples) imports in a circle.

Two checks, because each misses what the other sees (and a third: nothing
outside storage/store.py reaches into ``Store``'s private members):
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
    "replication": ("equeue_broker.replication",),
    "server": ("equeue_broker.server", "equeue_broker.__main__"),
    "namesrv": ("equeue_broker.namesrv",),
    "broker": ("equeue_broker", "equeue_broker.testing", "equeue_broker.testing_zk"),
    "harness": (
        "equeue_broker.testing_checks",
        "equeue_broker.testing_group",
        "equeue_broker.testing_report",
    ),
    "client": ("equeue_spark", "equeue_spark.client"),
    "cli": ("equeue_spark.cli",),
    "spark": ("equeue_spark.spark", "pyspark_equeue"),
    "console": ("equeue_spark.console",),
}
ALLOWED: dict[str, set[str]] = {
    "contract": {"contract"},
    "storage": {"contract", "storage"},
    "replication": {"contract", "storage", "replication"},
    "server": {"contract", "storage", "replication", "server", "broker"},
    "broker": {"contract"},
    "harness": {"contract", "storage", "replication", "broker", "harness"},
    "namesrv": {"contract", "namesrv", "server"},
    "client": {"contract", "client"},
    "cli": {"contract", "client", "cli"},
    "spark": {"contract", "client", "spark"},
    "console": {"contract", "client", "cli", "console"},
}
FOLDERS_ALLOWED = {
    # folder: top-level names of ours it may import
    "bench": {"equeue_broker", "equeue_spark", "equeue_proto", "bench"},
    "hardening": {"equeue_broker", "equeue_spark", "equeue_proto", "hardening"},
    "examples": {"equeue_broker", "equeue_spark", "equeue_proto"},
    # tests/hardening runs the hardening scripts bounded; every other test uses the
    # shipped harness (equeue_broker.testing*), never bench/.
    "tests": {
        "equeue_broker",
        "equeue_spark",
        "equeue_proto",
        "pyspark_equeue",
        "tests",
        "hardening",
    },
}
SCRIPT_FOLDERS = ("bench", "hardening", "tests", "examples", "protos")
"""The repository's other folders of Python: scripts and the tests, checked for cycles too."""
OURS = (*PACKAGE_DIRS, "pyspark_equeue", *SCRIPT_FOLDERS)
SHIPPED = (*PACKAGE_DIRS, "pyspark_equeue")


def module_files() -> dict[str, Path]:
    """Every shipped module of ours by import name."""
    found = {"pyspark_equeue": ROOT / "pyspark_equeue.py"}
    for package, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def repository_files() -> dict[str, Path]:
    """Every module of the repository: the shipped ones, and those of
    ``SCRIPT_FOLDERS`` by their dotted path from the checkout (``bench._measure``,
    ``tests.support.waits``, ``examples._local_broker``)."""
    found = module_files()
    for folder in SCRIPT_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
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
    if not (path.parent / "__init__.py").exists():  # a script: its folder is on sys.path
        folder = name.rsplit(".", 1)[0] if "." in name else ""
        out = {f"{folder}.{m}" if f"{folder}.{m}" in modules else m for m in out}
    return {m for m in out if m.split(".")[0] in OURS}


def layer_of(module: str) -> str:
    best = max(
        ((layer, prefix) for layer, prefixes in LAYERS.items() for prefix in prefixes
         if module == prefix or module.startswith(prefix + ".")),
        key=lambda item: len(item[1]),
    )  # fmt: skip
    return best[0]


REPOSITORY = repository_files()
GRAPH = {name: imports_of(path, name, set(REPOSITORY)) for name, path in sorted(REPOSITORY.items())}
"""Module -> the modules of ours it imports, over the whole repository."""
SHIPPED_GRAPH = {name: GRAPH[name] for name in module_files()}


def test_every_import_follows_the_layers() -> None:
    wrong = [
        f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for module, targets in SHIPPED_GRAPH.items()
        for target in sorted(targets)
        if target.split(".")[0] in SHIPPED and layer_of(target) not in ALLOWED[layer_of(module)]
    ]
    shipped_importing_tests = [
        f"{module} imports {target}"
        for module, targets in SHIPPED_GRAPH.items()
        for target in targets
        if target.split(".")[0] not in SHIPPED
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
    """Over every module of the repository: the packages, bench, hardening, tests,
    examples. An import inside a function counts (it is the same dependency,
    only deferred). A package importing its own submodules (its __init__
    re-exporting them) is not a cycle: the submodules import the package's
    siblings, not its __init__."""
    assert strongly_connected(GRAPH) == []


def test_the_cycle_check_sees_every_folder() -> None:
    folders = {name.split(".")[0] for name in GRAPH}
    assert folders >= {*SHIPPED, *SCRIPT_FOLDERS}
    assert "tests.support.waits" in GRAPH
    assert "examples.broker_quickstart" in GRAPH
    assert "examples._local_broker" in GRAPH["examples.broker_quickstart"]


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
    """tests may run hardening's scripts (they test them, bounded); bench,
    hardening and examples use only the shipped packages, so no folder cycle."""
    ours = {"equeue_broker", "equeue_spark", "equeue_proto", "pyspark_equeue", "tests", "bench",
            "hardening", "examples", "broker"}  # fmt: skip
    wrong = {
        path: sorted((names & ours) - FOLDERS_ALLOWED[folder])
        for path, names in folder_imports(folder).items()
        if (names & ours) - FOLDERS_ALLOWED[folder]
    }
    assert wrong == {}


def test_only_the_hardening_tests_import_hardening() -> None:
    """The invariant checkers live in the shipped harness; hardening/ is imported
    only by the tests that run its scripts bounded."""
    wrong = [
        path
        for path, names in folder_imports("tests").items()
        if "hardening" in names and not path.startswith("tests/hardening/")
    ]
    assert wrong == []


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
    "replication": (["equeue_broker.replication." + name for name in (
                        "election", "errors", "failover", "follower", "insync", "master",
                        "pipelined", "replica_log", "replicas", "role", "wire")],
                    ["equeue_broker.server", "equeue_spark", "pyspark", "pyarrow"]),
    "server": (["equeue_broker.server.app"], ["equeue_spark", "pyspark", "pyarrow"]),
    "harness": (["equeue_broker.testing_checks", "equeue_broker.testing_group",
                 "equeue_broker.testing_report"],
                ["equeue_spark", "pyspark", "pyarrow"]),
    "namesrv": (["equeue_broker.namesrv.app"],
                ["equeue_broker.storage", "equeue_spark", "pyspark", "pyarrow"]),
    "client": (["equeue_spark.client", "equeue_spark.client.columns", "equeue_spark.cli"],
               ["equeue_broker", "pyspark", "pyarrow", "pandas"]),
    "spark": (["pyspark_equeue"], ["equeue_broker"]),
    "console": (["equeue_spark.console.app", "equeue_spark.console.web"],
                ["equeue_broker", "pyspark", "pyarrow", "pandas"]),
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


# -- Store's private members stay in store.py ---------------------------------------

STORE_MODULE = PACKAGE_DIRS["equeue_broker"] / "storage" / "store.py"


def store_private_names() -> set[str]:
    """Every private member of ``Store``: ``self._x`` it sets or reads, ``def _x``."""
    tree = ast.parse(STORE_MODULE.read_text())
    store = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Store")
    names = set()
    for node in ast.walk(store):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self"):  # fmt: skip
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_accesses(source: str, names: set[str]) -> list[str]:
    """``<expr>._x`` for each ``_x`` of ``names`` where ``<expr>`` is not ``self``
    or ``cls`` (a class's own members are its own business)."""
    return sorted(
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in names
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    )  # fmt: skip


def test_the_private_access_check_finds_accesses() -> None:
    names = store_private_names()
    assert {"_state", "_writer", "_topic_admin", "_reads"} <= names
    source = "store._state.lock\nself._store._writer\nself._reads\nx = s._topic_admin.topics"
    assert private_accesses(source, names) == [
        "line 1: store._state", "line 2: self._store._writer", "line 4: s._topic_admin",
    ]  # fmt: skip


def test_nothing_outside_store_py_touches_store_privates() -> None:
    """The rest of the broker uses ``Store``'s public API (replication/ too:
    ``append_at``, ``truncate``, ``read_log``, ``set_hw_limit``, ``hold_back``);
    the engine's shared state is passed explicitly (storage/engine.py)."""
    names = store_private_names()
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sorted(PACKAGE_DIRS["equeue_broker"].rglob("*.py"))
        if path != STORE_MODULE and (hits := private_accesses(path.read_text(), names))
    }
    assert found == {}
