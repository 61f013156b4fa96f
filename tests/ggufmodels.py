"""Tiny GGUF models written with the `gguf` package: real files llama.cpp loads, random weights, kilobytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_tiny_llama(path: Path, *, n_embd: int = 64, n_layer: int = 2, n_head: int = 4, n_head_kv: int = 2,
                     n_ff: int = 128, ctx: int = 2048, seed: int = 0, extra: dict | None = None) -> Path:
    """A llama-architecture model with an SPM byte vocabulary (<unk>, <s>, </s>, 256 byte tokens, a few words).

    ``extra``: more header keys, e.g. ``{"llama.nextn_predict_layers": 1}`` (the MTP marker llama.cpp reads)."""
    import gguf

    rng = np.random.default_rng(seed)
    words = ["▁hello", "▁world", "▁the", "▁a", "▁is", "▁V100", "▁fast", "."]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(words))]
    n_vocab = len(tokens)
    head_dim = n_embd // n_head

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("kit-tiny-llama")
    writer.add_context_length(ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_file_type(0)  # all f32
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_chat_template("{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}")
    for key, value in (extra or {}).items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        else:
            writer.add_uint32(key, value)

    def t(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer.add_tensor("token_embd.weight", t(n_vocab, n_embd))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", t(n_vocab, n_embd))
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", t(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", t(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", t(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", t(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", t(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", t(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", t(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# A 27B model with real tensor shapes (Qwen3-style: 64 layers, 5120 wide, 40 heads, 8 KV heads of 128, FFN 21504,
# vocab 151936): about 26.7 B parameters, 14.2 GB at IQ4_XS. Written sparse, so it costs no disk.
SHAPES_27B = {"n_layer": 64, "n_embd": 5120, "n_head": 40, "n_head_kv": 8, "head_dim": 128, "n_ff": 21504,
              "n_vocab": 151936, "ctx": 40960}


def tensor_shapes(s: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy-order shape) for every tensor of a llama-style model."""
    q, kv = s["n_head"] * s["head_dim"], s["n_head_kv"] * s["head_dim"]
    out = [("token_embd.weight", (s["n_vocab"], s["n_embd"])), ("output_norm.weight", (s["n_embd"],)),
           ("output.weight", (s["n_vocab"], s["n_embd"]))]
    for i in range(s["n_layer"]):
        out += [
            (f"blk.{i}.attn_norm.weight", (s["n_embd"],)),
            (f"blk.{i}.attn_q.weight", (q, s["n_embd"])),
            (f"blk.{i}.attn_k.weight", (kv, s["n_embd"])),
            (f"blk.{i}.attn_v.weight", (kv, s["n_embd"])),
            (f"blk.{i}.attn_output.weight", (s["n_embd"], q)),
            (f"blk.{i}.ffn_norm.weight", (s["n_embd"],)),
            (f"blk.{i}.ffn_gate.weight", (s["n_ff"], s["n_embd"])),
            (f"blk.{i}.ffn_up.weight", (s["n_ff"], s["n_embd"])),
            (f"blk.{i}.ffn_down.weight", (s["n_embd"], s["n_ff"])),
        ]
    return out


def add_real_size_vocab(writer, n_vocab: int) -> None:
    """An SPM vocabulary of ``n_vocab`` tokens (<unk>, <s>, </s>, the 256 byte tokens, then words): the size of a
    real Qwen vocabulary, so header readers and llama.cpp's loader see a real-shaped tokenizer."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581w{i}" for i in range(n_vocab - len(tokens))]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(n_vocab - 259)])
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * (n_vocab - 259))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template("{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}")


def write_sparse_27b(path: Path, quant: str = "IQ4_XS", shapes: dict | None = None, *, arch: str = "qwen3",
                     vocab: bool = False, extra: dict | None = None, split: tuple[int, int] | None = None) -> Path:
    """Header and tensor table of a real-shaped 27B GGUF; the data region is a hole (sparse file).

    ``vocab``: add a real-size tokenizer (151,936 tokens); ``arch: llama`` makes a file llama.cpp loads (the
    qwen3 architecture would also want q/k norm tensors). ``split=(no, count)``: part ``no`` (0-based) of ``count``
    as llama.cpp's gguf-split writes them (examples/gguf-split: every part has ``split.no``, ``split.count`` and
    ``split.tensors.count``; only part 0 has the model's keys; the tensors are dealt out in order)."""
    import gguf

    s = shapes or SHAPES_27B
    qtype = gguf.GGMLQuantizationType[quant]
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    all_tensors = tensor_shapes(s)
    tensors = all_tensors
    if split is not None:
        no, count = split
        per = -(-len(all_tensors) // count)
        tensors = all_tensors[no * per:(no + 1) * per]
    writer = gguf.GGUFWriter(str(path), arch)
    if split is not None:
        writer.add_uint16("split.no", split[0])
        writer.add_uint16("split.count", split[1])
        writer.add_int32("split.tensors.count", len(all_tensors))
    if split is not None and split[0] > 0:
        writer.kv_data[0].pop("general.architecture", None)  # later parts carry the split keys only
    else:
        _model_keys(writer, s, vocab, extra)
    for name, shape in tensors:
        n = int(np.prod(shape))
        if len(shape) == 1:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), n * 4, gguf.GGMLQuantizationType.F32)
        else:
            byte_shape = (*shape[:-1], shape[-1] // block * block_bytes)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), n // block * block_bytes, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    size = path.stat().st_size
    alignment = 32
    data = 0
    for _name, shape in tensors:
        n = int(np.prod(shape))
        nbytes = n * 4 if len(shape) == 1 else n // block * block_bytes
        data += (nbytes + alignment - 1) // alignment * alignment
    with open(path, "r+b") as f:
        f.truncate((size + alignment - 1) // alignment * alignment + data)
    return path


def _model_keys(writer, s: dict, vocab: bool, extra: dict | None) -> None:
    writer.add_name("kit-sparse-27b")
    writer.add_context_length(s["ctx"])
    writer.add_embedding_length(s["n_embd"])
    writer.add_block_count(s["n_layer"])
    writer.add_feed_forward_length(s["n_ff"])
    writer.add_head_count(s["n_head"])
    writer.add_head_count_kv(s["n_head_kv"])
    writer.add_key_length(s["head_dim"])
    writer.add_value_length(s["head_dim"])
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_dimension_count(s["head_dim"])
    if vocab:
        add_real_size_vocab(writer, s["n_vocab"])
    for key, value in (extra or {}).items():
        writer.add_uint32(key, value)
