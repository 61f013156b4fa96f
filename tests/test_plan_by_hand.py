"""`kit plan`'s arithmetic against figures worked out by hand (#12): a toy model whose every tensor has a round size,
on GPUs of 1 GiB, so each expected byte count below is a sum a reader can redo in the comment beside it. Nothing
here calls the formula it checks; the 27B checks in test_plan.py read a real-shaped header, these pin the sums.

Units: MiB = 1048576, GiB = 1073741824. The V100 has no measured CUDA context in images/gpus.yaml, so kit plans
with the table's default, 450 MiB = 471859200 per GPU.
"""

from __future__ import annotations

import pytest

from kit import plan
from kit.errors import KitError
from kit.modelinfo import ModelInfo, TensorInfo
from tests.conftest import make_config

MIB = 1048576
OVERHEAD = 450 * MIB  # 471859200


def toy(context_length: int = 131072, mtp_layers: int = 0, ffn_mib: int = 64, n_vocab: int = 400000,
        swa_layers: tuple[int, ...] = ()) -> ModelInfo:
    """4 layers, 2 KV heads of 64: one token of one layer's f16 K+V is 2 x 64 x (2 + 2) = 512 bytes.
    Tensors: token_embd 1 MiB + token_embd_norm 1 KiB (both stay on the host), blk.i.ffn_up ``ffn_mib`` MiB each,
    blk.0.attn_norm 4 KiB (a norm: never split by rows), output 8 MiB (the last GPU). ``swa_layers`` keep a sliding
    window of 512 tokens."""
    tensors = [TensorInfo("token_embd.weight", MIB, "Q8_0", None),
               TensorInfo("token_embd_norm.weight", 1024, "F32", None),
               *(TensorInfo(f"blk.{i}.ffn_up.weight", ffn_mib * MIB, "Q8_0", i) for i in range(4)),
               TensorInfo("blk.0.attn_norm.weight", 4096, "F32", 0),
               TensorInfo("output.weight", 8 * MIB, "Q8_0", None)]
    return ModelInfo(path="/models/toy.gguf", format="gguf", architecture="llama", n_layer=4, n_embd=256, n_head=4,
                     n_head_kv=2, head_dim=64, n_ff=512, n_vocab=n_vocab, context_length=context_length,
                     tensors=tensors, weights_bytes=sum(t.nbytes for t in tensors), mtp_layers=mtp_layers,
                     sliding_window=512 if swa_layers else 0, swa_layers=list(swa_layers))


def config(memory_gib: float = 1, concurrency: int = 4, llama: dict | None = None, **more):
    data = {"hardware": {"memory_gib": memory_gib}, "serve": {"concurrency": concurrency},
            "engines": {"llama.cpp": llama or {}}}
    for key, value in more.items():
        data.setdefault(key, {}).update(value)
    return make_config(data)


def cpu_config():
    """No GPU, 2 slots."""
    return config(concurrency=2, hardware={"gpus": 0, "gpu_model": "none", "archs": [], "interconnect": "none",
                                           "device_ids": []}, engines={"llama.cpp": {"flavor": "cpu"}})


def gpu(index, weights, kv, compute, layers, total=1024 * MIB):
    used = weights + kv + compute + OVERHEAD
    return {"index": index, "total": total, "weights": weights, "kv": kv, "compute": compute, "overhead": OVERHEAD,
            "layers": layers, "host": "", "device": "", "used": used, "free": total - used, "fits": total >= used}


