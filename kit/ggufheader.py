"""A GGUF header read the way a planner needs it: every key, the tensor table, and nothing else.

``gguf.GGUFReader`` builds a Python object for every token string of the vocabulary (151,936 of them plus the
merges in a real Qwen file), which takes seconds. kit needs scalar keys, the length of the token list and the
tensor table, so arrays are skipped with the file's own lengths: fixed-size elements by one seek, strings by
reading each 8-byte length and seeking past the bytes. Layout: ggml's ``docs/gguf.md`` (magic ``GGUF``, version,
tensor count, KV count, the KV pairs, then per tensor name / n_dims / dims / type / offset).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

# GGUFValueType: id -> struct format of one element (STRING = 8 and ARRAY = 9 are read by hand)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
# arrays up to this many elements are kept (layer patterns, per-layer head counts); longer ones only by length
KEEP_ARRAY = 4096


class GGUFError(ValueError):
    """The file is not a GGUF header this reader understands."""


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]  # as stored: ne[0] first (the row length)
    type_id: int
    type_name: str
    nbytes: int


@dataclass
class Header:
    version: int
    data_offset: int = 0  # where the tensor data starts: after the tensor table, aligned to general.alignment
    keys: dict[str, Any] = field(default_factory=dict)
    array_lengths: dict[str, int] = field(default_factory=dict)
    tensors: list[Tensor] = field(default_factory=list)

    def get(self, key: str, default: Any = None) -> Any:
        return self.keys.get(key, default)


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise GGUFError("the header ends early")
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    length = _read(f, "<Q")
    data = f.read(length)
    if len(data) != length:
        raise GGUFError("the header ends early")
    return data.decode("utf-8", errors="replace")


def _value(f: BinaryIO, vtype: int, key: str, header: Header) -> Any:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == STRING:
        return _string(f)
    if vtype != ARRAY:
        raise GGUFError(f"key {key} has unknown value type {vtype}")
    etype, count = _read(f, "<I"), _read(f, "<Q")
    header.array_lengths[key] = count
    if count <= KEEP_ARRAY:
        return [_value(f, etype, key, header) for _ in range(count)]
    if etype in _SCALARS:
        f.seek(count * struct.calcsize(_SCALARS[etype]), 1)
    elif etype == STRING:
        for _ in range(count):
            f.seek(_read(f, "<Q"), 1)
    else:
        raise GGUFError(f"key {key} is an array of {etype}, which this reader cannot skip")
    return None


def _tensor_bytes(shape: tuple[int, ...], type_id: int) -> tuple[str, int]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        qtype = GGMLQuantizationType(type_id)
    except ValueError:
        raise GGUFError(f"unknown tensor type {type_id}") from None
    block, type_size = GGML_QUANT_SIZES[qtype]
    elements = 1
    for n in shape:
        elements *= n
    return qtype.name, elements // block * type_size


def read(path: str | Path) -> Header:
    with open(path, "rb") as f:
        return read_stream(f)


def read_stream(f: BinaryIO) -> Header:
    """The header from any seekable binary stream: a file, or a remote file read by HTTP ranges (kit/hub.py)."""
    if f.read(4) != b"GGUF":
        raise GGUFError("no GGUF magic")
    version = _read(f, "<I")
    if version < 2:
        raise GGUFError(f"GGUF version {version} is too old")
    n_tensors, n_kv = _read(f, "<Q"), _read(f, "<Q")
    header = Header(version)
    for _ in range(n_kv):
        key = _string(f)
        header.keys[key] = _value(f, _read(f, "<I"), key, header)
    for _ in range(n_tensors):
        name = _string(f)
        dims = tuple(_read(f, "<Q") for _ in range(_read(f, "<I")))
        type_id = _read(f, "<I")
        _read(f, "<Q")  # offset in the data section
        type_name, nbytes = _tensor_bytes(dims, type_id)
        header.tensors.append(Tensor(name, dims, type_id, type_name, nbytes))
    alignment = int(header.get("general.alignment", 32) or 32)
    header.data_offset = -(-f.tell() // alignment) * alignment
    return header
