"""An engine image's name, and the CUDA version it is built with: decided from the config alone (no model needed),
so the Dockerfile, compose, the 1Panel app and `kit build` all name the same image."""

from __future__ import annotations

from kit import archs, catalog
from kit.config import StackConfig


def engine_cuda_version(config: StackConfig, name: str) -> str:
    """An engine may need its own toolkit (vLLM keeps sm_70 only below CUDA 12.8); the stack's otherwise."""
    return str(config.engine_settings(name).get("cuda") or config.cuda.version)


def image_tag(config: StackConfig, name: str) -> str:
    """``kit/llama-cpp:0c1e57098-cu12.9.1-sm70``; the cpu flavor is ``...-cpu``."""
    from kit import resolve

    engine = catalog.get(name)
    settings = config.engine_settings(name)
    gpu = resolve.gpu(config, name)
    ref = str(settings.get("ref") or engine.version).lstrip("v")
    if gpu:
        suffix = f"cu{engine_cuda_version(config, name)}-{archs.label(archs.configured(config))}"
    else:
        suffix = "cpu"
    return f"{config.build.registry}/{engine.slug}:{ref}-{suffix}"
