"""1Panel apps: the committed appstore/ equals what the code renders, and the validator's rules hold."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kit import config as cfg
from kit.panel import check, export
from tests.conftest import ROOT
from tests.conftest import make_config
from tests.test_compose import COMPOSE, needs_compose

REFERENCE = ROOT.parent / "shared" / "reference" / "1panel-appstore"
STORE = ROOT / "appstore"


def exported(tmp_path) -> Path:
    out = tmp_path / "appstore"
    from kit import render, resolve

    config = cfg.from_dict({})
    names = export.runnable_apps(config)
    render.write_tree(out, export.export_files(resolve.stack(config, names), names))
    return out


def test_committed_appstore_equals_rendered(tmp_path):
    out = exported(tmp_path)
    fresh = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    committed = {p.relative_to(STORE).as_posix(): p.read_bytes() for p in STORE.rglob("*") if p.is_file()}
    assert sorted(fresh) == sorted(committed), "appstore/ is stale: run `kit panel export -o appstore`"
    for rel, data in fresh.items():
        assert data == committed[rel], f"appstore/{rel} is stale: run `kit panel export -o appstore`"


def test_exported_apps_pass_every_rule_strictly():
    assert check.check_store(STORE) == []


def test_exported_app_shape():
    app = yaml.safe_load((STORE / "llama-cpp-v100/data.yml").read_text())
    props = app["additionalProperties"]
    assert props["key"] == "llama-cpp-v100" and props["type"] == "tool" and props["tags"] == ["AI"]
    assert {"en", "zh", "zh-Hant", "zh-hant", "ja", "ko", "ru", "tr", "es-es", "pt-br", "ms", "fa"} <= set(props["description"])
    version = next(d for d in (STORE / "llama-cpp-v100").iterdir() if d.is_dir())
    assert not version.name.startswith("v")
    fields = yaml.safe_load((version / "data.yml").read_text())["additionalProperties"]["formFields"]
    by_key = {f["envKey"]: f for f in fields}
    assert set(by_key) == {"PANEL_APP_PORT_HTTP", "MODEL_DIR", "MODEL_FILE", "CONTEXT_LENGTH", "GPU_ID_1",
                           "GPU_ID_2", "API_KEY", "EXTRA_ARGS"}
    assert by_key["PANEL_APP_PORT_HTTP"]["type"] == "number" and by_key["PANEL_APP_PORT_HTTP"]["rule"] == "paramPort"
    assert by_key["API_KEY"]["type"] == "password" and by_key["API_KEY"]["random"] is True
    assert (by_key["GPU_ID_1"]["default"], by_key["GPU_ID_2"]["default"]) == (0, 1)
    assert by_key["GPU_ID_2"]["type"] == "number" and by_key["GPU_ID_2"]["labelEn"] == "GPU 2 id (nvidia-smi index)"
    assert by_key["CONTEXT_LENGTH"]["default"] == 16384
    service = yaml.safe_load((version / "docker-compose.yml").read_text())["services"]["llama-cpp-v100"]
    assert service["container_name"] == "${CONTAINER_NAME}" and service["labels"] == {"createdBy": "Apps"}
    assert service["entrypoint"] == ["/app/llama-server"]
    # one entry per GPU: what CDI resolves (nvidia.com/gpu=0, nvidia.com/gpu=1)
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["${GPU_ID_1}", "${GPU_ID_2}"]
    assert service["ports"] == ["${PANEL_APP_PORT_HTTP}:8080"]
    assert (STORE / "llama-cpp-v100/logo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="../shared/reference is not next to this checkout")
def test_reference_apps_are_accepted():
    """The real official apps load in 1Panel, so the checker must not reject them (validator-only rules they break
    are warnings); and it does see the rules they break."""
    problems = check.check_store(REFERENCE / "apps", require_logo=False, store_data=REFERENCE / "data.yaml",
                                 strict=False)
    assert [p for p in problems if p.level == "error"] == []
    strict = check.check_store(REFERENCE / "apps", require_logo=False, store_data=REFERENCE / "data.yaml")
    found = {(p.where, p.what) for p in strict if p.level == "error"}
    assert ("dosgame/v3.9.6", "version folder name starts with 'v'") in found
    assert ("vllm/nvidia-0.25.1", "no service has labels createdBy") in found
    # things real apps do that are fine: zh-hant spelling, ${HOST_IP}-free ports, PANEL_DB_PORT with a service field
    assert not any(p.where.startswith(("llama-cpp", "ollama/", "ollama")) for p in strict if p.level == "error")


BREAKAGES = {
    "null default": (lambda d: _edit_fields(d, lambda f: f[1].update(default=None)), "is null"),
    "space in envKey": (lambda d: _edit_fields(d, lambda f: f[1].update(envKey="MODEL DIR")), "contains a space"),
    "undeclared var": (lambda d: _edit_compose(d, lambda t: t.replace("${MODEL_DIR}", "${MODELS_DIR}")),
                       "undeclared variables ['MODELS_DIR']"),
    "missing language": (lambda d: _edit_app(d, lambda a: a["additionalProperties"]["description"].pop("tr")),
                         "lacks languages ['tr']"),
    "key differs": (lambda d: _edit_app(d, lambda a: a["additionalProperties"].update(key="llama")),
                    "differs from the folder name"),
    "unknown tag": (lambda d: _edit_app(d, lambda a: a["additionalProperties"].update(tags=["LLM"])),
                    "not official tag keys"),
    "logo not png": (lambda d: (d / "logo.png").write_bytes(b"GIF89a"), "logo.png is not a PNG"),
    "port rule": (lambda d: _edit_fields(d, lambda f: f[0].pop("rule")), "needs rule: paramPort"),
    "no network": (lambda d: _edit_compose(d, lambda t: t.replace("external: true", "external: false")),
                   "lacks the external 1panel-network"),
    "v version": (lambda d: next(p for p in d.iterdir() if p.is_dir()).rename(d / "v1.0"), "starts with 'v'"),
}


def _version(d: Path) -> Path:
    return next(p for p in d.iterdir() if p.is_dir())


def _edit_fields(d, fn):
    path = _version(d) / "data.yml"
    data = yaml.safe_load(path.read_text())
    fn(data["additionalProperties"]["formFields"])
    path.write_text(yaml.safe_dump(data, allow_unicode=True))


def _edit_compose(d, fn):
    path = _version(d) / "docker-compose.yml"
    path.write_text(fn(path.read_text()))


def _edit_app(d, fn):
    path = d / "data.yml"
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data, allow_unicode=True))


@pytest.mark.parametrize("case", sorted(BREAKAGES))
def test_checker_catches(case, tmp_path):
    app = tmp_path / "llama-cpp-v100"
    shutil.copytree(STORE / "llama-cpp-v100", app)
    assert check.check_store(tmp_path) == []
    breaker, expected = BREAKAGES[case]
    breaker(app)
    errors = [p.what for p in check.check_store(tmp_path) if p.level == "error"]
    assert any(expected in e for e in errors), errors


@needs_compose
@pytest.mark.parametrize("app", ["llama-cpp-v100", "vllm-v100", "ninfer-v100"])
def test_app_compose_passes_real_compose(app, tmp_path):
    """As 1Panel runs it: .env from the form (1Panel's quoting), CONTAINER_NAME set, compose up's config."""
    version = _version(STORE / app)
    fields = yaml.safe_load((version / "data.yml").read_text())["additionalProperties"]["formFields"]
    values = {f["envKey"]: f["default"] for f in fields}
    values.update(MODEL_FILE="My Model Q4.gguf", EXTRA_ARGS="--threads 8 --verbose", CONTAINER_NAME="1Panel-local-x")
    env = "\n".join(f"{k}={v}" if isinstance(v, int) else f'{k}="{v}"' for k, v in values.items())
    (tmp_path / ".env").write_text(env + "\n")
    shutil.copy(version / "docker-compose.yml", tmp_path / "docker-compose.yml")
    result = subprocess.run([*COMPOSE, "-f", str(tmp_path / "docker-compose.yml"), "--env-file", str(tmp_path / ".env"),
                             "config", "--format", "json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    service = json.loads(result.stdout)["services"][app]
    command = service["command"]
    assert command[command.index("--model") + 1] == "/models/My Model Q4.gguf"
    assert command[-3:] == ["--threads", "8", "--verbose"]
    assert service["entrypoint"] and "nvidia_entrypoint" not in service["entrypoint"][0]
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["0", "1"]


def test_check_accepts_one_app_folder_as_well_as_a_store():
    from kit.panel import check

    assert check.check_store(STORE / "llama-cpp-v100") == []
    assert check.check_store(STORE) == []


def test_cpu_stack_exports_only_what_runs_on_cpu():
    from kit import resolve
    from kit.panel import export

    config = make_config({"preset": "cpu"})
    names = export.runnable_apps(config)
    files = export.export_files(resolve.stack(config, names), names)
    apps = {rel.split("/")[0] for rel in files}
    assert apps == {"llama-cpp-v100"}  # vLLM and NInfer have no cpu flavor
    compose = next(v for k, v in files.items() if k.endswith("docker-compose.yml"))
    assert "deploy" not in compose and "nvidia" not in compose and "GPU_ID" not in compose
