"""``kit model list``: every GGUF in a repo planned against this stack from its header alone, and the one to take.

Each model's header (every part's, for a split one) is read through HTTP ranges (kit/hub.py), turned into the same
``ModelInfo`` a local file gives, and planned by ``kit plan`` for llama.cpp at the stack's context and concurrency.
The recommendation is the largest file that fits: on these cards the bigger quant is the better one, as long as
the KV cache for every slot still fits beside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kit import ggufheader, modelinfo, plan
from kit.config import StackConfig
from kit.hub import HfHub, ModelScopeHub, RemoteModel

# quant names as they appear in GGUF file names (Q4_K_M, IQ4_XS, Q8_0, F16, BF16, ...)
QUANT_IN_NAME = re.compile(r"(?i)[-_.]((?:I?Q\d(?:_[A-Z0-9]+)*)|BF16|F16|F32)(?=[-_.])")


@dataclass
class Choice:
    model: RemoteModel
    quant: str
    plan: plan.Plan | None
    problem: str = ""  # why it could not be planned

    @property
    def fits(self) -> bool:
        return self.plan is not None and self.plan.fits


def quant_name(file_type: str, name: str) -> str:
    """The header's general.file_type (llama.cpp's LlamaFileType) by name; the file name's when there is none."""
    import gguf

    if file_type.isdigit():
        try:
            return gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
        except ValueError:
            pass
    found = QUANT_IN_NAME.search(name.rsplit("/", 1)[-1] + ".")
    return found.group(1).upper() if found else "?"


def remote_info(hub: HfHub | ModelScopeHub, model: RemoteModel) -> tuple[modelinfo.ModelInfo, int]:
    """A hub model's ModelInfo from its headers (every part's, read by ranges), and the bytes read to get it.
    Raises ggufheader.GGUFError for a header this reader does not know."""
    headers, fetched = [], 0
    for part in model.parts:
        reader = hub.open(part)
        headers.append(ggufheader.read_stream(reader))
        fetched += reader.fetched
    return modelinfo.from_header(modelinfo.merge_parts(headers), f"{hub.source}/{model.name}"), fetched


def plan_remote(config: StackConfig, hub: HfHub | ModelScopeHub, model: RemoteModel) -> tuple[Choice, int]:
    """One model planned from its headers; the bytes read to do it."""
    if model.missing:
        return Choice(model, "?", None, f"the repo lacks part(s) {', '.join(model.missing)}"), 0
    try:
        info, fetched = remote_info(hub, model)
    except ggufheader.GGUFError as exc:
        return Choice(model, "?", None, f"not a GGUF header this reader knows ({exc})"), 0
    return Choice(model, quant_name(info.file_type, model.name), plan.make_plan(config, info, "llama.cpp")), fetched


def recommend(choices: list[Choice]) -> Choice | None:
    """The largest model that fits at the stack's context and concurrency."""
    fitting = [c for c in choices if c.fits]
    return max(fitting, key=lambda c: c.model.size) if fitting else None


@dataclass
class HfVerdict:
    engine: str
    ok: bool
    text: str


def hf_verdicts(config: StackConfig, hf_config: dict) -> list[HfVerdict]:
    """What each HF-format engine of the stack makes of a checkpoint's config.json on these GPUs (the engine's
    ``supports.quant_methods``); llama.cpp-only stacks are told to take a GGUF."""
    from kit import catalog

    engines = [n for n in config.engine_names() if "hf" in catalog.get(n).supports.model_formats]
    if not engines:
        return [HfVerdict(config.stack.primary, False, f"{config.stack.primary} serves GGUF files, and this repo has "
                          "a Hugging Face checkpoint (config.json): take a GGUF repo of the model, or set "
                          "stack.primary: vllm")]
    text_config = hf_config.get("text_config", hf_config)
    method = str((hf_config.get("quantization_config") or {}).get("quant_method") or "")
    dtype = str(hf_config.get("torch_dtype") or text_config.get("torch_dtype") or "")
    arch = min(config.hardware.archs) if config.hardware.archs else 0
    out = []
    for name in engines:
        need = catalog.get(name).supports.quant_methods.get(method)
        if need is not None and arch < need.arch:
            out.append(HfVerdict(name, False, f"{name} cannot serve {method} checkpoints on sm_{arch}: its kernels "
                                 f"need sm_{need.arch}+ ({need.source}); take a GPTQ or GGUF build of this model"))
            continue
        said = f"{name} can serve it ({method or 'not quantized'})"
        if dtype == "bfloat16" and arch < 80:
            said += f"; its bf16 weights are served as float16 on sm_{arch} (model.dtype: float16)"
        out.append(HfVerdict(name, True, said))
    return out


def plan_hf(config: StackConfig, engine: str, hf_config: dict, weights: int, label: str) -> plan.Plan:
    """A hub checkpoint planned for a tensor-parallel engine from its config.json and its weights' size (the
    repo's *.safetensors files, as the tree lists them)."""
    return plan.make_plan(config, modelinfo.from_hf_config(hf_config, weights, label), engine)