def test_layer_split_per_gpu_bytes():
    """2 GPUs [1, 1], 4 slots of 1024 tokens, ubatch 512, flash attention (auto), no draft.
    Layers: llama.cpp puts layer il on the first GPU whose cumulative share (0.5, 1.0) exceeds il / 5:
    0/5, 1/5, 2/5 -> GPU 0; 3/5 and the output layer (4/5) -> GPU 1.
    KV per layer: 4 slots x 1024 tokens x 512 B = 2 MiB; GPU 0 6 MiB = 6291456, GPU 1 2 MiB = 2097152.
    Weights: GPU 0 3 x 64 MiB + 4 KiB = 201330688; GPU 1 64 MiB + 8 MiB (output) = 75497472; host 1 MiB + 1 KiB.
    Compute (n_ff 512, n_embd 256, K/V width 128): mask 1024 x 512 x 2 = 1048576; FFN 512 x 4 x (3 x 512 + 3 x 256)
    = 4718592; attention 512 x 4 x (4 x 256 + 2 x 128) = 2621440; logits on the last GPU: 400000 x 4 outputs x 4 B
    = 6400000. GPU 0: 4718592 + 1048576 = 5767168; GPU 1: 6400000 + 1048576 = 7448576."""
    got = plan.plan_layer_split(config(), toy(), 1024).as_dict()
    assert got["gpus"] == [gpu(0, 201330688, 6291456, 5767168, [0, 1, 2]),
                           gpu(1, 75497472, 2097152, 7448576, [3])]
    assert {k: got[k] for k in ("engine", "ctx", "host_bytes", "max_ctx", "batch", "ubatch", "kv_tokens", "slots",
                                "fits")} == {"engine": "llama.cpp", "ctx": 1024, "host_bytes": 1049600, "max_ctx": 0,
                                             "batch": 512, "ubatch": 512, "kv_tokens": None, "slots": 4, "fits": True}
    assert got["model"]["n_layer"] == 4 and got["model"]["path"] == "/models/toy.gguf"


def test_sliding_window_layers_keep_their_window():
    """Layers 0 and 1 slide over 512 tokens: 4 slots x 512 x 512 B = 1 MiB each instead of 2 MiB. GPU 0 (layers 0,
    1, 2): 1 + 1 + 2 MiB = 4194304; GPU 1 (layer 3): 2 MiB. On the CPU (2 slots of 2048): 2 x 512 x 512 B = 0.5 MiB
    for each window layer, 2 x 2048 x 512 B = 2 MiB for the others: 5 MiB = 5242880 beside 277877760 of weights."""
    swa = toy(swa_layers=(0, 1))
    assert [g.kv for g in plan.plan_layer_split(config(), swa, 1024).gpus] == [4194304, 2097152]
    cpu = cpu_config()
    assert plan.plan_layer_split(cpu, swa, 2048).host_bytes == 277877760 + 5242880


def test_layers_follow_llama_cpps_float32_shares():
    """9 layers over [7, 3]: layer il goes to the first GPU whose share exceeds il / 10. In float32, as llama.cpp
    computes both, 7 / 10 equals the first share 0.7 exactly, so layer 7 goes to GPU 1 (upper_bound: the first share
    greater than the value); in float64 0.7 (0.69999999999999996) is above float32's 0.699999988, which would keep it
    on GPU 0. Layers 0-6 on GPU 0, layers 7, 8 and the output on GPU 1."""
    assert plan.assign_layers(9, [7.0, 3.0]) == [0] * 7 + [1] * 3


def test_row_split_cuts_matrices_but_not_norms_and_tensor_split_cuts_everything():
    """row: every matrix is halved (4 x 32 MiB + 4 MiB output = 132 MiB = 138412032 per GPU), the 4 KiB norm stays
    with layer 0 (GPU 0: 138416128); the KV stays with each layer's GPU (6 MiB / 2 MiB, as for layer).
    tensor: everything is halved, the norm too: (4 x 64 MiB + 8 MiB + 4 KiB) / 2 = 138414080 on each GPU, and so is
    the KV: 4 layers x 2 MiB / 2 = 4194304."""
    row = plan.plan_layer_split(config(llama={"split_mode": "row"}), toy(), 1024)
    assert [(g.weights, g.kv) for g in row.gpus] == [(138416128, 6291456), (138412032, 2097152)]
    tensor = plan.plan_layer_split(config(llama={"split_mode": "tensor"}), toy(), 1024)
    assert [(g.weights, g.kv) for g in tensor.gpus] == [(138414080, 4194304), (138414080, 4194304)]


def test_cpu_plan_is_all_host_memory():
    """No GPU: weights (4 x 64 MiB + 8 MiB + 1 MiB + 1 KiB + 4 KiB = 277877760) plus the KV of 4 layers x 2 slots
    x 2048 tokens x 512 B = 8 MiB = 8388608: 286267392 bytes on the host; the plan serves its own context."""
    cpu = cpu_config()
    got = plan.plan_layer_split(cpu, toy(), 2048).as_dict()
    assert got["gpus"] == [] and got["host_bytes"] == 277877760 + 8388608
    assert (got["engine"], got["ctx"], got["max_ctx"], got["batch"], got["ubatch"], got["slots"]) == \
        ("llama.cpp", 2048, 2048, 512, 512, 2)


