"""``kit plan``: will this model fit these GPUs at this context? Answered before anything is built or loaded.

llama.cpp (layer split): layers go to GPUs by the tensor-split ratios (as llama.cpp assigns them: layer i to the
first GPU whose cumulative share exceeds i / n_layer); token embeddings stay on the host; the output layer sits on
the last GPU. Per GPU: weights + KV cache (2 x ctx x kv_heads x head_dim x bytes per layer, GQA-aware, SWA layers
capped at the window) + compute buffer + CUDA context. vLLM / NInfer (tensor parallel): weights / TP, then what
``--gpu-memory-utilization`` leaves becomes the KV pool.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from kit import catalog, hosts, paths
from kit.config import StackConfig
from kit.errors import KitError
from kit.modelinfo import ModelInfo

GIB = 2**30
MIB = 2**20
CTX_STEP = 256


@lru_cache(maxsize=1)
def gpu_table() -> dict[str, Any]:
    return yaml.safe_load((paths.images_dir() / "gpus.yaml").read_text(encoding="utf-8"))


def kv_bytes(cache_type: str, field: str = "engines.llama.cpp.cache_type_k") -> float:
    table = gpu_table()["kv_bytes"]
    if cache_type not in table:
        raise KitError(field, f"unknown KV cache type {cache_type!r}", f"use one of {sorted(table)}")
    return float(table[cache_type])


@dataclass
class GpuPlan:
    index: int
    total: int
    weights: int = 0
    kv: int = 0
    compute: int = 0
    overhead: int = 0
    layers: list[int] = field(default_factory=list)
    host: str = ""  # the host lending it through rpc-server; "" = this machine
    device: str = ""  # a lent GPU's name in the primary's --device (RPC0, ...)

    @property
    def label(self) -> str:
        return f"{self.device} ({self.host})" if self.host else str(self.index)

    @property
    def used(self) -> int:
        return self.weights + self.kv + self.compute + self.overhead

    @property
    def free(self) -> int:
        return self.total - self.used

    @property
    def fits(self) -> bool:
        return self.free >= 0


@dataclass
class Plan:
    engine: str
    model: dict[str, Any]
    ctx: int
    gpus: list[GpuPlan]
    host_bytes: int
    max_ctx: int
    batch: int
    ubatch: int
    kv_tokens: int | None = None  # vLLM: tokens the KV pool holds
    fix: str = ""
    slots: int = 1  # requests served at once, each up to ctx tokens
    network: str = ""  # what crosses to lent devices (stack.rpc_workers)

    @property
    def fits(self) -> bool:
        return all(g.fits for g in self.gpus) and (self.kv_tokens is None or self.kv_tokens >= self.ctx * self.slots)

    @property
    def serves(self) -> str:
        return f"{self.slots} concurrent request{'s' if self.slots > 1 else ''} of up to {self.ctx} tokens each"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for g, raw in zip(self.gpus, out["gpus"]):
            raw.update(used=g.used, free=g.free, fits=g.fits)
        out["fits"] = self.fits
        return out


def assign_layers(n_layer: int, split: list[float]) -> list[int]:
    """Device of each repeating layer, then of the output layer (``n_layer + 1`` entries), as llama.cpp assigns
    them with every layer offloaded (src/llama-model.cpp, ``load_tensors``: layer ``il`` goes to the first device
    whose cumulative split share exceeds ``il / (n_layer + 1)`` in float32; the output layer is ``il = n_layer``).
    So 64 layers over [1, 1] are 33 + 31, and the output layer sits with the last 31."""
    import numpy as np

    shares = np.cumsum(np.array(split, dtype=np.float32))
    shares = shares / shares[-1]
    act = n_layer + 1
    return [int(np.searchsorted(shares, np.float32(il) / np.float32(act), side="right")) for il in range(act)]


def layer_kv_bytes(model: ModelInfo, layer: int, ctx: int, k_type: str, v_type: str, slots: int = 1) -> float:
    """One layer's KV cache for ``slots`` sequences of ``ctx`` tokens each (a sliding-window layer keeps its window)."""
    tokens = min(ctx, model.sliding_window) if layer in model.swa_layers and model.sliding_window else ctx
    per_token = model.n_head_kv * model.head_dim * (kv_bytes(k_type) + kv_bytes(v_type, "engines.llama.cpp.cache_type_v"))
    return slots * tokens * per_token


