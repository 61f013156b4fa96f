"""kit.ggufheader against gguf's own GGUFReader (the independent oracle: gguf-py reads every value), on files written
with gguf's GGUFWriter: a real-size vocabulary whose strings are skipped, long scalar arrays, another alignment, and
headers broken in each way the reader must name."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from kit import ggufheader
from tests.ggufmodels import SHAPES_27B, write_sparse_27b, write_tiny_llama


def oracle(path: Path):
    import gguf

    reader = gguf.GGUFReader(str(path))
    lengths = {f.name: len(f.data) for f in reader.fields.values() if f.types and f.types[0] == gguf.GGUFValueType.ARRAY}
    tensors = [(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.n_bytes)) for t in reader.tensors]
    return reader, lengths, tensors


@pytest.fixture(scope="module")
def real_vocab(tmp_path_factory):
    """A 27B-shaped header (llama architecture) with the 151,936-token vocabulary."""
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    write_sparse_27b(path, "Q4_K", SHAPES_27B, arch="llama", vocab=True)
    return path


def test_the_header_matches_gguf_reader(real_vocab):
    reader, lengths, tensors = oracle(real_vocab)
    header = ggufheader.read(real_vocab)
    # every array's length, the 151,936-token vocabulary included (its strings skipped, not read)
    assert header.array_lengths == lengths and header.array_lengths["tokenizer.ggml.tokens"] == 151936
    assert header.keys["tokenizer.ggml.tokens"] is None  # longer than KEEP_ARRAY: kept by length only
    assert [(t.name, t.shape, t.type_id, t.nbytes) for t in header.tensors] == tensors
    assert header.data_offset == reader.data_offset
    assert header.get("llama.block_count") == 64 and header.get("absent", "d") == "d"


def test_long_scalar_arrays_are_skipped_by_their_size_and_short_ones_kept(tmp_path):
    import gguf

    path = tmp_path / "arrays.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("kit.long_f32", [0.5] * 5000)            # > KEEP_ARRAY: one seek of 5000 x 4 bytes
    writer.add_array("kit.exactly_keep", list(range(ggufheader.KEEP_ARRAY)))  # kept: the limit is inclusive
    writer.add_array("kit.words", ["a", "bb", "ccc"])
    writer.add_uint32("kit.after", 7)                        # read after the skips: the offsets were right
    writer.add_tensor("t", np.ones((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = ggufheader.read(path)
    reader, lengths, tensors = oracle(path)
    assert header.keys["kit.long_f32"] is None and header.array_lengths["kit.long_f32"] == 5000
    assert header.keys["kit.exactly_keep"] == list(range(ggufheader.KEEP_ARRAY))
    assert header.keys["kit.words"] == ["a", "bb", "ccc"] and header.keys["kit.after"] == 7
    assert header.array_lengths == lengths
    # t: 4 x 8 f32 = 128 bytes, shape stored ne[0] first
    assert [(t.name, t.shape, t.type_name, t.nbytes) for t in header.tensors] == [("t", (8, 4), "F32", 128)]
    assert header.data_offset == reader.data_offset


def test_another_alignment_moves_the_data_offset(tmp_path):
    import gguf

    offsets = {}
    for alignment in (32, 64, 256):
        path = tmp_path / f"a{alignment}.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        if alignment != 32:
            writer.add_custom_alignment(alignment)
        writer.add_tensor("t", np.ones(3, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        header = ggufheader.read(path)
        assert header.data_offset % alignment == 0 and header.data_offset == oracle(path)[0].data_offset
        offsets[alignment] = header.data_offset
    assert offsets[256] >= offsets[64] >= offsets[32]


def _valid(tmp_path: Path) -> bytes:
    return write_tiny_llama(tmp_path / "tiny.gguf").read_bytes()


@pytest.mark.parametrize("damage,message", [
    (lambda b: b"GGUX" + b[4:], "no GGUF magic"),
    (lambda b: b[:4] + struct.pack("<I", 1) + b[8:], "GGUF version 1 is too old"),
    (lambda b: b[:200], "the header ends early"),                  # cut inside the keys
    (lambda b: b[:23], "the header ends early"),                   # cut inside the counts
])
def test_broken_headers_are_named(tmp_path, damage, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(damage(_valid(tmp_path)))
    with pytest.raises(ggufheader.GGUFError) as err:
        ggufheader.read(path)
    assert str(err.value) == message  # the whole message: a reader's words are what the user sees


def test_version_2_is_read_and_the_data_starts_at_the_next_32_bytes(tmp_path):
    # magic (4) + version (4) + tensor count (8) + key count (8) = 24 bytes, no keys, no tensors: with no
    # general.alignment the data starts at the next multiple of 32 (ggml docs/gguf.md: GGUF_DEFAULT_ALIGNMENT), 32
    path = tmp_path / "v2.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 2, 0, 0))
    header = ggufheader.read(path)
    assert (header.version, header.data_offset, header.keys, header.tensors) == (2, 32, {}, [])
    # one key general.alignment = 128 (uint32, type 4): 24 + 8 + 17 + 4 + 4 = 57 bytes, so the data starts at 128
    # (at 64 had the default 32 been used)
    key = b"general.alignment"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                     + struct.pack("<II", 4, 128))
    header = ggufheader.read(path)
    assert (header.version, header.get("general.alignment"), header.data_offset) == (3, 128, 128)


def test_an_unknown_value_type_is_named(tmp_path):
    # magic, version 3, 0 tensors, 1 key "k" of value type 99
    blob = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99)
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    with pytest.raises(ggufheader.GGUFError, match="key k has unknown value type 99"):
        ggufheader.read(path)


def test_a_long_array_of_arrays_cannot_be_skipped(tmp_path):
    # key "nested": ARRAY (9) of ARRAY (9), 5000 long: no fixed size to seek past
    blob = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 6) + b"nested" + struct.pack("<I", 9)
            + struct.pack("<IQ", 9, 5000))
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    with pytest.raises(ggufheader.GGUFError, match="key nested is an array of 9, which this reader cannot skip"):
        ggufheader.read(path)


def test_an_unknown_tensor_type_is_named(tmp_path):
    blob = (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1) + b"t" + struct.pack("<I", 1)
            + struct.pack("<Q", 8) + struct.pack("<I", 999) + struct.pack("<Q", 0))
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    with pytest.raises(ggufheader.GGUFError, match="unknown tensor type 999"):
        ggufheader.read(path)


def test_quantized_tensor_bytes_are_blocks_times_block_size(tmp_path):
    # Q4_K: 256 values per 144-byte block; a 512 x 256 tensor is 512 blocks = 73,728 bytes (worked by hand)
    write_sparse_27b(tmp_path / "q.gguf", "Q4_K", {**SHAPES_27B, "n_layer": 1, "n_embd": 256, "n_head": 2,
                                                   "n_head_kv": 2, "head_dim": 128, "n_ff": 512, "n_vocab": 512},
                     arch="llama")
    header = ggufheader.read(tmp_path / "q.gguf")
    ffn_up = next(t for t in header.tensors if t.name == "blk.0.ffn_up.weight")
    assert ffn_up.type_name == "Q4_K" and ffn_up.shape == (256, 512) and ffn_up.nbytes == 73728
    assert isinstance(ffn_up.nbytes, int)  # whole blocks: an integer count of bytes, never a float


def test_an_alignment_of_0_means_the_default_and_bad_utf8_is_replaced(tmp_path):
    # general.alignment = 0 (uint32): no alignment given, so 32; the key "k" holds the string b"\xffok" (a string
    # is type 8: an 8-byte length, then the bytes), which is no UTF-8: read with U+FFFD, not an error
    key = b"general.alignment"
    blob = (b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + struct.pack("<Q", len(key)) + key + struct.pack("<II", 4, 0)
            + struct.pack("<Q", 1) + b"k" + struct.pack("<IQ", 8, 3) + b"\xffok")
    path = tmp_path / "a0.gguf"
    path.write_bytes(blob)
    header = ggufheader.read(path)
    # 24 + (8 + 17 + 4 + 4) + (8 + 1 + 4 + 8 + 3) = 81 bytes: the next multiple of 32 is 96
    assert (header.get("general.alignment"), header.get("k"), header.data_offset) == (0, "\ufffdok", 96)