def test_too_long_a_context_gets_every_fix_that_works_in_order():
    """4 slots of 65536 tokens on 1 GiB GPUs. GPU 0 holds 3 layers: weights 192 MiB + 4 KiB, KV 3 x 512 B x 4 x 65536
    = 384 MiB, compute 4.5 MiB + mask 65536 x 512 x 2 = 64 MiB, overhead 450 MiB: 1094.5 MiB + 4 KiB, 70.5 MiB
    over (0.07 GiB, printed 0.1).
    - longest context: GPU 0 has 1024 - 450 - 192 - 4.5 MiB - 4 KiB = 395833344 B for ctx x (3 x 512 x 4 + 1024)
      = 7168 x ctx: ctx <= 55222.4, in steps of 256: 55040;
    - 3 slots: 65536 x (3 x 512 x 3 + 1024) = 369098752 B fits in 395833344;
    - q8_0 K and V (1.0625 B each): 65536 x (3 x 2 x 64 x 2.125 x 4 + 1024) = 281018368 B fits;
    - 3 GPUs ([1, 1, 1]: layers 0, 1 | 2, 3 | output): GPU 0 128 MiB + 4 KiB + 256 MiB KV + 68.5 MiB + 450 MiB
      = 902.5 MiB + 4 KiB fits.
    The 512 ubatch does not fit and neither does any smaller one down to 64 (at 64: 642.5625 MiB + 4 KiB + 384 MiB
    + 8 MiB mask > 1024 MiB): the plan recommends 64 / 64."""
    got = plan.make_plan(config(model={"ctx": 65536}), toy(), "llama.cpp")
    assert not got.fits and got.max_ctx == 55040 and (got.batch, got.ubatch) == (64, 64)
    assert isinstance(got.batch, int) and isinstance(got.ubatch, int)  # they become --batch-size / --ubatch-size
    assert got.fix == ("shorten model.ctx to 55040; or serve fewer requests at once (serve.concurrency: 3); "
                       "or set cache_type_k/cache_type_v: q8_0 (halves the KV cache); "
                       "or a smaller quant (weights must shrink by 0.1 GiB on the fullest GPU); "
                       "or one more GPU (3 in total)")


def test_weights_that_fit_nowhere_leave_only_a_smaller_quant():
    """700 MiB per layer: GPU 0 holds 2100 MiB of weights with 1024 MiB to hold them; one slot of 1024 tokens.
    Used: 2100 MiB + 4 KiB + KV 3 x 0.5 MiB + compute (4.5 + 1) MiB + 450 MiB = 2557 MiB + 4 KiB: 1533 MiB + 4 KiB
    over = 1.497 GiB, printed 1.5. No context fits (0), one slot is the least, q8_0 does not help, and 3 GPUs still
    put 1400 MiB on GPU 0."""
    got = plan.make_plan(config(concurrency=1, model={"ctx": 1024}), toy(ffn_mib=700), "llama.cpp")
    assert got.max_ctx == 0
    assert got.fix == "a smaller quant (weights must shrink by 1.5 GiB on the fullest GPU)"


def test_fewer_slots_is_the_largest_count_that_fits():
    """GPU 0 has 395833344 B for ctx x (1536 x slots + 1024) (see above). At 65536 tokens: 4 slots need 469762048,
    3 need 369098752: 3. At 80000 tokens: 3 slots need 450560000, 2 need 327680000: 2. At 100000 tokens: 2 slots
    need 409600000 B, 1 needs 256000000: 1. At 131072 tokens with 2 slots: 1 slot needs 335544320: 1."""
    fix = plan.make_plan(config(model={"ctx": 80000}), toy(), "llama.cpp").fix
    assert "(serve.concurrency: 2)" in fix
    fix = plan.make_plan(config(model={"ctx": 100000}), toy(), "llama.cpp").fix
    assert "(serve.concurrency: 1)" in fix
    fix = plan.make_plan(config(concurrency=2, model={"ctx": 131072}), toy(), "llama.cpp").fix
    assert "(serve.concurrency: 1)" in fix


