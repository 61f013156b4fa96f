"""`kit model list / pull` against a stand-in hub built from huggingface_hub's own source (tests/hubserver.py).

The hub serves real GGUF headers written with `gguf`: 27B-shaped files with a real-size vocabulary (their data is a
sparse hole) for planning, tiny files for downloads, and split models as llama.cpp's gguf-split writes them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kit import hub, modelchoice, modelinfo, plan
from kit.errors import KitError
from tests.conftest import make_config
from tests.ggufmodels import write_sparse_27b, write_tiny_llama
from tests.hubserver import Hub, Repo, Storage

REPO = "kit-test/Qwen-27B-GGUF"
MID = {"n_layer": 2, "n_embd": 1024, "n_head": 8, "n_head_kv": 8, "head_dim": 128, "n_ff": 4096, "n_vocab": 4096,
       "ctx": 2048}
TINY = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "head_dim": 16, "n_ff": 128, "n_vocab": 300,
        "ctx": 2048}


@pytest.fixture(scope="module")
def servers():
    from pytest_httpserver import HTTPServer

    import re

    storage_server = HTTPServer(host="127.0.0.1", threaded=True)  # another origin than the hub: a CDN
    storage_server.start()
    storage = Storage()
    storage_server.expect_request(re.compile(r"^/blobs/.*")).respond_with_handler(storage)
    hub_server = HTTPServer(host="127.0.0.1", threaded=True)
    hub_server.start()
    stand_in = Hub(storage, storage_server.url_for("/"))
    hub_server.expect_request(re.compile(r".*")).respond_with_handler(stand_in)
    yield stand_in, storage, hub_server.url_for("/").rstrip("/")
    hub_server.stop()
    storage.release.set()
    storage_server.stop()


@pytest.fixture(scope="module")
def quants(tmp_path_factory, servers):
    """Four quants of one 27B model as a GGUF repo publishes them, one split in three parts (sparse files)."""
    stand_in, _, _ = servers
    folder = tmp_path_factory.mktemp("repo")
    files = {
        "Qwen-27B-IQ4_XS.gguf": write_sparse_27b(folder / "iq4", "IQ4_XS", vocab=True,
                                                 extra={"general.file_type": 30}),  # LlamaFileType.MOSTLY_IQ4_XS
        "Qwen-27B-Q4_K_M.gguf": write_sparse_27b(folder / "q4", "Q4_K", vocab=True, extra={"general.file_type": 15}),
        "Qwen-27B-Q5_K_M.gguf": write_sparse_27b(folder / "q5", "Q5_K", vocab=True, extra={"general.file_type": 17}),
    }
    for i in range(3):
        name = f"Q8_0/Qwen-27B-Q8_0-{i + 1:05d}-of-00003.gguf"
        files[name] = write_sparse_27b(folder / f"q8-{i}", "Q8_0", vocab=i == 0, split=(i, 3),
                                       extra={"general.file_type": 7})
    files["mmproj-Qwen-27B-F16.gguf"] = write_tiny_llama(folder / "mmproj")  # a vision projector, not a model
    (folder / "README.md").write_text("# Qwen 27B GGUF\n")
    files["README.md"] = folder / "README.md"
    # sparse files: the published sha256 is not hashed here (listing never downloads)
    shas = {p: f"{i:064x}" for i, p in enumerate(sorted(files)) if p.endswith(".gguf") and "mmproj" not in p}
    stand_in.add(REPO, Repo(files, shas))
    return folder, files


def test_list_plans_every_quant_from_headers_alone(servers, quants):
    stand_in, storage, endpoint = servers
    folder, files = quants
    config = make_config({"mirrors": {"hf_endpoint": endpoint}})
    repo = hub.HfHub(hub.parse_source(f"hf:{REPO}"), endpoint)
    models = hub.gguf_models(repo.files())
    # the projector is not a model; the three parts are one
    assert [m.name for m in models] == ["Q8_0/Qwen-27B-Q8_0-00001-of-00003.gguf", "Qwen-27B-IQ4_XS.gguf",
                                        "Qwen-27B-Q4_K_M.gguf", "Qwen-27B-Q5_K_M.gguf"]
    assert len(models[0].parts) == 3
    before = storage.bytes_sent()
    choices = {}
    for model in models:
        choice, _ = modelchoice.plan_remote(config, repo, model)
        choices[model.name] = choice
    sent = storage.bytes_sent() - before
    total = sum(m.size for m in models)
    assert sent < total / 100, (sent, total)  # headers only: a few MiB of ~75 GB
    # the same header read from disk plans the same: the range reader is the only difference
    for name, disk in (("Qwen-27B-IQ4_XS.gguf", files["Qwen-27B-IQ4_XS.gguf"]),
                       ("Qwen-27B-Q5_K_M.gguf", files["Qwen-27B-Q5_K_M.gguf"])):
        local = plan.make_plan(config, modelinfo.read(disk), "llama.cpp", config.model.ctx)
        assert choices[name].plan.as_dict()["gpus"] == local.as_dict()["gpus"]
        assert choices[name].plan.max_ctx == local.max_ctx
    assert [choices[n].quant for n in sorted(choices)] == ["Q8_0", "IQ4_XS", "Q4_K_M", "Q5_K_M"]
    fitting = {n for n, c in choices.items() if c.fits}
    best = modelchoice.recommend(list(choices.values()))
    assert best is not None and best.model.name in fitting
    assert all(choices[n].model.size <= best.model.size for n in fitting)  # the largest that fits
    assert "Q8_0/Qwen-27B-Q8_0-00001-of-00003.gguf" not in fitting  # 27 GiB of weights on 2 x 16 GiB


def run_kit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(cwd / ".hf-home")}
    env.pop("HF_ENDPOINT", None)
    env.pop("HF_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "kit", *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=300)


def kit_yaml(folder: Path, endpoint: str, source: str = "") -> Path:
    path = folder / "kit.yaml"
    path.write_text("# my stack\npreset: dual-v100-nvlink\nmodel:\n  dir: ./models   # where the models live\n"
                    "  file: none.gguf   # the model file\n" + (f"  source: {source}\n" if source else "")
                    + f"mirrors:\n  hf_endpoint: {endpoint}\n")
    return path


def test_list_command_prints_the_table_and_recommends(servers, quants, tmp_path):
    _, _, endpoint = servers
    kit_yaml(tmp_path, endpoint)
    result = run_kit("model", "list", f"hf:{REPO}", "-c", "kit.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Qwen-27B-IQ4_XS.gguf" in result.stdout and "MiB of headers for" in result.stdout
    assert "recommended: " in result.stdout and f"kit model pull hf:{REPO} --file " in result.stdout


@pytest.mark.parametrize("source,phrase,field", [
    ("hf:kit-test/nothing-here", "no such repo, or it is private", "model.source"),
    (f"hf:{REPO}@v9", "no revision 'v9'", "model.source"),
    ("hf:kit-test/gated", "is gated", "model.source"),
    ("hf:kit-test/safetensors-only", "has no .gguf files", "SOURCE"),
    ("hf:not a repo", "is not a model source", "SOURCE"),
])
def test_list_errors_are_one_line_with_the_fix(servers, quants, tmp_path, source, phrase, field):
    stand_in, _, endpoint = servers
    folder, files = quants
    stand_in.add("kit-test/gated", Repo({"README.md": files["README.md"]}, gated=True))
    stand_in.add("kit-test/safetensors-only", Repo({"README.md": files["README.md"]}))
    kit_yaml(tmp_path, endpoint)
    result = run_kit("model", "list", source, "-c", "kit.yaml", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: ") and phrase in lines[0], lines


def test_an_unreachable_endpoint_names_the_mirror_setting(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kit_yaml(tmp_path, f"http://127.0.0.1:{port}")
    result = run_kit("model", "list", f"hf:{REPO}", "-c", "kit.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: mirrors.hf_endpoint: cannot reach http://127.0.0.1:{port}"), result.stderr
    assert "hf-mirror.com" in result.stderr and "Traceback" not in result.stderr


@pytest.fixture
def tiny_repo(servers, tmp_path):
    """A tiny model (single file) and a tiny split one, small enough to download."""
    stand_in, storage, endpoint = servers
    folder = tmp_path / "blobs"
    folder.mkdir()
    files = {"tiny-F32.gguf": write_tiny_llama(folder / "tiny.gguf"),
             # ~45 MB (a sparse file): huggingface_hub writes in 10 MB chunks, so a kill mid-way leaves bytes to resume
             "mid-Q8_0.gguf": write_sparse_27b(folder / "mid.gguf", "Q8_0", MID, arch="llama")}
    for i in range(2):
        files[f"tiny-split-Q8_0-{i + 1:05d}-of-00002.gguf"] = write_sparse_27b(
            folder / f"split-{i}", "Q8_0", TINY, arch="llama", split=(i, 2))
    name = f"kit-test/tiny-{tmp_path.name}"
    stand_in.add(name, Repo(files))
    storage.hold_after, storage.flip_byte = None, None
    storage.release.clear()
    storage.held.clear()
    return name, files, endpoint, storage


def test_pull_downloads_checks_and_writes_the_config(tiny_repo, tmp_path):
    name, files, endpoint, _ = tiny_repo
    work = tmp_path / "work"
    work.mkdir()
    kit_yaml(work, endpoint)
    result = run_kit("model", "pull", f"hf:{name}", "-c", "kit.yaml", "--file", "tiny-split-Q8_0-00002-of-00002.gguf",
                     cwd=work)
    assert result.returncode == 0, result.stdout + result.stderr
    for part in ("tiny-split-Q8_0-00001-of-00002.gguf", "tiny-split-Q8_0-00002-of-00002.gguf"):
        assert (work / "models" / part).read_bytes() == files[part].read_bytes()
    text = (work / "kit.yaml").read_text()
    assert "  file: tiny-split-Q8_0-00001-of-00002.gguf   # the model file\n" in text  # part 1, comment kept
    assert yaml.safe_load(text)["model"]["source"] == f"hf:{name}" and text.startswith("# my stack\n")
    assert not [p for p in (work / "models" / hub.STAGING).glob("*.gguf")]  # nothing left in staging
    # kit plan reads the split model from its parts
    info = modelinfo.read(work / "models" / "tiny-split-Q8_0-00001-of-00002.gguf")
    assert info.n_layer == 2 and len(info.tensors) == 3 + 9 * 2
    # a second pull finds the parts whole and downloads nothing
    again = run_kit("model", "pull", "-c", "kit.yaml", "--file", "tiny-split-Q8_0-00001-of-00002.gguf", cwd=work)
    assert again.returncode == 0 and "downloading" not in again.stdout, again.stdout + again.stderr


def test_a_flipped_byte_fails_the_checksum_and_leaves_no_file(tiny_repo, tmp_path):
    name, files, endpoint, storage = tiny_repo
    config = make_config({"mirrors": {"hf_endpoint": endpoint}, "model": {"dir": str(tmp_path / "m")}})
    repo = hub.HfHub(hub.parse_source(f"hf:{name}"), config.mirrors.hf_endpoint)
    model = next(m for m in hub.gguf_models(repo.files()) if m.name == "tiny-F32.gguf")
    storage.flip_byte = model.parts[0].sha256
    with pytest.raises(KitError) as err:
        hub.pull(repo, model, tmp_path / "m", echo=lambda _l: None)
    assert err.value.field == "model.source"
    assert "arrived with sha256" in err.value.problem and "the download was deleted" in err.value.problem
    assert not (tmp_path / "m" / "tiny-F32.gguf").exists()
    assert not list((tmp_path / "m" / hub.STAGING).rglob("tiny-F32.gguf"))


def test_a_killed_download_resumes_where_it_stopped(tiny_repo, tmp_path):
    name, files, endpoint, storage = tiny_repo
    work = tmp_path / "work"
    work.mkdir()
    kit_yaml(work, endpoint)
    size = files["mid-Q8_0.gguf"].stat().st_size
    storage.hold_after = size // 2  # past two of the client's 10 MB chunks
    first = len(storage.sent)
    env = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(work / ".hf-home")}
    proc = subprocess.Popen([sys.executable, "-m", "kit", "model", "pull", f"hf:{name}", "-c", "kit.yaml", "--file",
                             "mid-Q8_0.gguf"], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert storage.held.wait(60), "the download never started"
    time.sleep(1)  # let the client write what it received
    proc.kill()
    proc.wait()
    storage.hold_after = None
    storage.release.set()
    assert not (work / "models" / "mid-Q8_0.gguf").exists()  # never a partial file under the final name
    result = run_kit("model", "pull", f"hf:{name}", "-c", "kit.yaml", "--file", "mid-Q8_0.gguf", cwd=work)  # again
    assert result.returncode == 0, result.stdout + result.stderr
    assert (work / "models" / "mid-Q8_0.gguf").read_bytes() == files["mid-Q8_0.gguf"].read_bytes()
    resumed = [r for r in storage.sent[first:] if r[1] > 0]
    assert resumed and resumed[-1][2] < size, storage.sent[first:]  # the second run fetched the rest only


def test_free_disk_is_checked_before_anything_is_written(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(100, 90, 10 * 2**30))
    with pytest.raises(KitError) as err:
        hub.check_free_disk(tmp_path, 15 * 2**30)
    assert err.value.line() == (f"model.dir: {tmp_path} has 10.0 GiB free; the download needs 15.0 GiB; "
                                "free some space or point model.dir at a larger disk")


def test_split_names_follow_llama_split_path():
    # llama.cpp src/llama.cpp llama_split_path: "%s-%05d-of-%05d.gguf", numbered from 1
    assert modelinfo.split_parts("m-Q8_0-00002-of-00003.gguf") == [
        "m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00002-of-00003.gguf", "m-Q8_0-00003-of-00003.gguf"]
    assert modelinfo.split_parts("m-Q8_0.gguf") == ["m-Q8_0.gguf"]


def test_a_missing_part_is_named(tmp_path):
    write_sparse_27b(tmp_path / "m-00001-of-00002.gguf", "Q8_0", TINY, arch="llama", split=(0, 2))
    with pytest.raises(KitError) as err:
        modelinfo.read(tmp_path / "m-00001-of-00002.gguf")
    assert err.value.field == "MODEL"  # the CLI argument; a stack's resolution renames it to its model field
    assert "m-00002-of-00002.gguf is missing" in err.value.problem and "kit model pull" in err.value.fix


def test_deploy_preflight_checks_every_part_and_says_how_to_pull(tmp_path):
    from kit import deploy

    write_sparse_27b(tmp_path / "m-Q8_0-00001-of-00002.gguf", "Q8_0", TINY, arch="llama", split=(0, 2))
    config = make_config({"model": {"dir": str(tmp_path), "file": "m-Q8_0-00001-of-00002.gguf",
                                    "source": f"hf:{REPO}"}})
    with pytest.raises(KitError) as err:
        deploy.require_model(config)
    assert err.value.line() == (f"model.file: {tmp_path}/m-Q8_0-00002-of-00002.gguf does not exist on this host; "
                                f"get it with: kit model pull hf:{REPO} --file m-Q8_0-00001-of-00002.gguf")


def test_the_model_size_comes_from_its_files_once_they_are_here(tmp_path):
    from kit import resolve

    config = make_config({"model": {"dir": str(tmp_path), "file": "m-00001-of-00002.gguf", "size_gib": 15}})
    assert resolve.model_size_gib(config) == 15 and resolve.start_period_s(config) == 60 + 150  # not here yet
    for i, size in ((1, 3 * 2**30), (2, 2**30)):  # 3 GiB + 1 GiB, sparse
        with open(tmp_path / f"m-{i:05d}-of-00002.gguf", "wb") as f:
            f.truncate(size)
    assert resolve.model_size_gib(config) == 4.0 and resolve.start_period_s(config) == 60 + 40


@pytest.mark.parametrize("hf_config,primary,code,said", [
    # the seeds' vLLM command: an AWQ checkpoint on V100s
    ({"quantization_config": {"quant_method": "awq", "bits": 4}}, "vllm", 1,
     "no: vllm cannot serve awq checkpoints on sm_70: its kernels need sm_75+ (vllm#1488, #4202"),
    ({"quantization_config": {"quant_method": "compressed-tensors"}}, "vllm", 1, "need sm_80+ (llm-compressor#1258"),
    ({"quantization_config": {"quant_method": "fp8"}}, "vllm", 1, "need sm_80+"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 4}, "torch_dtype": "bfloat16"}, "vllm", 0,
     "ok: vllm can serve it (gptq); its bf16 weights are served as float16 on sm_70"),
    ({"torch_dtype": "float16"}, "llama.cpp", 1, "llama.cpp serves GGUF files"),
])
def test_an_hf_checkpoint_is_judged_by_the_engines_kernels(servers, tmp_path, hf_config, primary, code, said):
    import json

    stand_in, _, endpoint = servers
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], **hf_config}))
    name = f"kit-test/hf-{tmp_path.name}"
    stand_in.add(name, Repo({"config.json": tmp_path / "config.json"}))
    work = tmp_path / "work"
    work.mkdir()
    (work / "kit.yaml").write_text(f"preset: dual-v100-nvlink\nstack: {{primary: {primary}}}\n"
                                   f"mirrors: {{hf_endpoint: {endpoint}}}\n")
    result = run_kit("model", "list", f"hf:{name}", "-c", "kit.yaml", cwd=work)
    assert result.returncode == code, result.stdout + result.stderr
    assert said in result.stdout, result.stdout


def test_plan_takes_a_hub_file_like_a_local_one(servers, quants, tmp_path):
    import json

    _, _, endpoint = servers
    folder, files = quants
    kit_yaml(tmp_path, endpoint)
    remote = run_kit("plan", f"hf:{REPO}", "--file", "Q8_0/Qwen-27B-Q8_0-00002-of-00003.gguf", "--json", "-c",
                     "kit.yaml", cwd=tmp_path)
    assert remote.returncode == 1, remote.stderr  # 27 GiB of weights do not fit 2 x 16 GiB at 4 x 16K
    local = run_kit("plan", str(files["Qwen-27B-IQ4_XS.gguf"]), "--json", "-c", "kit.yaml", cwd=tmp_path)
    hub_iq4 = run_kit("plan", f"hf:{REPO}", "--file", "Qwen-27B-IQ4_XS.gguf", "--json", "-c", "kit.yaml", cwd=tmp_path)
    assert local.returncode == hub_iq4.returncode == 0, hub_iq4.stderr
    assert json.loads(local.stdout)["gpus"] == json.loads(hub_iq4.stdout)["gpus"]
    missing = run_kit("plan", f"hf:{REPO}", "-c", "kit.yaml", cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.startswith("error: --file: name one of hf:kit-test/Qwen-27B-GGUF")


# Qwen2.5-7B-Instruct's config.json (the published values planning reads), with a GPTQ quantization_config added
QWEN_7B = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
           "max_position_embeddings": 32768, "num_attention_heads": 28, "num_hidden_layers": 28,
           "num_key_value_heads": 4, "vocab_size": 152064, "torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "gptq", "bits": 4}}


def test_an_hf_checkpoint_that_runs_is_planned_for_vllm(servers, tmp_path):
    import json

    stand_in, _, endpoint = servers
    (tmp_path / "config.json").write_text(json.dumps(QWEN_7B))
    weights = tmp_path / "model.safetensors"
    with open(weights, "wb") as f:
        f.truncate(5 * 2**30)  # 5 GiB, sparse: listed by size, never downloaded
    name = f"kit-test/hf7b-{tmp_path.name}"
    stand_in.add(name, Repo({"config.json": tmp_path / "config.json", "model.safetensors": weights},
                            {"model.safetensors": "f" * 64}))
    work = tmp_path / "work"
    work.mkdir()
    (work / "kit.yaml").write_text(f"preset: dual-v100-nvlink\nstack: {{primary: vllm}}\n"
                                   f"mirrors: {{hf_endpoint: {endpoint}}}\n")
    result = run_kit("model", "list", f"hf:{name}", "-c", "kit.yaml", cwd=work)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vllm: 5.00 GiB of weights; 4 concurrent requests of up to 16384 tokens each: fits" in result.stdout


# ---- ModelScope, through its own client (modelscope_hub) against tests/hubserver.ModelScope
@pytest.fixture(scope="module")
def modelscope(servers, quants):
    import re

    from pytest_httpserver import HTTPServer

    from tests.hubserver import ModelScope

    _, storage, _ = servers
    folder, files = quants
    server = HTTPServer(host="127.0.0.1", threaded=True)
    server.start()
    stand_in = ModelScope(storage)
    server.expect_request(re.compile(r".*")).respond_with_handler(stand_in)
    listed = {k: v for k, v in files.items() if k.startswith("Qwen-27B-IQ4") or k.startswith("Q8_0/")}
    stand_in.add("kit-test/Qwen-27B-GGUF", Repo(listed, {p: f"{i:064x}" for i, p in enumerate(sorted(listed))},
                                                revisions=("master",)))
    yield stand_in, server.url_for("/").rstrip("/")
    server.stop()


def ms_yaml(folder: Path, endpoint: str) -> None:
    (folder / "kit.yaml").write_text("preset: dual-v100-nvlink\nmodel:\n  dir: ./models\n"
                                     f"mirrors:\n  modelscope_endpoint: {endpoint}\n")


def test_modelscope_list_plans_from_headers(modelscope, servers, quants, tmp_path):
    stand_in, endpoint = modelscope
    _, storage, _ = servers
    ms_yaml(tmp_path, endpoint)
    before = storage.bytes_sent()
    result = run_kit("model", "list", "modelscope:kit-test/Qwen-27B-GGUF", "-c", "kit.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Qwen-27B-IQ4_XS.gguf *" in result.stdout and "Q8_0/Qwen-27B-Q8_0-00001-of-00003.gguf" in result.stdout
    assert storage.bytes_sent() - before < 30 * 2**20  # headers only, of ~40 GB
    # the client's own routes: the file list with Revision=master&Recursive=True, then the download URL by ranges
    assert any(path.startswith("/api/v1/models/kit-test/Qwen-27B-GGUF/repo/files?") and "Recursive=True" in path
               and "Revision=master" in path for _, path in stand_in.requests), stand_in.requests[:3]
    assert any("FilePath=Qwen-27B-IQ4_XS.gguf" in path for _, path in stand_in.requests)


def test_modelscope_pull_verifies_and_writes_the_source(modelscope, tmp_path):
    stand_in, endpoint = modelscope
    tiny = write_tiny_llama(tmp_path / "tiny.gguf")
    stand_in.add("kit-test/tiny", Repo({"tiny-F32.gguf": tiny}, revisions=("master",)))
    work = tmp_path / "work"
    work.mkdir()
    ms_yaml(work, endpoint)
    result = run_kit("model", "pull", "modelscope:kit-test/tiny", "-c", "kit.yaml", "--file", "tiny-F32.gguf",
                     cwd=work)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (work / "models" / "tiny-F32.gguf").read_bytes() == tiny.read_bytes()
    config = yaml.safe_load((work / "kit.yaml").read_text())
    assert config["model"] == {"dir": "./models", "file": "tiny-F32.gguf", "source": "modelscope:kit-test/tiny"}


@pytest.mark.parametrize("source,phrase", [
    ("modelscope:kit-test/nothing", "no such repo or revision 'master'"),
    ("modelscope:kit-test/Qwen-27B-GGUF@v9", "no such repo or revision 'v9'"),
    ("modelscope:kit-test/private", "refused access (private or gated)"),
])
def test_modelscope_errors_are_one_line(modelscope, quants, tmp_path, source, phrase):
    stand_in, endpoint = modelscope
    _, files = quants
    stand_in.add("kit-test/private", Repo({"README.md": files["README.md"]}, gated=True, revisions=("master",)))
    ms_yaml(tmp_path, endpoint)
    result = run_kit("model", "list", source, "-c", "kit.yaml", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model.source: ") and phrase in lines[0], lines


def test_an_unreachable_modelscope_names_its_setting(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ms_yaml(tmp_path, f"http://127.0.0.1:{port}")
    result = run_kit("model", "list", "modelscope:kit-test/x", "-c", "kit.yaml", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: mirrors.modelscope_endpoint: cannot reach http://127.0.0.1:{port}")
