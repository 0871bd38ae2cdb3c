"""The vendored front-end files (the console's uPlot) are the ones their README
names: same bytes (sha256), the MIT licence beside them, and shipped in the
wheel by setup.cfg's package_data."""

from __future__ import annotations

import configparser
import fnmatch
import hashlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "equeue_spark" / "console" / "static"
VENDOR = STATIC / "vendor"
ROW = re.compile(r"^\| `(?P<file>[^`]+)` \| .* \| `(?P<sha>[0-9a-f]{64})` \|$")


def recorded() -> dict[str, str]:
    rows = (ROW.match(line) for line in (VENDOR / "README.md").read_text().splitlines())
    return {m["file"]: m["sha"] for m in rows if m}


def test_every_vendored_file_has_the_recorded_hash() -> None:
    hashes = recorded()
    assert set(hashes) == {"uPlot.iife.min.js", "uPlot.min.css", "LICENSE.uPlot"}
    on_disk = {p.name for p in VENDOR.iterdir() if p.name != "README.md"}
    assert on_disk == set(hashes), "every vendored file is listed in vendor/README.md"
    for name, sha in hashes.items():
        got = hashlib.sha256((VENDOR / name).read_bytes()).hexdigest()
        assert got == sha, f"vendor/{name} changed: sha256 {got}, README says {sha}"
    readme = (VENDOR / "README.md").read_text()
    assert "1.6.32" in readme and "npm pack uplot@1.6.32" in readme


def test_the_licence_is_mit_and_names_the_author() -> None:
    text = (VENDOR / "LICENSE.uPlot").read_text()
    assert text.startswith("The MIT License (MIT)")
    assert "Leon Sorokin" in text
    assert "Permission is hereby granted, free of charge" in text


def test_package_data_ships_the_pages_and_the_vendored_files() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    patterns = [
        p.strip()
        for p in config["options.package_data"]["equeue_spark"].replace("\n", ",").split(",")
        if p.strip()
    ]
    package = ROOT / "equeue_spark"
    files = [p for p in STATIC.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"page.html", "console.js", "console.css", "README.md"}
    for path in files:
        relative = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatchcase(relative, pattern) for pattern in patterns), (
            f"{relative} is not shipped: add it to setup.cfg [options.package_data]"
        )
