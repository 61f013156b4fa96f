"""The NCCL probe and the build's NCCL check, exercised without Docker or a GPU.

`nccl-version.c` is compiled with gcc and run against stub `libnccl.so.2` files that export `ncclGetVersion` with a
chosen code (nccl.h's NCCL_VERSION_CODE: major*1000 + minor*100 + patch below 2.9, major*10000 + minor*100 + patch
from 2.9 on); `nccl-check.sh` runs with a stub `kit-nccl-version` on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, require

CONTEXT = ROOT / "templates" / "dockerfile" / "context"
GCC = shutil.which("gcc") or shutil.which("cc")


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    require("GCC", GCC is not None, "no C compiler (apt-get install gcc)")
    out = tmp_path_factory.mktemp("probe") / "kit-nccl-version"
    subprocess.run([GCC, "-O2", "-o", str(out), str(CONTEXT / "nccl-version.c"), "-ldl"], check=True)
    return out


def stub_nccl(folder: Path, code: int | None, result: int = 0) -> Path:
    """A libnccl.so.2 whose ncclGetVersion reports ``code`` (None: the symbol is missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "nccl.c"
    body = f"int ncclGetVersion(int *v) {{ *v = {code}; return {result}; }}\n" if code is not None else "int other(void) { return 0; }\n"
    src.write_text(body)
    lib = folder / "libnccl.so.2"
    subprocess.run([GCC, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


@pytest.mark.parametrize("code,expected", [
    (22703, "2.27.3"),   # 2 * 10000 + 27 * 100 + 3
    (23203, "2.32.3"),
    (2804, "2.8.4"),     # before 2.9: 2 * 1000 + 8 * 100 + 4
    (21901, "2.19.1"),
])
def test_probe_decodes_the_version_code(probe, tmp_path, code, expected):
    lib = stub_nccl(tmp_path / str(code), code)
    result = subprocess.run([str(probe), str(lib)], capture_output=True, text=True)
    assert (result.returncode, result.stdout.strip()) == (0, expected), result.stderr


def test_probe_resolves_libnccl_as_the_loader_does(probe, tmp_path):
    stub_nccl(tmp_path / "lib", 22703)
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path / "lib")}
    result = subprocess.run([str(probe)], capture_output=True, text=True, env=env)
    assert result.stdout.strip() == "2.27.3"


def test_probe_fails_without_nccl_or_its_symbol(probe, tmp_path):
    missing = subprocess.run([str(probe), str(tmp_path / "none.so")], capture_output=True, text=True)
    assert missing.returncode == 2 and "cannot load" in missing.stderr
    no_symbol = subprocess.run([str(probe), str(stub_nccl(tmp_path / "nosym", None))], capture_output=True, text=True)
    assert no_symbol.returncode == 3 and "ncclGetVersion failed" in no_symbol.stderr
    failing = subprocess.run([str(probe), str(stub_nccl(tmp_path / "err", 22703, result=1))], capture_output=True,
                             text=True)
    assert failing.returncode == 3


def check(tmp_path: Path, seen: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    """nccl-check.sh with a stub kit-nccl-version that prints ``seen`` (None: exits 2, as with no libnccl)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "kit-nccl-version"
    stub.write_text("#!/bin/sh\n" + (f"echo {seen}\n" if seen else "echo 'cannot load' >&2; exit 2\n"))
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(["sh", str(CONTEXT / "nccl-check.sh"), *args], capture_output=True, text=True, env=env)


def test_check_passes_on_the_pin(tmp_path):
    result = check(tmp_path, "2.27.3", "builder", "2.27.3")
    assert result.returncode == 0 and "NCCL 2.27.3 in the builder stage matches nccl.version 2.27.3" in result.stdout


def test_check_fails_on_another_version(tmp_path):
    result = check(tmp_path, "2.32.3", "runtime", "2.27.3")
    assert result.returncode == 1
    assert "the loader resolves NCCL 2.32.3 but nccl.version pins 2.27.3" in result.stderr


def test_check_fails_without_nccl(tmp_path):
    result = check(tmp_path, None, "runtime", "2.27.3")
    assert result.returncode == 1 and "libnccl.so.2 cannot be loaded" in result.stderr


def test_check_compares_the_runtime_with_what_the_builder_saw(tmp_path):
    builder = tmp_path / "nccl-builder.txt"
    builder.write_text("2.26.2\n")
    # runtime equals the pin, but the builder compiled against another NCCL: that is the seeds' 20 % trap
    result = check(tmp_path, "2.27.3", "runtime", "2.27.3", str(builder))
    assert result.returncode == 1
    assert "loads NCCL 2.27.3 but the builder compiled against NCCL 2.26.2" in result.stderr
    builder.write_text("2.27.3\n")
    assert check(tmp_path, "2.27.3", "runtime", "2.27.3", str(builder)).returncode == 0


def nccl_header(folder: Path, code: int) -> Path:
    """An include folder whose nccl.h has the version lines of NVIDIA's nccl.h (2.27.3 shown: NCCL_MAJOR 2,
    NCCL_MINOR 27, NCCL_PATCH 3, NCCL_VERSION_CODE 22703, then the NCCL_VERSION(X,Y,Z) macro)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nccl.h").write_text(
        "#ifndef NCCL_H_\n#define NCCL_H_\n\n#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 3\n"
        f'#define NCCL_SUFFIX ""\n\n#define NCCL_VERSION_CODE {code}\n'
        "#define NCCL_VERSION(X,Y,Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : "
        "(X) * 10000 + (Y) * 100 + (Z))\n")
    return folder


