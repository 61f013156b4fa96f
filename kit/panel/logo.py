"""A deterministic 256x256 PNG logo (1Panel requires a real logo.png for local apps), written with zlib only."""

from __future__ import annotations

import struct
import zlib

SIZE = 256


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(color: tuple[int, int, int], accent: tuple[int, int, int] = (255, 255, 255)) -> bytes:
    """Rounded tile in ``color`` with two accent bars: two GPUs joined by a link."""
    rows = []
    r = 40
    for y in range(SIZE):
        row = bytearray([0])  # filter: none
        for x in range(SIZE):
            cx = min(x, SIZE - 1 - x)
            cy = min(y, SIZE - 1 - y)
            inside = not (cx < r and cy < r and (r - cx) ** 2 + (r - cy) ** 2 > r * r)
            gpu = (56 <= x < 112 or 144 <= x < 200) and 64 <= y < 192
            link = 112 <= x < 144 and 116 <= y < 140
            if not inside:
                row += bytes((0, 0, 0, 0))
            elif gpu or link:
                row += bytes((*accent, 255))
            else:
                row += bytes((*color, 255))
        rows.append(bytes(row))
    raw = zlib.compress(b"".join(rows), 9)
    header = struct.pack(">IIBBBBB", SIZE, SIZE, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", raw) + _chunk(b"IEND", b"")
