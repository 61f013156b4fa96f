"""The stack config (``kit.yaml``) as a typed, validated model.

Every field has a default, and the defaults are the seeds' setup: 2 x V100-SXM2-16GB over NVLink, sm_70, CUDA
12.9.1, NCCL 2.27.3, llama.cpp serving a 27B IQ4_XS GGUF at 16K context with MTP draft 3. A preset
(``images/presets.yaml``) is a partial override of these defaults; a user file is a partial override of a preset.

Facts live once: the NCCL version is ``nccl.version`` and nothing else; both Dockerfile stages read it.
"""

from __future__ import annotations

import copy
import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from kit import catalog, paths
from kit.errors import KitError
from kit.fuzzy import did_you_mean
from kit.versions import is_version


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


def _version(value: Any) -> str:
    text = str(value).strip()
    if not is_version(text):
        raise ValueError(f"{text!r} is not a version; write it like 12.9.1")
    return text


class Stack(Section):
    name: str = Field("v100", description="Compose project name and prefix for containers.")
    primary: str = Field("llama.cpp", description="The engine that serves requests (a name from `kit engines`).")
    fallback: str | None = Field(
        None, description="A second engine that answers when the primary is down (may be a second copy of the primary)."
    )
    front_door: bool = Field(False, description="Put an nginx proxy in front: primary first, fallback as backup "
                             "(always there with several hosts: it balances over their engines).")
    rpc_workers: list[str] = Field(
        default_factory=list, description="Hosts (names in hosts:) whose devices join the primary's through "
        "rpc-server (llama.cpp RPC): one model across boxes. rpc-server has no authentication: keep that network "
        "private.")
    rpc_listen_all: bool = Field(
        False, description="Publish rpc-server on every interface of its host, not only its address: anyone who "
        "reaches the port can use its GPUs and memory.")