def linked(probe: Path, tmp_path: Path, include: str, library: str, pin: str = "2.27.3"):
    """nccl-linked.sh on a CMakeCache.txt as CMake writes find_path / find_library results."""
    cache = tmp_path / "CMakeCache.txt"
    cache.write_text("//Path to a file.\n"
                     f"NCCL_INCLUDE_DIR:PATH={include}\n\n"
                     "//Path to a library.\n"
                     f"NCCL_LIBRARY:FILEPATH={library}\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shutil.copy(probe, bin_dir / "kit-nccl-version")
    out = tmp_path / "nccl-linked.txt"
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    result = subprocess.run(["sh", str(CONTEXT / "nccl-linked.sh"), str(cache), pin, str(out)], capture_output=True,
                            text=True, env=env)
    return result, out


def test_linked_records_the_header_and_library_the_compile_used(probe, tmp_path):
    include = nccl_header(tmp_path / "include", 22703)
    lib = stub_nccl(tmp_path / "lib", 22703)
    result, out = linked(probe, tmp_path, str(include), str(lib))
    assert result.returncode == 0, result.stderr
    assert out.read_text() == f"header 2.27.3 {include}/nccl.h\nlibrary 2.27.3 {lib}\n"


@pytest.mark.parametrize("header_code,lib_code,said", [
    (22602, 22703, "compiled against nccl.h 2.26.2"),   # the devel image's own nccl.h found first
    (22703, 23203, "linked 2.32.3"),                    # a header from the pin, a library from elsewhere
    (2804, 22703, "compiled against nccl.h 2.8.4"),     # before 2.9: 2*1000 + 8*100 + 4
])
def test_linked_fails_the_build_when_the_compile_used_another_nccl(probe, tmp_path, header_code, lib_code, said):
    include = nccl_header(tmp_path / "include", header_code)
    lib = stub_nccl(tmp_path / "lib", lib_code)
    result, out = linked(probe, tmp_path, str(include), str(lib))
    assert result.returncode == 1 and said in result.stderr and "nccl.version pins 2.27.3" in result.stderr
    assert not out.exists()


def test_linked_fails_when_cmake_found_no_nccl(probe, tmp_path):
    # FindNCCL.cmake without NCCL_ROOT: find_path/find_library leave <VAR>-NOTFOUND and GGML_USE_NCCL is not set
    result, _ = linked(probe, tmp_path, "NCCL_INCLUDE_DIR-NOTFOUND", "NCCL_LIBRARY-NOTFOUND")
    assert result.returncode == 1 and "the build found no NCCL" in result.stderr


def torch_archs(tmp_path: Path, flags: str, *want: str) -> subprocess.CompletedProcess[str]:
    """torch-archs.py against a stand-in `torch` module: torch._C._cuda_getArchFlags() returns the space-separated
    list torch was built with (torch/cuda/__init__.py get_arch_list splits it)."""
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text(f'__version__ = "2.8.0+cu128"\nclass _C:\n    @staticmethod\n'
                                      f'    def _cuda_getArchFlags():\n        return {flags!r}\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake")}
    return subprocess.run([sys.executable, str(CONTEXT / "torch-archs.py"), *want], capture_output=True, text=True,
                          env=env)


def test_torch_archs_passes_when_torch_carries_the_arch(tmp_path):
    # torch 2.8.0's cu128 wheels: 7.0;7.5;8.0;8.6;9.0;10.0;12.0 (pytorch#160269)
    result = torch_archs(tmp_path, "sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120", "sm_70")
    assert result.returncode == 0 and result.stdout.startswith("kit: torch 2.8.0+cu128 carries sm_70 ("), result


def test_torch_archs_fails_when_volta_is_gone(tmp_path):
    # what a real torch 2.11.0+cu130 answered on the lent H200 host (2026-12-03):
    # torch._C._cuda_getArchFlags() == 'sm_75 sm_80 sm_86 sm_90 sm_100 sm_120'; the same script there said rc=1
    result = torch_archs(tmp_path, "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120", "sm_70")
    assert result.returncode == 1
    assert "was built for sm_75 sm_80 sm_86 sm_90 sm_100 sm_120, not sm_70" in result.stderr
    assert torch_archs(tmp_path, "", "sm_70").returncode == 1  # a CPU-only torch


# ---- kit verify's own probe: compiled once on this host (never the image's), or kit's ctypes script without a
# compiler; probe_nccl runs either one "in the image", here this host through testinfra's local backend

class _Here:
    """What probe_nccl needs of an Inspection, on this host: commands run here, copy_in leaves the file where it is."""

    def __init__(self) -> None:
        import testinfra

        self.host = testinfra.get_host("local://")

    def copy_in(self, source: Path, folder: str = "/tmp") -> str:
        return str(source)


def test_verify_compiles_its_probe_once_into_the_users_cache(tmp_path, monkeypatch):
    from kit import verify

    require("GCC", GCC is not None, "no C compiler (apt-get install gcc)")
    monkeypatch.setattr(Path, "home", lambda: tmp_path)
    binary = verify.kit_probe()
    assert binary is not None and binary.parent == tmp_path / ".cache" / "kit" and binary.name.startswith("nccl-probe-")
    assert not binary.with_suffix(".tmp").exists()  # written beside, then renamed in
    lib = stub_nccl(tmp_path / "a", 22703)
    assert subprocess.run([str(binary), str(lib)], capture_output=True, text=True).stdout == "2.27.3\n"
    # the second call finds it: no compiler is asked again
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("compiled again"))
    assert verify.kit_probe() == binary


def test_verify_without_a_compiler_or_with_a_failing_one_has_no_probe(tmp_path, monkeypatch):
    from kit import verify

    monkeypatch.setattr(Path, "home", lambda: tmp_path)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert verify.kit_probe() is None
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setattr(shutil, "which", lambda name: str(broken) if name == "gcc" else None)
    assert verify.kit_probe() is None and not list((tmp_path / ".cache" / "kit").glob("nccl-probe-*"))


@pytest.mark.parametrize("code,expected", [(22703, "2.27.3"), (2804, "2.8.4")])  # by hand as above
def test_probe_nccl_with_kits_probe_and_with_its_ctypes_script(tmp_path, monkeypatch, code, expected):
    from kit import verify

    require("GCC", GCC is not None, "no C compiler (apt-get install gcc)")
    lib = str(stub_nccl(tmp_path / "lib", code))
    monkeypatch.setattr(Path, "home", lambda: tmp_path)
    assert verify.probe_nccl(_Here(), lib) == (expected, "kit's probe")
    monkeypatch.setattr(verify, "kit_probe", lambda: None)  # no compiler here: the image's python3, kit's script
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert verify.probe_nccl(_Here(), lib) == (expected, "kit's ctypes script")


def test_probe_nccl_reports_a_library_that_does_not_load(tmp_path, monkeypatch):
    from kit import verify

    monkeypatch.setattr(verify, "kit_probe", lambda: None)
    with pytest.raises(RuntimeError) as err:
        verify.probe_nccl(_Here(), str(tmp_path / "missing.so"))
    assert "missing.so" in str(err.value)
