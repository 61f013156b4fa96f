"""Every preset's rendered llama-server argv starts the real engine (the cpu build, real source at kit's ref).

The defaults are tested as users get them: the argv comes from `serving.command` on each preset unchanged, except
the flags the cpu flavor declares it cannot take (`drops_flags` in images/llama.cpp.yaml), and the model is a tiny
GGUF without MTP layers, like most GGUF files. Needs Docker (CI: KIT_REQUIRE_DOCKER=1).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from pathlib import Path

import pytest
import requests

from kit import catalog, config as cfg, resolve, rules, serving
from tests.ggufmodels import write_tiny_llama

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ENGINE = "llama.cpp"


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory) -> Path:
    """No MTP layers; trained for 40960 tokens so no preset's context is capped by the model."""
    folder = tmp_path_factory.mktemp("plain")
    write_tiny_llama(folder / "model.gguf", ctx=40960)
    folder.chmod(0o755)
    return folder / "model.gguf"


@contextlib.contextmanager
def serving_container(client, image: str, argv: list[str], model: Path):
    container = client.containers.run(image, command=argv, detach=True, ports={"8080/tcp": ("127.0.0.1", None)},
                                      volumes={str(model.parent): {"bind": "/models", "mode": "ro"}})
    try:
        deadline = time.monotonic() + 120
        url = None
        while time.monotonic() < deadline:
            container.reload()
            assert container.status in ("created", "running"), container.logs()[-3000:].decode()
            ports = container.attrs["NetworkSettings"]["Ports"].get("8080/tcp")
            if ports:
                url = f"http://127.0.0.1:{ports[0]['HostPort']}"
                with contextlib.suppress(requests.ConnectionError):
                    if requests.get(f"{url}/health", timeout=2).status_code == 200:
                        break
            time.sleep(0.5)
        else:
            pytest.fail(f"not healthy in 120 s: {container.logs()[-3000:].decode()}")
        yield url, container
    finally:
        container.remove(force=True)


def preset_argv(preset: str, model: Path) -> tuple[cfg.StackConfig, list[str]]:
    config = cfg.from_dict({"preset": preset, "model": {"dir": str(model.parent), "file": model.name}})
    rules.validate(config)
    return config, list(resolve.engine(config, ENGINE).argv)


PRESETS = [name for name in cfg.presets() if ENGINE in cfg.from_dict({"preset": name}).engine_names()]


def test_every_llama_preset_is_covered():
    assert {"dual-v100-nvlink", "dual-v100-pcie", "single-v100-32g", "cpu", "ninfer-primary"} <= set(PRESETS)


def test_the_cpu_drop_list_is_all_that_differs(plain_model):
    """The argv started below is the preset's own, less exactly the declared flags (--device: a CPU build has no
    CUDA0; the next test shows it refuses it)."""
    drops = catalog.get(ENGINE).flavors["cpu"].drops_flags
    for preset in PRESETS:
        _, argv = preset_argv(preset, plain_model)
        started = serving.on_flavor(argv, ENGINE, "cpu")
        removed = [t for t in argv if t not in started]
        assert all(t in drops or argv[argv.index(t) - 1] in drops for t in removed), (preset, removed)
        assert len(argv) - len(started) == len(removed)
    # a CPU build takes --n-gpu-layers / --split-mode / --tensor-split and warns; --device CUDA0 it refuses
    assert drops == ["--device"]
    _, default = preset_argv("dual-v100-nvlink", plain_model)
    assert default[default.index("--device") + 1] == "CUDA0,CUDA1"


def exit_log(client, image: str, argv: list[str], model: Path) -> tuple[int, str]:
    container = client.containers.run(image, command=argv, detach=True,
                                      volumes={str(model.parent): {"bind": "/models", "mode": "ro"}})
    try:
        code = container.wait(timeout=120)["StatusCode"]
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def test_a_gpu_argv_without_gpus_exits_naming_the_device(cpu_image, plain_model, docker_ready):
    """Where no CUDA device exists (here: a build without the CUDA module; on a GPU host: a container without GPUs),
    the default argv stops with the device named instead of serving from the CPU; `kit logs --check` names it."""
    from kit import logscan

    _, argv = preset_argv("dual-v100-nvlink", plain_model)
    code, logs = exit_log(docker_ready, cpu_image.tag, argv, plain_model)
    assert code != 0, logs[-2000:]
    assert 'error while handling argument "--device": invalid device: CUDA0' in logs, logs[-2000:]
    assert "gpu-not-visible" in {f.name for f in logscan.scan(logs)}


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_argv_starts_the_real_engine(preset, cpu_image, plain_model, docker_ready):
    config, argv = preset_argv(preset, plain_model)
    assert "--spec-type" not in argv  # auto decided from the header: no MTP layers here
    started = serving.on_flavor(argv, ENGINE, "cpu")
    with serving_container(docker_ready, cpu_image.tag, started, plain_model) as (url, container):
        reply = requests.post(f"{url}/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] > 0
        slots = requests.get(f"{url}/props", timeout=10).json()
        # llama-server agrees with kit: serve.concurrency slots, each of model.ctx tokens
        assert slots["total_slots"] == config.serve.concurrency
        assert slots["default_generation_settings"]["n_ctx"] == resolve.engine(config, ENGINE).ctx
        # model.name is the id clients send and see (--alias)
        models = requests.get(f"{url}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == config.model.name
        logs = container.logs().decode()
        assert "exiting due to model loading error" not in logs


def test_model_with_mtp_layers_renders_draft_mtp(tmp_path):
    write_tiny_llama(tmp_path / "model.gguf", extra={"llama.nextn_predict_layers": 1})
    _, argv = preset_argv("dual-v100-nvlink", tmp_path / "model.gguf")
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"


def test_default_cpu_stack_serves_four_full_length_requests_at_once(cpu_image, plain_model, docker_ready):
    """serve.concurrency 4 and model.ctx 2048 (the cpu preset): four requests of 2048 tokens each, at once."""
    config, argv = preset_argv("cpu", plain_model)
    ctx, slots, max_tokens = config.model.ctx, config.serve.concurrency, 32
    assert (ctx, slots) == (2048, 4)
    with serving_container(docker_ready, cpu_image.tag, argv, plain_model) as (url, _):
        def ask(prompt: str, n: int = max_tokens) -> requests.Response:
            return requests.post(f"{url}/v1/chat/completions", timeout=300, json={
                "messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0,
                "ignore_eos": True, "cache_prompt": False})

        # Every "x" is one byte-fallback token in this vocabulary: learn the template's own tokens once
        overhead = ask("x" * 10, 1).json()["usage"]["prompt_tokens"] - 10
        length = ctx - max_tokens - overhead  # prompt + reply = exactly ctx tokens
        prompts = [f"{i}" + "x" * (length - 1) for i in range(slots)]
        with concurrent.futures.ThreadPoolExecutor(slots) as pool:
            replies = list(pool.map(ask, prompts))
        for reply in replies:
            assert reply.status_code == 200, reply.text[:300]
            usage = reply.json()["usage"]
            assert usage["prompt_tokens"] + usage["completion_tokens"] == ctx, usage
        # one token more than a slot holds is refused: the limit is model.ctx per request, not the whole pool
        too_long = ask("x" * (ctx - overhead + 1), 1)
        assert too_long.status_code == 400 and "exceeds the available context size" in too_long.text
