"""The documentation against the code: the Spark option table, links, paths,
the shipped files, the front page.

- The option table in docs/spark.md and ``equeue_spark/spark/options.py`` name
  the same options, for reads and for writes; so does ``EqueueDataSource``'s
  docstring (read from the source file, so pyspark is not imported).
- Every relative link in README.md and docs/*.md points to an existing file,
  and an anchor into a markdown file to one of its headings.
- Every repository path a doc names in backticks or in a code block
  (``hardening/budgets.py``, ``tests/support/acked.py``, a file named alone
  such as ``test_startup.py``, a module such as ``equeue_broker.testing_zk``)
  exists in the repository (issue 26: docs cited files that are not in it).
- A systemd unit shown in a doc is the shipped ``docs/equeue-broker.service``,
  verbatim; a broker config shown in a doc parses through the broker's own
  parser, and one that long is the shipped ``docs/equeue-broker.toml``.
- README.md is a front page: at most 200 lines.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from equeue_spark.spark import options

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
SPARK_DOC = DOCS / "spark.md"
SOURCE = ROOT / "equeue_spark" / "spark" / "source.py"
README_MAX_LINES = 200

UNIT = DOCS / "equeue-broker.service"
SAMPLE_CONFIG = DOCS / "equeue-broker.toml"

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
_NAME = re.compile(r"^`([A-Za-z][A-Za-z0-9]*)`$")


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md")), ROOT / "protos" / "README.md"]


def _without_code_blocks(text: str) -> str:
    return _FENCE.sub("", text)


def _table_rows(text: str, header: tuple[str, ...]) -> list[list[str]]:
    """The body rows of the first markdown table whose header cells are ``header``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if _cells(line) == list(header):
            rows = []
            for body in lines[i + 2 :]:  # skip the |---| line
                if not body.startswith("|"):
                    break
                rows.append(_cells(body))
            return rows
    raise AssertionError(f"no table with header {header} in {SPARK_DOC.name}")


def _cells(line: str) -> list[str]:
    if not line.startswith("|"):
        return []
    # A pipe inside a cell is written \| (as in the tags option's a\|b).
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [p.strip() for p in parts]


def _documented_options() -> dict[str, set[str]]:
    """``{"read": names, "write": names}`` from the option table of docs/spark.md."""
    rows = _table_rows(SPARK_DOC.read_text(), ("option", "applies to", "default", "meaning"))
    documented: dict[str, set[str]] = {"read": set(), "write": set()}
    seen: set[str] = set()
    for row in rows:
        match = _NAME.match(row[0])
        assert match, f"option cell {row[0]!r}: one option name in backticks per row"
        name = match.group(1)
        assert name not in seen, f"option {name} is documented twice"
        seen.add(name)
        sides = {side.strip() for side in row[1].split(",")}
        assert sides and sides <= {"read", "write"}, f"{name}: applies to {row[1]!r}"
        for side in sides:
            documented[side].add(name)
    return documented


def _accepted_options() -> dict[str, set[str]]:
    """The option names ``ReadOptions.parse`` and ``WriteOptions.parse`` accept."""
    return {"read": set(options._READ_NAMES), "write": set(options._WRITE_NAMES)}


@pytest.mark.parametrize("side", ["read", "write"])
def test_spark_option_table_matches_options_py(side: str) -> None:
    documented = _documented_options()[side]
    accepted = _accepted_options()[side]
    assert sorted(accepted - documented) == [], f"{side} options missing from docs/spark.md"
    assert sorted(documented - accepted) == [], f"documented {side} options options.py rejects"


