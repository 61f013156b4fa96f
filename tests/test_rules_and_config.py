"""Every V100 rule and bad-input case, with its exact one-line error."""

from __future__ import annotations

import pytest

from kit import config as cfg, resolve
from kit import rules
from kit.errors import KitError
from tests.conftest import make_config

# rule id -> (config that breaks it, exact error line)
RULE_CASES = {
    "cuda13-drops-volta": (
        {"cuda": {"version": "13.0.1"}},
        "cuda.version: CUDA 13 cannot compile for sm_70 (got 13.0.1); use 12.9.1 or older",
    ),
    "vllm-cuda-drops-volta": (
        {"stack": {"primary": "vllm"}, "engines": {"vllm": {"cuda": "12.9.1"}}},
        "engines.vllm.cuda: vLLM built with CUDA 12.9.1 silently drops sm_70 (no kernel image at run time); "
        "set engines.vllm.cuda: 12.6.3",
    ),
    "vllm-release-drops-volta": (
        {"stack": {"primary": "vllm"}, "engines": {"vllm": {"ref": "v0.31.0"}}},
        "engines.vllm.ref: vLLM v0.31.0 requires compute capability 7.5+, not sm_70; pin engines.vllm.ref: v0.19.1",
    ),
    "vllm-serve-args-need-0.13": (
        {"stack": {"primary": "vllm"}, "engines": {"vllm": {"ref": "v0.12.0"}}},
        "engines.vllm.ref: vLLM 0.12.0 has no --attention-backend flag, which kit's vLLM command passes (added in "
        "0.13.0); pin engines.vllm.ref: v0.19.1 (or any release from v0.13.0 on)",
    ),
    "torch-variant-drops-volta": (
        {"stack": {"primary": "vllm"}, "engines": {"vllm": {"torch_variant": "cu128", "torch": "2.11.0"}}},
        "engines.vllm.torch_variant: torch 2.11.0 cu128 wheels no longer ship sm_70 kernels; "
        "set engines.vllm.torch_variant: cu126, or a torch below 2.11 (its cu128 wheels still carry sm_70)",
    ),
    "no-bf16-before-ampere": (
        {"model": {"dtype": "bfloat16"}},
        "model.dtype: sm_70 (Volta) has no bf16; set model.dtype: float16 (vLLM --dtype half)",
    ),
    "arch-never-detected-in-build": (
        {"hardware": {"archs": ["native"]}},
        "hardware.archs: 'native' asks nvcc to detect the GPU, but no GPU is visible inside docker build; "
        "list the archs, e.g. [70] for V100",
    ),
    "arch-known": (
        {"hardware": {"archs": [71]}},
        "hardware.archs: 71 is not a CUDA SM architecture; use numbers like 70 (V100), 75, 80, 86, 89, 90",
    ),
    "gpu-flavor-needs-archs": (
        {"hardware": {"archs": []}},
        "hardware.archs: a GPU engine needs at least one SM architecture; set hardware.archs: [70] (or use the cpu preset)",
    ),
    "tensor-split-per-gpu": (
        {"engines": {"llama.cpp": {"tensor_split": [1, 1, 1]}}},
        "engines.llama.cpp.tensor_split: has 3 ratios for 2 GPUs; give one ratio per GPU, e.g. [1, 1] for two",
    ),
    "device-ids-per-gpu": (
        {"hardware": {"device_ids": ["0"]}},
        'hardware.device_ids: has 1 ids for 2 GPUs; list one id per GPU, e.g. ["0", "1"]',
    ),
    "nccl-apt-needs-cuda-image": (
        {"cuda": {"source": "wheels"}, "nccl": {"source": "apt"}},
        "nccl.source: apt NCCL comes from NVIDIA's CUDA apt repo, which only the nvidia/cuda images have "
        "(cuda.source is wheels); set nccl.source: pip",
    ),
    "cuda-wheels-are-cu12": (
        {"cuda": {"source": "wheels", "version": "11.8.0"}, "nccl": {"source": "pip"}},
        "cuda.version: CUDA 11.8.0 has no cu12 wheels on PyPI; use a 12.x version with cuda.source: wheels",
    ),
    "debian-packages-cuda": (
        {"cuda": {"source": "debian", "version": "12.9.1"}, "nccl": {"source": "pip"}},
        "cuda.version: no Debian release packages CUDA 12.9.1; Debian has 11.8 (bookworm), 12.4 (trixie); "
        "set cuda.version to one of those with cuda.source: debian",
    ),
    "nccl-cu12-only-on-volta": (
        {"nccl": {"version": "3.0.1"}},
        "nccl.version: NCCL 3.0.1 is not a CUDA 12 release; pin a 2.x NCCL such as 2.27.3",
    ),
    "no-credentials-in-mirrors": (
        {"mirrors": {"pip_index": "https://bob:secret@pypi.example.cn/simple"}},
        "mirrors.pip_index: holds a user:password, which would be baked into an image layer; "
        "use a mirror that needs no credentials, or configure auth on the build host",
    ),
    "cpu-flavor-without-gpus": (
        {"hardware": {"gpus": 0, "device_ids": []}, "engines": {"llama.cpp": {"tensor_split": []}}},
        "hardware.gpus: is 0 but llama.cpp uses its GPU flavor; "
        "set engines.llama.cpp.flavor: cpu, or hardware.gpus to the GPU count",
    ),
}