def compute_bytes(model: ModelInfo, ctx: int, ubatch: int, flash: bool, last: bool, outputs: int,
                  engine: str = "llama.cpp") -> int:
    """llama.cpp's compute buffer: the worst case it reserves at start (src/llama-context.cpp, graph_reserve for a
    ubatch of prompt tokens). ggml-alloc reuses memory between ops, so it is the larger of the two peaks of a layer
    (the FFN, or attention), plus the attention mask that lives through the whole graph. ``ctx`` is one slot's KV
    length: kit runs one KV stream per slot, and the mask and scores span one stream.
    - FFN peak: gate, up and their product (f32, 3 x n_ff per token) and three n_embd-wide activations
    - attention peak: four n_embd-wide and two K/V-wide rows per token; without flash attention also the f32 scores
      (n_head x ctx per token) and a second copy of the mask
    - mask: f16, one row of ctx per prompt token
    - logits (the GPU with the output layer): f32, one n_vocab row per output, in memory the layers have freed;
      llama-server asks for one output per slot and draft token (server_output_limits), not one per prompt token
    Exact (to 0.01 MiB) at 9 settings on an H200 (benchmarks/results/gpu-compute-h200.json: ubatch 256-1024, 1-4
    slots of 4096-32768 tokens, flash attention on and off); the plan was 3x too high before (417 vs 172 MiB)."""
    fit = catalog.get(engine).plan.compute
    width = {"n_ff": model.n_ff, "n_embd": model.n_embd, "kv_width": model.n_head_kv * model.head_dim}
    mask = ctx * ubatch * fit["mask_bytes"]
    ffn = ubatch * 4 * sum(rows * width[name] for name, rows in fit["ffn_rows"].items())
    attention = ubatch * 4 * sum(rows * width[name] for name, rows in fit["attention_rows"].items())
    if not flash:
        attention += model.n_head * ctx * ubatch * fit["scores_bytes"] + mask
    logits = model.n_vocab * outputs * 4 if last else 0
    return int(max(ffn, attention, logits) + mask)


def server_outputs(config: StackConfig, model: ModelInfo, engine: str = "llama.cpp") -> int:
    """Outputs llama-server reserves logits for: slots x (1 + draft tokens), at most a batch (common/speculative.cpp,
    common_speculative_get_output_limits)."""
    settings = config.engine_settings(engine)
    spec = str(settings.get("spec_type", "none"))
    rule = catalog.get(engine).model_dependent.get("spec_type")
    if spec == "auto" and rule:
        spec = rule.for_model(model.mtp_layers)
    draft = int(settings.get("spec_draft_n_max", 0)) if spec not in ("", "none") else 0
    return min(int(settings["batch"]), config.serve.concurrency * (1 + draft))


def cuda_context_bytes(config: StackConfig) -> int:
    """What the CUDA runtime, cuBLAS and NCCL take per GPU before any model byte: the GPU's measured figure in
    images/gpus.yaml where there is one, else the table's default."""
    table = gpu_table()
    mib = table["gpus"].get(config.hardware.gpu_model, {}).get("cuda_context_mib", table["cuda_context_mib"])
    return int(mib * MIB)


