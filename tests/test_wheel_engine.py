"""The ``wheel`` recipe end to end (#14 item 5): a NInfer image built from a wheelhouse, deployed as a GPU engine
with the compose file users get, and serving a completion through the front door.

No GPU here, so two stand-ins, each written from the real part's source (see their docstrings):
- ``ninfer`` is tests/standin_ninfer.py packaged as a wheel under NInfer's entry-point name (tests/wheelhouse.py);
  it refuses to start without ``libcuda.so.1``, with fewer GPUs than its tensor-parallel size, or with a flag it
  does not know, as a real CUDA engine would.
- ``nvidia-container-runtime-hook`` is tests/nvidiahook.py. dockerd registers its "nvidia" device driver only when
  that binary is on its own PATH (moby daemon/nvidia_linux.go, ``init``), so the stack runs on a second dockerd
  (tests/dockerd2.py) started with the stand-in on its PATH: compose's ``deploy.resources.reservations.devices``
  goes through Docker's real device-request code (``setNvidiaGPUs``), and the hook sees exactly the environment
  Docker gives it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from kit import build, config as cfg
from tests.conftest import FIXTURES, ROOT, free_port
from tests.dockerd2 import second_daemon
from tests.ggufmodels import write_tiny_llama
from tests.standin_ninfer import REPLY
from tests.wheelhouse import write_ninfer_wheel

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def kit(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kit", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _program(path: Path, module: str) -> Path:
    """An executable that runs ``tests/<module>.py``'s ``main(sys.argv)`` with this Python."""
    path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                    f"from tests.{module} import main\nsys.exit(main(sys.argv))\n")
    path.chmod(0o755)
    return path


def hook_dir(folder: Path) -> Path:
    """A folder holding an executable named ``nvidia-container-runtime-hook`` that runs the stand-in."""
    folder.mkdir(parents=True, exist_ok=True)
    _program(folder / "nvidia-container-runtime-hook", "nvidiahook")
    return folder


