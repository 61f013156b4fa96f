"""The .nv_fatbin reader against real CUDA objects and against cuobjdump as the oracle."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kit import fatbin

FIX = Path(__file__).parent / "fixtures" / "fatbin"
# Debian's toolkit (CUDA 11.8) still targets sm_70; its ptxas must win over a CUDA 13 one earlier on PATH.
TOOLKIT_PATH = os.pathsep.join(["/usr/lib/nvidia-cuda-toolkit/bin", "/usr/bin", os.environ.get("PATH", "")])


def _nvcc() -> str | None:
    nvcc = shutil.which("nvcc", path=TOOLKIT_PATH)
    if not nvcc:
        return None
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, env={"PATH": TOOLKIT_PATH}).stdout
    match = re.search(r"release (\d+)\.", version)
    return nvcc if match and int(match.group(1)) < 13 else None  # CUDA 13 rejects sm_70


NVCC = _nvcc()
NEED_NVCC = os.environ.get("KIT_REQUIRE_NVCC") == "1"


def cuobjdump(path: Path) -> dict[str, list[int]]:
    out = subprocess.run(["cuobjdump", "--list-elf", "--list-ptx", str(path)], capture_output=True, text=True,
                         env={"PATH": TOOLKIT_PATH}).stdout
    sass = sorted({int(a) for a in re.findall(r"^ELF file .*\.sm_(\d+)\.cubin$", out, flags=re.M)})
    ptx = sorted({int(a) for a in re.findall(r"^PTX file .*\.sm_(\d+)\.ptx$", out, flags=re.M)})
    return {"sass": sass, "ptx": ptx}


@pytest.mark.parametrize("name,expected", [
    ("sm70.o", {"sass": [70], "ptx": []}),
    ("sm70_80.o", {"sass": [70, 80], "ptx": []}),
    ("sm80.o", {"sass": [80], "ptx": []}),
    ("ptx70.o", {"sass": [], "ptx": [70]}),
    ("k.fatbin", {"sass": [70], "ptx": []}),
])
def test_committed_real_objects(name, expected):
    assert fatbin.archs(FIX / name) == expected


def elf(path: Path, sections: list[tuple[bytes, int, bytes]], shoff: int | None = None, shnum: int | None = None) -> Path:
    """A 64-bit little-endian relocatable ELF written byte by byte (System V gABI layout): the given (name, sh_type,
    bytes) sections after a SHT_NULL one, then the section-name table. ``shoff``/``shnum`` override the header's
    e_shoff/e_shnum. Nothing on this machine decides what it holds."""
    names = b"\0" + b"".join(name + b"\0" for name, _, _ in sections) + b".shstrtab\0"
    body, placed, at = b"", [], 64
    for name, kind, data in sections:
        placed.append((names.index(b"\0" + name + b"\0") + 1, kind, at + len(body), len(data)))
        body += data
    names_at = 64 + len(body)
    table_at = (names_at + len(names) + 7) // 8 * 8
    count = len(sections) + 2
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8  # ELFCLASS64, ELFDATA2LSB, EV_CURRENT, System V
    header = ident + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, table_at if shoff is None else shoff, 0, 64, 0, 0,
                                 64, count if shnum is None else shnum, count - 1)

    def section(name: int, kind: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, 0, 0, 1, 0)

    table = section(0, 0, 0, 0) + b"".join(section(*s) for s in placed)  # SHT_NULL first
    table += section(names.index(b".shstrtab"), 3, names_at, len(names))  # SHT_STRTAB
    blob = header + body + names
    path.write_bytes(blob + b"\0" * (table_at - len(blob)) + table)
    return path


def elf_without_device_code(path: Path) -> Path:
    """A .text section with four bytes of code (nop nop nop ret) and no .nv_fatbin."""
    return elf(path, [(b".text", 1, b"\x90\x90\x90\xc3")])  # SHT_PROGBITS


def container(*entries: bytes) -> bytes:
    """A fat container as NVIDIA's fatbin.h lays it out (ZLUDA's zluda_dump reads the same): u32 magic 0xBA55ED50,
    u16 version, u16 header size (16), u64 size of the entries that follow."""
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def entry(kind: int, arch: int, payload: bytes = b"", header: int = 0x40, flags: int = 0) -> bytes:
    """One entry: u16 kind (1 PTX, 2 ELF), u16 unknown, u32 header size, u64 payload size, u32 arch at 0x1c, and from
    a 0x30-byte header on, u64 flags at 0x28 (0x2000 = compressed)."""
    head = bytearray(header)
    struct.pack_into("<HHIQ", head, 0, kind, 0x0101, header, len(payload))
    struct.pack_into("<I", head, 0x1C, arch)
    if header >= 0x30:
        struct.pack_into("<Q", head, 0x28, flags)
    return bytes(head) + payload


def test_file_without_device_code(tmp_path):
    plain = elf_without_device_code(tmp_path / "plain.o")
    sections = fatbin._sections(plain.read_bytes())  # read as an ELF: .text at 64, 4 bytes
    assert sections[".text"] == (64, 4) and ".nv_fatbin" not in sections
    assert fatbin.archs(plain) == {"sass": [], "ptx": []}
    bad = tmp_path / "x.bin"
    bad.write_bytes(b"not an elf at all")
    with pytest.raises(fatbin.FatbinError):
        fatbin.read_entries(bad)


def test_corrupt_container_is_an_error():
    blob = bytearray((FIX / "k.fatbin").read_bytes())
    blob[0:4] = struct.pack("<I", 0xDEADBEEF)
    with pytest.raises(fatbin.FatbinError):
        fatbin.parse_fatbin(bytes(blob))


def test_cli_expect(capsys):
    assert fatbin.main([str(FIX / "sm70.o"), "--expect", "70"]) == 0
    assert fatbin.main([str(FIX / "sm70_80.o"), "--expect", "70"]) == 1
    assert "sass=[70, 80]" in capsys.readouterr().out


@pytest.mark.skipif(NVCC is None and not NEED_NVCC, reason="no CUDA <= 12 nvcc (CI installs Debian's toolkit)")
@pytest.mark.parametrize("gencode,expected", [
    (["-gencode", "arch=compute_70,code=sm_70"], {"sass": [70], "ptx": []}),
    (["-gencode", "arch=compute_70,code=sm_70", "-gencode", "arch=compute_80,code=sm_80"], {"sass": [70, 80], "ptx": []}),
    (["-gencode", "arch=compute_70,code=[sm_70,compute_70]"], {"sass": [70], "ptx": [70]}),
])
@pytest.mark.parametrize("kind", ["object", "shared"])
def test_freshly_compiled_matches_cuobjdump(tmp_path, gencode, expected, kind):
    assert NVCC, "KIT_REQUIRE_NVCC=1 but no CUDA <= 12 nvcc was found"
    out = tmp_path / ("k.o" if kind == "object" else "libk.so")
    flags = ["-c"] if kind == "object" else ["-shared", "-cudart", "shared"]
    subprocess.run([NVCC, *flags, "-Xcompiler", "-fPIC", *gencode, "-o", str(out), str(FIX / "k.cu")],
                   check=True, env={"PATH": TOOLKIT_PATH, "HOME": str(tmp_path)})
    assert cuobjdump(out) == expected
    assert fatbin.archs(out) == expected


@pytest.mark.skipif(NVCC is None and not NEED_NVCC, reason="no CUDA <= 12 nvcc (CI installs Debian's toolkit)")
@pytest.mark.parametrize("compress", [False, True])
def test_compressed_entries_are_read_without_decompressing(tmp_path, compress):
    """nvcc -Xfatbin=-compress-all is the oracle for the entry's compression flag; the arch needs no decompression."""
    assert NVCC, "KIT_REQUIRE_NVCC=1 but no CUDA <= 12 nvcc was found"
    out = tmp_path / "k.o"
    extra = ["-Xfatbin=-compress-all"] if compress else []
    subprocess.run([NVCC, "-c", "-gencode", "arch=compute_70,code=sm_70", *extra, "-o", str(out), str(FIX / "k.cu")],
                   check=True, env={"PATH": TOOLKIT_PATH, "HOME": str(tmp_path)})
    assert fatbin.read_entries(out) == [fatbin.Entry("sass", 70, compress)]
    assert cuobjdump(out) == {"sass": [70], "ptx": []}