BAD_INPUT = {
    "unknown key": ({"cuda": {"versoin": "12.9.1"}}, "cuda.versoin: unknown key; did you mean 'version'?"),
    "unknown section": ({"hardwear": {}}, "hardwear: unknown key; did you mean 'hardware'?"),
    "unknown engine key": (
        {"engines": {"llama.cpp": {"spec_draft_max": 3}}},
        "engines.llama.cpp.spec_draft_max: unknown key; did you mean 'spec_draft_n_max'?",
    ),
    "unknown engine": ({"stack": {"primary": "llamacpp"}}, "stack.primary: unknown engine 'llamacpp'; did you mean 'llama.cpp'?"),
    "malformed cuda": ({"cuda": {"version": "12.x"}}, "cuda.version: '12.x' is not a version; write it like 12.9.1"),
    "malformed nccl": ({"nccl": {"version": "2.27"}}, None),  # 2.27 is a valid two-part version
    "malformed nccl text": ({"nccl": {"version": "latest"}}, "nccl.version: 'latest' is not a version; write it like 12.9.1"),
    "bad literal": ({"hardware": {"interconnect": "infiniband"}},
                    "hardware.interconnect: 'infiniband' is not allowed; use one of 'nvlink', 'pcie' or 'none'"),
    "bad jobs": ({"build": {"jobs": "many"}}, "build.jobs: 'many' is not allowed; use a number or 'auto'"),
    "bad setting type": ({"engines": {"llama.cpp": {"spec_draft_n_max": "three"}}},
                         "engines.llama.cpp.spec_draft_n_max: 'three' has the wrong type; use a value like 3"),
    "unknown preset": ({"preset": "dual-v100"}, None),
    "unknown fallback": ({"stack": {"fallback": "vlm"}}, "stack.fallback: unknown engine 'vlm'; did you mean 'vllm'?"),
    # a mapping where a list item belongs is an error, never text in the compose file
    "mapping as a GPU id": ({"hardware": {"device_ids": [{"nested": 1}, "1"]}},
                            "hardware.device_ids: {'nested': 1} is not a GPU id; list ids like [\"0\", \"1\"]"),
    "mapping as a split ratio": ({"engines": {"llama.cpp": {"tensor_split": [{"nested": 1}, 1]}}},
                                 "engines.llama.cpp.tensor_split[0]: {'nested': 1} is not a plain value; "
                                 "use a list like [1, 1]"),
    "list as an extra arg": ({"engines": {"llama.cpp": {"extra_args": [["--x"]]}}},
                             "engines.llama.cpp.extra_args[0]: ['--x'] is not a plain value; use a list like []"),
}


@pytest.mark.parametrize("value,expected", [("on", "on"), ("off", "off"), (True, "on"), (False, "off"),
                                            ("auto", "auto")])
