"""Rendered compose stacks, checked by the real compose v2 binary and by their structure."""

from __future__ import annotations

import json
import stat
import subprocess

import pytest
import yaml

from kit import compose, dockerhost, render, resolve
from tests.conftest import make_config
from tests.golden_cases import CASES


def _compose() -> list[str] | None:
    try:
        return dockerhost.compose_cmd()
    except Exception:
        return None


COMPOSE = _compose()
needs_compose = pytest.mark.usefixtures("compose_binary")  # the fixture lives in conftest.py


def rendered(tmp_path, data):
    out = tmp_path / "out"
    render.render_stack(make_config(data), out)
    return out


def compose_config(out) -> dict:
    result = subprocess.run([*COMPOSE, "-f", str(out / "compose.yaml"), "--env-file", str(out / ".env"),
                             "config", "--format", "json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@needs_compose
@pytest.mark.parametrize("case", sorted(CASES))
def test_real_compose_accepts_every_case(case, tmp_path):
    out = rendered(tmp_path, CASES[case])
    model = compose_config(out)
    config = make_config(CASES[case])
    for name, service in model["services"].items():
        assert service["entrypoint"], f"{name} has no explicit entrypoint"
        assert isinstance(service["command"], list)
        assert "nvidia_entrypoint" not in " ".join(service["entrypoint"])
        for port in service.get("ports", []):
            assert port["host_ip"] == "127.0.0.1"
        devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        for device in devices:
            assert device["driver"] == "nvidia" and "count" not in device
            assert device["device_ids"] == config.hardware.device_ids
            # compute: without it the NVIDIA hook mounts no libcuda.so.1 (test_wheel_engine.py runs the stand-in hook)
            assert set(device["capabilities"]) == {"gpu", "compute", "utility"}


@needs_compose
def test_model_path_with_spaces_and_quotes_survives(tmp_path):
    weird = "Qwen 27B \"IQ4\" it's.gguf"
    out = rendered(tmp_path, {"preset": "cpu", "model": {"file": weird, "dir": str(tmp_path / "my models")}})
    service = compose_config(out)["services"]["llama-cpp"]
    command = service["command"]
    assert command[command.index("--model") + 1] == f"/models/{weird}"
    assert service["volumes"][0]["source"] == str(tmp_path / "my models")
    assert service["volumes"][0]["read_only"] is True


def test_api_key_only_in_env_file(tmp_path):
    out = rendered(tmp_path, {})
    env = dict(line.split("=", 1) for line in (out / ".env").read_text().splitlines() if "=" in line)
    key = env["KIT_API_KEY"]
    assert len(key) > 20
    assert key not in (out / "compose.yaml").read_text()
    assert "${KIT_API_KEY}" in (out / "compose.yaml").read_text()
    assert stat.S_IMODE((out / ".env").stat().st_mode) == 0o600
    for dockerfile in out.glob("images/*/Dockerfile"):
        assert key not in dockerfile.read_text()
    # re-rendering keeps the key (clients keep working) and `kit deploy` stays idempotent
    render.render_stack(make_config({}), out)
    assert f"KIT_API_KEY={key}" in (out / ".env").read_text()


def test_nccl_environment_follows_interconnect(tmp_path):
    nvlink = yaml.safe_load((rendered(tmp_path / "a", {}) / "compose.yaml").read_text())
    pcie = yaml.safe_load((rendered(tmp_path / "b", {"preset": "dual-v100-pcie"}) / "compose.yaml").read_text())
    cpu = yaml.safe_load((rendered(tmp_path / "c", {"preset": "cpu"}) / "compose.yaml").read_text())
    assert nvlink["services"]["llama-cpp"]["environment"]["NCCL_P2P_LEVEL"] == "NVL"
    assert pcie["services"]["llama-cpp"]["environment"]["NCCL_P2P_LEVEL"] == "PHB"
    assert nvlink["services"]["llama-cpp"]["environment"]["NCCL_DEBUG"] == "WARN"
    assert "NCCL_DEBUG" not in cpu["services"]["llama-cpp"]["environment"]
    assert "deploy" not in cpu["services"]["llama-cpp"]


def test_service_shape(tmp_path):
    compose = yaml.safe_load((rendered(tmp_path, {}) / "compose.yaml").read_text())
    service = compose["services"]["llama-cpp"]
    assert service["ipc"] == "host"
    assert service["ulimits"]["memlock"] == -1
    assert service["restart"] == "unless-stopped"
    assert service["logging"]["options"]["max-size"] == "50m"
    assert service["healthcheck"]["start_period"] == "210s"  # 60 s + 10 s/GiB for 15 GiB
    assert service["entrypoint"] == ["/app/llama-server"]
    assert service["command"][:2] == ["--model", "/models/Qwen3.8-27B-IQ4_XS.gguf"]
    argv = service["command"]
    # 4 users at once, each up to 16384 tokens; llama-server sizes the KV cache to 4 x 16384 itself
    assert argv[argv.index("--parallel") + 1] == "4" and argv[argv.index("--kv-unified-per-slot") + 1] == "16384"
    assert "--ctx-size" not in argv
    # the model is not on this machine: no MTP assumed, so no speculative flags that would stop llama-server
    assert "--spec-type" not in argv and "--spec-draft-n-max" not in argv


def test_expose_binds_all_interfaces(tmp_path):
    compose = yaml.safe_load((rendered(tmp_path, {"serve": {"expose": True}}) / "compose.yaml").read_text())
    assert compose["services"]["llama-cpp"]["ports"] == ["8080:8080"]


def test_front_door_has_backup_upstream(tmp_path):
    out = rendered(tmp_path, {"preset": "ninfer-primary"})
    conf = (out / "front-door/nginx.conf").read_text()
    assert "server ninfer:8000 max_fails=1" in conf and "server llama-cpp:8080 backup;" in conf
    assert "proxy_next_upstream error timeout http_502 http_503" in conf
    assert "listen 8080;" in conf and "listen 8000;" not in conf  # the front door's own port, not its upstream's
    compose = yaml.safe_load((out / "compose.yaml").read_text())
    assert compose["services"]["front-door"]["ports"] == ["127.0.0.1:8080:8080"]
    assert compose["services"]["ninfer"]["ports"] == ["127.0.0.1:8081:8000"]


def test_the_front_door_service_and_the_engines_labels_by_hand():
    """ninfer-primary, written out from what each field is for: nginx started by its own binary on kit's conf, the
    conf mounted read-only, health from /kit/health, restarted unless stopped, json-file logs capped at 3 x 50 MB,
    and the role labels `kit status` / `kit down` find the stack by."""
    config = make_config({"preset": "ninfer-primary", "stack": {"name": "seed"}})
    services = compose.compose_dict(resolve.stack(config))["services"]
    logs = {"driver": "json-file", "options": {"max-size": "50m", "max-file": "3"}}
    assert services["front-door"] == {
        "image": "kit/front-door:0.1.0", "pull_policy": "never", "container_name": "seed-front-door",
        "entrypoint": ["/usr/sbin/nginx"], "command": ["-c", "/etc/kit/nginx.conf", "-g", "daemon off;"],
        "ports": ["127.0.0.1:8080:8080"], "volumes": ["./front-door/nginx.conf:/etc/kit/nginx.conf:ro"],
        "depends_on": {"ninfer": {"condition": "service_started"}, "llama-cpp": {"condition": "service_started"}},
        "healthcheck": {"test": ["CMD", "curl", "-fsS", "http://127.0.0.1:8080/kit/health"], "interval": "10s",
                        "timeout": "3s", "retries": 3, "start_period": "10s"},
        "restart": "unless-stopped", "logging": logs, "labels": {"io.kit.role": "front-door"}}
    assert services["ninfer"]["labels"] == {"io.kit.role": "primary", "io.kit.engine": "ninfer"}
    assert services["llama-cpp"]["labels"] == {"io.kit.role": "fallback", "io.kit.engine": "llama.cpp"}
    assert services["ninfer"]["logging"] == logs and services["ninfer"]["pull_policy"] == "never"
    assert services["ninfer"]["deploy"] == {"resources": {"reservations": {"devices": [
        {"driver": "nvidia", "device_ids": ["0", "1"], "capabilities": ["gpu", "compute", "utility"]}]}}}
    assert services["ninfer"]["healthcheck"]["retries"] == 3
    # images pushed to a registry may be pulled when missing; built here, never
    pushed = compose.compose_dict(resolve.stack(make_config({"preset": "ninfer-primary", "build": {"push": True}})))
    assert pushed["services"]["ninfer"]["pull_policy"] == "missing"


def test_no_api_key_means_no_key_variable_anywhere():
    config = make_config({"serve": {"api_key": False}})
    assert "LLAMA_API_KEY" not in compose.compose_dict(resolve.stack(config))["services"]["llama-cpp"]["environment"]
    assert "KIT_API_KEY" not in compose.env_text(config)


def test_env_file_text_and_reading_it_back(tmp_path):
    """.env: a comment, the model folder, then the key (kit- and 32 URL-safe characters for 24 random bytes); reading
    it back skips comments and blank lines, splits at the first '=', and unquotes."""
    config = make_config({"model": {"dir": str(tmp_path / "models")}})
    lines = compose.env_text(config).split("\n")
    assert lines[0] == "# kit: secrets and host paths for compose. Mode 0600; never commit."
    assert lines[1] == f"KIT_MODEL_DIR={tmp_path / 'models'}"
    assert lines[2].startswith("KIT_API_KEY=kit-") and len(lines[2]) == len("KIT_API_KEY=kit-") + 32
    assert lines[3:] == [""]
    env = tmp_path / ".env"
    env.write_text('# KIT_API_KEY=commented\n  # x=y\nKIT_API_KEY = "kit-a=b"\nno equals sign\nKIT_MODEL_DIR=/m\n')
    assert compose.read_env(env) == {"KIT_API_KEY": "kit-a=b", "KIT_MODEL_DIR": "/m"}
    assert compose.read_env(tmp_path / "missing") == {}
    kept = compose.files(resolve.stack(config), tmp_path)[".env"]
    assert "KIT_API_KEY=kit-a=b\n" in kept


def test_compose_yaml_keeps_the_order_and_the_characters(tmp_path):
    """A reader sees image, entrypoint, command in kit's order, and a model named in Chinese as it is."""
    text = compose.compose_yaml(resolve.stack(make_config({"preset": "cpu", "model": {"file": "千问-27B.gguf"}})))
    assert text.startswith("# Rendered by kit 0.1.0: edit kit.yaml")
    body = text.split("services:\n", 1)[1]
    assert body.index("image:") < body.index("entrypoint:") < body.index("command:")
    assert "千问-27B.gguf" in text and "command:\n    - --model" in text


def test_the_front_door_image_files(tmp_path):
    ca = tmp_path / "ca.crt"
    ca.write_text("cert")
    files = compose.front_door_image_files(make_config({"mirrors": {"ca_bundle": str(ca)},
                                                        "base": {"runtime": "kit/base:trixie"}}))
    assert set(files) == {"Dockerfile", "kit/ca.crt"} and files["kit/ca.crt"] == ca
    assert "ARG RUNTIME_IMAGE=kit/base:trixie\n" in files["Dockerfile"]
    plain = compose.front_door_image_files(make_config({"mirrors": {"registry": "mirror.example/"}}))
    assert set(plain) == {"Dockerfile"} and "ARG RUNTIME_IMAGE=mirror.example/debian:bookworm-slim\n" in plain["Dockerfile"]


def test_no_front_door_writes_no_nginx_conf(tmp_path):
    out = rendered(tmp_path, {})  # the default stack: one engine, nothing to choose from
    assert not (out / "front-door").exists()
    assert "front-door" not in yaml.safe_load((out / "compose.yaml").read_text())["services"]