def plan_layer_split(config: StackConfig, model: ModelInfo, ctx: int, *, engine: str | None = None,
                     ubatch: int | None = None, cache_types: tuple[str, str] | None = None,
                     gpus: int | None = None) -> Plan:
    """An engine that puts whole layers on each GPU (``plan.memory: layer-split``: llama.cpp), each with its KV
    cache and compute buffer; the stack's primary also on the GPUs other hosts lend it (stack.rpc_workers)."""
    engine = engine or config.stack.primary
    settings = config.engine_settings(engine)
    slots = config.serve.concurrency
    n_gpu = config.hardware.gpus if gpus is None else gpus
    k_type, v_type = cache_types or (settings["cache_type_k"], settings["cache_type_v"])
    ub = ubatch or int(settings["ubatch"])
    flash = str(settings["flash_attn"]).lower() in ("on", "auto", "true", "1")
    mem = int(config.hardware.memory_gib * GIB)
    overhead = cuda_context_bytes(config)
    split = [float(x) for x in settings["tensor_split"]] if len(settings["tensor_split"]) == n_gpu else [1.0] * n_gpu
    host = 0
    plans = [GpuPlan(i, mem, overhead=overhead) for i in range(n_gpu)]
    # other hosts' GPUs (stack.rpc_workers) take whole layers after the local ones, by their own split ratio
    lent_devices = hosts.lent_devices(config) if n_gpu and engine == config.stack.primary else []
    lent = [(name, d) for name, d in zip(hosts.rpc_device_names(config, lent_devices), lent_devices) if d.gpu]
    split += [d.weight for _, d in lent]
    plans += [GpuPlan(n_gpu + j, int(d.memory_gib * GIB), overhead=overhead, host=d.host, device=name)
              for j, (name, d) in enumerate(lent)]
    if n_gpu == 0:  # CPU: everything in host memory
        host = model.weights_bytes + int(sum(layer_kv_bytes(model, l, ctx, k_type, v_type, slots)
                                             for l in range(model.n_layer)))
        return Plan(engine, model.summary(), ctx, [], host, ctx, int(settings["batch"]), ub, slots=slots)
    mode = "layer" if gpus is not None else str(settings["split_mode"])  # "one more GPU" assumes a layer split
    if len(plans) == 1 or mode == "none":
        devices = [0] * (model.n_layer + 1)
    else:
        devices = assign_layers(model.n_layer, split)
    shares = [x / sum(split) for x in split]
    for layer in range(model.n_layer):
        plans[devices[layer]].layers.append(layer)
        kv = layer_kv_bytes(model, layer, ctx, k_type, v_type, slots)
        if mode == "tensor":  # heads split across the GPUs
            for p, share in zip(plans, shares):
                p.kv += int(kv * share)
        else:  # layer and row: a layer's KV lives on the layer's device
            plans[devices[layer]].kv += int(kv)
    last = devices[model.n_layer]
    for t in model.tensors:
        if t.name.startswith("token_embd"):
            host += t.nbytes  # the input layer always stays on the CPU
            continue
        home = devices[t.layer] if t.layer is not None else last
        matrix = t.name.endswith(".weight") and not t.name.endswith("norm.weight")
        if mode == "tensor" or mode == "row" and matrix:
            # row: matrices are split by rows over every GPU (ggml's split buffer type); tensor: everything is
            for p, share in zip(plans, shares):
                p.weights += int(t.nbytes * share)
        else:
            plans[home].weights += t.nbytes
    outputs = server_outputs(config, model, engine)
    for p in plans:
        p.compute = compute_bytes(model, ctx, ub, flash, p.index == last, outputs, engine)
    return Plan(engine, model.summary(), ctx, plans, host, 0, int(settings["batch"]), ub, slots=slots,
                network=rpc_traffic(model, devices, n_gpu, ub) if lent else "")


def rpc_traffic(model: ModelInfo, devices: list[int], local: int, ubatch: int) -> str:
    """What crosses the network per token with layers on lent devices: at each change between this machine's
    devices and a lent one along the layers, the f32 activations (n_embd x 4 bytes a token); one crossing more when
    the output layer is lent (its result comes back). Decode waits one round trip per crossing and token."""
    remote = [d >= local for d in [0, *devices[: model.n_layer]]]  # token embeddings start on this machine
    crossings = sum(a != b for a, b in zip(remote, remote[1:])) + (1 if devices[model.n_layer] >= local else 0)
    act = model.n_embd * 4
    batch_mib = ubatch * act * crossings / MIB
    return (f"network: {crossings} crossing(s) of this machine and lent GPUs per token, {act / 1024:.0f} KiB of "
            f"activations each; a {ubatch}-token prompt batch moves {batch_mib:.0f} MiB "
            f"({batch_mib * MIB / 117e6 * 1000:.0f} ms at 1 Gb/s); every generated token waits {crossings} round "
            "trip(s)")


def tp_kv_bytes_per_token(n_layer: int, n_head_kv: int, head_dim: int, tp: int) -> float:
    """KV bytes one token takes on each GPU under tensor parallelism (fp16 K and V, heads split across GPUs)."""
    return 2 * n_layer * (n_head_kv / tp) * head_dim * 2


