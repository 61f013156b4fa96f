"""``kit plan``'s output as rows and lines: the figures of a plan in GiB, decided here so the CLI only prints them
(and colours the fits column)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kit.modelinfo import ModelInfo
from kit.plan import GIB, Plan, StackPlan, reserved
from kit.resolve import trained_length_note


@dataclass(frozen=True)
class Report:
    title: str
    header: list[str]  # the last column is "fits"
    rows: list[list[str]]  # per GPU; empty for a CPU stack (then the title is a line of its own)
    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _gib(n: float, digits: int = 2) -> str:
    return f"{n / GIB:.{digits}f}"


def _yes(fits: bool) -> str:
    return "yes" if fits else "no"


def single(result: Plan, info: ModelInfo, name: str) -> Report:
    title = (f"{Path(info.path).name}: {info.architecture}, {info.n_layer} layers, {info.n_head_kv}/{info.n_head} "
             f"KV/heads x {info.head_dim}, {_gib(info.weights_bytes, 1)} GiB weights - {name} at ctx {result.ctx}")
    rows = [[g.label, str(len(g.layers)) if g.layers else "-", _gib(g.weights), _gib(g.kv), _gib(g.compute),
             _gib(g.overhead), _gib(g.used), _gib(g.total, 1), _gib(g.free), _yes(g.fits)] for g in result.gpus]
    lines: list[str] = []
    if result.host_bytes:
        lines.append(f"host memory: {_gib(result.host_bytes)} GiB (token embeddings"
                     f"{' + all layers' if not result.gpus else ''})")
    lines.append(f"serves {result.serves} (serve.concurrency x model.ctx)")
    if result.network:
        lines.append(result.network)
    if result.kv_tokens is not None:
        lines.append(f"KV pool holds {result.kv_tokens} tokens (gpu_memory_utilization)")
    else:
        lines.append(f"largest context per request that fits: {result.max_ctx}; recommended --batch-size "
                     f"{result.batch} --ubatch-size {result.ubatch}")
    warnings = [trained_length_note(result.ctx, info)] if info.context_length and result.ctx > info.context_length \
        else []
    return Report(title, ["GPU", "layers", "weights", "KV cache", "compute", "CUDA ctx", "used", "of", "free", "fits"],
                  rows, lines, warnings)


def stack(together: StackPlan) -> Report:
    """Per GPU, what each engine takes and the sum; whether it fits is the caller's to say (with the fix)."""
    rows = []
    for i in range(together.gpu_count):
        used = together.used(i)
        rows.append([str(i), *[_gib(reserved(p, i)) for p in together.plans], _gib(used),
                     _gib(together.total, 1), _yes(used <= together.total)])
    return Report("the stack on shared GPUs",
                  ["GPU", *[f"{p.engine} (GiB)" for p in together.plans], "together", "of", "fits"], rows)


def replica_line(name: str, result: Plan) -> str:
    """One line per replica host planned on its own hardware."""
    gpus = result.gpus
    box = f"{len(gpus)} x {_gib(gpus[0].total, 0)} GiB" if gpus else "CPU"
    verdict = "fits" if result.fits else f"does not fit: {result.fix}"
    return f"host {name} ({box}): {verdict} at ctx {result.ctx}"
