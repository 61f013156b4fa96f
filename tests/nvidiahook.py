"""A stand-in for ``nvidia-container-runtime-hook`` on a machine with no NVIDIA GPU, written from the real parts it
stands in for, so a GPU stack can be deployed here with its compose file exactly as users get it:

- dockerd registers its "nvidia" device driver only when this binary is on its PATH (moby ``daemon/nvidia_linux.go``,
  ``init``: ``exec.LookPath(nvidiaHook)``). A device request then appends ``NVIDIA_VISIBLE_DEVICES`` (the request's
  ``device_ids`` joined by ``,``) and ``NVIDIA_DRIVER_CAPABILITIES`` (the request's NVIDIA capabilities: compute,
  utility, video, ... but not ``gpu``) to the process environment and adds this binary as a ``prestart`` hook with
  args ``[nvidia-container-runtime-hook, prestart]`` (``setNvidiaGPUs``).
- The OCI runtime gives a hook the container state on stdin (runtime-spec ``runtime.md``, "State": ``id``,
  ``bundle``, ...); the hook reads ``<bundle>/config.json``.
- nvidia-container-toolkit reads the environment into a map where the last value wins (``internal/config/image``,
  ``WithEnv``) and decides the driver capabilities (``HookConfig.getDriverCapabilities``): unset on an image with
  ``CUDA_VERSION`` and no ``NVIDIA_REQUIRE_CUDA`` (a "legacy" image) means all; unset otherwise means the defaults
  ``utility,compute`` (``DefaultDriverCapabilities``); set means exactly those. It then mounts the driver's parts for
  them: ``libcuda.so.1`` for ``compute``, ``nvidia-smi`` and NVML for ``utility``.

This stand-in does the same decision and then, instead of bind-mounting a driver, writes marker files at the paths the
real libraries would take in the container's root filesystem, and appends what it decided to ``$KIT_NVIDIA_HOOK_LOG``
(one JSON line per container). An engine in the container can then check for ``libcuda.so.1`` as a CUDA program's
loader would.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ALL_CAPABILITIES = {"compute", "compat32", "graphics", "utility", "video", "display"}  # allNvidiaCaps
DEFAULT_CAPABILITIES = {"utility", "compute"}  # DefaultDriverCapabilities
# where Debian's and NVIDIA's own images find the driver's user-space parts
MOUNTS = {"compute": ["usr/lib/x86_64-linux-gnu/libcuda.so.1"],
          "utility": ["usr/bin/nvidia-smi", "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]}


def environment(spec: dict) -> dict[str, str]:
    """The process environment as the toolkit reads it: later entries override earlier ones."""
    env: dict[str, str] = {}
    for entry in (spec.get("process") or {}).get("env") or []:
        key, _, value = entry.partition("=")
        env[key] = value
    return env


def capabilities(env: dict[str, str]) -> set[str]:
    if "NVIDIA_DRIVER_CAPABILITIES" not in env:
        legacy = bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA")
        return set(ALL_CAPABILITIES) if legacy else set(DEFAULT_CAPABILITIES)
    value = env["NVIDIA_DRIVER_CAPABILITIES"]
    if not value:
        return set(DEFAULT_CAPABILITIES)
    asked = {c.strip() for c in value.split(",") if c.strip()}
    return set(ALL_CAPABILITIES) if "all" in asked else asked & ALL_CAPABILITIES


def main(argv: list[str]) -> int:
    if argv[1:2] != ["prestart"]:
        return 0  # the real hook's poststart/poststop do nothing either
    state = json.load(sys.stdin)
    bundle = Path(state["bundle"])
    spec = json.loads((bundle / "config.json").read_text())
    env = environment(spec)
    devices = env.get("NVIDIA_VISIBLE_DEVICES", "")
    caps = capabilities(env)
    root = Path(spec["root"]["path"])
    root = root if root.is_absolute() else bundle / root
    if devices and devices != "void":
        for cap in sorted(caps & set(MOUNTS)):
            for rel in MOUNTS[cap]:
                target = root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(f"stand-in for the NVIDIA driver's {rel} ({cap})\n")
    log = os.environ.get("KIT_NVIDIA_HOOK_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"id": state.get("id"), "devices": devices, "capabilities": sorted(caps)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
