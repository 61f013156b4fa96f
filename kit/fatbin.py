"""List the SM architectures inside CUDA binaries without cuobjdump (runtime images have none).

An ELF shared library or object that carries device code has a ``.nv_fatbin`` section: fat containers back to
back (``u32 magic 0xBA55ED50, u16 version, u16 header_size, u64 fat_size``), each holding entries
(``u16 kind`` 1 = PTX / 2 = ELF cubin, ``u32 header_size`` @4, ``u64 payload_size`` @8, ``u32 arch`` @0x1c).
Listing archs needs no decompression. Checked against ``cuobjdump --list-elf/--list-ptx`` on real objects.
Sources: ZLUDA zluda_dump, cuda-fatbin-decompression (see ../shared/reference/engines.md).
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KIND = {1: "ptx", 2: "sass"}


@dataclass(frozen=True)
class Entry:
    kind: str  # "sass" (real code, ELF cubin) or "ptx"
    arch: int  # 70 for sm_70 / compute_70
    compressed: bool


class FatbinError(ValueError):
    pass


def _sections(data: bytes) -> dict[str, tuple[int, int]]:
    """ELF64 little-endian section name -> (offset, size)."""
    if data[:4] != b"\x7fELF":
        raise FatbinError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise FatbinError("only 64-bit little-endian ELF is supported")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shnum == 0:
        return {}
    headers = []
    for i in range(shnum):
        base = shoff + i * shentsize
        name, _type, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", data, base)
        headers.append((name, offset, size, _type))
    str_off, str_size = headers[shstrndx][1], headers[shstrndx][2]
    strtab = data[str_off:str_off + str_size]
    out = {}
    for name, offset, size, type_ in headers:
        end = strtab.find(b"\0", name)
        label = strtab[name:end].decode("ascii", "replace")
        if type_ != 8:  # SHT_NOBITS has no bytes in the file
            out[label] = (offset, size)
    return out


def parse_fatbin(blob: bytes) -> list[Entry]:
    """Entries of every fat container in ``blob`` (a ``.nv_fatbin`` section or a ``.fatbin`` file)."""
    entries: list[Entry] = []
    pos = 0
    while pos + 16 <= len(blob):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            # containers are aligned; skip padding between them
            if blob[pos:pos + 4] == b"\0\0\0\0":
                pos += 4
                continue
            raise FatbinError(f"bad fatbin magic 0x{magic:08x} at offset {pos}")
        cursor, end = pos + header_size, pos + header_size + fat_size
        while cursor + 0x20 <= end:
            kind, _unk, entry_header, payload = struct.unpack_from("<HHIQ", blob, cursor)
            if entry_header == 0:
                break
            arch = struct.unpack_from("<I", blob, cursor + 0x1C)[0]
            flags = struct.unpack_from("<Q", blob, cursor + 0x28)[0] if entry_header >= 0x30 else 0
            if kind in KIND:
                entries.append(Entry(KIND[kind], arch, bool(flags & 0x2000)))
            cursor += entry_header + payload
        pos = end
    return entries


def read_entries(path: str | Path) -> list[Entry]:
    data = Path(path).read_bytes()
    if data[:4] == struct.pack("<I", FATBIN_MAGIC):
        return parse_fatbin(data)
    section = _sections(data).get(".nv_fatbin")
    if section is None:
        return []
    offset, size = section
    return parse_fatbin(data[offset:offset + size])


def archs(path: str | Path) -> dict[str, list[int]]:
    """``{"sass": [70], "ptx": []}`` for one file."""
    entries = read_entries(path)
    return {kind: sorted({e.arch for e in entries if e.kind == kind}) for kind in ("sass", "ptx")}


def main(argv: list[str] | None = None) -> int:
    """``python -m kit.fatbin FILE... [--expect 70,80]``: print archs; with --expect, exit 1 unless they match."""
    args = list(sys.argv[1:] if argv is None else argv)
    expect = None
    if "--expect" in args:
        i = args.index("--expect")
        expect = sorted(int(a) for a in args[i + 1].split(","))
        del args[i:i + 2]
    bad = 0
    for path in args:
        found = archs(path)
        print(f"{path}: sass={found['sass']} ptx={found['ptx']}")
        if expect is not None and (found["sass"] or found["ptx"]) and found["sass"] != expect:
            print(f"  expected real code for exactly {expect}", file=sys.stderr)
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