def write_stack(folder: Path) -> Path:
    """The seeds' final setup (preset ninfer-primary: NInfer primary on both GPUs, llama.cpp fallback, front door) as
    CI can build it: CUDA 12.4 from Debian trixie, NCCL from PyPI, the fallback on the cpu flavor CI compiles."""
    models = folder / "models"
    (models / "tiny-hf").mkdir(parents=True)
    write_tiny_llama(models / "model.gguf")
    # a transformer checkpoint's config.json: what `kit plan` reads for an hf-format engine
    (models / "tiny-hf" / "config.json").write_text(json.dumps({
        "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_size": 64, "num_hidden_layers": 2,
        "max_position_embeddings": 4096, "vocab_size": 256, "torch_dtype": "float16"}))
    models.chmod(0o755)
    write_ninfer_wheel(folder / "wheels")
    # CUDA 12.4 from Debian trixie, NCCL from PyPI, the CA bundle: the route CI compiles (tests/fixtures)
    config = cfg.deep_merge(yaml.safe_load((FIXTURES / "debian-cuda-ci.yaml").read_text()), {
        "preset": "ninfer-primary",
        "stack": {"name": "kitci-wheel"},
        "model": {"dir": str(models), "file": "model.gguf", "ctx": 2048},
        "serve": {"port": free_port()},
        "engines": {"llama.cpp": {"flavor": "cpu"},
                    "ninfer": {"model_file": "tiny-hf", "wheelhouse": str(folder / "wheels"),
                               "requirement": "ninfer==0.0.1"}},
    })
    path = folder / "kit.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_wheel_engine_is_built_deployed_on_gpus_and_serves_through_the_front_door(tmp_path, cpu_image, base_image):
    path = write_stack(tmp_path)
    rendered = kit("render", "-c", str(path), "-o", "out", cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    compose = yaml.safe_load((tmp_path / "out" / "compose.yaml").read_text())
    images = {name: service["image"] for name, service in compose["services"].items()}
    assert images["llama-cpp"] == cpu_image.tag, "the fallback is the cpu image the docker tier built"

    # the wheelhouse is the engine's source: pip installs from it with no index
    built = kit("build", "-c", str(path), "ninfer", "--report", "report.json", cwd=tmp_path)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [report] = json.loads((tmp_path / "report.json").read_text())
    assert report["tag"] == images["ninfer"] and report["nccl_pin"] == "2.27.3" and report["archs"] == [70], report
    build.build_front_door(cfg.load(path), echo=lambda _l: None)

    # the image on its own: the venv's console script is the entrypoint, the pinned NCCL in place, no secrets
    verified = kit("verify", images["ninfer"], "-c", str(path), "--json", cwd=tmp_path)
    checks = {c["name"]: c for c in json.loads(verified.stdout)}
    for name in ("entrypoint", "nccl-runtime", "nccl-builder", "libs", "runs", "user", "healthcheck", "secrets"):
        assert checks[name]["status"] == "ok", checks[name]
    # the stand-in wheel is pure Python: verify rightly finds no sm_70 kernels in it (a real NInfer wheel carries them)
    assert checks["cuda-arch"] == {"name": "cuda-arch", "status": "fail",
                                   "detail": "no CUDA device code found; expected sm_[70]"}
    assert verified.returncode == 1 and "1 check(s) failed: cuda-arch" in verified.stderr

    hooks = hook_dir(tmp_path / "hookbin")
    hook_log = tmp_path / "hook.jsonl"
    # this CI sandbox cannot raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE): runc through tests/runc_rlimits.py
    runtime = _program(tmp_path / "kd2-runc", "runc_rlimits")
    with second_daemon([hooks], extra_env={"KIT_NVIDIA_HOOK_LOG": str(hook_log)}, runtime=runtime) as gpubox:
        gpubox.load_from_first(*images.values())
        env = gpubox.env(PATH=f"{hooks}{os.pathsep}{os.environ['PATH']}")

        # the oracle tells the old bug apart: a request for "utility" alone mounts no CUDA driver
        no_compute = gpubox.docker("run", "--rm", "--gpus", '"device=0","capabilities=utility"', "--entrypoint",
                                   "ls", images["ninfer"], "/usr/lib/x86_64-linux-gnu/libcuda.so.1", check=False)
        assert no_compute.returncode != 0, no_compute.stdout
        hook_log.unlink()

        try:
            deployed = kit("deploy", "-c", str(path), "-o", "out", cwd=tmp_path, env=env, timeout=600)
            engine_log = gpubox.docker("logs", "kitci-wheel-ninfer", check=False)
            assert deployed.returncode == 0, (deployed.stdout[-3000:] + deployed.stderr[-3000:]
                                              + engine_log.stdout[-2000:] + engine_log.stderr[-2000:])

            # Docker's device request reached the hook: both GPUs, and the driver's compute part (libcuda.so.1)
            calls = [json.loads(line) for line in hook_log.read_text().splitlines()]
            assert calls, "the NVIDIA hook never ran: compose asked Docker for no GPU"
            assert {c["devices"] for c in calls} == {"0,1"}
            assert all({"compute", "utility"} <= set(c["capabilities"]) for c in calls), calls

            # the engine runs the argv kit rendered, under its entrypoint, and says what it found
            inspect = json.loads(gpubox.docker("inspect", "kitci-wheel-ninfer").stdout)[0]
            assert inspect["Path"] == "/opt/venv/bin/ninfer"
            assert inspect["Args"] == ["serve", *compose["services"]["ninfer"]["command"]]
            # what compose asked Docker for, as users get it: unlimited pinned memory, both GPUs with compute
            assert {u["Name"]: u["Hard"] for u in inspect["HostConfig"]["Ulimits"]} == {"memlock": -1,
                                                                                        "stack": 67108864}
            [request] = inspect["HostConfig"]["DeviceRequests"]
            assert request["DeviceIDs"] == ["0", "1"] and set(request["Capabilities"][0]) == {"gpu", "compute", "utility"}
            logs = gpubox.docker("logs", "kitci-wheel-ninfer")
            assert "GPUs 0,1, NCCL 22703" in logs.stdout + logs.stderr, logs.stdout + logs.stderr

            key = (tmp_path / "out" / ".env").read_text().split("KIT_API_KEY=")[1].split()[0]
            url = f"http://127.0.0.1:{yaml.safe_load(path.read_text())['serve']['port']}"
            body = {"model": "tiny-hf", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
            reply = requests.post(f"{url}/v1/chat/completions", json=body,
                                  headers={"Authorization": f"Bearer {key}"}, timeout=60)
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"] == REPLY
            assert requests.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code == 401
        finally:
            down = kit("down", "-o", "out", cwd=tmp_path, env=env, timeout=300)
        assert down.returncode == 0, down.stderr
        assert gpubox.docker("ps", "-aq").stdout.split() == [], "kit down leaves no container behind"
