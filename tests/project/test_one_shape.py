"""One client shape for one broker or a cluster: "one broker is a cluster of one".

The client has one routing component, ``Routes`` (equeue_spark/client/routing.py;
``StaticRoutes`` for a broker address, ``NameServerRoutes`` in cluster.py for
name servers). ``cluster.connect(config)`` picks one, and nothing else in
equeue_spark asks which one it has: a difference between the two is a method
of ``Routes`` with one meaning and two implementations (``names_groups``,
``shown_group``, ``misnamed``, ``leave_out``, ``group``, ``send_requests``'
pipeline, ...), so each caller has one code path.

This check reads every module of equeue_spark outside routing.py, cluster.py
and connection.py (where the settings are read and the choice made) and
fails on any read of:

- ``is_cluster`` (``ClientConfig.is_cluster``: which kind the settings name);
- ``NameServerRoutes`` / ``StaticRoutes`` (a name, an attribute or an import);
- ``options.cluster`` (``ReadOptions``/``WriteOptions.cluster``, whether the
  option ``namesrv`` was given) and the same flag in the option parser
  (``scope.cluster``, a ``cluster=`` argument).

``ALLOWED`` lists what must still read it, each with why (nothing now); an
entry no module needs any more fails too, so the list does not rot.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "equeue_spark"

CHOOSERS = {
    "equeue_spark/client/routing.py": "Routes and StaticRoutes themselves",
    "equeue_spark/client/cluster.py": "NameServerRoutes, and connect/routes_type: the one choice",
    "equeue_spark/client/connection.py": "ClientConfig: the settings naming one kind or the other",
}
"""The modules that may ask which kind of routes there is."""

KINDS = {"is_cluster", "NameServerRoutes", "StaticRoutes"}
FLAG_HOLDERS = ("options", "scope")
"""Objects whose ``.cluster`` is the "option namesrv given" flag."""

ALLOWED: dict[tuple[str, str], str] = {}


def _reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every read of which kind of routes there is."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in KINDS:
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute) and node.attr in KINDS:
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.ImportFrom):
            found.extend((node.lineno, a.name) for a in node.names if a.name in KINDS)
        elif isinstance(node, ast.Attribute) and node.attr == "cluster":
            holder = ast.unparse(node.value).rsplit(".", 1)[-1]
            if holder in FLAG_HOLDERS:
                found.append((node.lineno, f"{holder}.cluster"))
        elif isinstance(node, ast.keyword) and node.arg == "cluster":
            found.append((node.value.lineno, "cluster="))
    return found


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name not in CHOOSERS:
            out.append((name, ast.parse(path.read_text(), filename=name)))
    return out


def test_only_the_routing_modules_ask_which_kind_of_routes_there_is() -> None:
    wrong = []
    used = set()
    for name, tree in _modules():
        for line, what in _reads(tree):
            if (name, what) in ALLOWED:
                used.add((name, what))
            else:
                wrong.append(f"{name}:{line}: reads {what}")
    assert not wrong, (
        "these branch on one broker versus a cluster outside client/routing.py, "
        "cluster.py and connection.py; ask a Routes method whose two implementations "
        "differ instead (docs/architecture.md, the client's routing):\n" + "\n".join(wrong)
    )
    assert used == set(ALLOWED), f"allowed but no longer needed: {sorted(set(ALLOWED) - used)}"


def test_the_choosers_exist() -> None:
    """The allowed modules are where this check says (a move must update it)."""
    for name in CHOOSERS:
        assert (ROOT / name).is_file(), name


def test_the_check_sees_each_kind_of_read() -> None:
    """The finder itself: each form it must catch, and a CLI's ``args.cluster``
    (the --cluster filter, a cluster's name) it must not."""
    source = (
        "from equeue_spark.client.cluster import NameServerRoutes\n"
        "a = config.is_cluster\n"
        "b = isinstance(r, StaticRoutes)\n"
        "c = self.options.cluster\n"
        "d = f(x, cluster=True)\n"
        "e = admin.cluster_stats(args.cluster)\n"
    )
    assert sorted(line for line, _ in _reads(ast.parse(source))) == [1, 2, 3, 4, 5]
