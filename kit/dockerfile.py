"""Decide everything an engine's Dockerfile needs, as plain values for its template.

Decisions (base images, NCCL package names, arch spellings, cmake flags, job count) are made here once; the
templates in ``templates/dockerfile/`` only lay them out.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from kit import __version__, archs, cudasource, resolve
from kit.config import StackConfig
from kit.errors import KitError
from kit.versions import major_minor

DEBIAN_BASE = "debian:bookworm-slim"
PIP_PACKAGES = ["python3", "python3-pip"]
USER = {"name": "kit", "uid": 10001, "home": "/home/kit"}
PYPI = "pypi"  # torch_variant: the pip index's own torch wheels
DEPS_DIR = "/opt/kit/deps"  # local folders for what an engine's build would fetch (build.fetches)


def base_images(config: StackConfig, cuda: str, gpu: bool) -> dict[str, str]:
    """The builder and runtime images for a toolkit version: NVIDIA's, Debian's release that packages it, or plain
    Debian for a CPU build; ``base.builder``/``base.runtime`` override, the registry mirror prefixes the defaults."""
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


def nccl_values(config: StackConfig, cuda: str) -> dict[str, Any]:
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


class Recipe:
    """One engine's Dockerfile for one stack, after repo2docker's BuildPack: each hook decides one part once (cached),
    ``template_values()`` gathers them for the template ``templates/dockerfile/<name>.Dockerfile.j2`` and ``files()`` is
    the build folder. A recipe differs from another only in the hooks it overrides; adding one is a subclass and a
    template."""

    name = ""
    # the recipe compiles against pip-installed Python packages (pip in its toolchain, whatever the CUDA source)
    needs_pip = True
    # what the build folder holds of the engine (kit.build.SOURCES): its source tree at src/, or its wheels at wheels/
    source = "tree"

    def __init__(self, config: StackConfig, image: resolve.ResolvedImage, ca_bundle: bool) -> None:
        self.config = config
        self.image = image
        self.engine = image.entry
        self.settings = image.settings
        self.flavor_name = image.flavor
        self.flavor = self.engine.flavors[self.flavor_name]
        self.gpu = self.flavor.gpu
        self.ca_bundle = ca_bundle

    # ---- hooks: each decides one thing

    @cached_property
    def archs(self) -> list[int]:
        return archs.configured(self.config) if self.gpu else []

    @cached_property
    def cuda_version(self) -> str:
        return self.image.cuda_version

    @cached_property
    def debian_cuda(self) -> dict[str, Any] | None:
        """The Debian toolkit's packages and host compiler (cuda.source: debian)."""
        return _debian_toolkit(self.cuda_version) if self.gpu and self.config.cuda.source == "debian" else None

    @cached_property
    def ref(self) -> str:
        return str(self.settings.get("ref") or self.engine.source.ref or self.engine.version)

    @cached_property
    def bases(self) -> dict[str, str]:
        return base_images(self.config, self.cuda_version, self.gpu)

    @cached_property
    def nccl(self) -> dict[str, Any] | None:
        return nccl_values(self.config, self.cuda_version) if self.gpu else None

    @cached_property
    def cuda(self) -> dict[str, Any]:
        wheels = self.gpu and self.config.cuda.source == "wheels"
        return {"version": self.cuda_version, "source": self.config.cuda.source,
                "builder_wheels": cudasource.cuda_wheels("builder", self.cuda_version) if wheels else [],
                "runtime_wheels": cudasource.cuda_wheels("runtime", self.cuda_version) if wheels else []}

    @cached_property
    def gpu_flags(self) -> dict[str, str]:
        """The build flags a GPU flavor adds: the archs, where NCCL is, the CUDA host compiler."""
        flags: dict[str, str] = {}
        if self.gpu:
            flags["CMAKE_CUDA_ARCHITECTURES"] = f'"{archs.cmake(self.archs)}"'
            if self.nccl and self.nccl["source"] == "pip":
                flags["NCCL_ROOT"] = self.nccl["pip_root"]
            if self.debian_cuda:
                flags["CMAKE_CUDA_HOST_COMPILER"] = self.debian_cuda["host_compiler"]
        return flags

    @cached_property
    def flavor_flags(self) -> dict[str, str]:
        """The engine's build flags with the flavor's over them. "{ref}" in a catalog value is the pinned ref
        (llama.cpp's LLAMA_BUILD_COMMIT: a source tree without .git would otherwise report "commit unknown")."""
        flags = {k: v.replace("{ref}", self.ref) for k, v in self.engine.build.cmake.items()}
        flags.update(self.flavor.cmake)
        return flags

    @cached_property
    def build_flags(self) -> dict[str, str]:
        """The core's flags: the flavor's, and the GPU's too unless a backend stage compiles the GPU code apart."""
        return self.flavor_flags if self.backend else {**self.flavor_flags, **self.gpu_flags}

    @cached_property
    def backend(self) -> dict[str, Any] | None:
        """A GPU backend compiled in its own build folder with the core's flags plus its own; only its module is
        kept, so the core (compiled without CUDA) stays identical to every other flavor's."""
        if not (self.flavor.backend and self.gpu):
            return None
        flags = {**self.flavor_flags, **self.flavor.backend.cmake, **self.gpu_flags}
        return {"target": self.flavor.backend.target, "files": self.flavor.backend.files,
                "cmake_flags": sorted(flags.items())}

    def packages(self) -> dict[str, list[str]]:
        """apt packages per stage: the engine's build tools (stage compilers), the GPU toolchain (CUDA, pip, the NCCL
        probe's compiler), what only this engine's compile needs after them, and the runtime's. The first two are
        the shared stages of templates/dockerfile/_toolchain.j2: one set of layers for every engine on a base."""
        build, toolchain = self._build_and_toolchain()
        extra = _new(build + toolchain, list(self.engine.build.extra_packages))
        return {"build_packages": build, "toolchain_packages": toolchain, "extra_packages": extra,
                "runtime_packages": self._runtime_packages()}

    def _build_and_toolchain(self) -> tuple[list[str], list[str]]:
        wheels = self.gpu and self.config.cuda.source == "wheels"
        pip_nccl = self.gpu and self.config.nccl.source == "pip"
        debian = self.debian_cuda["builder_packages"] if self.debian_cuda and self.engine.build.compiles_cuda else []
        pip = PIP_PACKAGES if wheels or pip_nccl or self.needs_pip else []
        probe = ["build-essential"] if self.nccl else []  # compiles the kit-nccl-version probe
        build = list(self.engine.build.packages)
        return build, _new(build, debian + pip + probe)

    def _runtime_packages(self) -> list[str]:
        runtime = list(self.engine.runtime.packages) + (self.debian_cuda["runtime_packages"] if self.debian_cuda else [])
        if self.gpu and (self.config.cuda.source == "wheels" or self.config.nccl.source == "pip"):
            runtime += _new(runtime, PIP_PACKAGES)
        return runtime

    def torch(self) -> dict[str, str]:
        """The torch wheel a torch-source build compiles against: its version, variant and index. Variant ``pypi``
        is the pip index itself (mirrors.pip_index, else PyPI), whose default torch wheels carry their own CUDA."""
        variant = str(self.settings.get("torch_variant", ""))
        index = "" if variant in ("", PYPI) else f"{self.engine.build.torch_index}/{variant}"
        return {"version": str(self.settings.get("torch", "")), "variant": variant, "index": index}

    def fetched_sources(self) -> list[dict[str, Any]]:
        """What the engine's build would fetch from GitHub that it gets as a folder instead: kit's stand-in when every
        configured arch is below the source's ``min_arch`` (none of its kernels could run, and its build would compile
        them all the same), else the stack's own folder (engines.<name>.local_sources). Each lands in
        /opt/kit/deps/<name>, and the variable the build reads points there."""
        given = dict(self.settings.get("local_sources") or {})
        fetches = self.engine.build.fetches
        unknown = sorted(set(given) - set(fetches))
        if unknown:
            raise KitError(f"engines.{self.engine.name}.local_sources.{unknown[0]}",
                           "is not a source this engine's build fetches", f"use one of {', '.join(fetches)}")
        sources: list[dict[str, Any]] = []
        for name, fetch in fetches.items():
            item = {"name": name, "env": fetch.env, "path": f"{DEPS_DIR}/{name}", "git": fetch.git, "ref": fetch.ref,
                    "stand_in": 0}
            if self.archs and max(self.archs) < fetch.min_arch:
                sources.append({**item, "folder": f"kit/stand-ins/{name}/", "stand_in": fetch.min_arch})
            elif name in given:
                sources.append({**item, "folder": f"deps/{name}/", "host": str(given[name])})
        return sources

    def local_sources(self) -> list[dict[str, Any]]:
        """The stack's own folders among the fetched sources: ``kit build`` copies each into the build folder."""
        return [s for s in self.fetched_sources() if "host" in s]

    def helpers(self) -> list[str]:
        """Files of templates/dockerfile/context/ the build uses: the NCCL probe and check for a GPU flavor."""
        return ["nccl-version.c", "nccl-check.sh"] if self.gpu else []

    def manifest(self) -> dict[str, Any]:
        """/opt/kit/manifest.json: what was built, read by kit verify."""
        nccl, backend = self.nccl, self.backend
        return {
            "engine": self.engine.name,
            "ref": self.ref,
            "flavor": self.flavor_name,
            "recipe": self.name,
            "archs": self.archs,
            "cuda": self.cuda_version if self.gpu else None,
            "cuda_source": self.config.cuda.source if self.gpu else None,
            "nccl_pin": nccl["version"] if nccl else None,
            "nccl_source": nccl["source"] if nccl else None,
            "nccl_builder": "@NCCL_BUILDER@" if nccl else None,
            "build_flags": {k: v.strip('"') for k, v in sorted(self.build_flags.items())},
            "backend": {"target": backend["target"], "files": backend["files"],
                        "build_flags": {k: v.strip('"') for k, v in backend["cmake_flags"]}} if backend else None,
            "torch_cuda_arch_list": None,
            "entrypoint": self.engine.entrypoint,
            "prefix": self.engine.runtime.prefix,  # where the engine's code lives: kit verify scans all of it
            "package": self.engine.runtime.package or None,  # a Python engine's package in that prefix
            "kit_version": __version__,
        }

    def labels(self) -> dict[str, str]:
        return {
            "org.opencontainers.image.title": f"kit {self.engine.name}",
            "org.opencontainers.image.version": self.ref,
            "org.opencontainers.image.source": self.engine.source.git or self.engine.homepage or "local",
            "io.kit.engine": self.engine.name,
            "io.kit.flavor": self.flavor_name,
            "io.kit.archs": ",".join(str(a) for a in self.archs),
            "io.kit.cuda": self.cuda_version if self.gpu else "none",
            "io.kit.nccl": self.nccl["version"] if self.nccl else "none",
        }

    # ---- what the template and the build folder read

    def template_values(self) -> dict[str, Any]:
        engine, config, settings = self.engine, self.config, self.settings
        return {
            "kit_version": __version__,
            "engine": {"name": engine.name, "ref": self.ref},
            "flavor": self.flavor_name,
            "gpu": self.gpu,
            "images": self.bases,
            "cuda": self.cuda,
            "nccl": self.nccl,
            "archs": {"cmake": archs.cmake(self.archs), "torch": archs.torch(self.archs),
                      "sm": [f"sm_{a}" for a in self.archs]},  # how torch._C._cuda_getArchFlags() names them
            "jobs": config.build_jobs(),
            "cmake_flags": sorted(self.build_flags.items()),
            "backend": self.backend,
            "targets": engine.build.targets,
            "binaries": engine.runtime.binaries,
            "libraries": engine.runtime.libraries,  # shell patterns of the shared libraries the runtime stage keeps
            "prefix": engine.runtime.prefix,
            **self.packages(),
            "mirrors": {"apt": config.mirrors.apt, "pip_index": config.mirrors.pip_index, "ca_bundle": self.ca_bundle},
            "debian_nonfree": bool(self.debian_cuda),
            "torch": self.torch(),
            "fetched_sources": self.fetched_sources(),
            "requirement": settings.get("requirement", ""),
            "entrypoint": engine.entrypoint,
            "port": engine.port,
            "health": {"cmd": engine.health_cmd, "start_period": self.image.start_period_s},
            "user": USER,
            "labels": self.labels(),
            "manifest": self.manifest(),
        }

    def files(self) -> dict[str, str | Path]:
        """Relative path -> text (or a host file to copy) for ``images/<engine>/``."""
        from kit import paths, templating

        ctx = self.template_values()
        files: dict[str, str | Path] = {
            "Dockerfile": templating.render(f"dockerfile/{self.name}.Dockerfile.j2", ctx),
            "kit/manifest.json": json.dumps(ctx["manifest"], indent=2) + "\n",
        }
        context = paths.templates_dir() / "dockerfile" / "context"
        for helper in self.helpers():
            files[f"kit/{helper}"] = (context / helper).read_text()
        for source in ctx["fetched_sources"]:
            if source["stand_in"]:
                folder = context / "stand-ins" / source["name"]
                for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                    files[f"{source['folder']}{path.relative_to(folder).as_posix()}"] = path.read_text()
        if self.config.mirrors.ca_bundle:
            files["kit/ca.crt"] = Path(self.config.mirrors.ca_bundle)
        return files


