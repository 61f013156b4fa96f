"""kit plan: figures computed independently here, on GGUF files the tests write (one with real 27B shapes, sparse)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from kit import modelinfo, plan, resolve
from kit.errors import KitError
from tests.conftest import make_config
from tests.ggufmodels import SHAPES_27B, tensor_shapes, write_sparse_27b, write_tiny_llama

GIB = 2**30


@pytest.fixture(scope="module")
def model27(tmp_path_factory):
    path = write_sparse_27b(tmp_path_factory.mktemp("m") / "qwen-27b-IQ4_XS.gguf")
    return path


def expected_weights(shapes: dict, block: int = 256, block_bytes: int = 136) -> int:
    total = 0
    for _name, shape in tensor_shapes(shapes):
        n = int(np.prod(shape))
        total += n * 4 if len(shape) == 1 else n // block * block_bytes
    return total


def test_sparse_file_costs_no_disk(model27):
    st = model27.stat()
    assert st.st_size > 14e9 and st.st_blocks * 512 < 10e6


def test_reads_the_27b_header(model27):
    m = modelinfo.read(model27)
    assert (m.n_layer, m.n_embd, m.n_head, m.n_head_kv, m.head_dim) == (64, 5120, 40, 8, 128)
    assert m.n_vocab == 151936 and m.context_length == 40960
    assert m.weights_bytes == expected_weights(SHAPES_27B)
    # seed: a 27B IQ4_XS is about 15 GB
    assert 13.5e9 < m.weights_bytes < 16e9


def test_dual_v100_16k_per_gpu_figures(model27):
    config = make_config({})
    p = plan.make_plan(config, modelinfo.read(model27))
    # llama.cpp puts layer il on the first GPU whose share exceeds il / 65 (64 layers + the output layer):
    # il <= 32 (32/65 = 0.492 < 0.5) on GPU 0, so 33 + 31, and the output layer (64/65) on GPU 1
    assert p.fits and [len(g.layers) for g in p.gpus] == [33, 31]
    # per layer: 4 slots (serve.concurrency) x 16384 tokens x 8 KV heads x 128 x (2 + 2 bytes: f16 K and V) = 256 MiB
    kv_layer = 4 * 16384 * 8 * 128 * (2 + 2)
    assert kv_layer == 256 * 2**20
    assert [g.kv for g in p.gpus] == [33 * kv_layer, 31 * kv_layer]
    assert p.slots == 4 and p.serves == "4 concurrent requests of up to 16384 tokens each"
    layer = expected_weights({**SHAPES_27B, "n_layer": 1}) - expected_weights({**SHAPES_27B, "n_layer": 0})
    output = 151936 * 5120 // 256 * 136 + 5120 * 4
    assert p.gpus[0].weights == 33 * layer
    assert p.gpus[1].weights == 31 * layer + output
    assert p.host_bytes == 151936 * 5120 // 256 * 136  # token embeddings stay on the host
    assert all(g.overhead == 450 * 2**20 for g in p.gpus)
    # GPU 1 has ~0.5 GiB left at 16384; each more token per slot costs 4 x 32 x 8 x 128 x 4 B = 512 KiB there
    assert 16384 < p.max_ctx < 16384 + 1024 * 2 and (p.batch, p.ubatch) == (512, 512)


def test_seed_kv_figures_are_plausible(model27):
    """Seeds: KV 2-4 GB at 8K, 6-8 GB at 32K; 16 GB cards run a 27B but cramped."""
    config = make_config({"serve": {"concurrency": 1}})  # the seeds' figures are for one request
    m = modelinfo.read(model27)
    kv8 = sum(g.kv for g in plan.plan_layer_split(config, m, 8192).gpus)
    kv32 = sum(g.kv for g in plan.plan_layer_split(config, m, 32768).gpus)
    assert 2 * GIB <= kv8 <= 4 * GIB
    assert 6 * GIB <= kv32 <= 8 * GIB
    cramped = plan.plan_layer_split(config, m, 32768)
    assert all(g.fits for g in cramped.gpus) and max(g.used / g.total for g in cramped.gpus) > 0.65


def test_q8_kv_halves_the_cache(model27):
    config = make_config({"engines": {"llama.cpp": {"cache_type_k": "q8_0", "cache_type_v": "q8_0"}}})
    p = plan.plan_layer_split(config, modelinfo.read(model27), 16384)
    # q8_0: 34 bytes per 32 values = 1.0625 B per value, K and V: 2.125 B; 4 slots x 32 layers x 16384 x 8 x 128
    assert p.gpus[0].kv == 33 * int(4 * 16384 * 8 * 128 * 2 * 1.0625)


def test_does_not_fit_exits_1_with_the_cheapest_fix(model27, tmp_path):
    cfg_file = tmp_path / "kit.yaml"
    cfg_file.write_text(yaml.safe_dump({"preset": "single-v100-32g", "hardware": {"memory_gib": 16},
                                        "serve": {"concurrency": 1}}))
    result = subprocess.run([sys.executable, "-m", "kit", "plan", str(model27), "-c", str(cfg_file), "--ctx", "32768"],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert "does not fit at ctx 32768" in result.stderr
    assert "shorten model.ctx to" in result.stderr and "one more GPU (2 in total)" in result.stderr
    data = json.loads(subprocess.run([sys.executable, "-m", "kit", "plan", str(model27), "-c", str(cfg_file), "--json", "--ctx", "8192"],
                                     capture_output=True, text=True).stdout)
    assert data["fits"] is True and data["gpus"][0]["weights"] == modelinfo.read(model27).weights_bytes - data["host_bytes"]


def test_largest_ctx_is_the_boundary(model27):
    config = make_config({"preset": "single-v100-32g", "hardware": {"memory_gib": 16}})
    m = modelinfo.read(model27)
    best = plan.largest_ctx(config, m)
    assert all(g.fits for g in plan.plan_layer_split(config, m, best).gpus)
    assert not all(g.fits for g in plan.plan_layer_split(config, m, best + plan.CTX_STEP).gpus)


def test_tensor_split_ratios(model27):
    config = make_config({"engines": {"llama.cpp": {"tensor_split": [3, 1]}}})
    p = plan.plan_layer_split(config, modelinfo.read(model27), 4096)
    # il / 65 < 0.75 for il <= 48: 49 layers on GPU 0, 15 on GPU 1
    assert [len(g.layers) for g in p.gpus] == [49, 15]
    # 4 layers + output over [1, 1]: il / 5 = 0, 0.2, 0.4 on GPU 0; 0.6, 0.8 (the output layer) on GPU 1
    assert plan.assign_layers(4, [1, 1]) == [0, 0, 0, 1, 1]
    # a boundary exactly on a share goes to the next GPU (upper_bound): 63 layers, il = 32 -> 32/64 = 0.5
    assert plan.assign_layers(63, [1, 1])[31:33] == [0, 1]


def test_row_and_tensor_split(model27):
    m = modelinfo.read(model27)
    layer_mode = plan.plan_layer_split(make_config({}), m, 4096)
    row = plan.plan_layer_split(make_config({"engines": {"llama.cpp": {"split_mode": "row"}}}), m, 4096)
    tensor = plan.plan_layer_split(make_config({"engines": {"llama.cpp": {"split_mode": "tensor"}}}), m, 4096)
    # row: matrices split in half over both GPUs, norms and the KV cache stay with the layer's GPU (33 + 31)
    norms = 2 * 5120 * 4  # attn_norm + ffn_norm, f32
    matrices = expected_weights({**SHAPES_27B, "n_layer": 1}) - expected_weights({**SHAPES_27B, "n_layer": 0}) - norms
    output = 151936 * 5120 // 256 * 136
    assert row.gpus[0].weights == 64 * matrices // 2 + output // 2 + 33 * norms
    assert row.gpus[1].weights == 64 * matrices // 2 + output // 2 + 31 * norms + 5120 * 4
    assert [g.kv for g in row.gpus] == [g.kv for g in layer_mode.gpus]
    # tensor: heads split, so each GPU holds half of every layer's KV
    kv_layer = 4 * 4096 * 8 * 128 * 4
    assert [g.kv for g in tensor.gpus] == [64 * kv_layer // 2] * 2


def test_sliding_window_read_from_the_file(tmp_path):
    import gguf

    # llama.cpp's key <arch>.attention.sliding_window_pattern: one bool per layer, true = sliding-window layer
    path = write_tiny_llama(tmp_path / "swa.gguf", extra={"llama.attention.sliding_window": 512,
                                                         "llama.attention.sliding_window_pattern": [True, False]})
    m = modelinfo.read(path)
    assert (m.sliding_window, m.swa_layers) == (512, [0])
    # layer 0 keeps 512 tokens, layer 1 all 4096: tokens x 2 KV heads x 16 x (2 + 2 bytes)
    assert plan.layer_kv_bytes(m, 0, 4096, "f16", "f16") == 512 * 2 * 16 * 4
    assert plan.layer_kv_bytes(m, 1, 4096, "f16", "f16") == 4096 * 2 * 16 * 4
    # the period form (every 2nd layer full): layer 0 sliding, layer 1 full
    period = write_tiny_llama(tmp_path / "p.gguf", extra={"llama.attention.sliding_window": 256,
                                                          "llama.attention.sliding_window_pattern": 2})
    assert modelinfo.read(period).swa_layers == [0]
    assert gguf.GGUFReader(str(path)).fields["llama.attention.sliding_window"].contents() == 512


def test_mtp_layers_read_from_the_file(tmp_path):
    with_mtp = write_tiny_llama(tmp_path / "mtp.gguf", extra={"llama.nextn_predict_layers": 1})
    assert modelinfo.read(with_mtp).mtp_layers == 1
    assert modelinfo.read(write_tiny_llama(tmp_path / "plain.gguf")).mtp_layers == 0


def test_concurrency_is_a_fix_when_it_does_not_fit(model27):
    # one 20 GiB GPU at 8192 tokens per request: 12.84 GiB of layer weights + 0.41 compute + 0.44 CUDA context
    # = 13.69 GiB, and each slot's KV is 64 layers x 8192 x 8 x 128 x 4 B = 2 GiB: 4 slots = 21.69 (no),
    # 3 slots = 19.69 (yes)
    config = make_config({"preset": "single-v100-32g", "hardware": {"memory_gib": 20}, "model": {"ctx": 8192}})
    p = plan.make_plan(config, modelinfo.read(model27))
    assert not p.fits and "serve fewer requests at once (serve.concurrency: 3)" in p.fix, p.fix


def test_tiny_model_on_cpu(tmp_path):
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    config = make_config({"preset": "cpu"})
    p = plan.make_plan(config, modelinfo.read(path))
    assert p.gpus == [] and p.fits
    # 4 slots x 2 layers x 2048 tokens x (2 KV heads x 16) x (2 + 2 bytes)
    assert p.host_bytes == modelinfo.read(path).weights_bytes + 4 * 2 * 2048 * 2 * 16 * 4


def test_vllm_kv_pool_from_hf_config(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 64, "hidden_size": 5120, "num_attention_heads": 40,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 21504, "vocab_size": 151936,
        "max_position_embeddings": 40960}))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 16 * 10**9}}))
    config = make_config({"stack": {"primary": "vllm"}, "model": {"format": "hf"}})
    p = plan.make_plan(config, modelinfo.read(folder), "vllm", 16384)
    pool = int(16 * GIB * 0.9) - 8 * 10**9 - int(450 * 2**20 + 1.5 * GIB)
    per_token = 2 * 64 * 4 * 128 * 2  # TP=2 halves the KV heads per GPU
    assert p.kv_tokens == pool // per_token == 41041
    # 4 requests x 16384 = 65536 tokens do not fit the pool; each can have 41041 // 4 = 10260 -> 10240
    assert not p.fits and "shorten model.ctx to 10240" in p.fix
    two = plan.make_plan(make_config({"stack": {"primary": "vllm"}, "model": {"format": "hf"},
                                      "serve": {"concurrency": 2}}), modelinfo.read(folder), "vllm", 16384)
    assert two.fits and two.max_ctx == 41041 // 2


def test_ctx_auto_renders_the_planned_context(tmp_path):
    write_sparse_27b(tmp_path / "Qwen3.8-27B-IQ4_XS.gguf")
    config = make_config({"model": {"ctx": "auto", "dir": str(tmp_path)}})
    argv = list(resolve.engine(config, "llama.cpp").argv)
    chosen = int(argv[argv.index("--kv-unified-per-slot") + 1])
    assert argv[argv.index("--parallel") + 1] == "4"
    # the largest per-request context with 4 slots: it fits and one step more does not
    m = modelinfo.read(tmp_path / "Qwen3.8-27B-IQ4_XS.gguf")
    assert chosen % 256 == 0 and 16384 < chosen < 40960
    assert all(g.fits for g in plan.plan_layer_split(config, m, chosen).gpus)
    assert not all(g.fits for g in plan.plan_layer_split(config, m, chosen + 256).gpus)
    missing = make_config({"model": {"ctx": "auto", "dir": str(tmp_path / "nope")}})
    with pytest.raises(KitError) as err:
        list(resolve.engine(missing, "llama.cpp").argv)
    assert err.value.line().startswith("model.ctx: auto needs the model at")


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"nope")
    with pytest.raises(KitError) as err:
        modelinfo.read(bad)
    assert err.value.field == "MODEL" and "is not a readable GGUF file" in err.value.problem


def _hf_model(folder, total_bytes):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 64, "hidden_size": 5120, "num_attention_heads": 40,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 21504, "vocab_size": 151936,
        "max_position_embeddings": 40960}))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total_bytes}}))


@pytest.mark.parametrize("preset,memory,util,expect", [
    ("ninfer-primary", 16, 0.9, "do not fit together"),
    # llama.cpp (4 slots x 16384) takes at most 15.46 GiB of a 32 GiB GPU: 16.54 / 32 = 0.52 is left for NInfer
    ("ninfer-primary", 32, 0.9, "set engines.ninfer.gpu_memory_utilization: 0.52"),
    ("ninfer-primary", 32, 0.5, None),
])
def test_stack_plan_primary_and_fallback_share_gpus(tmp_path, preset, memory, util, expect):
    """The seeds' final setup: NInfer reserves gpu_memory_utilization of every GPU, llama.cpp needs its share too."""
    _hf_model(tmp_path / "Qwen3.8-27B-NF4", 15 * 10**9)
    write_sparse_27b(tmp_path / "Qwen3.8-27B-IQ4_XS.gguf")
    cfg_file = tmp_path / "kit.yaml"
    cfg_file.write_text(yaml.safe_dump({"preset": preset, "model": {"dir": str(tmp_path)},
                                        "hardware": {"memory_gib": memory},
                                        "engines": {"ninfer": {"gpu_memory_utilization": util}}}))
    result = subprocess.run([sys.executable, "-m", "kit", "plan", "--stack", "-c", str(cfg_file)],
                            capture_output=True, text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    if expect is None:
        assert result.returncode == 0, result.stdout + result.stderr
    else:
        assert result.returncode == 1, result.stdout + result.stderr
        assert expect in result.stderr
    assert "together" in result.stdout


def test_compute_buffer_matches_llama_cpp_log_on_h200(model27):
    """`CUDA0 compute buffer size` from llama.cpp's own log on an H200, 27B shape (5120 wide, FFN 21504, 40/8 heads
    of 128, vocabulary 151936): benchmarks/results/gpu-compute-h200.json. Worked out by hand per row below:
      FFN peak per token: 4 B x (3 x 21504 + 3 x 5120) = 319,488 B      (x 512 tokens = 156 MiB)
      attention peak per token: 4 B x (4 x 5120 + 2 x 8 x 128) = 90,112 B (x 512 = 44 MiB)
      mask: 2 B x ctx per token; scores (flash off): 4 B x 40 heads x ctx per token"""
    m = modelinfo.read(model27)
    MiB = 2**20
    measured = {  # (ctx per slot, ubatch, flash) -> MiB in llama.cpp's log
        (16384, 512, True): 172.01, (16384, 256, True): 86.01, (16384, 1024, True): 344.02,
        (4096, 512, True): 160.01, (32768, 512, True): 188.01, (65536, 512, True): 220.0,  # 65536: one unified stream
        (16384, 512, False): 1356.01, (4096, 512, False): 372.01, (16384, 256, False): 678.0,
    }
    by_hand = {
        (16384, 512, True): 512 * 319_488 + 16384 * 512 * 2,                       # 156 + 16
        (16384, 256, True): 256 * 319_488 + 16384 * 256 * 2,                       # 78 + 8
        (16384, 1024, True): 1024 * 319_488 + 16384 * 1024 * 2,                    # 312 + 32
        (4096, 512, True): 512 * 319_488 + 4096 * 512 * 2,                         # 156 + 4
        (32768, 512, True): 512 * 319_488 + 32768 * 512 * 2,                       # 156 + 32
        (65536, 512, True): 512 * 319_488 + 65536 * 512 * 2,                       # 156 + 64
        # flash off: attention (44 + 1280 scores + 16 mask) beats the FFN's 156, then the mask again
        (16384, 512, False): 512 * 90_112 + 40 * 16384 * 512 * 4 + 2 * 16384 * 512 * 2,
        (4096, 512, False): 512 * 90_112 + 40 * 4096 * 512 * 4 + 2 * 4096 * 512 * 2,
        (16384, 256, False): 256 * 90_112 + 40 * 16384 * 256 * 4 + 2 * 16384 * 256 * 2,
    }
    for (ctx, ubatch, flash), mib in measured.items():
        planned = plan.compute_bytes(m, ctx, ubatch, flash, True, 4)
        assert planned == by_hand[(ctx, ubatch, flash)], (ctx, ubatch, flash)
        assert abs(planned / MiB - mib) <= 0.02, (ctx, ubatch, flash, planned / MiB, mib)
    # the plan asks for one output per slot: 4 slots' logits (2.3 MiB) fit in what the layers freed
    config = make_config({"preset": "single-v100-32g"})
    assert plan.plan_layer_split(config, m, 16384).gpus[0].compute == by_hand[(16384, 512, True)]
    # a whole batch of outputs (embeddings) would not: 151936 x 512 x 4 B = 297 MiB > the FFN's 156
    assert plan.compute_bytes(m, 16384, 512, True, True, 512) == 151936 * 512 * 4 + 16384 * 512 * 2


def test_draft_tokens_add_outputs(tmp_path):
    from tests.ggufmodels import write_tiny_llama

    with_mtp = modelinfo.read(write_tiny_llama(tmp_path / "mtp.gguf", extra={"llama.nextn_predict_layers": 1}))
    plain = modelinfo.read(write_tiny_llama(tmp_path / "plain.gguf"))
    config = make_config({})
    # spec_type auto: draft-mtp with spec_draft_n_max 3 on a model with MTP layers -> 4 slots x (1 + 3) outputs
    assert plan.server_outputs(config, with_mtp) == 16 and plan.server_outputs(config, plain) == 4
    # at most one batch: 200 slots x (1 + 3) = 800 outputs, capped at batch 512
    assert plan.server_outputs(make_config({"serve": {"concurrency": 200}}), with_mtp) == 512


def test_cuda_context_is_the_gpus_own_where_measured():
    assert plan.cuda_context_bytes(make_config({})) == 450 * 2**20  # V100: the seeds' upper end
    # H200: nvidia-smi's used memory less llama.cpp's model, KV and compute buffers = 601.2 MiB at all 9 settings
    assert plan.cuda_context_bytes(make_config({"hardware": {"gpu_model": "NVIDIA H200"}})) == 602 * 2**20


def test_roofline_reads_the_weights_on_the_gpus_not_the_file(model27):
    """#15 item 6: the limit divides by the bytes a token reads on the GPUs (kit plan's split), not the whole file;
    token embeddings stay on the host and a token reads one row of them."""
    from kit import roofline

    m = modelinfo.read(model27)
    p = plan.make_plan(make_config({}), m)
    layer = expected_weights({**SHAPES_27B, "n_layer": 1}) - expected_weights({**SHAPES_27B, "n_layer": 0})
    output = 151936 * 5120 // 256 * 136 + 5120 * 4  # output matrix (IQ4_XS blocks) + output norm (f32)
    on_gpus = 64 * layer + output
    assert sum(g.weights for g in p.gpus) == on_gpus
    # layer split: the two V100s take turns, 900 GB/s each: 900e9 / bytes on both
    r = roofline.plan_roofline([g.weights for g in p.gpus], 0, "layer", 900, 0, "")
    assert r.tok_s == 900e9 / on_gpus and r.read_bytes == on_gpus and r.bandwidth_source.startswith("datasheet")
    assert r.tok_s > 900e9 / m.weights_bytes  # the whole file (with the 0.42 GB embeddings) was the old divisor
    # row split: both read at once, the larger share sets the pace
    row = roofline.plan_roofline([6 * 10**9, 8 * 10**9], 0, "row", 900, 0, "")
    assert row.tok_s == 900e9 / 8e9
    # cpu: the layers from host memory at the host's bandwidth
    cpu = roofline.plan_roofline([], 10**9, "layer", 0, 40.0, "measured (copy test on this host)")
    assert cpu.tok_s == 40.0 and "measured" in cpu.line(20.0) and "50% of the 40.0 tok/s" in cpu.line(20.0)


def test_host_bandwidth_is_measured():
    from kit import roofline

    gbs = roofline.host_bandwidth_gbs(size=16 * 2**20, rounds=2)
    assert 0.1 < gbs < 10_000  # a real copy: neither zero nor infinite


def test_v_cache_has_its_own_type(model27):
    """K f16 and V q8_0: 2 + 1.0625 bytes per value, not K's type twice (a mutation that survived before)."""
    config = make_config({"engines": {"llama.cpp": {"cache_type_k": "f16", "cache_type_v": "q8_0"}}})
    p = plan.plan_layer_split(config, modelinfo.read(model27), 16384)
    # 4 slots x 16384 tokens x 8 KV heads x 128 x (2 + 1.0625) bytes, per layer; 33 layers on GPU 0
    assert p.gpus[0].kv == 33 * int(4 * 16384 * 8 * 128 * (2 + 1.0625))


def test_recommend_batch_shrinks_when_512_does_not_fit(model27):
    """ubatch 512 -> 256 saves 86 MiB here (by hand: 256 x 319,488 B of FFN peak + 16384 x 256 x 2 B of mask =
    90,177,536 B), so a card 43 MiB short at 512 fits at 256."""
    m = modelinfo.read(model27)
    single = {"preset": "single-v100-32g"}
    used_512 = plan.plan_layer_split(make_config(single), m, 16384, ubatch=512).gpus[0].used
    used_256 = plan.plan_layer_split(make_config(single), m, 16384, ubatch=256).gpus[0].used
    assert used_512 - used_256 == 90_177_536
    short = make_config({**single, "hardware": {"memory_gib": (used_512 - 43 * 2**20) / GIB}})
    assert plan.recommend_batch(short, m, 16384) == (256, 256)
    assert plan.recommend_batch(make_config(single), m, 16384) == (512, 512)


def test_three_uneven_gpus_get_layers_as_llama_cpp_assigns_them(model27):
    """[1, 1, 2] over 64 layers + the output layer (65): cumulative shares 0.25 / 0.5 / 1.0; layer il goes to the first
    GPU whose share exceeds il / 65: il 0-16 (16/65 = 0.246) on GPU 0, 17-32 (32/65 = 0.492) on GPU 1, the rest
    (33-63 and the output layer) on GPU 2."""
    config = make_config({"hardware": {"gpus": 3, "device_ids": ["0", "1", "2"]},
                          "engines": {"llama.cpp": {"tensor_split": [1, 1, 2]}}})
    p = plan.plan_layer_split(config, modelinfo.read(model27), 4096)
    assert [len(g.layers) for g in p.gpus] == [17, 16, 31]
    assert p.gpus[0].layers[-1] == 16 and p.gpus[1].layers == list(range(17, 33))
    assert plan.assign_layers(64, [1, 1, 2])[64] == 2  # the output layer


def test_split_mode_none_keeps_everything_on_one_gpu(model27):
    config = make_config({"engines": {"llama.cpp": {"split_mode": "none"}}})
    p = plan.plan_layer_split(config, modelinfo.read(model27), 4096)
    assert [len(g.layers) for g in p.gpus] == [64, 0] and p.gpus[1].weights == 0 and p.gpus[1].kv == 0


# llama.cpp reads "on", "true" and "1" as on (common/arg.cpp, is_truthy); YAML's unquoted on/true is True
@pytest.mark.parametrize("value,flash", [("on", True), ("auto", True), (True, True), ("true", True), (1, True),
                                         ("1", True), ("off", False), (False, False), (0, False)])
def test_flash_attention_setting_decides_the_scores(model27, value, flash):
    m = modelinfo.read(model27)
    config = make_config({"preset": "single-v100-32g", "engines": {"llama.cpp": {"flash_attn": value}}})
    compute = plan.plan_layer_split(config, m, 16384).gpus[0].compute
    assert compute == plan.compute_bytes(m, 16384, 512, flash, True, 4)
    # by hand: on = 172 MiB, off = 1356 MiB (llama.cpp's log on the H200, 4 x 16384, ubatch 512)
    assert compute == (180_355_072 if flash else 1_421_869_056)


def test_unknown_kv_cache_type_names_its_own_field(model27):
    m = modelinfo.read(model27)
    for key in ("cache_type_k", "cache_type_v"):
        try:
            config = make_config({"engines": {"llama.cpp": {key: "q9_9"}}})
        except KitError as exc:  # the config itself may refuse it first: then it must name the same field
            assert exc.field == f"engines.llama.cpp.{key}", exc.line()
            continue
        with pytest.raises(KitError) as err:
            plan.plan_layer_split(config, m, 4096)
        assert err.value.field == f"engines.llama.cpp.{key}" and "q9_9" in err.value.problem


@pytest.mark.parametrize("text,problem", [
    ("{}", "config.json has no num_attention_heads, hidden_size, num_hidden_layers"),
    ("{not json", "is not JSON"),
    ("[1, 2]", "is not a JSON object"),
    ('{"num_attention_heads": 0, "hidden_size": 64, "num_hidden_layers": 2}', "has a value kit cannot read"),
    ('{"num_attention_heads": "many", "hidden_size": 64, "num_hidden_layers": 2}', "has a value kit cannot read"),
])
def test_a_checkpoint_folder_kit_cannot_read_is_one_line_naming_the_engines_field(tmp_path, text, problem):
    """`kit render` / `kit plan` on a folder whose config.json is not a transformer's: one line, the engine's
    model_file field, exit 2, nothing written (it was a KeyError traceback)."""
    import subprocess
    import sys

    models = tmp_path / "models"
    (models / "ckpt").mkdir(parents=True)
    (models / "ckpt" / "config.json").write_text(text)
    (tmp_path / "kit.yaml").write_text(f"stack: {{primary: vllm}}\nmodel: {{dir: {models}, format: hf}}\n"
                                       "engines: {vllm: {model_file: ckpt}}\n")
    for command in (["render"], ["plan"]):
        result = subprocess.run([sys.executable, "-m", "kit", *command], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: engines.vllm.model_file: ") and problem in lines[0]
    assert not (tmp_path / "out").exists()


def test_plan_report_rows_are_the_plans_figures_in_gib(tmp_path):
    """The rows kit plan prints, from a plan whose figures are set by hand (GiB = 2**30 bytes)."""
    from kit import planreport
    from kit.plan import GpuPlan, StackPlan

    gib = 2**30
    gpu = GpuPlan(index=0, total=16 * gib, layers=[0, 1, 2], weights=7 * gib, kv=gib // 2, compute=gib // 4,
                  overhead=gib // 4)
    made = plan.Plan(engine="llama.cpp", model={}, ctx=8192, gpus=[gpu], host_bytes=gib // 8, max_ctx=40960,
                     batch=512, ubatch=512, slots=4)
    info = modelinfo.ModelInfo(path=str(tmp_path / "m.gguf"), format="gguf", architecture="llama", n_layer=3, n_embd=64,
                               n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_vocab=100, context_length=4096,
                               weights_bytes=7 * gib)
    report = planreport.single(made, info, "llama.cpp")
    # used = 7 + 0.5 + 0.25 + 0.25 = 8.00 GiB of 16.0; free 8.00
    assert report.rows == [["0", "3", "7.00", "0.50", "0.25", "0.25", "8.00", "16.0", "8.00", "yes"]]
    assert len(report.header) == len(report.rows[0]) and report.header[-1] == "fits"
    assert report.lines[0] == "host memory: 0.12 GiB (token embeddings)"  # 1/8 GiB = 0.125, shown as 0.12
    assert report.lines[-1] == "largest context per request that fits: 40960; recommended --batch-size 512 --ubatch-size 512"
    assert report.warnings and report.warnings[0].startswith("model.ctx 8192 is longer than m.gguf was trained for (4096)")
    # two engines on one 16 GiB GPU: 8 + 8 = 16.00 fits (<=), one byte more does not
    other = plan.Plan(**{**made.__dict__, "engine": "ninfer", "gpus": [GpuPlan(**gpu.__dict__)]})
    together = StackPlan([made, other], 16 * gib)
    assert planreport.stack(together).rows == [["0", "8.00", "8.00", "16.00", "16.0", "yes"]]