def test_padding_between_containers_is_skipped():
    # fat containers in a .nv_fatbin section are aligned: zero words may sit between them
    one = (FIX / "k.fatbin").read_bytes()
    assert [e.arch for e in fatbin.parse_fatbin(one + b"\0" * 8 + one)] == [70, 70]
    assert [e.arch for e in fatbin.parse_fatbin(one + b"\0" * 4)] == [70]  # trailing padding too


@pytest.mark.parametrize("header,message", [
    (b"\x7fELF\x01\x01\x01" + b"\0" * 57, "only 64-bit little-endian ELF is supported"),   # ELFCLASS32
    (b"\x7fELF\x02\x02\x01" + b"\0" * 57, "only 64-bit little-endian ELF is supported"),   # ELFDATA2MSB
    (b"MZ\x90\0" + b"\0" * 60, "not an ELF file"),
])
def test_elf_files_the_reader_cannot_take_are_named(tmp_path, header, message):
    path = tmp_path / "lib.so"
    path.write_bytes(header)
    with pytest.raises(fatbin.FatbinError) as err:
        fatbin.read_entries(path)
    assert str(err.value) == message


def test_an_elf_without_section_headers_has_no_device_code(tmp_path):
    # e_shoff = 0 (stripped of section headers): nothing to find, not an error
    header = bytearray(b"\x7fELF\x02\x01\x01" + b"\0" * 57)
    path = tmp_path / "lib.so"
    path.write_bytes(bytes(header))
    assert fatbin.archs(path) == {"sass": [], "ptx": []}


