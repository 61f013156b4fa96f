"""Resolve the stack once: config + catalog + the model's own header -> the values every output reads.

The route: ``image(config, name)`` -> ``ResolvedImage`` (config + catalog, no model header: catalog entry, flavor,
settings, tag, CUDA version) -> the Dockerfile recipes and ``kit build``; ``stack(config)`` -> ``ResolvedStack`` (its
services, and per engine a ``ResolvedEngine``: the image's values plus the model-dependent settings, context, serve
argv, environment) -> compose, the 1Panel apps and the Kubernetes manifests. Those read the resolved value and call
neither the catalog nor the config's engine settings again.

Some settings cannot be right for every model: speculative decoding with the model's MTP head exists only when the
GGUF carries MTP layers (llama-server exits at load otherwise), and ``model.ctx: auto`` is whatever fits. They are
decided here, once per config, from the model file when it is on this machine, and recorded with a note saying
what was read or assumed.

Concurrency is a stack fact (``serve.concurrency``): every engine serves that many requests at once, each up to
``model.ctx`` tokens (llama.cpp: ``--parallel`` slots with ``--kv-unified-per-slot ctx``, so llama-server sizes its
KV cache to slots x ctx and caps each slot at ctx; vLLM: ``--max-num-seqs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from kit import catalog, containerspec, imagetag, serving
from kit.config import StackConfig
from kit.errors import KitError
from kit.modelinfo import ModelInfo
from kit.services import Service, services

AUTO = "auto"


@dataclass(frozen=True)
class ResolvedImage:
    """An engine's image, decided from the config and the catalog alone: an image needs no model, so `kit build` runs
    where the model is not. The Dockerfile recipes and `kit build` read this."""

    name: str
    entry: catalog.Engine  # the engine's catalog entry (images/<engine>.yaml)
    flavor: str
    gpu: bool  # the flavor runs on GPUs and the stack has some
    settings: Mapping[str, Any]  # catalog defaults + config overrides (model-dependent ones undecided: no image reads them)
    tag: str  # kit/llama-cpp:0c1e57098-cu12.9.1-sm70
    cuda_version: str  # the engine's own toolkit if it names one (vLLM keeps sm_70 only below CUDA 12.8), else the stack's
    # how long the engine may load before failed health checks count (the image's HEALTHCHECK and every run output's):
    # from the weights' size, the files' own when they are here, else model.size_gib; never their header
    start_period_s: int


@dataclass(frozen=True)
class ResolvedEngine:
    """One engine of the stack, every value decided."""

    name: str
    image: ResolvedImage  # what the config alone decides: catalog entry, flavor, tag, health start period
    settings: Mapping[str, Any]  # catalog defaults + config overrides, model-dependent values decided
    model_file: str  # inside model.dir
    host_model_path: Path
    ctx: int  # the longest single request, in tokens
    slots: int  # requests served at once
    notes: tuple[str, ...]  # what was read from the model or assumed without it
    # the serve flags after the entrypoint, inside its container, and the environment (NCCL for GPU flavors, the
    # catalog's env; each output adds the API key): formatted by `serving` from the values above
    argv: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def entry(self) -> catalog.Engine:
        return self.image.entry

    @property
    def flavor(self) -> str:
        return self.image.flavor

    @property
    def gpu(self) -> bool:
        return self.image.gpu

    @property
    def start_period_s(self) -> int:
        return self.image.start_period_s

    @property
    def speculative(self) -> bool:
        return str(self.settings.get("spec_type", "none")) not in ("", "none")


def engine(config: StackConfig, name: str) -> ResolvedEngine:
    """The resolution of ``name`` for this config, computed once (the model header is read at most once)."""
    cache = config.resolution_cache()
    if name not in cache:
        cache[name] = _resolve(config, name)
    return cache[name]


@dataclass(frozen=True)
class ResolvedStack:
    """What every output of a stack reads: the config's plain values, its services, its engines resolved."""

    config: StackConfig
    services: tuple[Service, ...]
    engines: Mapping[str, ResolvedEngine]  # the stack's own (primary, fallback), then any asked for by name

    def engine(self, name: str) -> ResolvedEngine:
        return self.engines[name]

    @property
    def primary(self) -> ResolvedEngine:
        return self.engines[self.config.stack.primary]

    @property
    def notes(self) -> list[str]:
        """Every note of the stack's engines, for `kit render` and `kit deploy` to print."""
        return [note for name in self.config.engine_names() for note in self.engines[name].notes]


def image(config: StackConfig, name: str) -> ResolvedImage:
    """Engine ``name``'s image for this config, decided once."""
    cache = config.resolution_cache()
    key = f"image:{name}"
    if key not in cache:
        cache[key] = ResolvedImage(
            name=name, entry=catalog.get(name), flavor=flavor(config, name), gpu=gpu(config, name),
            settings=MappingProxyType(config.engine_settings(name)), tag=imagetag.image_tag(config, name),
            cuda_version=imagetag.engine_cuda_version(config, name), start_period_s=start_period_s(config))
    return cache[key]


def stack(config: StackConfig, names: tuple[str, ...] | list[str] = ()) -> ResolvedStack:
    """The stack resolved once per config; ``names``: further catalog engines to resolve under the stack's settings
    (`kit panel export` makes an app for every engine)."""
    wanted = tuple(dict.fromkeys([*config.engine_names(), *names]))
    cache = config.resolution_cache()
    key = f"stack:{','.join(wanted)}"
    if key not in cache:
        cache[key] = ResolvedStack(config=config, services=tuple(services(config)),
                                   engines=MappingProxyType({name: engine(config, name) for name in wanted}))
    return cache[key]


