"""The console's screenshots against docs/operations.md: the doc shows exactly
the PNGs in docs/images/console-*.png, those are the pages ``make
console-shots`` writes, and each is a whole, valid PNG of 1280x800 that keeps
the repository small."""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import pytest

from tests.support.console_shots import HEIGHT, SHOTS, WIDTH, shot_file

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "docs" / "images"
OPERATIONS = ROOT / "docs" / "operations.md"
MAX_BYTES = 200 * 1024
SIGNATURE = b"\x89PNG\r\n\x1a\n"
BYTES_PER_PIXEL = {(2, 8): 3, (6, 8): 4, (0, 8): 1, (4, 8): 2}
"""(colour type, bit depth) -> bytes a pixel: truecolour, with alpha, grey, grey+alpha."""


def shown_in_doc() -> list[str]:
    return re.findall(r"\]\(images/(console-[^)\s]+\.png)\)", OPERATIONS.read_text())


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, after checking every chunk's CRC, that it
    ends with IEND and that its image data inflates to exactly the rows the
    header promises; AssertionError naming what is wrong."""
    assert data.startswith(SIGNATURE), "no PNG signature"
    at, chunks, idat = len(SIGNATURE), [], b""
    while at < len(data):
        assert at + 12 <= len(data), "the last chunk is cut short"
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        assert at + 12 + length <= len(data), f"chunk {kind!r} cut short"
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"chunk {kind!r}: bad CRC"
        chunks.append(kind)
        idat += body if kind == b"IDAT" else b""
        at += 12 + length
    assert chunks[0] == b"IHDR", f"the first chunk is {chunks[0]!r}, not IHDR"
    assert chunks[-1] == b"IEND", f"the last chunk is {chunks[-1]!r}, not IEND"
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", data[16:29])
    assert interlace == 0, "interlaced"
    pixel = BYTES_PER_PIXEL.get((colour, depth))
    assert pixel is not None, f"colour type {colour} depth {depth}: not a screenshot's"
    rows = zlib.decompress(idat)
    assert len(rows) == height * (1 + width * pixel), "image data does not fill the image"
    return width, height


def test_the_doc_shows_exactly_the_screenshots_there_are() -> None:
    shown = shown_in_doc()
    on_disk = sorted(p.name for p in IMAGES.glob("console-*.png"))
    assert len(shown) == len(set(shown)), f"shown twice: {shown}"
    assert sorted(shown) == on_disk, "docs/operations.md and docs/images/ disagree"
    assert on_disk == sorted(shot_file(s) for s in SHOTS), "not what make console-shots writes"


@pytest.mark.parametrize("name", [shot_file(s) for s in SHOTS])
def test_each_screenshot_is_a_whole_png_of_the_shot_size(name: str) -> None:
    path = IMAGES / name
    data = path.read_bytes()
    assert len(data) < MAX_BYTES, f"{name}: {len(data)} bytes, keep it under {MAX_BYTES}"
    assert png_size(data) == (WIDTH, HEIGHT), name


def test_the_checker_refuses_a_damaged_png() -> None:
    data = (IMAGES / shot_file(SHOTS[0])).read_bytes()
    damaged = bytearray(data)
    damaged[data.index(b"IDAT") + 20] ^= 0xFF  # inside the image data: its CRC no longer holds
    with pytest.raises(AssertionError, match="bad CRC"):
        png_size(bytes(damaged))
    with pytest.raises(AssertionError, match="not IEND"):
        png_size(data[: len(data) - 12])
