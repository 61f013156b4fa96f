"""Decide everything an engine's Dockerfile needs, as plain values for its template.

Decisions (base images, NCCL package names, arch spellings, cmake flags, job count) are made here once; the
templates in ``templates/dockerfile/`` only lay them out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kit import __version__, archs, catalog, cudasource, serving
from kit.imagetag import engine_cuda_version
from kit.config import StackConfig
from kit.errors import KitError
from kit.versions import major_minor

# CUDA pieces from PyPI (cuda.source: wheels). The 12.x nvcc wheel has ptxas, nvvm and headers but no `nvcc`
# driver; the compile stage says so instead of failing obscurely.
CUDA_BUILDER_WHEELS = ["nvidia-cuda-nvcc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12", "nvidia-cuda-cccl-cu12"]
CUDA_RUNTIME_WHEELS = ["nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12"]
DEBIAN_BASE = "debian:bookworm-slim"
PIP_PACKAGES = ["python3", "python3-pip"]
USER = {"name": "kit", "uid": 10001, "home": "/home/kit"}


def base_images(config: StackConfig, name: str, gpu: bool) -> dict[str, str]:
    cuda = engine_cuda_version(config, name)
    if gpu and config.cuda.source == "image":
        defaults = {
            "builder": f"nvidia/cuda:{cuda}-devel-{config.cuda.os}",
            "runtime": f"nvidia/cuda:{cuda}-runtime-{config.cuda.os}",
        }
    elif gpu and config.cuda.source == "debian":  # the Debian release that packages this toolkit
        suite = _debian_toolkit(cuda)["suite"]
        defaults = {"builder": f"debian:{suite}-slim", "runtime": f"debian:{suite}-slim"}
    else:
        defaults = {"builder": DEBIAN_BASE, "runtime": DEBIAN_BASE}
    out = {}
    for stage, default in defaults.items():
        chosen = getattr(config.base, stage) or default
        out[stage] = chosen if getattr(config.base, stage) else config.mirrors.registry + chosen
    return out


def _debian_toolkit(cuda: str) -> dict[str, Any]:
    toolkit = cudasource.debian_toolkit(cuda)
    if toolkit is None:  # the rules say so first; a direct caller gets the same line
        raise KitError("cuda.version", *cudasource.unknown_debian_version(cuda))
    return toolkit


def nccl_facts(config: StackConfig, name: str) -> dict[str, Any]:
    cuda = engine_cuda_version(config, name)
    root = "/opt/kit/nccl/nvidia/nccl"
    apt = config.nccl.source == "apt"
    return {
        "version": config.nccl.version,
        "source": config.nccl.source,
        "apt_version": f"{config.nccl.version}-1+cuda{major_minor(cuda)}",
        "pip_requirement": f"nvidia-nccl-cu12=={config.nccl.version}",
        "pip_root": root,
        "pip_lib": f"{root}/lib",
        "so_path": "/usr/lib/x86_64-linux-gnu/libnccl.so.2" if apt else f"{root}/lib/libnccl.so.2",
    }


def _new(have: list[str], wanted: list[str]) -> list[str]:
    """``wanted`` less what ``have`` already lists, in order, once each."""
    out: list[str] = []
    for package in wanted:
        if package not in have and package not in out:
            out.append(package)
    return out


def context(config: StackConfig, name: str, ca_bundle: bool) -> dict[str, Any]:
    engine = catalog.get(name)
    settings = config.engine_settings(name)
    flavor_name = serving.flavor(config, name)
    flavor = engine.flavors[flavor_name]
    gpu = flavor.gpu
    arch_list = archs.configured(config) if gpu else []
    wheels = gpu and config.cuda.source == "wheels"
    pip_nccl = gpu and config.nccl.source == "pip"
    cuda_version = engine_cuda_version(config, name)
    debian_cuda = _debian_toolkit(cuda_version) if gpu and config.cuda.source == "debian" else None
    cuda_pin = f"=={major_minor(cuda_version)}.*"
    nccl = nccl_facts(config, name) if gpu else None
    ref = str(settings.get("ref") or engine.source.ref or engine.version)

    # "{ref}" in a catalog value is the pinned ref (llama.cpp's LLAMA_BUILD_COMMIT: a source tree without .git
    # would otherwise report "commit unknown" in --version)
    cmake_flags: dict[str, str] = {k: v.replace("{ref}", ref) for k, v in engine.build.cmake.items()}
    cmake_flags.update(flavor.cmake)
    gpu_flags: dict[str, str] = {}
    if gpu:
        gpu_flags["CMAKE_CUDA_ARCHITECTURES"] = f'"{archs.cmake(arch_list)}"'
        if nccl and nccl["source"] == "pip":
            gpu_flags["NCCL_ROOT"] = nccl["pip_root"]
        if debian_cuda:
            gpu_flags["CMAKE_CUDA_HOST_COMPILER"] = debian_cuda["host_compiler"]
    backend = None
    if flavor.backend and gpu:
        # the GPU backend compiles in its own build folder with the core's flags plus its own; only its module is
        # kept, so the core (compiled without CUDA) stays identical to every other flavor's
        backend_flags = {**cmake_flags, **flavor.backend.cmake, **gpu_flags}
        backend = {"target": flavor.backend.target, "files": flavor.backend.files,
                   "cmake_flags": sorted(backend_flags.items())}
    else:
        cmake_flags.update(gpu_flags)

    debian_builder = debian_cuda["builder_packages"] if debian_cuda and engine.build.compiles_cuda else []
    pip = PIP_PACKAGES if wheels or pip_nccl or engine.recipe != "cmake" else []
    probe = ["build-essential"] if nccl else []  # compiles the kit-nccl-version probe
    build_packages = list(engine.build.packages)
    # cmake: the engine's build tools are shared by every flavor on one base, and CUDA, pip and NCCL are the GPU
    # toolchain stage's; the other recipes have one toolchain stage that holds everything
    toolchain_packages = _new(build_packages, debian_builder + pip + probe)
    if engine.recipe != "cmake":
        build_packages += toolchain_packages
        toolchain_packages = []
    runtime_packages = list(engine.runtime.packages) + (debian_cuda["runtime_packages"] if debian_cuda else [])
    if wheels or pip_nccl:
        runtime_packages += _new(runtime_packages, PIP_PACKAGES)

    manifest = {
        "engine": engine.name,
        "ref": ref,
        "flavor": flavor_name,
        "recipe": engine.recipe,
        "archs": arch_list,
        "cuda": cuda_version if gpu else None,
        "cuda_source": config.cuda.source if gpu else None,
        "nccl_pin": nccl["version"] if nccl else None,
        "nccl_source": nccl["source"] if nccl else None,
        "nccl_builder": "@NCCL_BUILDER@" if nccl else None,
        "build_flags": {k: v.strip('"') for k, v in sorted(cmake_flags.items())},
        "backend": {"target": backend["target"], "files": backend["files"],
                    "build_flags": {k: v.strip('"') for k, v in backend["cmake_flags"]}} if backend else None,
        "torch_cuda_arch_list": archs.torch(arch_list) if gpu and engine.recipe == "torch-source" else None,
        "entrypoint": engine.entrypoint,
        "prefix": engine.runtime.prefix,  # where the engine's code lives: kit verify scans all of it
        "kit_version": __version__,
    }
    labels = {
        "org.opencontainers.image.title": f"kit {engine.name}",
        "org.opencontainers.image.version": ref,
        "org.opencontainers.image.source": engine.source.git or engine.homepage or "local",
        "io.kit.engine": engine.name,
        "io.kit.flavor": flavor_name,
        "io.kit.archs": ",".join(str(a) for a in arch_list),
        "io.kit.cuda": cuda_version if gpu else "none",
        "io.kit.nccl": nccl["version"] if nccl else "none",
    }
    return {
        "kit_version": __version__,
        "engine": {"name": engine.name, "ref": ref, "recipe": engine.recipe},
        "flavor": flavor_name,
        "gpu": gpu,
        "images": base_images(config, name, gpu),
        "cuda": {
            "version": cuda_version,
            "source": config.cuda.source,
            "builder_wheels": [w + cuda_pin for w in CUDA_BUILDER_WHEELS] if wheels else [],
            "runtime_wheels": [w + cuda_pin for w in CUDA_RUNTIME_WHEELS] if wheels else [],
        },
        "nccl": nccl,
        "archs": {"list": arch_list, "cmake": archs.cmake(arch_list), "torch": archs.torch(arch_list),
                  "sm": [f"sm_{a}" for a in arch_list]},  # how torch._C._cuda_getArchFlags() names them
        "jobs": config.build_jobs(),
        "cmake_flags": sorted(cmake_flags.items()),
        "backend": backend,
        "targets": engine.build.targets,
        "binaries": engine.runtime.binaries,
        "libraries": engine.runtime.libraries,  # shell patterns of the shared libraries the runtime stage keeps
        "prefix": engine.runtime.prefix,
        "build_packages": build_packages,
        "toolchain_packages": toolchain_packages,
        "runtime_packages": runtime_packages,
        "mirrors": {"apt": config.mirrors.apt, "pip_index": config.mirrors.pip_index, "ca_bundle": ca_bundle},
        "debian_nonfree": bool(debian_cuda),
        "torch": {
            "version": settings.get("torch", ""),
            "variant": settings.get("torch_variant", ""),
            "index": f"{engine.build.torch_index}/{settings.get('torch_variant', '')}",
        },
        "requirement": settings.get("requirement", ""),
        "entrypoint": engine.entrypoint,
        "port": engine.port,
        "health": {"cmd": engine.health_cmd, "start_period": serving.start_period_s(config)},
        "user": USER,
        "labels": labels,
        "manifest": manifest,
    }


def render_files(config: StackConfig, name: str) -> dict[str, str | Path]:
    """Relative path -> text (or a host file to copy) for ``images/<engine>/``."""
    from kit import paths, templating

    engine = catalog.get(name)
    ca = config.mirrors.ca_bundle
    ctx = context(config, name, ca_bundle=bool(ca))
    files: dict[str, str | Path] = {
        "Dockerfile": templating.render(f"dockerfile/{engine.recipe}.Dockerfile.j2", ctx),
        "kit/manifest.json": json.dumps(ctx["manifest"], indent=2) + "\n",
    }
    if ctx["gpu"]:
        linked = ["nccl-linked.sh"] if engine.recipe == "cmake" and ctx["nccl"] else []  # reads CMake's cache
        torch = ["torch-archs.py"] if engine.recipe == "torch-source" else []  # checks torch before the compile
        for helper in ["nccl-version.c", "nccl-check.sh", *linked, *torch]:
            files[f"kit/{helper}"] = (paths.templates_dir() / "dockerfile" / "context" / helper).read_text()
    if ca:
        files["kit/ca.crt"] = Path(ca)
    return files