def model_info(config: StackConfig, name: str) -> ModelInfo | None:
    """The model's header when the file is on this machine, read once per config."""
    cache = config.resolution_cache()
    key = f"model:{name}"
    if key not in cache:
        path = host_model_path(config, name)
        cache[key] = None
        if path.is_file() or path.is_dir():
            from kit import modelinfo

            try:
                cache[key] = modelinfo.read(path)
            except KitError as exc:
                raise KitError(model_field(config, name), exc.problem, exc.fix) from None
    return cache[key]


def model_field(config: StackConfig, name: str) -> str:
    """The kit.yaml field that names this engine's model, for an error about it."""
    return f"engines.{name}.model_file" if config.engine_settings(name).get("model_file") else "model.file"


def model_file(config: StackConfig, name: str) -> str:
    return str(config.engine_settings(name).get("model_file") or config.model.file)


def host_model_path(config: StackConfig, name: str) -> Path:
    return Path(config.model.dir).expanduser() / model_file(config, name)


def model_size_gib(config: StackConfig) -> float:
    """The primary's weights in GiB: the files' own size (every part of a split GGUF) when they are on this
    machine, else model.size_gib (what the user expects to put there)."""
    from kit.modelinfo import split_parts

    path = host_model_path(config, config.stack.primary)
    if path.is_dir():  # an HF folder: all its files
        parts = [p for p in path.rglob("*") if p.is_file()]
    else:
        parts = [path.with_name(n) for n in split_parts(path.name)]
    if parts and all(p.is_file() for p in parts):
        return sum(p.stat().st_size for p in parts) / 2**30
    return config.model.size_gib


def flavor(config: StackConfig, name: str) -> str:
    value = config.engine_settings(name)["flavor"]
    record = catalog.get(name)
    if value not in record.flavors:
        raise KitError(f"engines.{name}.flavor", f"unknown flavor {value!r}", f"use one of {sorted(record.flavors)}")
    return value


def start_period_s(config: StackConfig) -> int:
    """Time before failed health checks count: 60 s plus 10 s per GiB of weights (a 15 GB model from a SATA SSD)."""
    return int(60 + 10 * model_size_gib(config))


def gpu(config: StackConfig, name: str) -> bool:
    """The engine runs on GPUs: its flavor is a GPU one and the stack has GPUs (the one place that decides it; no
    model needed, so `kit status` and `kit down` can ask it anywhere)."""
    return catalog.get(name).flavors[flavor(config, name)].gpu and config.hardware.gpus > 0


def _resolve(config: StackConfig, name: str) -> ResolvedEngine:
    built = image(config, name)
    record = built.entry
    settings = dict(built.settings)
    notes: list[str] = []
    path = host_model_path(config, name)
    for key, rule in record.model_dependent.items():
        if key in settings:
            settings[key] = _decide(name, key, str(settings[key]), rule, config, path, notes)
    ctx = config.model.ctx
    info = model_info(config, name) if ctx == AUTO or path.exists() else None
    if ctx == AUTO:
        from kit.plan import auto_ctx

        if info is None:
            raise KitError("model.ctx", f"auto needs the model at {path} to plan", "put the model there or set a number")
        ctx = auto_ctx(config, name, info)
        capped = " (capped at what the model was trained for)" if ctx == info.context_length else ""
        notes.append(f"model.ctx auto: {ctx} tokens per request x {config.serve.concurrency} fit{capped} (kit plan)")
    elif info is not None and info.context_length and int(ctx) > info.context_length:
        notes.append(trained_length_note(int(ctx), info))
    decided = ResolvedEngine(
        name=name, image=built, settings=MappingProxyType(settings), model_file=model_file(config, name),
        host_model_path=path, ctx=int(ctx), slots=config.serve.concurrency, notes=tuple(notes),
    )
    env = {**(containerspec.nccl_env(config) if decided.gpu else {}), **serving.environment(config, decided)}
    return replace(decided, argv=tuple(serving.command(config, decided)), env=MappingProxyType(env))


def _decide(name: str, key: str, value: str, rule: Any, config: StackConfig, path: Path, notes: list[str]) -> str:
    """A setting whose right value depends on the model (today: speculative decoding and MTP layers)."""
    field = f"engines.{name}.{key}"
    if value != AUTO and value not in rule.needs_mtp:
        return value
    info = model_info(config, name)
    if info is None:
        if value == AUTO:
            notes.append(f"{field} auto: {path} is not on this machine, so assumed no MTP layers ({key} "
                         f"{rule.without_mtp}); render where the model is, or `kit deploy` decides it on the host")
            return rule.without_mtp
        notes.append(f"{field} {value}: needs MTP layers; {path} is not on this machine to check")
        return value
    marker = f"{info.architecture}.nextn_predict_layers"
    if value == AUTO:
        chosen = rule.for_model(info.mtp_layers)
        notes.append(f"{field} auto: {chosen} ({path.name}: {marker} = {info.mtp_layers})")
        return chosen
    if info.mtp_layers <= 0:
        raise KitError(field, f"{value} needs MTP layers and {path.name} has none ({marker} is 0 or absent)",
                       f"use {key}: auto (or {rule.without_mtp})")
    return value


def trained_length_note(ctx: int, info: ModelInfo) -> str:
    """A context past the model's trained length: llama-server caps each slot there unless RoPE is scaled."""
    factor = -(-ctx // info.context_length)
    return (f"model.ctx {ctx} is longer than {Path(info.path).name} was trained for ({info.context_length}): "
            f"llama-server caps each request at {info.context_length}; a longer context needs RoPE scaling, e.g. "
            f"extra_args [--rope-scaling, yarn, --rope-scale, '{factor}'] (quality drops)")


def notes(config: StackConfig) -> list[str]:
    """Every note of every engine of the stack, for `kit render` and `kit deploy` to print."""
    return stack(config).notes
