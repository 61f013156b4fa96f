"""Every way kit.yaml can be wrong, as the one line kit prints for it (field: problem; fix), written out in full.
From kit.config's mutation survivors: a line that names the wrong field or drops its fix is a bug users see."""

from __future__ import annotations

import pytest

from kit import config as cfg
from kit.errors import KitError


def line_for(tmp_path, text: str | None) -> str:
    path = tmp_path / "kit.yaml"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(KitError) as err:
        cfg.load(path)
    return err.value.line().replace(str(tmp_path), "DIR")


def test_the_file_itself(tmp_path):
    assert line_for(tmp_path, None) == "--config: DIR/kit.yaml does not exist; create one with `kit init -o kit.yaml`"
    assert line_for(tmp_path, "") == ("--config: DIR/kit.yaml is empty; start from `kit init -o kit.yaml`, or write at "
                                      "least one line such as `preset: dual-v100-nvlink`")
    # the third line opens a mapping inside a plain scalar: PyYAML marks line 3 (0-based mark.line 2, + 1)
    assert line_for(tmp_path, "stack:\n  name: a\n  primary: b: c\n") == (
        "--config: DIR/kit.yaml is not valid YAML at line 3; fix the indentation or quoting")
    assert line_for(tmp_path, "- a\n- b\n") == "DIR/kit.yaml must be a YAML mapping; start from `kit init`"


def test_keys_and_values(tmp_path):
    assert line_for(tmp_path, "stak: {}\n").startswith("stak: unknown key; ")
    assert line_for(tmp_path, "serve: {prot: 80}\n") == "serve.prot: unknown key; did you mean 'port'?"
    assert line_for(tmp_path, "hardware: {interconnect: infiniband}\n") == (
        "hardware.interconnect: 'infiniband' is not allowed; use one of 'nvlink', 'pcie' or 'none'")
    assert line_for(tmp_path, "build: {jobs: many}\n") == "build.jobs: 'many' is not allowed; use a number or 'auto'"
    assert line_for(tmp_path, "preset: dual-v100-nvlnk\n") == "preset: unknown preset 'dual-v100-nvlnk'; did you mean 'dual-v100-nvlink'?"


def test_engines_and_their_settings(tmp_path):
    assert line_for(tmp_path, "stack: {primary: llama}\n") == "stack.primary: unknown engine 'llama'; did you mean 'llama.cpp'?"
    assert line_for(tmp_path, "stack: {fallback: vlm}\n") == "stack.fallback: unknown engine 'vlm'; did you mean 'vllm'?"
    assert line_for(tmp_path, "engines: {vllmm: {}}\n") == "engines.vllmm: unknown engine; did you mean 'vllm'?"
    assert line_for(tmp_path, "engines: {vllm: [1]}\n") == (
        "engines.vllm: Input should be a valid dictionary; see `kit init` for the expected form")
    assert line_for(tmp_path, "engines: {vllm: {torch_varient: pypi}}\n") == (
        "engines.vllm.torch_varient: unknown key; did you mean 'torch_variant'?")
    assert line_for(tmp_path, "engines: {vllm: {enforce_eager: 'yes'}}\n") == (
        "engines.vllm.enforce_eager: 'yes' has the wrong type; use a value like False")
    assert line_for(tmp_path, "engines: {vllm: {gpu_memory_utilization: true}}\n") == (
        "engines.vllm.gpu_memory_utilization: True has the wrong type; use a value like 0.9")
    assert line_for(tmp_path, "engines: {llama.cpp: {extra_args: [[a]]}}\n") == (
        "engines.llama.cpp.extra_args[0]: ['a'] is not a plain value; use a list like []")
    assert line_for(tmp_path, "engines: {vllm: {local_sources: {cutlass: {a: 1}}}}\n") == (
        "engines.vllm.local_sources.cutlass: {'a': 1} is not a plain value; use NAME: value pairs")


def test_an_unquoted_on_off_means_on_off(tmp_path):
    path = tmp_path / "kit.yaml"
    path.write_text("engines: {llama.cpp: {flash_attn: off}}\n")
    assert cfg.load(path).engine_settings("llama.cpp")["flash_attn"] == "off"
    path.write_text("engines: {llama.cpp: {flash_attn: on}}\n")
    assert cfg.load(path).engine_settings("llama.cpp")["flash_attn"] == "on"


def test_no_path_is_the_default_stack():
    config = cfg.load(None)
    assert config.stack.primary == "llama.cpp" and config.hardware.gpus == 2 and config.preset is None


def test_build_jobs_worked_by_hand(monkeypatch):
    def jobs(build: dict) -> int:
        return cfg.from_dict({"build": build}).build_jobs()
    assert jobs({"jobs": 3, "cpus": 64, "memory_gib": 512}) == 3  # set: taken as it is
    assert jobs({"cpus": 16, "memory_gib": 24}) == 6  # min(16, 24 // 4 = 6)
    assert jobs({"cpus": 16, "memory_gib": 24, "memory_per_job_gib": 5}) == 4  # 24 // 5 = 4
    assert jobs({"cpus": 2, "memory_gib": 3}) == 1  # 3 // 4 = 0, but never below 1
    monkeypatch.setattr(cfg.os, "cpu_count", lambda: 12)
    monkeypatch.setattr(cfg, "_host_memory_gib", lambda: 40.0)
    assert jobs({}) == 10  # auto: min(12 CPUs, 40 // 4)
    monkeypatch.setattr(cfg.os, "cpu_count", lambda: None)
    assert jobs({}) == 1  # an unknown CPU count counts as one


def test_setting_types_against_their_defaults(tmp_path):
    path = tmp_path / "kit.yaml"
    path.write_text("engines: {vllm: {model_file: null, gpu_memory_utilization: 1}}\n")  # "" may be left empty
    assert cfg.load(path).engine_settings("vllm")["gpu_memory_utilization"] == 1
    assert line_for(tmp_path, "engines: {vllm: {ref: null}}\n") == (
        "engines.vllm.ref: None has the wrong type; use a value like 'v0.19.1'")
    assert line_for(tmp_path, "engines: {vllm: {ref: [v1]}}\n") == (
        "engines.vllm.ref: ['v1'] has the wrong type; use a value like 'v0.19.1'")
    assert line_for(tmp_path, "engines: {vllm: {extra_args: --x}}\n") == (
        "engines.vllm.extra_args: '--x' has the wrong type; use a value like []")
    assert line_for(tmp_path, "build: {jobs: 2.5}\n") == "build.jobs: 2.5 is not allowed; use a number or 'auto'"