def plan_tensor_parallel(config: StackConfig, engine: str, model: ModelInfo, ctx: int, *,
                         gpus: int | None = None) -> Plan:
    settings = config.engine_settings(engine)
    tp = max(1, config.hardware.gpus if gpus is None else gpus)
    util = float(settings.get("gpu_memory_utilization", 0.9))
    mem = int(config.hardware.memory_gib * GIB)
    overhead = cuda_context_bytes(config) + int(gpu_table()["vllm_activation_gib"] * GIB)
    reserved, weights = int(mem * util), model.weights_bytes // tp
    pool = max(0, reserved - weights - overhead)  # vLLM takes the whole pool for KV blocks
    plans = [GpuPlan(i, reserved, weights=weights, kv=pool, overhead=overhead) for i in range(tp)]
    per_token = tp_kv_bytes_per_token(model.n_layer, model.n_head_kv, model.head_dim, tp)
    tokens = int(pool // per_token) if per_token else 0
    slots = config.serve.concurrency
    per_request = tokens // slots
    return Plan(engine, model.summary(), ctx, plans, 0, min(per_request, model.context_length or per_request), 0, 0,
                kv_tokens=tokens, slots=slots)


def make_plan(config: StackConfig, model: ModelInfo, engine: str | None = None, ctx: int | None = None) -> Plan:
    engine = engine or config.stack.primary
    if ctx is None:
        ctx = config.model.ctx if isinstance(config.model.ctx, int) else (model.context_length or 4096)
    if catalog.get(engine).plan.memory == "tensor-parallel":
        plan = plan_tensor_parallel(config, engine, model, ctx)
        if not plan.fits:
            plan.fix = cheapest_fix(config, model, plan, engine)
        return plan
    plan = plan_layer_split(config, model, ctx, engine=engine)
    plan.max_ctx = largest_ctx(config, model, engine=engine)
    plan.batch, plan.ubatch = recommend_batch(config, model, ctx, engine)
    if not plan.fits:
        plan.fix = cheapest_fix(config, model, plan, engine)
    return plan


def largest_ctx(config: StackConfig, model: ModelInfo, **kw: Any) -> int:
    limit = model.context_length or 131072
    lo, hi = 0, limit // CTX_STEP
    while lo < hi:
        mid = (lo + hi + 1) // 2
        p = plan_layer_split(config, model, mid * CTX_STEP, **kw)
        if p.fits:
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_STEP if lo else 0


def recommend_batch(config: StackConfig, model: ModelInfo, ctx: int, engine: str | None = None) -> tuple[int, int]:
    """The seeds' sweet spot (512/512) when it fits, else the largest power of two down to 64."""
    engine = engine or config.stack.primary
    ub = 512
    while ub > 64 and not plan_layer_split(config, model, ctx, engine=engine, ubatch=ub).fits:
        ub //= 2
    batch = int(config.engine_settings(engine)["batch"]) if ub == 512 else ub
    return batch, ub


def cheapest_fix(config: StackConfig, model: ModelInfo, plan: Plan, engine: str) -> str:
    short = max((g.used - g.total for g in plan.gpus), default=0)
    if catalog.get(engine).plan.memory == "tensor-parallel":
        if plan.kv_tokens and plan.kv_tokens // plan.slots > 1024:  # the pool's share, not the model's cap
            return (f"shorten model.ctx to {plan.max_ctx // CTX_STEP * CTX_STEP} (the KV pool holds {plan.kv_tokens} "
                    f"tokens for {plan.slots} requests), serve fewer at once, or raise gpu_memory_utilization")
        return f"weights leave no KV pool: use a smaller quant or {config.hardware.gpus + 1} GPUs"
    fixes = []
    if plan.max_ctx >= 2048:
        fixes.append(f"shorten model.ctx to {plan.max_ctx}")
    if config.serve.concurrency > 1:
        fewer = next((n for n in range(config.serve.concurrency - 1, 0, -1)
                      if plan_layer_split(config.model_copy(update={"serve": config.serve.model_copy(
                          update={"concurrency": n})}), model, plan.ctx, engine=engine).fits), 0)
        if fewer:
            fixes.append(f"serve fewer requests at once (serve.concurrency: {fewer})")
    if plan_layer_split(config, model, plan.ctx, engine=engine, cache_types=("q8_0", "q8_0")).fits:
        fixes.append("set cache_type_k/cache_type_v: q8_0 (halves the KV cache)")
    fixes.append(f"a smaller quant (weights must shrink by {short / GIB:.1f} GiB on the fullest GPU)")
    if plan_layer_split(config, model, plan.ctx, engine=engine, gpus=config.hardware.gpus + 1).fits:
        fixes.append(f"one more GPU ({config.hardware.gpus + 1} in total)")
    return "; or ".join(fixes)


def model_path(config: StackConfig, engine: str, given: str | None) -> Path:
    from kit.resolve import host_model_path

    return Path(given) if given else host_model_path(config, engine)


def on_replicas(config: StackConfig, model: ModelInfo, ctx: int | None = None) -> list[tuple[Any, Plan]]:
    """The primary planned on each replica host whose hardware differs from the stack's (``hosts[].hardware``):
    a box with fewer or smaller GPUs may not hold what this one does."""
    out = []
    for index, host in enumerate(config.hosts):
        target = next((t for t in hosts.replicas(config) if t.name == host.name), None)
        if target is None or not host.hardware or not host.hardware.model_fields_set:
            continue
        out.append((target, make_plan(hosts.host_config(config, target), model, config.stack.primary, ctx)))
    return out


def read_model(config: StackConfig, engine: str, given: str | None) -> ModelInfo:
    """The model ``kit plan`` plans: the one given on the command line, or the stack's (an error about the stack's
    names its kit.yaml field)."""
    from kit import modelinfo, resolve

    try:
        return modelinfo.read(model_path(config, engine, given))
    except KitError as exc:
        if given:
            raise
        raise KitError(resolve.model_field(config, engine), exc.problem, exc.fix) from None


def auto_ctx(config: StackConfig, engine: str, model: ModelInfo) -> int:
    """``model.ctx: auto``: the longest request that every one of serve.concurrency slots can hold at once,
    capped by what the model was trained for."""
    plan = make_plan(config, model, engine, ctx=min(model.context_length or 4096, 4096))
    best = plan.max_ctx
    best = min(best, model.context_length or best)
    if best < CTX_STEP:
        raise KitError("model.ctx", f"{Path(model.path).name} does not fit {config.hardware.gpus} GPU(s) at any "
                       f"context with serve.concurrency {config.serve.concurrency}",
                       "run `kit plan` for the numbers and the cheapest fix")
    return best // CTX_STEP * CTX_STEP


@dataclass
class StackPlan:
    """Primary and fallback on the same GPUs: what each takes per GPU, and whether the sum fits."""

    plans: list[Plan]
    total: int

    def used(self, index: int) -> int:
        return sum(reserved(p, index) for p in self.plans)

    @property
    def gpu_count(self) -> int:
        return max((len(p.gpus) for p in self.plans), default=0)

    @property
    def fits(self) -> bool:
        return all(self.used(i) <= self.total for i in range(self.gpu_count))

    def fix(self, config: StackConfig) -> str:
        """Lower a tensor-parallel engine's reservation so both fit, or say one of them must go."""
        others = {p.engine: max(reserved(p, i) for i in range(len(p.gpus))) for p in self.plans}
        for p in self.plans:
            if p.kv_tokens is None:
                continue
            room = self.total - sum(v for k, v in others.items() if k != p.engine)
            need = max(g.weights + g.overhead for g in p.gpus) + p.ctx * _kv_per_token(p)
            if room >= need:
                return (f"set engines.{p.engine}.gpu_memory_utilization: {room / self.total:.2f} "
                        f"(it reserves that share of every GPU, leaving room for {', '.join(k for k in others if k != p.engine)})")
        return "the two engines do not fit together: drop stack.fallback, or give each engine its own GPUs"


def reserved(p: Plan, index: int) -> int:
    """What ``p`` takes of GPU ``index`` (nothing on a GPU it does not use)."""
    if index >= len(p.gpus):
        return 0
    return p.gpus[index].used


def _kv_per_token(p: Plan) -> float:
    m = p.model
    return tp_kv_bytes_per_token(m["n_layer"], m["n_head_kv"], m["head_dim"], max(1, len(p.gpus)))


def plan_stack(config: StackConfig, models: dict[str, ModelInfo]) -> StackPlan:
    plans = [make_plan(config, models[name], name) for name in config.engine_names()]
    return StackPlan(plans, int(config.hardware.memory_gib * GIB))
