"""`kit deploy` on this machine's CPU setup, for real: health, smoke request, self-healing, down/up, front door."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from kit import build, config as cfg, deploy, dockerhost, rules
from kit.services import endpoint
from tests.conftest import FIXTURES, free_port

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def write_config(folder: Path, tiny_gguf: Path, name: str, **stack) -> Path:
    raw = yaml.safe_load((FIXTURES / "cpu-ci.yaml").read_text())
    raw["model"] = {"dir": str(tiny_gguf.parent)}
    raw["serve"] = {"port": free_port()}
    raw["stack"] = {"name": name, **stack}
    path = folder / "kit.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def kit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kit", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture
def stack(tmp_path, cpu_image, tiny_gguf):
    created: list[Path] = []

    def make(name: str, **stack_fields):
        path = write_config(tmp_path, tiny_gguf, name, **stack_fields)
        created.append(tmp_path / "out")
        config = cfg.load(path)
        rules.validate(config)
        return path, config

    yield make
    for out in created:
        if (out / "compose.yaml").exists():
            subprocess.run([sys.executable, "-m", "kit", "down", "-o", str(out)], capture_output=True)


def ids(config):
    return sorted(c.id for c in deploy.containers(config))


def test_deploy_heals_and_redeploys(stack, tmp_path, tiny_gguf):
    path, config = stack("kitci-single")
    first = kit("deploy", "-c", str(path), "-o", "out", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "ready" in first.stdout and "smoke:" in first.stdout
    before = ids(config)

    again = kit("deploy", "-c", str(path), "-o", "out", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert ids(config) == before, "a second deploy must change nothing"

    # crash the engine: kill its process from the host; restart: unless-stopped brings it back healthy
    container = deploy.containers(config)[0]
    container.reload()
    os.kill(container.attrs["State"]["Pid"], signal.SIGKILL)
    time.sleep(2)
    deploy.wait_healthy(config, 120, echo=lambda _l: None)
    container.reload()
    assert container.attrs["RestartCount"] >= 1

    status = kit("status", "-c", str(path), cwd=tmp_path)
    assert "healthy" in status.stdout
    # no -c: ./kit.yaml is the stack; with no kit.yaml at all, kit's labels on the running containers find it
    assert "kitci-single" in kit("status", cwd=tmp_path).stdout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    found = kit("status", cwd=elsewhere)
    assert "kitci-single" in found.stdout and "healthy" in found.stdout, found.stdout
    clean = kit("logs", "-o", "out", "--check", cwd=tmp_path)
    assert clean.returncode == 0, clean.stdout

    down = kit("down", "-o", "out", cwd=tmp_path)
    assert down.returncode == 0 and not deploy.containers(config)
    assert tiny_gguf.is_file(), "down must never touch the model folder"
    back = kit("deploy", "-c", str(path), "-o", "out", cwd=tmp_path)
    assert back.returncode == 0, back.stderr
    # the rendered folder is gone: -c names the stack, compose finds it by its project label
    import shutil

    shutil.rmtree(tmp_path / "out")
    gone = kit("down", "-c", str(path), cwd=tmp_path)
    assert gone.returncode == 0, gone.stderr
    assert not deploy.containers(config) and tiny_gguf.is_file()


def test_front_door_answers_when_primary_is_down(stack, tmp_path):
    path, config = stack("kitci-door", fallback="llama.cpp", front_door=True)
    build.build_front_door(config, echo=lambda _l: None)
    result = kit("deploy", "-c", str(path), "-o", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    key = deploy.api_key(tmp_path / "out")
    url = endpoint(config)
    primary = next(c for c in deploy.containers(config) if c.labels.get("io.kit.role") == "primary")
    primary.stop(timeout=5)
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    reply = requests.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] > 0
    unauthorized = requests.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert unauthorized.status_code == 401, "the API key from .env must be enforced"


def test_logs_check_flags_silent_failures(tmp_path):
    from kit import logscan

    text = ("ggml_cuda_init: found 2 CUDA devices\n"
            "W NCCL init failed (unhandled cuda error); falling back to internal AllReduce\n"
            "CUDA error: no kernel image is available for execution on the device\n")
    names = {f.name for f in logscan.scan(text)}
    assert names == {"nccl-fallback", "no-kernel-image"}
    assert not logscan.scan("all good\nserver listening on 0.0.0.0:8080\n")


# Start-up failures as llama-server 0c1e57098 (the cpu build) printed them, one real log excerpt per signature
STARTUP_LINES = {
    "model-missing": "0.00.010.962 E gguf_init_from_file: failed to open GGUF file '/models/nope.gguf' "
                     "(No such file or directory)",
    "mtp-without-layers": "0.00.031.734 W llama_init_from_model: context type MTP requested but model doesn't "
                          "contain MTP layers",
    "bad-flag": "error: invalid argument: --bogus-flag",
    # llama-server built as the image builds it, on an H200 with CUDA_VISIBLE_DEVICES="" (gpu-presets-h200.md)
    "gpu-not-visible": 'error while handling argument "--device": invalid device: CUDA0',
    "compute-buffers": "llama_init_from_model: failed to allocate compute pp buffers",
}


def test_a_line_is_named_once_by_its_most_specific_signature():
    from kit import logscan

    text = ("0.00.101.740 E ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\n"
            'error while handling argument "--device": invalid device: CUDA0\n'
            'error while handling argument "--ctx-size": bad value\n')
    advice = {f.name: f.advice for f in logscan.scan(text)}
    assert "run `kit doctor` on the host" in advice["gpu-not-visible"]  # each finding carries its fix
    findings = {f.name: f.line for f in logscan.scan(text)}
    assert findings == {"gpu-not-visible": "0.00.101.740 E ggml_cuda_init: failed to initialize CUDA: no "
                                           "CUDA-capable device is detected",
                        "bad-flag": 'error while handling argument "--ctx-size": bad value'}


@pytest.mark.parametrize("name", sorted(STARTUP_LINES))
def test_startup_failures_are_named(name):
    from kit import logscan

    findings = logscan.scan("0.00.010.403 I srv    load_model: loading model\n" + STARTUP_LINES[name] + "\n")
    assert [f.name for f in findings] == [name]


def test_logs_check_finds_a_crash_loop(stack, tmp_path, cpu_image):
    """A model that is not there: the engine exits, compose restarts it; --check names the loop and the cause."""
    path, config = stack("kitci-loop")
    out = tmp_path / "out"
    from kit import render

    raw = yaml.safe_load(path.read_text())
    raw["model"]["file"] = "nope.gguf"
    path.write_text(yaml.safe_dump(raw))
    render.render_stack(cfg.load(path), out)  # past the pre-flight, as a stack whose model was moved away
    subprocess.run([*dockerhost.compose_cmd(), "-f", str(out / "compose.yaml"),
                    "--env-file", str(out / ".env"), "up", "-d"], check=True, capture_output=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        c = deploy.containers(config)[0]
        c.reload()
        if c.attrs.get("RestartCount", 0) >= 2:
            break
        time.sleep(2)
    result = kit("logs", "-o", "out", "--check", "-c", str(path), cwd=tmp_path)
    assert result.returncode == 1, result.stdout
    assert "model-missing" in result.stdout and "nope.gguf" in result.stdout
    assert "crash-loop" in result.stdout and "restarted" in result.stdout


def test_preflight_stops_before_anything_is_written_or_started(stack, tmp_path, tiny_gguf):
    path, config = stack("kitci-preflight")
    raw = yaml.safe_load(path.read_text())
    raw["model"]["file"] = "missing.gguf"
    path.write_text(yaml.safe_dump(raw))
    result = kit("deploy", "-c", str(path), "-o", "out", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: model.file: ") and "missing.gguf does not exist on this host" in result.stderr
    assert not (tmp_path / "out").exists() and not deploy.containers(config)

    # a port held by something else: named, nothing started
    raw["model"]["file"] = tiny_gguf.name
    path.write_text(yaml.safe_dump(raw))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", raw["serve"]["port"]))
        busy.listen()
        result = kit("deploy", "-c", str(path), "-o", "out", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"serve.port: port {raw['serve']['port']} (llama-cpp) is in use by another process" in result.stderr
    assert not (tmp_path / "out").exists() and not deploy.containers(config)


def test_verify_serves_starts_the_engine_until_its_healthcheck_passes(stack, tmp_path, cpu_image):
    path, _ = stack("kitci-verify")
    result = kit("verify", cpu_image.tag, "--serve", "-c", str(path), "--check", "serves", "--check", "healthcheck",
                 "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert checks["serves"]["status"] == "ok" and "s after start (curl -fsS http://127.0.0.1:8080/health" in \
        checks["serves"]["detail"], checks
    assert checks["healthcheck"]["detail"].endswith("(fails while the engine is down)")
    # without --serve the check says how to run it
    plain = kit("verify", cpu_image.tag, "--check", "serves", "--json", cwd=tmp_path)
    assert json.loads(plain.stdout)[0]["status"] == "skip"


def test_verify_serves_fails_with_the_engines_reason(stack, tmp_path, cpu_image):
    path, _ = stack("kitci-verify-missing")
    raw = yaml.safe_load(path.read_text())
    raw["model"]["file"] = "not-there.gguf"
    path.write_text(yaml.safe_dump(raw))
    result = kit("verify", cpu_image.tag, "--serve", "-c", str(path), "--check", "serves", "--json", cwd=tmp_path)
    assert result.returncode == 1
    (check,) = json.loads(result.stdout)
    assert check["status"] == "fail" and check["detail"].startswith("the engine exited 1: "), check


def _container_argv(config) -> list[str]:
    from kit.tunerun import process_argv

    (container,) = deploy.containers(config)
    container.reload()
    return process_argv(int(container.attrs["State"]["Pid"]))


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_kit_tune_restarts_the_real_engine_per_trial_and_leaves_the_stack_on_the_winner(stack, tmp_path, cpu_image):
    """kit tune on the deployed cpu stack: two real settings, every trial a restart of the real llama-server with its
    flags (read from the container's process), the winner written, the stack healthy on it, no image rebuilt."""
    path, config = stack("kitci-tune")
    deployed = kit("deploy", "-c", str(path), "-o", "out", cwd=tmp_path)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    before = yaml.safe_load((tmp_path / "out/compose.yaml").read_text())
    image_id = dockerhost.client().images.get(cpu_image.tag).id
    (tmp_path / "space.yaml").write_text("space:\n  serve.concurrency: [1, 2]\n  ubatch: [256, 512]\n")
    done = kit("tune", "-c", str(path), "-o", "out", "--space", "space.yaml", "--requests", "2", "--budget", "10m",
               "--write", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr

    lines = [json.loads(line) for line in (tmp_path / "tune-llama-cpp.jsonl").read_text().splitlines()][1:]
    measured = [t for t in lines if t["measurement"]["status"] in ("ok", "pruned")]
    # the start (concurrency 4 from the cpu preset, ubatch 512), then concurrency 1 and 2, then the other ubatch
    assert len(measured) >= 3, done.stdout
    for t in measured:
        argv = t["measurement"]["argv"]
        assert argv[0] == "/app/llama-server", argv
        assert _flag(argv, "--parallel") == str(t["point"]["serve.concurrency"])
        assert _flag(argv, "--ubatch-size") == str(t["point"]["ubatch"])
    # (a point within noise of the best is measured again: the same point may appear more than once)
    assert len({(t["point"]["serve.concurrency"], t["point"]["ubatch"]) for t in measured}) >= 3
    print(done.stdout)

    best_line = next(line for line in done.stdout.splitlines() if line.startswith("best: "))
    written = cfg.load(path)
    rules.validate(written)
    best = {"serve.concurrency": written.serve.concurrency, "ubatch": written.engine_settings("llama.cpp")["ubatch"]}
    assert best_line.startswith(f"best: serve.concurrency={best['serve.concurrency']} ubatch={best['ubatch']} = ")
    # the stack is left healthy, on the winner
    deploy.wait_healthy(written, 60, echo=lambda _l: None)
    running = _container_argv(written)
    assert _flag(running, "--parallel") == str(best["serve.concurrency"])
    assert _flag(running, "--ubatch-size") == str(best["ubatch"])
    # a re-render of the written kit.yaml changes the engine's serve flags only, and runs the same image
    rendered = kit("render", "-c", str(path), "-o", "again", cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    after = yaml.safe_load((tmp_path / "again/compose.yaml").read_text())
    engine_before, engine_after = before["services"]["llama-cpp"], after["services"]["llama-cpp"]
    assert {k: v for k, v in engine_before.items() if k != "command"} == \
        {k: v for k, v in engine_after.items() if k != "command"}
    assert {**before, "services": None} == {**after, "services": None}
    changed = {engine_before["command"][i - 1] for i, (a, b) in
               enumerate(zip(engine_before["command"], engine_after["command"])) if a != b}
    assert changed <= {"--parallel", "--ubatch-size"}, changed
    assert dockerhost.client().images.get(cpu_image.tag).id == image_id
    (container,) = deploy.containers(written)
    assert container.image.id == image_id


def test_compose_up_failures_are_named_with_their_fix(tmp_path, base_image):
    """`docker compose up` itself can fail before any engine log exists; kit deploy names the cause. The GPU case is
    Docker's real answer on this machine (no NVIDIA hook, runtime or CDI spec: moby daemon/devices.go); the memlock
    line is runc's, as this CI sandbox's dockerd (no CAP_SYS_RESOURCE) printed it for a GPU service's `memlock: -1`."""
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump({"name": "kitci-nodriver", "services": {"gpu": {
        "image": base_image, "command": ["true"], "deploy": {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu", "compute", "utility"]}]}}}}}}))
    (tmp_path / ".env").write_text("")
    try:
        with pytest.raises(deploy.CheckFailed) as err:
            deploy._compose(tmp_path, "up", "-d")
        assert 'could not select device driver "nvidia"' in str(err.value)
        assert str(err.value).splitlines()[-1].startswith("no-nvidia-driver: this Docker cannot hand out NVIDIA GPUs")
    finally:
        deploy._compose(tmp_path, "down", check=False)
    from kit import logscan

    runc = ("Error response from daemon: failed to create shim task: OCI runtime create failed: runc create failed: "
            "unable to start container process: error during container init: error setting rlimits for ready process: "
            "error setting rlimit type 8: operation not permitted: unknown")
    assert [f.name for f in logscan.scan(runc)] == ["memlock-denied"]