def test_bad_magic_names_the_offset():
    blob = bytearray((FIX / "k.fatbin").read_bytes())
    blob[0:4] = struct.pack("<I", 0xDEADBEEF)
    with pytest.raises(fatbin.FatbinError, match=r"^bad fatbin magic 0xdeadbeef at offset 0$"):
        fatbin.parse_fatbin(bytes(blob))


def test_cli_counts_each_file_and_reads_a_list(capsys, tmp_path, monkeypatch):
    assert fatbin.main([str(FIX / "sm70_80.o"), "--expect", "80,70"]) == 0  # the order of the list does not matter
    assert fatbin.main([str(FIX / "sm70.o"), str(FIX / "sm70_80.o"), "--expect", "70,80"]) == 1
    err = capsys.readouterr().err
    assert err.count("expected real code for exactly [70, 80]") == 1  # only sm70.o differs
    # a file without device code is not a mismatch; --expect may come first
    assert fatbin.main(["--expect", "70", str(elf_without_device_code(tmp_path / "plain.o"))]) == 0
    assert fatbin.main(["--expect", "70", str(FIX / "sm70_80.o")]) == 1
    assert fatbin.main([str(FIX / "ptx70.o"), "--expect", "70"]) == 1  # PTX only: no real code


def test_the_module_reads_its_own_command_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["fatbin", str(FIX / "sm70.o"), "--expect", "70"])
    assert fatbin.main() == 0
    assert capsys.readouterr().out == f"{FIX / 'sm70.o'}: sass=[70] ptx=[]\n"