class Hardware(Section):
    gpu_model: str = Field("Tesla V100-SXM2-16GB", description="As nvidia-smi names it; `kit doctor` compares.")
    gpus: int = Field(2, ge=0, description="GPUs the engines use (0 = CPU only).")
    memory_gib: float = Field(16, gt=0, description="Memory of one GPU in GiB.")
    archs: list[int | str] = Field(
        default_factory=lambda: [70], description="SM architectures to compile for (70 = V100). Never 'native'."
    )
    interconnect: Literal["nvlink", "pcie", "none"] = Field("nvlink", description="How the GPUs talk (NCCL env).")
    device_ids: list[str] = Field(default_factory=lambda: ["0", "1"], description="GPU ids given to the containers.")

    @field_validator("device_ids", mode="before")
    @classmethod
    def _ids_as_str(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        for item in value:
            if isinstance(item, (dict, list)) or isinstance(item, bool):
                raise ValueError(f"{item!r} is not a GPU id; list ids like [\"0\", \"1\"]")
        return [str(v) for v in value]


class Cuda(Section):
    version: str = Field("12.9.1", description="CUDA toolkit; 12.9.1 is the newest that compiles sm_70.")
    source: Literal["image", "wheels", "debian"] = Field(
        "image", description="image: nvidia/cuda devel/runtime images; wheels: CUDA from PyPI on a plain Debian base; "
        "debian: Debian's non-free CUDA 11.8 toolkit (offline route to sm_70 binaries)."
    )
    os: str = Field("ubuntu22.04", description="OS suffix of the nvidia/cuda image tags.")

    _check_version = field_validator("version", mode="before")(classmethod(lambda cls, v: _version(v)))


class Nccl(Section):
    version: str = Field("2.27.3", description="THE NCCL version, installed and checked in builder and runtime.")
    source: Literal["apt", "pip"] = Field(
        "apt", description="apt: libnccl2 from NVIDIA's repo (nvidia/cuda images); pip: nvidia-nccl-cu12."
    )

    _check_version = field_validator("version", mode="before")(classmethod(lambda cls, v: _version(v)))


class Base(Section):
    builder: str = Field("", description="Builder base image; empty = chosen from cuda.source and the flavor.")
    runtime: str = Field("", description="Runtime base image; empty = chosen from cuda.source and the flavor.")


class Mirrors(Section):
    registry: str = Field("", description="Prefix for base image names, e.g. 'docker.m.daocloud.io/'.")
    apt: str = Field("", description="Debian/Ubuntu mirror URL replacing deb.debian.org / archive.ubuntu.com.")
    pip_index: str = Field("", description="pip index URL used inside builds.")
    ca_bundle: str = Field("", description="PEM bundle on this host trusted inside builds (apt, pip, git).")
    hf_endpoint: str = Field("", description="Hugging Face hub mirror for `kit model` (the HF_ENDPOINT convention), "
                             "e.g. https://hf-mirror.com; empty = HF_ENDPOINT from the environment, else the hub.")
    modelscope_endpoint: str = Field("", description="ModelScope endpoint for `kit model` (MODELSCOPE_ENDPOINT); "
                                     "empty = the client's default, https://modelscope.cn.")


class Build(Section):
    jobs: int | Literal["auto"] = Field("auto", description="Parallel compile jobs; auto = min(cpus, memory / per job).")
    cpus: int | Literal["auto"] = Field("auto", description="CPUs of the build host; auto = this machine.")
    memory_gib: float | Literal["auto"] = Field("auto", description="Memory of the build host; auto = this machine.")
    memory_per_job_gib: float = Field(4, gt=0, description="Peak memory of one nvcc job (seed 000: ~4 GB).")
    registry: str = Field("kit", description="Image name prefix: <registry>/<engine>:<tag>.")
    push: bool = Field(False, description="Push after building. Off: a missing registry account must not fail builds.")


class Model(Section):
    dir: str = Field("./models", description="Host folder with the model; mounted read-only at /models.")
    file: str = Field("Qwen3.8-27B-IQ4_XS.gguf", description="GGUF file or HF folder inside model.dir (a split "
                      "GGUF: its first part, NAME-00001-of-0000N.gguf).")
    source: str = Field("", description="Where `kit model` gets it: hf:ORG/REPO[@REV], modelscope:ORG/REPO[@REV], "
                        "or empty (the file is already in model.dir). Tokens come from the environment, never here.")
    name: str = Field("qwen3.8-27b", description="Name the API serves the model as.")
    format: Literal["gguf", "hf"] = Field("gguf", description="gguf for llama.cpp; hf (safetensors) for vLLM/NInfer.")
    size_gib: float = Field(15.0, gt=0, description="Weights size for the healthcheck start period while the model "
                            "is not on this machine; once it is, its files' size is used.")
    dtype: Literal["float16", "bfloat16", "float32"] = Field("float16", description="Volta has no bf16: float16.")
    ctx: int | Literal["auto"] = Field(
        16384, description="Longest single request in tokens (prompt + reply); every one of serve.concurrency "
        "requests gets this much. auto = the largest that kit plan fits."
    )


class Serve(Section):
    port: int = Field(8080, ge=1, le=65535, description="Host port of the endpoint.")
    expose: bool = Field(False, description="Bind on all interfaces; off = 127.0.0.1 only.")
    api_key: bool = Field(True, description="Generate an API key into .env (mode 0600).")
    concurrency: int = Field(
        4, ge=1, le=256, description="Requests served at once, each up to model.ctx tokens (llama.cpp --parallel "
        "slots, vLLM --max-num-seqs); the seeds' load is 4 users."
    )


class Host(Section):
    """One box with a Docker daemon. The first host runs the stack as configured, and the front door; every further
    host runs a replica of the primary that the front door balances onto."""

    name: str = Field(..., description="A short name (a-z, 0-9, -): status rows, out/hosts/<name>/.")
    docker: str = Field("", description="The host's Docker endpoint: ssh://user@host[:port] (your ssh config and "
                        "keys), tcp://host:2376 (with tls), unix:///path, or a Docker context name; empty = this "
                        "machine's (DOCKER_HOST, else the default socket).")
    address: str = Field("", description="The IP the front door reaches this host's engine on (its engine publishes "
                         "there, with the API key); empty = the IP of an ssh:// or tcp:// endpoint.")
    tls: str = Field("", description="Folder with ca.pem, cert.pem and key.pem for a tcp:// endpoint "
                     "(DOCKER_CERT_PATH).")
    hardware: Hardware | None = Field(None, description="This host's hardware where it differs from `hardware:` "
                                      "(gpus, device_ids, gpu_model, ...); archs must stay the stack's: one image.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,31}", value):
            raise ValueError(f"{value!r} is not a host name kit can use; write lower-case letters, digits and '-', "
                             "like box2")
        return value

    @field_validator("docker")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        scheme = value.partition("://")[0] if "://" in value else ""
        if scheme and scheme not in ENDPOINT_SCHEMES:
            raise ValueError(f"{value!r} is not a Docker endpoint; write ssh://user@host, tcp://host:2376, "
                             "unix:///path or a Docker context name")
        return value

    @field_validator("address")
    @classmethod
    def _ip(cls, value: str) -> str:
        if value:
            try:
                ip = ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(f"{value!r} is not an IP address; the engine publishes its port on it, so write "
                                 "the host's IP, e.g. 192.168.1.12") from None
            if ip.is_unspecified:
                raise ValueError(f"{value} is every interface, not an address anyone can dial; write the host's IP "
                                 "(stack.rpc_listen_all publishes rpc-server on every interface)")
        return value


ENDPOINT_SCHEMES = ("ssh", "tcp", "unix")


class StackConfig(Section):
    preset: str | None = Field(None, description="Preset this file starts from (`kit init --preset`).")
    stack: Stack = Field(default_factory=Stack)
    hardware: Hardware = Field(default_factory=Hardware)
    cuda: Cuda = Field(default_factory=Cuda)
    nccl: Nccl = Field(default_factory=Nccl)
    base: Base = Field(default_factory=Base)
    mirrors: Mirrors = Field(default_factory=Mirrors)
    build: Build = Field(default_factory=Build)
    model: Model = Field(default_factory=Model)
    serve: Serve = Field(default_factory=Serve)
    engines: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Per-engine settings over the catalog defaults (`kit engines`)."
    )
    hosts: list[Host] = Field(
        default_factory=list, description="The boxes the stack runs on; empty = this machine only. The first runs "
        "the stack and the front door, every further one a replica of the primary (`kit deploy` copies the images)."
    )
    # kit.resolve's per-engine results: a config is read once, so what it resolves to is computed once
    _resolved: dict[str, Any] = PrivateAttr(default_factory=dict)

    def resolution_cache(self) -> dict[str, Any]:
        return self._resolved

    # ----- derived facts, computed once here so templates and code never re-derive them -----
    def engine_names(self) -> list[str]:
        names = [self.stack.primary]
        if self.stack.fallback:
            names.append(self.stack.fallback)
        return names

    def engine_settings(self, name: str) -> dict[str, Any]:
        """Catalog defaults with this config's overrides on top."""
        merged = copy.deepcopy(catalog.get(name).settings)
        merged.update(copy.deepcopy(self.engines.get(name, {})))
        return merged

    def build_jobs(self) -> int:
        """Compile jobs bounded by memory: min(CPUs, memory / memory per job), at least 1 (seed 000 pit 2)."""
        if self.build.jobs != "auto":
            return int(self.build.jobs)
        cpus = (os.cpu_count() or 1) if self.build.cpus == "auto" else int(self.build.cpus)
        memory = _host_memory_gib() if self.build.memory_gib == "auto" else float(self.build.memory_gib)
        return max(1, min(cpus, int(memory // self.build.memory_per_job_gib)))


def _host_memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 8.0


# ------------------------------------------------------------------ loading


def presets() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load((paths.images_dir() / "presets.yaml").read_text(encoding="utf-8"))
    return data["presets"]


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def preset_data(name: str) -> dict[str, Any]:
    table = presets()
    if name not in table:
        raise KitError("preset", f"unknown preset {name!r}", did_you_mean(name, table))
    return copy.deepcopy(table[name]["config"])


def from_dict(raw: dict[str, Any], origin: str = "kit.yaml") -> StackConfig:
    if not isinstance(raw, dict):
        raise KitError("", f"{origin} must be a YAML mapping", "start from `kit init`")
    data = raw
    if raw.get("preset"):
        data = deep_merge(preset_data(str(raw["preset"])), raw)
    try:
        config = StackConfig.model_validate(data)
    except ValidationError as exc:
        raise _to_kit_error(exc) from None
    _check_engines(config)
    _check_hosts(config)
    return config


def load(path: str | Path | None) -> StackConfig:
    """Read ``kit.yaml``; no path means the defaults (the dual-V100 NVLink stack)."""
    if path is None:
        return from_dict({})
    file = Path(path)
    if not file.is_file():
        raise KitError("--config", f"{file} does not exist", "create one with `kit init -o kit.yaml`")
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise KitError("--config", f"{file} is not valid YAML{where}", "fix the indentation or quoting") from None
    if raw is None:
        raise KitError("--config", f"{file} is empty",
                       "start from `kit init -o kit.yaml`, or write at least one line such as `preset: dual-v100-nvlink`")
    return from_dict(raw, origin=str(file))


_UNION_TAGS = {"int", "float", "str", "bool", "list", "dict"}


def _to_kit_error(exc: ValidationError) -> KitError:
    err = exc.errors()[0]
    parts = [p for p in err["loc"] if str(p) not in _UNION_TAGS and "[" not in str(p)]
    loc = [str(p) for p in parts if not isinstance(p, int)]
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")
    if err["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1])
        valid = list(parent.model_fields) if parent else []
        return KitError(field, "unknown key", did_you_mean(loc[-1], valid))
    literal = [e for e in exc.errors() if e["type"] == "literal_error" and e["loc"][: len(err["loc"]) - 1] == err["loc"][:-1]]
    if literal:
        expected = literal[0]["ctx"]["expected"]
        numeric = err["type"] in ("int_parsing", "float_parsing", "int_type", "float_type", "int_from_float")
        fix = f"use a number or {expected}" if numeric else f"use one of {expected}"
        return KitError(field, f"{literal[0].get('input')!r} is not allowed", fix)
    message = str(err["msg"]).removeprefix("Value error, ")
    if "; " in message:
        problem, fix = message.split("; ", 1)
        return KitError(field, problem, fix)
    return KitError(field, message, "see `kit init` for the expected form")


def _model_at(loc: list[str]) -> type[BaseModel] | None:
    model: type[BaseModel] = StackConfig
    for part in loc:
        field = model.model_fields.get(part)
        inner = _section_of(field.annotation) if field else None
        if inner is None:
            return None
        model = inner
    return model


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The section a field holds: ``Hardware``, or the item of ``list[Host]``, or the ``Hardware`` of
    ``Hardware | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    found = [a for a in getattr(annotation, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)]
    return found[0] if len(found) == 1 else None


def _check_engines(config: StackConfig) -> None:
    """Engine names and their settings are checked against the catalog: names, keys and value types."""
    known = catalog.all_engines()
    for field, name in (("stack.primary", config.stack.primary), ("stack.fallback", config.stack.fallback)):
        if name is not None and name not in known:
            raise KitError(field, f"unknown engine {name!r}", did_you_mean(name, known))
    for name, overrides in config.engines.items():
        if name not in known:
            raise KitError(f"engines.{name}", "unknown engine", did_you_mean(name, known))
        defaults = known[name].settings
        for key, value in list(overrides.items()):
            if key not in defaults:
                raise KitError(f"engines.{name}.{key}", "unknown key", did_you_mean(key, defaults))
            if isinstance(value, bool) and defaults[key] in SWITCHES:
                # YAML reads an unquoted on/off as a boolean: for an on/off/auto setting it means on/off
                overrides[key] = value = "on" if value else "off"
            _check_type(f"engines.{name}.{key}", value, defaults[key])


def _check_hosts(config: StackConfig) -> None:
    """Hosts by name once; every replica reachable at an IP; one image for all (the same archs)."""
    seen: set[str] = set()
    if config.hosts and config.hosts[0].docker:
        raise KitError("hosts[0].docker", "the first host is this machine: it runs the front door, and kit checks "
                       "its model, ports and images here", "list this machine first, with no docker endpoint")
    if config.hosts and config.hosts[0].hardware:
        raise KitError("hosts[0].hardware", "the first host is this machine, whose hardware is `hardware:`",
                       "move these values to hardware:")
    for i, host in enumerate(config.hosts):
        if host.name in seen:
            raise KitError(f"hosts[{i}].name", f"{host.name!r} is named twice", "give every host its own name")
        seen.add(host.name)
        if i and not replica_address(host):
            raise KitError(f"hosts[{i}].address", f"the front door cannot tell where {host.name}'s engine is",
                           "write the host's IP, e.g. address: 192.168.1.12")
        if host.hardware and "archs" in host.hardware.model_fields_set \
                and host.hardware.archs != config.hardware.archs:
            raise KitError(f"hosts[{i}].hardware.archs", "every host runs the same image",
                           f"list every host's arch in hardware.archs (now {config.hardware.archs}) and drop this one")
        if host.tls and not host.docker.startswith("tcp://"):
            raise KitError(f"hosts[{i}].tls", "TLS material is for a tcp:// endpoint",
                           "drop tls, or write docker: tcp://HOST:2376")
    _check_rpc_workers(config)


def _check_rpc_workers(config: StackConfig) -> None:
    """Workers are further hosts, each once, lending to an engine that can use them, with no second copy of it."""
    workers = config.stack.rpc_workers
    if not workers:
        return
    primary = catalog.get(config.stack.primary)
    if primary.rpc is None:
        able = [n for n, e in catalog.all_engines().items() if e.rpc is not None]
        raise KitError("stack.rpc_workers", f"{primary.name} cannot use other hosts' devices",
                       f"drop rpc_workers, or make the primary one of: {', '.join(able)}")
    names = [h.name for h in config.hosts[1:]]
    for i, name in enumerate(workers):
        if name not in names:
            fix = "list it under hosts: after this machine" if name not in [h.name for h in config.hosts] else \
                "this machine runs the primary; name the other hosts"
            raise KitError(f"stack.rpc_workers[{i}]", f"{name!r} is not another host", fix)
        if name in workers[:i]:
            raise KitError(f"stack.rpc_workers[{i}]", f"{name!r} is named twice", "name each worker once")
    if config.stack.fallback == config.stack.primary:
        raise KitError("stack.fallback", f"a second {primary.name} would share the primary's RPC workers, which serve "
                       "one client at a time", "drop the fallback, or make it another engine")
    split = config.engine_settings(primary.name).get("split_mode", "layer")
    if split != "layer":
        what = "keeps every layer on one GPU" if split == "none" else "cuts every layer over this machine's GPUs"
        raise KitError(f"engines.{primary.name}.split_mode", f"{split} {what}; a lent device takes whole layers",
                       "use split_mode: layer with rpc_workers")


def replica_address(host: Host) -> str:
    """Where a replica's engine publishes and the front door dials: ``address``, else the endpoint's host when it is
    an IP (ssh://kit@192.168.1.12 -> 192.168.1.12), else nothing (a name the front door's container may not
    resolve)."""
    if host.address:
        return host.address
    from urllib.parse import urlsplit

    if "://" not in host.docker:
        return ""
    name = urlsplit(host.docker).hostname or ""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return ""
    return name


# the values of on/off/auto settings (llama.cpp --flash-attn): YAML turns unquoted on/off into true/false
SWITCHES = ("on", "off", "auto")


def _check_type(field: str, value: Any, default: Any) -> None:
    if default is None or value is None and default == "":
        return
    if isinstance(default, list) and isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, (dict, list)) or item is None:
                raise KitError(f"{field}[{i}]", f"{item!r} is not a plain value", f"use a list like {default!r}")
    expected: tuple[type, ...]
    if isinstance(default, bool):
        expected = (bool,)
    elif isinstance(default, (int, float)):
        expected = (int, float)
    elif isinstance(default, list):
        expected = (list,)
    elif isinstance(default, dict):
        expected = (dict,)
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(item, (str, int, float)) or isinstance(item, bool):
                    raise KitError(f"{field}.{key}", f"{item!r} is not a plain value", "use NAME: value pairs")
    else:
        expected = (str, int, float)  # "all" or 99, "auto" or 0.9: strings may hold numbers
    if isinstance(value, bool) and not isinstance(default, bool) or not isinstance(value, expected):
        raise KitError(field, f"{value!r} has the wrong type", f"use a value like {default!r}")