def test_source_docstring_lists_every_option() -> None:
    tree = ast.parse(SOURCE.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EqueueDataSource"]
    doc = ast.get_docstring(cls) or ""
    assert "Options\n-------" in doc and "Examples\n--------" in doc
    section = doc.split("Options\n-------", 1)[1].split("Examples\n--------", 1)[0]
    listed = set(re.findall(r"^(\w+) : ", section, re.MULTILINE))
    accepted = _accepted_options()
    assert listed == accepted["read"] | accepted["write"]


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file."""
    anchors = set()
    for heading in _HEADING.findall(_without_code_blocks(path.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def _broken_links() -> list[tuple[str, Path]]:
    """(``page: target``, the file it resolves to) for every link that points nowhere."""
    broken = []
    for page in _markdown_files():
        for target in _LINK.findall(_without_code_blocks(page.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            path_part, _, anchor = target.partition("#")
            resolved = (page.parent / path_part).resolve() if path_part else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if not resolved.exists():
                broken.append((where, resolved))
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append((f"{where} (no such heading)", resolved))
    return broken


def test_relative_links_point_to_existing_files() -> None:
    assert _broken_links() == []


# -- paths named in the docs ------------------------------------------------------

_NOT_SOURCE = {".git", ".venv", "build", "__pycache__", ".mypy_cache", ".ruff_cache",
               ".pytest_cache", ".hypothesis", "equeue_mq.egg-info"}  # fmt: skip


def _repository_files() -> list[str]:
    """Every file of the checkout (paths relative to the root), without the
    virtualenv, build output and caches."""
    found = []
    for directory, subdirectories, names in os.walk(ROOT):
        subdirectories[:] = [d for d in subdirectories if d not in _NOT_SOURCE]
        found += [(Path(directory) / n).relative_to(ROOT).as_posix() for n in names]
    return found


_TICKED = re.compile(r"`([^`\s]+)`")
_SOURCE_SUFFIXES = (".py", ".md", ".proto", ".c", ".pyi", ".service", ".toml", ".sh")
_PACKAGES = {"equeue_broker": "broker/equeue_broker", "equeue_spark": "equeue_spark",
             "equeue_proto": "equeue_proto"}  # fmt: skip
_MODULE = re.compile(rf"^(?:{'|'.join(_PACKAGES)})(?:\.\w+)+$")


def _named_paths(text: str, top: set[str]) -> set[str]:
    """What a doc names that looks like a repository path: backticked tokens
    that start with a top-level folder of the repository or end in a source
    file's suffix, and, in prose and code blocks alike, any word starting with
    ``<top-level folder>/``. Absolute paths and URLs are not the repository's."""
    folders = "|".join(re.escape(t) for t in sorted(top) if (ROOT / t).is_dir())
    in_text = re.findall(rf"(?<![\w./<~$-])((?:{folders})/[\w./*{{}},-]*)", text)
    named = set()
    for found in [*_TICKED.findall(text), *in_text]:
        token = found.split("#")[0].rstrip(".,:;)")
        if not token or token.startswith((".", "/", "<", "~", "$", "-")) or "://" in token:
            continue
        if token.split("/")[0] in top or (token.endswith(_SOURCE_SUFFIXES) and "/" in token):
            named.update(_expand_braces(token))
        elif token.endswith(_SOURCE_SUFFIXES[:4]) or _MODULE.match(token):
            named.add(token)  # a source file named alone (test_startup.py), a module
    return named


def _expand_braces(token: str) -> list[str]:
    """``a{,_grpc}.py`` -> ``a.py``, ``a_grpc.py`` (as a shell writes two files)."""
    match = re.search(r"\{([^{}]*)\}", token)
    if match is None:
        return [token]
    head, tail = token[: match.start()], token[match.end() :]
    return [p for part in match[1].split(",") for p in _expand_braces(head + part + tail)]


def _exists(token: str, page: Path, files: list[str], folders: set[str]) -> bool:
    if _MODULE.match(token):  # a module, or a name in one (equeue_broker.testing.BrokerProcess)
        package, *parts = token.split(".")
        for n in range(len(parts), max(0, len(parts) - 2), -1):
            base = "/".join([_PACKAGES[package], *parts[:n]])
            if f"{base}.py" in files or f"{base}/__init__.py" in files:
                return True
        return False
    path = token.rstrip("/")
    if "*" in path:
        return any(Path(f).match(path) for f in files)
    relative = (page.parent / path).resolve()
    if path in files or path in folders or relative.exists():
        return True
    # Named from inside its folder (``replication/role.py``, ``test_budgets.py``).
    return any(f.endswith("/" + path) for f in files) or any(
        d.endswith("/" + path) for d in folders
    )


def test_every_repository_path_the_docs_name_exists() -> None:
    files = _repository_files()
    folders = {p.as_posix() for f in files for p in Path(f).parents if p != Path(".")}
    top = {f.split("/")[0] for f in files}
    missing = [
        f"{page.relative_to(ROOT)}: {token}"
        for page in _markdown_files()
        for token in sorted(_named_paths(page.read_text(), top))
        if not _exists(token, page, files, folders)
    ]
    assert missing == [], "paths the docs name that are not in the repository"


def test_the_path_check_finds_a_missing_path() -> None:
    """The check itself: what issue 26 found is caught, what is there passes."""
    files = _repository_files()
    folders = {p.as_posix() for f in files for p in Path(f).parents if p != Path(".")}
    top = {f.split("/")[0] for f in files}
    text = (
        "see the workspace's `shared/reference/cluster.md`, `hardening/gone.py`,"
        " `test_nothing_here.py`, `equeue_broker.testing_none` and `docs/nowhere.md`;"
        " run `python bench/missing_bench.py`; kept: `hardening/budgets.py`,"
        " `equeue_broker.testing_zk`, `test_startup.py`, `/etc/equeue/broker.toml`,"
        " `equeue_proto/v1/broker_pb2{,_grpc}.py`\n```sh\npython hardening/none.py\n```\n"
    )
    page = DOCS / "example.md"
    named = _named_paths(text, top)
    assert sorted(t for t in named if not _exists(t, page, files, folders)) == [
        "bench/missing_bench.py", "docs/nowhere.md", "equeue_broker.testing_none",
        "hardening/gone.py", "hardening/none.py", "shared/reference/cluster.md",
        "test_nothing_here.py",
    ]  # fmt: skip


# -- the shipped unit and config, as the docs show them ---------------------------


def _code_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced code block."""
    return [
        (m[2].strip(), m[3])
        for m in re.finditer(r"^(```|~~~)([^\n]*)\n(.*?)^\1[ \t]*$", text, re.MULTILINE | re.DOTALL)
    ]


def test_a_systemd_unit_shown_in_the_docs_is_the_shipped_one() -> None:
    shipped = UNIT.read_text()
    shown = [
        (page.relative_to(ROOT), body)
        for page in _markdown_files()
        for _, body in _code_blocks(page.read_text())
        if re.search(r"^\[(Unit|Service|Install)\]$", body, re.MULTILINE)
    ]
    for page, body in shown:
        assert body == shipped, f"{page} shows a unit that is not docs/equeue-broker.service"


_ASSIGNMENT = re.compile(r"^([A-Za-z][\w-]*)\s*=", re.MULTILINE)


def test_a_broker_config_shown_in_the_docs_parses_and_a_whole_one_is_the_sample(
    tmp_path: Path,
) -> None:
    from equeue_broker.server.config import BY_KEY, parse_args

    shipped = SAMPLE_CONFIG.read_text()
    for page in _markdown_files():
        for info, body in _code_blocks(page.read_text()):
            if info not in ("toml", "") or body.lstrip().startswith("[["):
                continue  # not TOML, or a tokens file ([[tokens]])
            keys = [k.replace("-", "_") for k in _ASSIGNMENT.findall(body)]
            if not keys or not all(k in BY_KEY for k in keys):
                continue  # not a broker config
            where = f"{page.relative_to(ROOT)}: {body[:60]!r}"
            config = tmp_path / "shown.toml"
            config.write_text(body)
            parse_args(["--config", str(config)])  # exits 2 naming the bad line
            if len(keys) >= 5:
                assert body == shipped, f"{where} copies docs/equeue-broker.toml, not verbatim"


def test_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
