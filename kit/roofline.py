"""The single-stream decode limit a measurement is compared with: the bytes each token reads, at the bandwidth of the
memory they are in (kit plan's split for where they are; the datasheet for a GPU, a copy test for this host)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.errors import KitError


def roofline(model_bytes: float, bandwidth_gbs: float, parallel_gpus: int = 1) -> float:
    """Decode tok/s if every token reads ``model_bytes`` once at full memory bandwidth (``parallel_gpus`` reading
    their shares at once)."""
    return bandwidth_gbs * 1e9 * parallel_gpus / model_bytes


@dataclass
class Roofline:
    """The single-stream decode limit of a stack: the bytes each token reads where they are, at that memory's
    bandwidth, with where each number came from."""

    tok_s: float
    read_bytes: float  # weights read per token (host-resident token embeddings: one row, left out)
    bandwidth_gbs: float
    bandwidth_source: str  # "datasheet (images/gpus.yaml)" or "measured: ..."
    how: str

    def line(self, best: float) -> str:
        return (f"{best:.1f} tok/s single-stream = {100 * best / self.tok_s:.0f}% of the {self.tok_s:.1f} tok/s "
                f"bandwidth limit ({self.how}; {round(self.bandwidth_gbs, 1):g} GB/s {self.bandwidth_source})")


def plan_roofline(gpu_weights: list[int], host_layer_bytes: int, split_mode: str, gpu_bandwidth_gbs: float,
                  host_bandwidth_gbs: float, host_source: str) -> Roofline:
    """From ``kit plan``'s split: with a layer split the GPUs take turns (a token reads every GPU's share one after
    the other); with row or tensor split they read their shares at once (the largest share sets the pace). A CPU
    stack reads its layers from host memory."""
    if not gpu_weights:
        return Roofline(host_bandwidth_gbs * 1e9 / host_layer_bytes, host_layer_bytes, host_bandwidth_gbs,
                        host_source, f"{host_layer_bytes / 1e9:.2f} GB of layers in host memory")
    total = float(sum(gpu_weights))
    if split_mode in ("row", "tensor") and len(gpu_weights) > 1:
        slowest = max(gpu_weights)
        return Roofline(gpu_bandwidth_gbs * 1e9 / slowest, total, gpu_bandwidth_gbs, "datasheet (images/gpus.yaml)",
                        f"{len(gpu_weights)} GPUs read {total / 1e9:.2f} GB at once, {slowest / 1e9:.2f} GB the largest")
    return Roofline(gpu_bandwidth_gbs * 1e9 / total, total, gpu_bandwidth_gbs, "datasheet (images/gpus.yaml)",
                    f"{total / 1e9:.2f} GB on {len(gpu_weights)} GPU(s), read in turn")


def host_bandwidth_gbs(size: int = 256 * 2**20, rounds: int = 3) -> float:
    """This machine's memory bandwidth from a copy test (one buffer copied into another: ``size`` read and written
    per round), the best of ``rounds``: the figure a CPU stack's decode is bound by."""
    src, dst = bytearray(size), bytearray(size)
    view = memoryview(dst)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        view[:] = src
        best = min(best, time.perf_counter() - start)
    return 2 * size / best / 1e9


def roofline_for(stack: Any, model_bytes: float | None = None, model_file: Path | None = None,
                 gpu: str | None = None, parallel_gpus: int = 1) -> tuple[Roofline | None, str]:
    """The decode limit to compare with, and a note when there is none: from the given weights size, else from
    kit plan's split of the stack's model when it is on this machine (GPU: datasheet bandwidth; cpu flavor: this
    host's, measured)."""
    from kit.plan import gpu_table

    gpus = gpu_table()["gpus"]
    name = gpu or (stack.hardware.gpu_model if stack is not None else "Tesla V100-SXM2-16GB")
    if (model_bytes or model_file) and name not in gpus:
        raise KitError("--gpu", f"unknown GPU {name!r}", f"use one of {', '.join(gpus)}")
    if model_file is not None:
        from kit import modelinfo

        model_bytes = float(modelinfo.read(model_file).weights_bytes)
    if model_bytes:
        bw = gpus[name]["bandwidth_gbs"]
        return Roofline(roofline(model_bytes, bw, parallel_gpus), model_bytes, bw, "datasheet (images/gpus.yaml)",
                        f"{model_bytes / 1e9:.2f} GB given, {parallel_gpus} GPU(s) at once"), ""
    if stack is None:
        return None, ""
    from kit import plan as planner, resolve

    primary = stack.stack.primary
    info = resolve.model_info(stack, primary)
    if info is None:
        return None, f"roofline: {resolve.host_model_path(stack, primary)} is not on this machine (pass --model-file)"
    resolved = resolve.engine(stack, primary)
    made = planner.make_plan(stack, info, primary, resolved.ctx)
    embeddings = sum(t.nbytes for t in info.tensors if t.name.startswith("token_embd"))
    split = str(resolved.settings.get("split_mode", "tensor"))
    host_bw = host_bandwidth_gbs() if not resolved.gpu else 0.0
    return plan_roofline([g.weights for g in made.gpus] if resolved.gpu else [], info.weights_bytes - embeddings,
                         split, gpus.get(stack.hardware.gpu_model, {}).get("bandwidth_gbs", 0.0), host_bw,
                         "measured (copy test on this host)"), ""