class CmakeRecipe(Recipe):
    """A CMake project (llama.cpp): the core once per base, the GPU backend in its own stage."""

    name = "cmake"
    needs_pip = False

    def helpers(self) -> list[str]:
        # nccl-linked.sh reads CMake's cache for the NCCL the compile used
        return super().helpers() + (["nccl-linked.sh"] if self.nccl else [])


class TorchSourceRecipe(Recipe):
    """A PyTorch extension project compiled from source (vLLM) against torch from a wheel index."""

    name = "torch-source"

    def manifest(self) -> dict[str, Any]:
        return {**super().manifest(), "torch_cuda_arch_list": archs.torch(self.archs) if self.gpu else None}

    def helpers(self) -> list[str]:
        # torch-archs.py checks the installed torch carries the archs before the compile starts
        return super().helpers() + (["torch-archs.py"] if self.gpu else [])


class WheelRecipe(Recipe):
    """An engine installed from built wheels (NInfer): nothing compiled."""

    name = "wheel"
    source = "wheelhouse"

    def packages(self) -> dict[str, list[str]]:
        # nothing compiled: one builder stage installs the tools and the toolchain together
        stages = super().packages()
        merged = stages["build_packages"] + stages["toolchain_packages"] + stages["extra_packages"]
        return {**stages, "build_packages": merged, "toolchain_packages": [], "extra_packages": []}


RECIPES: dict[str, type[Recipe]] = {r.name: r for r in (CmakeRecipe, TorchSourceRecipe, WheelRecipe)}


def recipe(config: StackConfig, name: str, ca_bundle: bool) -> Recipe:
    """The recipe object for engine ``name`` of this stack (``images/<name>.yaml``'s ``recipe:``, which the catalog
    holds to the names of RECIPES)."""
    image = resolve.image(config, name)
    return RECIPES[image.entry.recipe](config, image, ca_bundle)


def template_values(config: StackConfig, name: str, ca_bundle: bool) -> dict[str, Any]:
    """The template variables of engine ``name``'s Dockerfile."""
    return recipe(config, name, ca_bundle).template_values()


def render_files(config: StackConfig, name: str) -> dict[str, str | Path]:
    """Relative path -> text (or a host file to copy) for ``images/<engine>/``."""
    return recipe(config, name, bool(config.mirrors.ca_bundle)).files()
