"""The adapter to ``nvidia-smi``: the one place that runs it and parses its CSV, topology matrix and ``-q`` text.

Tests point PATH at a fake ``nvidia-smi`` that replays recorded outputs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

QUERY = ["index", "name", "memory.total", "compute_cap", "driver_version", "persistence_mode", "pcie.link.gen.max",
         "pcie.link.width.current", "pcie.link.width.max", "temperature.gpu", "clocks_throttle_reasons.active",
         "ecc.errors.uncorrected.volatile.total"]


class NoDriver(Exception):
    pass


@dataclass
class Gpu:
    index: int
    name: str
    memory_mib: int
    compute_cap: str
    driver: str
    persistence: bool
    pcie_gen_max: int | None
    pcie_width: int | None
    pcie_width_max: int | None
    temperature: int | None
    throttle: str
    ecc_uncorrected: int | None

    @property
    def arch(self) -> int:
        major, minor = self.compute_cap.split(".")
        return int(major) * 10 + int(minor)


def _run(args: list[str]) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise NoDriver("nvidia-smi is not on PATH")
    result = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise NoDriver((result.stdout + result.stderr).strip().splitlines()[-1] if (result.stdout + result.stderr).strip()
                       else f"nvidia-smi exited {result.returncode}")
    return result.stdout


def _int(value: str) -> int | None:
    value = value.strip()
    try:
        return int(float(value))
    except ValueError:
        return None  # [N/A], [Not Supported]


def gpus() -> list[Gpu]:
    text = _run([f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits"])
    out = []
    for line in text.strip().splitlines():
        f = [p.strip() for p in line.split(",")]
        if len(f) < len(QUERY):
            continue
        out.append(Gpu(int(f[0]), f[1], _int(f[2]) or 0, f[3], f[4], f[5].lower() == "enabled", _int(f[6]), _int(f[7]),
                       _int(f[8]), _int(f[9]), f[10], _int(f[11])))
    return out


def topology() -> dict[tuple[int, int], str]:
    """``{(0, 1): "NV6", ...}`` from ``nvidia-smi topo -m``."""
    text = _run(["topo", "-m"])
    lines = [l for l in text.splitlines() if l.strip()]
    header = lines[0].split()
    columns = [h for h in header if re.fullmatch(r"GPU\d+", h)]
    links: dict[tuple[int, int], str] = {}
    for line in lines[1:]:
        parts = line.split()
        if not parts or not re.fullmatch(r"GPU\d+", parts[0]):
            continue
        row = int(parts[0][3:])
        for col, value in zip(columns, parts[1:1 + len(columns)]):
            c = int(col[3:])
            if c != row:
                links[(row, c)] = value
    return links


def cuda_version() -> str | None:
    """The CUDA version the driver supports, from ``nvidia-smi -q``."""
    match = re.search(r"CUDA Version\s*:\s*([0-9.]+)", _run(["-q"]))
    return match.group(1) if match else None
