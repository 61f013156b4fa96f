"""kit.serving: the argv each engine gets, with expected values written out by hand (no Docker; the real engine
starting on these argvs is tests/test_engine_argv.py)."""

from __future__ import annotations

import pytest

from kit import catalog, serving
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
    assert flag(serving.command(config, "llama.cpp"), "--device") == devices
    assert serving.context(config, "llama.cpp")["devices"] == (devices.split(",") if devices else [])


@pytest.mark.parametrize("preset,tp", [("dual-v100-nvlink", "2"), ("single-v100-32g", None)])
def test_vllm_splits_tensors_only_over_several_gpus(preset, tp):
    config = make_config({"preset": preset, "stack": {"primary": "vllm"}})
    argv = serving.command(config, "vllm")
    assert flag(argv, "--tensor-parallel-size") == tp
    assert serving.context(config, "vllm")["multi_gpu"] is (tp is not None)


def test_extra_args_come_last_as_strings():
    config = make_config({"engines": {"llama.cpp": {"extra_args": ["--no-mmap", "--threads", 8]}}})
    assert serving.command(config, "llama.cpp")[-3:] == ["--no-mmap", "--threads", "8"]


def test_a_flag_template_with_an_unknown_name_blames_the_catalog(monkeypatch):
    engine = catalog.get("llama.cpp")
    broken = engine.model_copy(update={"serve": engine.serve.model_copy(update={
        "args": [*engine.serve.args, catalog.ServeArg(flag="--nope", value="{no_such_value}")]})})
    monkeypatch.setattr(catalog, "get", lambda name, field="stack.primary": broken)
    with pytest.raises(KitError) as err:
        serving.command(make_config(), "llama.cpp")
    assert err.value.line() == "images/llama.cpp.yaml: serve flag --nope uses unknown 'no_such_value'; fix the catalog"


def test_start_period_is_a_minute_plus_ten_seconds_per_gib():
    # model.size_gib 15 and the model not on this machine: 60 + 10 x 15 = 210 s
    assert serving.start_period_s(make_config({"model": {"size_gib": 15, "dir": "/nonexistent"}})) == 210
    assert serving.start_period_s(make_config({"model": {"size_gib": 0.5, "dir": "/nonexistent"}})) == 65
