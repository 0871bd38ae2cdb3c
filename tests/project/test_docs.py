"""The documentation against the code: the Spark option table, links, the front page.

- The option table in docs/spark.md and ``equeue_spark/spark/options.py`` name
  the same options, for reads and for writes; so does ``EqueueDataSource``'s
  docstring (read from the source file, so pyspark is not imported).
- Every relative link in README.md and docs/*.md points to an existing file,
  and an anchor into a markdown file to one of its headings.
- README.md is a front page: at most 200 lines.
"""

from __future__ import annotations

import ast
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

WRITTEN_ON_ANOTHER_BRANCH = {"docs/equeue-broker.toml", "docs/equeue-broker.service"}
"""Linked from the docs, written in parallel with them (the sample broker config
and the systemd unit). Until they land, their links alone make the link test
xfail instead of fail; any other broken link fails it."""

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
_NAME = re.compile(r"^`([A-Za-z][A-Za-z0-9]*)`$")


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


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
    broken = _broken_links()
    pending = [where for where, path in broken if _relative(path) in WRITTEN_ON_ANOTHER_BRANCH]
    assert [where for where, path in broken if where not in pending] == []
    if pending:
        pytest.xfail(f"not written yet (another branch): {pending}")


def _relative(path: Path) -> str:
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def test_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