def test_a_batch_the_user_set_is_kept_when_the_ubatch_fits():
    """512 fits (test_layer_split_per_gpu_bytes): the recommended batch is the user's 2048, the ubatch 512."""
    got = plan.make_plan(config(model={"ctx": 1024}, llama={"batch": 2048}), toy(), "llama.cpp")
    assert (got.batch, got.ubatch) == (2048, 512)


def test_longest_context_is_capped_by_the_model():
    """The same GPUs hold 55040 tokens per slot, but a model trained for 8192 plans 8192. On 1.5 GiB GPUs, GPU 0 has
    1610612736 - 677908480 (weights, fixed compute and overhead) = 932704256 B: ctx <= 932704256 / 7168 = 130120.6,
    in steps of 256: 130048."""
    assert plan.largest_ctx(config(memory_gib=1.5), toy()) == 130048
    assert plan.largest_ctx(config(), toy(context_length=8192)) == 8192
    assert plan.largest_ctx(config(), toy(context_length=0)) == 55040  # unknown: up to 131072


def test_draft_tokens_and_an_explicit_spec_type():
    """Outputs = slots x (1 + draft), at most a batch. With MTP layers, auto becomes draft-mtp with 3 drafts:
    4 x 4 = 16; an explicit none stays none (4); a batch of 8 caps it at 8."""
    mtp = toy(mtp_layers=1)
    assert plan.server_outputs(config(), mtp) == 16
    assert plan.server_outputs(config(llama={"spec_type": "none"}), mtp) == 4
    assert plan.server_outputs(config(llama={"batch": 8}), mtp) == 8
    assert plan.server_outputs(config(), toy()) == 4  # no MTP layers: auto is none


def test_model_ctx_auto_plans_the_models_own_context():
    """make_plan without a ctx: model.ctx auto means the model's trained length, or 4096 when the header has none."""
    auto = config(model={"ctx": "auto"})
    assert plan.make_plan(auto, toy(context_length=8192), "llama.cpp").ctx == 8192
    assert plan.make_plan(auto, toy(context_length=0), "llama.cpp").ctx == 4096


def hf_toy(weights: int, context_length: int = 32768) -> ModelInfo:
    """4 layers, 2 KV heads of 128: under TP=2 one token's fp16 K+V per GPU is 2 x 4 x (2 / 2) x 128 x 2 = 2048 B."""
    return ModelInfo(path="/models/toy-hf", format="hf", architecture="LlamaForCausalLM", n_layer=4, n_embd=512,
                     n_head=8, n_head_kv=2, head_dim=128, n_ff=1024, n_vocab=1000, context_length=context_length,
                     weights_bytes=weights)


def vllm(memory_gib: float = 16, util: float = 0.8, concurrency: int = 4):
    return make_config({"stack": {"primary": "vllm"}, "hardware": {"memory_gib": memory_gib},
                        "serve": {"concurrency": concurrency}, "engines": {"vllm": {"gpu_memory_utilization": util}}})


def test_tensor_parallel_pool_by_hand():
    """16 GiB x 0.8 = 13743895347 B reserved per GPU (17179869184 x 0.8 = 13743895347.2); weights 8 GiB / 2 =
    4294967296; overhead 450 MiB + 1.5 GiB activations = 2082471936. Pool: 13743895347 - 4294967296 - 2082471936
    = 7366456115 B; at 2048 B a token: 3596902 tokens (7366456115 / 2048 = 3596902.4); 4 slots: 899225 each,
    capped at the model's 32768."""
    got = plan.plan_tensor_parallel(vllm(), "vllm", hf_toy(8 * 2**30), 16384).as_dict()
    each = {"total": 13743895347, "weights": 4294967296, "kv": 7366456115, "compute": 0, "overhead": 2082471936,
            "layers": [], "host": "", "device": "", "used": 13743895347, "free": 0, "fits": True}
    assert got["gpus"] == [{"index": 0, **each}, {"index": 1, **each}]
    assert {k: got[k] for k in ("engine", "ctx", "host_bytes", "max_ctx", "batch", "ubatch", "kv_tokens", "slots",
                                "fits")} == {"engine": "vllm", "ctx": 16384, "host_bytes": 0, "max_ctx": 32768,
                                             "batch": 0, "ubatch": 0, "kv_tokens": 3596902, "slots": 4, "fits": True}
    assert got["model"]["path"] == "/models/toy-hf"
    # a header with no trained length: the pool's share per slot
    assert plan.plan_tensor_parallel(vllm(), "vllm", hf_toy(8 * 2**30, 0), 16384).max_ctx == 899225