def test_the_compressed_flag_is_bit_0x2000_of_the_flags_word():
    blob = container(entry(2, 70, b"\1" * 8, header=0x30, flags=0x2000),  # the smallest header that has flags
                     entry(2, 75, b"\2" * 8, flags=0x0001),  # another bit: not compressed
                     entry(2, 80, flags=0))
    assert fatbin.parse_fatbin(blob) == [fatbin.Entry("sass", 70, True), fatbin.Entry("sass", 75, False),
                                         fatbin.Entry("sass", 80, False)]


def test_flags_are_read_from_the_entry_s_own_header():
    # a 0x20-byte header has no flags word: the payload bytes where it would be say nothing; nor do the bytes before
    # the header (the previous entry's payload, all ones)
    blob = container(entry(2, 70, b"\xff" * 0x40), entry(2, 80, b"\xff" * 0x40),
                     entry(1, 70, b"\0" * 8 + struct.pack("<Q", 0x2000), header=0x20))
    assert fatbin.parse_fatbin(blob) == [fatbin.Entry("sass", 70, False), fatbin.Entry("sass", 80, False),
                                         fatbin.Entry("ptx", 70, False)]


def test_an_entry_that_ends_exactly_at_the_container_s_end_is_read():
    assert fatbin.parse_fatbin(container(entry(2, 70, header=0x20))) == [fatbin.Entry("sass", 70, False)]
    assert fatbin.parse_fatbin(container(entry(2, 70), entry(1, 86, header=0x20))) == [
        fatbin.Entry("sass", 70, False), fatbin.Entry("ptx", 86, False)]


def test_sixteen_trailing_bytes_are_a_container_header_to_check():
    good = container(entry(2, 70))
    with pytest.raises(fatbin.FatbinError, match=f"^bad fatbin magic 0x00000001 at offset {len(good)}$"):
        fatbin.parse_fatbin(good + struct.pack("<IIQ", 1, 0, 0))
    assert len(struct.pack("<IIQ", 1, 0, 0)) == 16
    assert [e.arch for e in fatbin.parse_fatbin(good + b"\0" * 15)] == [70]  # under 16 bytes: padding, not a header


def test_a_zero_header_entry_ends_its_container_not_the_section():
    # what follows a zero-size entry header in one container is not read; the next container is
    stop = entry(2, 80, b"\3" * 16)
    stop = stop[:4] + struct.pack("<I", 0) + stop[8:]  # header size 0, kind and arch still set
    blob = container(entry(2, 70), stop) + container(entry(2, 86))
    assert [e.arch for e in fatbin.parse_fatbin(blob)] == [70, 86]


def test_section_headers_are_read_only_when_the_elf_says_it_has_them(tmp_path):
    fat = container(entry(2, 70))
    whole = elf(tmp_path / "a.so", [(b".nv_fatbin", 1, fat)])
    assert fatbin.archs(whole) == {"sass": [70], "ptx": []}
    # e_shoff = 0 with a count, and a table offset with e_shnum = 0: either way, no section table to read
    assert fatbin._sections(elf(tmp_path / "b.so", [(b".nv_fatbin", 1, fat)], shoff=0).read_bytes()) == {}
    assert fatbin._sections(elf(tmp_path / "c.so", [(b".nv_fatbin", 1, fat)], shnum=0).read_bytes()) == {}


def test_section_names_outside_ascii_and_sections_without_bytes(tmp_path):
    # a name byte outside ASCII does not stop the read; a SHT_NOBITS (8) section has no bytes in the file, even when
    # it is called .nv_fatbin and its offset points at a container
    fat = container(entry(2, 70))
    path = elf(tmp_path / "a.so", [(b".caf\xe9", 1, b"\0" * 4), (b".nv_fatbin", 8, fat)])
    sections = fatbin._sections(path.read_bytes())
    assert sections[".caf\ufffd"] == (64, 4) and ".nv_fatbin" not in sections
    assert fatbin.archs(path) == {"sass": [], "ptx": []}


def test_without_expect_every_file_passes(capsys):
    assert fatbin.main([str(FIX / "sm70_80.o"), str(FIX / "ptx70.o")]) == 0
    assert capsys.readouterr().err == ""