def test_on_off_settings_take_yaml_booleans(value, expected, tmp_path):
    # `flash_attn: off` unquoted is YAML false: it means off, and renders --flash-attn off
    from kit import config as cfg

    path = tmp_path / "kit.yaml"
    text = {True: "on", False: "off"}.get(value, f'"{value}"') if isinstance(value, bool) else f'"{value}"'
    path.write_text(f"engines:\n  llama.cpp:\n    flash_attn: {text}\n")
    config = cfg.load(path)
    argv = list(resolve.engine(config, "llama.cpp").argv)
    assert argv[argv.index("--flash-attn") + 1] == expected


def test_empty_config_file_says_what_it_needs(tmp_path):
    from kit import config as cfg

    path = tmp_path / "kit.yaml"
    path.write_text("# nothing yet\n")
    with pytest.raises(KitError) as err:
        cfg.load(path)
    assert err.value.field == "--config" and "is empty" in err.value.problem and "kit init" in err.value.fix


def _error(data):
    with pytest.raises(KitError) as info:
        make_config(data)
    return info.value.line()


def test_every_rule_has_a_case():
    assert sorted(RULE_CASES) == sorted(rule["id"] for rule in rules.table())


@pytest.mark.parametrize("rule_id", sorted(RULE_CASES))
def test_rule(rule_id):
    data, expected = RULE_CASES[rule_id]
    assert _error(data) == expected


@pytest.mark.parametrize("rule", rules.table(), ids=lambda r: r["id"])
def test_rule_has_source_and_fix(rule):
    assert rule["source"] and rule["fix"] and rule["check"] in rules.CHECKS


@pytest.mark.parametrize("name", sorted(BAD_INPUT))
def test_bad_input(name):
    data, expected = BAD_INPUT[name]
    if expected is None and name == "malformed nccl":
        make_config(data)  # accepted
        return
    line = _error(data)
    if expected:
        assert line == expected
    else:
        assert line.startswith("preset: unknown preset 'dual-v100'; did you mean 'dual-v100-")
    assert "\n" not in line


def test_defaults_are_the_seed_setup():
    c = make_config({})
    assert (c.hardware.gpus, c.hardware.memory_gib, c.hardware.archs, c.hardware.interconnect) == (2, 16, [70], "nvlink")
    assert (c.cuda.version, c.nccl.version, c.stack.primary) == ("12.9.1", "2.27.3", "llama.cpp")
    assert (c.model.ctx, c.model.size_gib, c.model.dtype) == (16384, 15.0, "float16")
    llama = c.engine_settings("llama.cpp")
    assert (llama["spec_type"], llama["spec_draft_n_max"]) == ("auto", 3)
    assert c.serve.concurrency == 4  # seed 000: "4 concurrent, 248-264 t/s total"
    assert c.build.push is False


@pytest.mark.parametrize("preset", sorted(cfg.presets()))
def test_presets_are_valid(preset):
    c = make_config({"preset": preset})
    assert c.engine_names()[0] == c.stack.primary and c.stack.primary in ("llama.cpp", "ninfer")
    assert len(c.hardware.device_ids) == c.hardware.gpus


def test_ninfer_primary_is_the_seed_final_setup():
    c = make_config({"preset": "ninfer-primary"})
    assert (c.stack.primary, c.stack.fallback, c.stack.front_door) == ("ninfer", "llama.cpp", True)
    s = c.engine_settings("ninfer")
    assert s["quantization"] == "nf4"


def test_nccl_is_one_field():
    """There is no second NCCL field anywhere in the config model."""
    def walk(model, prefix=""):
        for key, field in model.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, cfg.BaseModel):
                yield from walk(ann, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}"
    nccl_fields = [f for f in walk(cfg.StackConfig) if "nccl" in f.lower() and f.endswith("version")]
    assert nccl_fields == ["nccl.version"]