def test_tensor_parallel_on_one_gpu_and_on_three():
    """gpus=1: the whole 8 GiB on one GPU; per token 2 x 4 x 2 x 128 x 2 = 4096 B. Pool 13743895347 - 8589934592
    - 2082471936 = 3071488819 B: 749875 tokens (3071488819 / 4096 = 749875.2).
    gpus=3 (asked for, the config says 2): weights 8589934592 // 3 = 2863311530 each."""
    one = plan.plan_tensor_parallel(vllm(), "vllm", hf_toy(8 * 2**30), 16384, gpus=1)
    assert len(one.gpus) == 1 and one.gpus[0].weights == 8589934592 and one.kv_tokens == 749875
    three = plan.plan_tensor_parallel(vllm(), "vllm", hf_toy(8 * 2**30), 16384, gpus=3)
    assert [g.weights for g in three.gpus] == [2863311530] * 3 and [g.index for g in three.gpus] == [0, 1, 2]


def test_tensor_parallel_fixes():
    """Weights of 24 GiB: 12 GiB per GPU over the 12.8 GiB reserved leaves -0.7 GiB after the overhead: no pool
    (0, not negative), no tokens, and the fix is a smaller quant or a third GPU.
    A 16384-token request for each of 64 slots over a 3596902-token pool does not fit: 56201 tokens each, so
    shorten to 56064 (219 x 256)."""
    none = plan.make_plan(vllm(), hf_toy(24 * 2**30), "vllm", ctx=16384)
    assert [g.kv for g in none.gpus] == [0, 0] and none.kv_tokens == 0 and not none.fits
    assert none.fix == "weights leave no KV pool: use a smaller quant or 3 GPUs"
    busy = plan.make_plan(vllm(concurrency=64), hf_toy(8 * 2**30, 131072), "vllm", ctx=65536)
    assert not busy.fits and busy.max_ctx == 56201
    assert busy.fix == ("shorten model.ctx to 56064 (the KV pool holds 3596902 tokens for 64 requests), serve fewer "
                        "at once, or raise gpu_memory_utilization")
    # a model trained for 1024 tokens: the pool has room, the model's own length is the cap to shorten to
    short = plan.make_plan(vllm(concurrency=64), hf_toy(8 * 2**30, 1024), "vllm", ctx=65536)
    assert short.fix == ("shorten model.ctx to 1024 (the KV pool holds 3596902 tokens for 64 requests), serve fewer "
                         "at once, or raise gpu_memory_utilization")


@pytest.mark.parametrize("context_length,expect", [(300, 256), (256, 256), (8192, 8192), (0, 899072)])
def test_auto_ctx_rounds_down_to_a_step_of_256(context_length, expect):
    """The pool holds 899225 tokens per slot; the model's length caps it and kit rounds down to 256: 300 -> 256,
    256 stays 256 (the smallest context kit serves); a header with no trained length gets the pool's share:
    899225 -> 899072 (3512 x 256)."""
    assert plan.auto_ctx(vllm(), "vllm", hf_toy(8 * 2**30, context_length)) == expect


def test_auto_ctx_that_fits_nothing_names_the_field_and_the_numbers():
    with pytest.raises(KitError) as err:
        plan.auto_ctx(vllm(), "vllm", hf_toy(24 * 2**30))
    assert err.value.field == "model.ctx"
    assert err.value.problem == "toy-hf does not fit 2 GPU(s) at any context with serve.concurrency 4"
    assert err.value.fix == "run `kit plan` for the numbers and the cheapest fix"


def test_unknown_kv_cache_type_lists_the_known_ones():
    with pytest.raises(KitError) as err:
        plan.kv_bytes("q3_k", "engines.llama.cpp.cache_type_v")
    assert err.value.field == "engines.llama.cpp.cache_type_v" and err.value.problem == "unknown KV cache type 'q3_k'"
    assert err.value.fix == "use one of ['bf16', 'f16', 'f32', 'q4_0', 'q4_1', 'q5_0', 'q5_1', 'q8_0']"
