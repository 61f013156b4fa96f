"""The engine catalog: one record per ``images/<engine>.yaml``.

An engine is data: its source, flavors, build inputs, entrypoint, port, health path, supported ranges and how
config settings become serve flags. Adding a pip-installed server is a new YAML file with ``recipe: wheel``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kit import paths
from kit.errors import KitError
from kit.fuzzy import did_you_mean


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Backend(_Record):
    """A GPU backend compiled on its own and loaded by the engine at start (llama.cpp's GGML_BACKEND_DL modules), so
    the rest of the engine is built once for every flavor."""

    target: str  # the build target (ggml-cuda)
    files: list[str]  # what the target leaves in build/bin, copied beside the engine binary
    cmake: dict[str, str] = Field(default_factory=dict)  # added to the engine's build.cmake for this compile
    devices: str = ""  # the engine's name for the i-th GPU ("CUDA{i}"), for serve flags that name devices


class Flavor(_Record):
    gpu: bool
    cmake: dict[str, str] = Field(default_factory=dict)  # added to build.cmake for the core compile
    backend: Backend | None = None
    drops_flags: list[str] = Field(default_factory=list)  # serve flags a build of this flavor cannot take


class Source(_Record):
    git: str = ""
    ref: str = ""
    wheelhouse: bool = False


class FetchedSource(_Record):
    """A source tree the engine's own build downloads (CMake FetchContent) unless told a local folder."""

    env: str  # the variable the build reads for a local folder
    git: str
    ref: str
    # the lowest SM architecture this source has kernels for; a build for older GPUs only gets kit's stand-in
    # (templates/dockerfile/context/stand-ins/<name>/) instead: no download, and no compile of kernels it can't use
    min_arch: int = 0


class BuildInputs(_Record):
    # the compilers: every engine built on one base lists the same, so the CUDA toolchain layers after them are shared
    # (a cold CI run installs the toolkit once, not once per engine)
    packages: list[str] = Field(default_factory=list)
    # what only this engine's compile needs, installed after the toolchain (torch-source)
    extra_packages: list[str] = Field(default_factory=list)
    cmake: dict[str, str] = Field(default_factory=dict)
    targets: list[str] = Field(default_factory=list)
    torch_index: str = ""
    # the build runs nvcc (cuda.source: debian installs the toolkit for it); an engine installed from built wheels
    # does not, and its builder need not download a CUDA toolkit
    compiles_cuda: bool = True
    # sources the build fetches from GitHub itself; engines.<name>.local_sources can name a folder for each
    fetches: dict[str, FetchedSource] = Field(default_factory=dict)


class RuntimeInputs(_Record):
    packages: list[str] = Field(default_factory=list)
    binaries: list[str] = Field(default_factory=list)
    libraries: list[str] = Field(default_factory=list)
    prefix: str = "/app"
    # a Python engine's import package under the prefix's site-packages: its extension modules are the engine's
    # device code, which kit verify judges (torch's and the nvidia-* wheels' libraries are not the engine's build)
    package: str = ""


class QuantNeed(_Record):
    arch: int  # the lowest SM architecture the engine's kernels for this checkpoint format run on
    source: str


class Supports(_Record):
    dtypes: list[str] = Field(default_factory=list)
    model_formats: list[str] = Field(default_factory=list)
    cuda_max_for_arch: dict[int, str] = Field(default_factory=dict)
    # an HF checkpoint's quantization_config.quant_method -> what its kernels need (kit model list reads config.json)
    quant_methods: dict[str, QuantNeed] = Field(default_factory=dict)


class ModelDependent(_Record):
    """A setting whose right value depends on the model: ``auto`` is decided from its header (kit/resolve.py)."""

    needs_mtp: list[str] = Field(default_factory=list)  # values that need MTP layers in the model
    with_mtp: str  # auto, when the model has MTP layers
    without_mtp: str  # auto, when it has none (or the model is not on this machine)

    def for_model(self, mtp_layers: int) -> str:
        """What ``auto`` becomes for a model with ``mtp_layers`` MTP layers."""
        return self.with_mtp if mtp_layers > 0 else self.without_mtp


class PlanFacts(_Record):
    """How the engine's memory is laid out, for kit plan and kit doctor."""

    # layer-split: whole layers per GPU, each GPU its own KV (llama.cpp); tensor-parallel: every layer cut across
    # all GPUs, weights and a preallocated KV pool in gpu_memory_utilization (vLLM and engines like it)
    memory: Literal["layer-split", "tensor-parallel"]
    # split modes (the engine's split_mode setting) that move activations between GPUs on every token; a
    # tensor-parallel engine always does
    peer_split_modes: list[str] = Field(default_factory=list)
    compute: dict[str, dict[str, int] | int] = Field(default_factory=dict)  # fitted compute-buffer constants

    def peer_traffic(self, split_mode: str | None) -> bool:
        return self.memory == "tensor-parallel" or split_mode in self.peer_split_modes


class ServeArg(_Record):
    flag: str
    value: str | None = None
    when: str | None = None  # a context key that must be truthy for the flag to be given
    unless: str | None = None  # one that must be falsy (a default-on switch turned off: --no-enable-...)


class Serve(_Record):
    args: list[ServeArg]
    env: dict[str, str] = Field(default_factory=dict)
    api_key_env: str = ""


class TuneDim(_Record):
    """One setting kit tune may change: the values it tries, in order, and a serve-context key that must be truthy
    for the setting to mean anything (``speculative``, ``multi_gpu``)."""

    values: list[Any] = Field(min_length=1)
    when: str | None = None


class TuneConstraint(_Record):
    setting: str
    at_most: str  # another setting of the space (or of the engine) that caps this one


class TuneSpace(_Record):
    """``tune:`` in an engine's YAML (or a ``--space`` file): keys are engine settings, or ``section.field`` of the
    stack (``serve.concurrency``)."""

    space: dict[str, TuneDim] = Field(default_factory=dict)
    constraints: list[TuneConstraint] = Field(default_factory=list)

    @field_validator("space", mode="before")
    @classmethod
    def _lists_are_values(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: {"values": v} if isinstance(v, list) else v for k, v in value.items()}
        return value


class RpcWorker(_Record):
    """How a host lends its devices to another host's engine (llama.cpp's RPC backend, GGML_RPC): a server from the
    engine's own image that the primary reaches over TCP. It has no authentication."""

    entrypoint: list[str]  # the server binary
    args: list[str]  # after it, str.format over {port}
    port: int
    devices: str  # the primary's name for the i-th remote device, numbered over every worker in --rpc order


class PanelApp(_Record):
    """The engine's 1Panel app (``kit panel export``): what differs per engine; images/1panel.yaml holds the rest."""

    key: str  # the app's folder and key in the store
    logo_rgb: tuple[int, int, int] = (60, 60, 60)  # the generated logo's colour
    name: str
    document: str = ""
    description: dict[str, str]  # by language; zh and en at least (1Panel's short descriptions)

    @field_validator("description")
    @classmethod
    def _en_and_zh(cls, value: dict[str, str]) -> dict[str, str]:
        missing = [lang for lang in ("en", "zh") if lang not in value]
        if missing:
            raise ValueError(f"panel.description needs {' and '.join(missing)} (1Panel's short descriptions)")
        return value


class Engine(_Record):
    name: str
    recipe: Literal["cmake", "torch-source", "wheel"]  # kit.dockerfile.RECIPES: one class and one template each
    description: str
    homepage: str = ""
    version: str
    source: Source
    default_flavor: str
    flavors: dict[str, Flavor]
    build: BuildInputs = Field(default_factory=BuildInputs)
    runtime: RuntimeInputs = Field(default_factory=RuntimeInputs)
    entrypoint: list[str]
    version_cmd: list[str] = Field(default_factory=list)
    port: int
    health: str
    health_cmd: list[str]
    supports: Supports = Field(default_factory=Supports)
    settings: dict[str, Any] = Field(default_factory=dict)
    model_dependent: dict[str, ModelDependent] = Field(default_factory=dict)
    plan: PlanFacts
    serve: Serve
    tune: TuneSpace = Field(default_factory=TuneSpace)
    rpc: RpcWorker | None = None  # hosts can lend their GPUs to this engine (stack.rpc_workers)
    panel: PanelApp | None = None  # a 1Panel app for this engine

    @property
    def slug(self) -> str:
        """Name usable in image tags, folder names and compose service keys (``llama.cpp`` -> ``llama-cpp``)."""
        return self.name.replace(".", "-").replace("_", "-").lower()


@lru_cache(maxsize=4)
def _load(folder: str) -> dict[str, Engine]:
    engines: dict[str, Engine] = {}
    for path in sorted(Path(folder).glob("*.yaml")):
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or "recipe" not in raw:
            continue  # rules.yaml, presets.yaml and friends live here too
        try:
            engine = Engine.model_validate(raw)
        except ValidationError as exc:  # a broken catalog is our bug, but say where
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise KitError(f"{path.name}:{loc}", first["msg"], "fix the engine definition") from None
        engines[engine.name] = engine
    return engines


def all_engines(folder: Path | None = None) -> dict[str, Engine]:
    return _load(str(folder or paths.images_dir()))


def get(name: str, field: str = "stack.primary") -> Engine:
    engines = all_engines()
    if name not in engines:
        raise KitError(field, f"unknown engine {name!r}", did_you_mean(name, engines))
    return engines[name]
