"""Model facts without loading weights: the GGUF header and tensor table, or a Hugging Face config + index.

A GGUF header is read by ``kit.ggufheader`` (keys and tensor table; the vocabulary only by its length), so a 15 GB
model with a 152k-token vocabulary is planned in well under a second.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.errors import KitError


@dataclass
class TensorInfo:
    name: str
    nbytes: int
    type: str
    layer: int | None  # blk.N.* -> N


@dataclass
class ModelInfo:
    path: str
    format: str  # gguf | hf
    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    context_length: int
    sliding_window: int = 0
    swa_layers: list[int] = field(default_factory=list)
    tensors: list[TensorInfo] = field(default_factory=list)
    weights_bytes: int = 0
    file_type: str = ""
    # MTP (multi-token prediction) layers: llama.cpp's `<arch>.nextn_predict_layers` (src/llama-arch.cpp,
    # LLM_KV_NEXTN_PREDICT_LAYERS); --spec-type draft-mtp needs them, or llama-server exits at load
    mtp_layers: int = 0

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "tensors"}


# llama.cpp's llama_split_path: PREFIX-%05d-of-%05d.gguf, numbered from 1; part 1 holds every key
SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_parts(name: str) -> list[str]:
    """Every part's file name of a split GGUF (any part's name works), or ``[name]`` for a single file."""
    match = SPLIT.match(name)
    if not match:
        return [name]
    count = int(match["count"])
    return [f"{match['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def merge_parts(headers: list[Any]) -> Any:
    """One header for a split model: part 1's keys, every part's tensors (gguf-split writes the keys once)."""
    first = headers[0]
    for other in headers[1:]:
        first.tensors.extend(other.tensors)
    return first


def read_gguf(path: Path) -> ModelInfo:
    from kit import ggufheader

    path = Path(path)
    headers = []
    for name in split_parts(path.name):
        part = path.with_name(name)
        if not part.is_file():
            raise KitError("MODEL", f"{part} is missing: {path.name} is one part of a split model",
                           "put every part in the same folder (kit model pull fetches them all)")
        try:
            headers.append(ggufheader.read(part))
        except (ggufheader.GGUFError, OSError) as exc:
            raise KitError("MODEL", f"{part} is not a readable GGUF file ({exc})",
                           "point kit plan at a .gguf model") from None
    return from_header(merge_parts(headers), str(path))


def from_header(header: Any, path: str) -> ModelInfo:
    """What kit plans with, from a GGUF header (a local file's, or one read by HTTP ranges)."""
    arch = str(header.get("general.architecture", "llama"))

    def meta(name: str, default: Any = None) -> Any:
        return header.get(f"{arch}.{name}", default)

    n_head_raw = meta("attention.head_count", 0) or 0
    n_head = int(max(n_head_raw) if isinstance(n_head_raw, list) else n_head_raw)
    n_head_kv_raw = meta("attention.head_count_kv", n_head)
    n_head_kv = int(max(n_head_kv_raw) if isinstance(n_head_kv_raw, list) else n_head_kv_raw or n_head)
    n_embd = int(meta("embedding_length", 0))
    head_dim = int(meta("attention.key_length", 0) or (n_embd // n_head if n_head else 0))
    n_layer = int(meta("block_count", 0))
    tensors = []
    vocab = 0
    for t in header.tensors:
        layer = int(t.name.split(".")[1]) if t.name.startswith("blk.") else None
        tensors.append(TensorInfo(t.name, t.nbytes, t.type_name, layer))
        if t.name == "token_embd.weight":
            vocab = int(t.shape[-1]) if len(t.shape) > 1 else 0
    vocab = header.array_lengths.get("tokenizer.ggml.tokens", vocab)
    window = int(meta("attention.sliding_window", 0) or 0)
    swa: list[int] = []
    if window:
        pattern = meta("attention.sliding_window_pattern", None)
        if isinstance(pattern, list):  # one bool per layer: true = sliding-window layer
            swa = [i for i, is_swa in enumerate(pattern) if is_swa]
        elif isinstance(pattern, int) and pattern > 1:  # every pattern-th layer is full attention
            swa = [i for i in range(n_layer) if (i + 1) % pattern != 0]
    n_ff_raw = meta("feed_forward_length", 0)
    n_ff = int(max(n_ff_raw) if isinstance(n_ff_raw, list) else n_ff_raw or 0)
    return ModelInfo(
        path=path, format="gguf", architecture=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
        n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff, n_vocab=vocab,
        context_length=int(meta("context_length", 0) or 0), sliding_window=window, swa_layers=swa, tensors=tensors,
        weights_bytes=sum(t.nbytes for t in tensors), file_type=str(header.get("general.file_type", "")),
        mtp_layers=int(meta("nextn_predict_layers", 0) or 0),
    )


def read_hf(folder: Path) -> ModelInfo:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise KitError("MODEL", f"{folder} has no config.json", "point kit plan at a Hugging Face model folder")
    try:
        cfg = json.loads(config_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise KitError("MODEL", f"{config_file} is not JSON ({exc})", "download the checkpoint's config.json again") \
            from None
    if not isinstance(cfg, dict):
        raise KitError("MODEL", f"{config_file} is not a JSON object", "download the checkpoint's config.json again")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weights = int(json.loads(index.read_text(encoding="utf-8")).get("metadata", {}).get("total_size", 0))
    else:
        weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    return from_hf_config(cfg, weights, str(folder))


def from_hf_config(cfg: dict[str, Any], weights: int, path: str) -> ModelInfo:
    """What kit plans with, from a checkpoint's config.json and its weights' size (a local folder, or a hub repo's
    file sizes)."""
    text = cfg.get("text_config", cfg)
    missing = [k for k in ("num_attention_heads", "hidden_size", "num_hidden_layers") if k not in text]
    if missing:
        raise KitError("MODEL", f"{path}'s config.json has no {', '.join(missing)}",
                       "kit reads a transformer checkpoint's config.json; download the checkpoint's own")
    try:
        return _from_hf_text(cfg, text, weights, path)
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise KitError("MODEL", f"{path}'s config.json has a value kit cannot read ({exc})",
                       "download the checkpoint's own config.json") from None


def _from_hf_text(cfg: dict[str, Any], text: dict[str, Any], weights: int, path: str) -> ModelInfo:
    n_head = int(text["num_attention_heads"])
    n_embd = int(text["hidden_size"])
    return ModelInfo(
        path=path, format="hf", architecture=str((cfg.get("architectures") or ["?"])[0]),
        n_layer=int(text["num_hidden_layers"]), n_embd=n_embd, n_head=n_head,
        n_head_kv=int(text.get("num_key_value_heads", n_head)), head_dim=int(text.get("head_dim") or n_embd // n_head),
        n_ff=int(text.get("intermediate_size", 0)), n_vocab=int(text.get("vocab_size", 0)),
        context_length=int(text.get("max_position_embeddings", 0)),
        sliding_window=int(text.get("sliding_window") or 0), weights_bytes=weights,
    )


def read(path: str | Path) -> ModelInfo:
    p = Path(path)
    if p.is_dir():
        return read_hf(p)
    if not p.is_file():
        raise KitError("MODEL", f"{p} does not exist", "pass the model file, or set model.dir and model.file")
    return read_gguf(p)
