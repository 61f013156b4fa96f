"""kit.serving: the argv each engine gets, with expected values written out by hand (no Docker; the real engine
starting on these argvs is tests/test_engine_argv.py)."""

from __future__ import annotations

import pytest

from kit import catalog, resolve, serving
from kit.errors import KitError
from tests.conftest import make_config


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize("data,devices", [
    ({"preset": "dual-v100-nvlink"}, "CUDA0,CUDA1"),   # the container sees its GPUs as 0..n-1, whatever device_ids
    ({"preset": "dual-v100-nvlink", "hardware": {"device_ids": ["2", "3"]}}, "CUDA0,CUDA1"),
    ({"preset": "single-v100-32g"}, "CUDA0"),
    ({"preset": "cpu"}, None),                          # no GPU flavor, no --device at all
])
def test_llama_names_its_gpus(data, devices):
    config = make_config(data)
    assert flag(list(resolve.engine(config, "llama.cpp").argv), "--device") == devices
    assert serving.flag_values(config, resolve.engine(config, "llama.cpp"))["devices"] == (devices.split(",") if devices else [])


@pytest.mark.parametrize("preset,tp", [("dual-v100-nvlink", "2"), ("single-v100-32g", None)])
def test_vllm_splits_tensors_only_over_several_gpus(preset, tp):
    config = make_config({"preset": preset, "stack": {"primary": "vllm"}})
    argv = list(resolve.engine(config, "vllm").argv)
    assert flag(argv, "--tensor-parallel-size") == tp
    assert serving.flag_values(config, resolve.engine(config, "vllm"))["multi_gpu"] is (tp is not None)


def test_extra_args_come_last_as_strings():
    config = make_config({"engines": {"llama.cpp": {"extra_args": ["--no-mmap", "--threads", 8]}}})
    assert list(resolve.engine(config, "llama.cpp").argv)[-3:] == ["--no-mmap", "--threads", "8"]


def test_a_flag_template_with_an_unknown_name_blames_the_catalog(monkeypatch):
    engine = catalog.get("llama.cpp")
    broken = engine.model_copy(update={"serve": engine.serve.model_copy(update={
        "args": [*engine.serve.args, catalog.ServeArg(flag="--nope", value="{no_such_value}")]})})
    monkeypatch.setattr(catalog, "get", lambda name, field="stack.primary": broken)
    with pytest.raises(KitError) as err:
        list(resolve.engine(make_config(), "llama.cpp").argv)
    assert err.value.line() == "images/llama.cpp.yaml: serve flag --nope uses unknown 'no_such_value'; fix the catalog"


def test_start_period_is_a_minute_plus_ten_seconds_per_gib():
    # model.size_gib 15 and the model not on this machine: 60 + 10 x 15 = 210 s
    assert resolve.start_period_s(make_config({"model": {"size_gib": 15, "dir": "/nonexistent"}})) == 210
    assert resolve.start_period_s(make_config({"model": {"size_gib": 0.5, "dir": "/nonexistent"}})) == 65


def test_the_default_stack_argv_by_hand(tmp_path):
    """The default preset (dual V100, llama.cpp) on a model without MTP layers, every flag from images/llama.cpp.yaml
    and the preset read by eye: 4 slots (serve.concurrency) of 16384 tokens (model.ctx), both GPUs named, layer
    split 1:1, flash attention auto, f16 K and V, batch and ubatch 512, no draft (spec_type auto on a model without
    MTP layers), the model's name as the alias, metrics on."""
    from tests.ggufmodels import write_tiny_llama

    write_tiny_llama(tmp_path / "Qwen3.8-27B-IQ4_XS.gguf")
    config = make_config({"model": {"dir": str(tmp_path)}})
    assert list(resolve.engine(config, "llama.cpp").argv) == [
        "--model", "/models/Qwen3.8-27B-IQ4_XS.gguf", "--host", "0.0.0.0", "--port", "8080", "--parallel", "4",
        "--kv-unified-per-slot", "16384", "--device", "CUDA0,CUDA1", "--n-gpu-layers", "all", "--split-mode", "layer",
        "--tensor-split", "1,1", "--flash-attn", "auto", "--cache-type-k", "f16", "--cache-type-v", "f16",
        "--batch-size", "512", "--ubatch-size", "512", "--alias", "qwen3.8-27b", "--metrics"]
    # kit tune --exec places the same engine on this host: the model folder, address and port change, nothing else
    here = serving.command(config, resolve.engine(config, "llama.cpp"), model_dir="/srv/models", host="127.0.0.1", port=9999)
    assert here[:6] == ["--model", "/srv/models/Qwen3.8-27B-IQ4_XS.gguf", "--host", "127.0.0.1", "--port", "9999"]
    context = serving.flag_values(config, resolve.engine(config, "llama.cpp"))
    assert {k: context[k] for k in ("model_path", "model_name", "ctx", "slots", "host", "port", "gpus", "gpu",
                                    "multi_gpu", "devices", "speculative", "spec_type")} == {
        "model_path": "/models/Qwen3.8-27B-IQ4_XS.gguf", "model_name": "qwen3.8-27b", "ctx": 16384, "slots": 4,
        "host": "0.0.0.0", "port": 8080, "gpus": 2, "gpu": True, "multi_gpu": True, "devices": ["CUDA0", "CUDA1"],
        "speculative": False, "spec_type": "none"}



@pytest.mark.parametrize("chunked,flag_present", [(True, False), (False, True)])
def test_a_default_on_vllm_switch_is_turned_off_only_when_the_setting_is_off(chunked, flag_present):
    """vLLM's chunked prefill is a BooleanOptionalAction that is on by default (vllm/engine/arg_utils.py): kit says
    nothing while the setting is on, and --no-enable-chunked-prefill when it is off."""
    config = make_config({"stack": {"primary": "vllm"}, "engines": {"vllm": {"enable_chunked_prefill": chunked}}})
    assert ("--no-enable-chunked-prefill" in list(resolve.engine(config, "vllm").argv)) is flag_present


def test_the_catalogs_serve_env_is_formatted_with_the_flag_values():
    """No shipped engine sets serve.env; an engine that does gets each value formatted from the resolved flag values,
    lists joined by commas as in argv (dual-v100-nvlink: two GPUs, CUDA0 and CUDA1; 4 slots)."""
    import dataclasses

    config = make_config({"preset": "dual-v100-nvlink"})
    resolved = resolve.engine(config, "llama.cpp")
    serve = resolved.entry.serve.model_copy(update={"env": {"KIT_DEVICES": "{devices}", "KIT_SLOTS": "{slots}",
                                                            "KIT_FIXED": "on"}})
    image = dataclasses.replace(resolved.image, entry=resolved.entry.model_copy(update={"serve": serve}))
    engine = dataclasses.replace(resolved, image=image)
    assert serving.environment(config, engine) == {"KIT_DEVICES": "CUDA0,CUDA1", "KIT_SLOTS": "4", "KIT_FIXED": "on"}
