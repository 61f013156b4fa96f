"""The .nv_fatbin reader against real CUDA objects and against cuobjdump as the oracle."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
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


def test_file_without_device_code(tmp_path):
    assert fatbin.archs(Path(shutil.which("python3") or "/bin/sh").resolve()) == {"sass": [], "ptx": []}
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