@pytest.mark.parametrize("version,archs,line", [
    ("11.8.0", [70], None),
    ("12.4.1", [70], None),
    ("12.4", [70, 90], None),
    # bookworm's 11.8 cannot compile ggml-cuda for sm_90 (checked here: nvcc 11.8 fails on its bf16/fp8 paths)
    ("11.8.0", [70, 90], "hardware.archs: Debian's CUDA 11.8.0 (bookworm) cannot compile sm_90; use a newer toolkit "
                         "(11.8 (bookworm), 12.4 (trixie)) or cuda.source: image"),
    ("12.2.0", [70], "cuda.version: no Debian release packages CUDA 12.2.0"),
])
def test_debian_cuda_routes(version, archs, line):
    data = {"cuda": {"source": "debian", "version": version}, "nccl": {"source": "pip"}, "hardware": {"archs": archs}}
    if line is None:
        make_config(data)
        return
    with pytest.raises(KitError) as err:
        make_config(data)
    assert err.value.line().startswith(line), err.value.line()


def test_debian_cuda_version_picks_the_release_and_its_compiler():
    from kit import dockerfile

    for version, suite, compiler, runtime in (("11.8.0", "bookworm", "g++-11", "libcudart11.0"),
                                              ("12.4.1", "trixie", "g++-13", "libcudart12")):
        config = make_config({"cuda": {"source": "debian", "version": version}, "nccl": {"source": "pip"}})
        ctx = dockerfile.template_values(config, "llama.cpp", ca_bundle=False)
        assert dockerfile.base_images(config, version, True) == {"builder": f"debian:{suite}-slim",
                                                                     "runtime": f"debian:{suite}-slim"}
        assert ("CMAKE_CUDA_HOST_COMPILER", compiler) in ctx["backend"]["cmake_flags"]
        assert runtime in ctx["runtime_packages"]


def test_rules_read_only_the_engines_in_the_stack():
    # vLLM's torch variant without Volta is refused when vLLM serves, and ignored when it is not in the stack
    with pytest.raises(KitError) as err:
        make_config({"stack": {"primary": "vllm"}, "engines": {"vllm": {"torch_variant": "cu130", "torch": "2.11.0"}}})
    assert err.value.field == "engines.vllm.torch_variant"
    make_config({"engines": {"vllm": {"torch_variant": "cu130", "torch": "2.11.0"}}})  # llama.cpp serves: no error


def test_a_git_ref_with_a_leading_v_is_compared_as_its_version():
    # vLLM's tags are v0.11.0: "v0.31.0" must be read as 0.31.0, past the last release with Volta
    with pytest.raises(KitError) as err:
        make_config({"stack": {"primary": "vllm"}, "engines": {"vllm": {"ref": "v0.31.0"}}})
    assert err.value.field == "engines.vllm.ref"
    make_config({"stack": {"primary": "vllm"}, "engines": {"vllm": {"ref": "v0.19.1"}}})
    make_config({"stack": {"primary": "vllm"}, "engines": {"vllm": {"ref": "v0.13.0"}}})  # the first with the flag
    make_config({"stack": {"primary": "vllm"}, "engines": {"vllm": {"ref": "a1b2c3d"}}})  # a commit: not a version


def test_torch_cu128_keeps_volta_below_2_11():
    # 2.8.0 and 2.10.0 on PyPI are cu128 builds (their nvidia-cuda-runtime-cu12==12.8.90 requirement) with sm_70
    for torch in ("2.8.0", "2.10.0"):
        make_config({"stack": {"primary": "vllm"}, "engines": {"vllm": {"torch_variant": "cu128", "torch": torch}}})


def test_rule_facts_carry_only_the_stacks_engines():
    """A llama.cpp-only stack with vLLM settings left in kit.yaml: the rules see llama.cpp's settings as flat paths,
    and nothing of vLLM or NInfer, so a vLLM rule cannot fire on it."""
    from kit import rules as rules_module

    flat = rules_module.fields(make_config({"engines": {"vllm": {"gpu_memory_utilization": 0.8}}}))
    assert flat["engines.in_use"] == ["llama.cpp"]
    assert flat["engines.llama.cpp.flavor"] == "cuda" and flat["hardware.archs"] == [70]
    assert not [k for k in flat if k.startswith(("engines.vllm", "engines.ninfer"))]
