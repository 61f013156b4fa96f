"""What an engine's container gets wherever it runs: compose, the 1Panel apps and Kubernetes read these, so the
three never disagree on the environment, the GPU request, the limits, the health check or the logs."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

import yaml

from kit import paths
from kit.config import StackConfig

if TYPE_CHECKING:
    from kit.resolve import ResolvedEngine


@lru_cache(maxsize=1)
def nccl_env_table() -> dict[str, Any]:
    return yaml.safe_load((paths.images_dir() / "interconnects.yaml").read_text(encoding="utf-8"))


def nccl_env(config: StackConfig) -> dict[str, str]:
    table = nccl_env_table()
    env = dict(table["common"])
    env.update(table["interconnects"][config.hardware.interconnect])
    return {k: str(v) for k, v in env.items()}


def logging_block() -> dict[str, Any]:
    return {"driver": "json-file", "options": {"max-size": "50m", "max-file": "3"}}


# Docker turns every NVIDIA capability of the request into NVIDIA_DRIVER_CAPABILITIES, appended after the image's own
# (moby daemon/nvidia_linux.go, setNvidiaGPUs), and the hook mounts exactly those driver parts (nvidia-container-toolkit
# HookConfig.getDriverCapabilities; the last value wins). "utility" alone mounts nvidia-smi but not libcuda.so.1, so
# the engine finds no CUDA driver: ask for compute too.
GPU_CAPABILITIES = ["gpu", "compute", "utility"]


def gpu_block(device_ids: list[str]) -> dict[str, Any]:
    return {"resources": {"reservations": {"devices": [
        {"driver": "nvidia", "device_ids": list(device_ids), "capabilities": list(GPU_CAPABILITIES)}]}}}


# pinned host memory for CUDA transfers and NCCL; CPU engines need neither
GPU_ULIMITS = {"memlock": -1, "stack": 67108864}


def engine_env(resolved: ResolvedEngine, api_key_ref: str | None) -> dict[str, str]:
    """An engine's environment: the resolved one (NCCL settings for GPU flavors, the catalog's env), then the API key
    as a reference (``${KIT_API_KEY}``, ``${API_KEY}``: each output keeps the key where it keeps secrets)."""
    env = dict(resolved.env)
    if api_key_ref and resolved.entry.serve.api_key_env:
        env[resolved.entry.serve.api_key_env] = api_key_ref
    return env


def healthcheck(resolved: ResolvedEngine) -> dict[str, Any]:
    """The engine's health command with a start period long enough to load the model."""
    return {"test": ["CMD", *resolved.entry.health_cmd], "interval": "15s", "timeout": "5s", "retries": 3,
            "start_period": f"{resolved.start_period_s}s"}
