"""The resolution stage: settings that depend on the model are decided from its header, once, and said."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from kit import resolve
from kit.errors import KitError
from tests.conftest import make_config
from tests.ggufmodels import write_tiny_llama

MTP_KEY = "llama.nextn_predict_layers"  # llama.cpp src/llama-arch.cpp: LLM_KV_NEXTN_PREDICT_LAYERS "%s.nextn_predict_layers"


def stack_with(tmp_path, mtp_layers: int | None, **llama):
    if mtp_layers is not None:
        write_tiny_llama(tmp_path / "m.gguf", extra={MTP_KEY: mtp_layers} if mtp_layers else None)
    return make_config({"model": {"dir": str(tmp_path), "file": "m.gguf"},
                        **({"engines": {"llama.cpp": llama}} if llama else {})})


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_model_with_mtp_layers_gets_draft_mtp(tmp_path):
    config = stack_with(tmp_path, 1)
    argv = list(resolve.engine(config, "llama.cpp").argv)
    assert flag(argv, "--spec-type") == "draft-mtp" and flag(argv, "--spec-draft-n-max") == "3"
    assert resolve.notes(config)[0] == \
        "engines.llama.cpp.spec_type auto: draft-mtp (m.gguf: llama.nextn_predict_layers = 1)"


def test_model_without_mtp_layers_gets_no_speculation(tmp_path):
    config = stack_with(tmp_path, 0)
    argv = list(resolve.engine(config, "llama.cpp").argv)
    assert "--spec-type" not in argv and "--spec-draft-n-max" not in argv
    assert resolve.engine(config, "llama.cpp").settings["spec_type"] == "none"


def test_explicit_draft_mtp_without_mtp_layers_is_exit_2(tmp_path):
    config = stack_with(tmp_path, 0, spec_type="draft-mtp")
    with pytest.raises(KitError) as err:
        list(resolve.engine(config, "llama.cpp").argv)
    assert err.value.field == "engines.llama.cpp.spec_type"
    assert "m.gguf has none (llama.nextn_predict_layers is 0 or absent)" in err.value.problem
    cfg = tmp_path / "kit.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"dir": str(tmp_path), "file": "m.gguf"},
                                   "engines": {"llama.cpp": {"spec_type": "draft-mtp"}}}))
    result = subprocess.run([sys.executable, "-m", "kit", "render", "-c", str(cfg), "-o", str(tmp_path / "out")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and not (tmp_path / "out").exists()
    assert result.stderr.strip().startswith("error: engines.llama.cpp.spec_type: draft-mtp needs MTP layers")
    assert "Traceback" not in result.stderr


def test_model_not_here_assumes_none_and_says_so(tmp_path):
    config = stack_with(tmp_path, None)
    argv = list(resolve.engine(config, "llama.cpp").argv)
    assert "--spec-type" not in argv
    (note,) = resolve.notes(config)
    assert note.startswith("engines.llama.cpp.spec_type auto:") and "is not on this machine" in note
    explicit = stack_with(tmp_path, None, spec_type="none")
    assert resolve.notes(explicit) == [] and "--spec-type" not in list(resolve.engine(explicit, "llama.cpp").argv)


def test_render_prints_the_notes(tmp_path):
    write_tiny_llama(tmp_path / "m.gguf", extra={MTP_KEY: 2})
    cfg = tmp_path / "kit.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"dir": str(tmp_path), "file": "m.gguf"}}))
    result = subprocess.run([sys.executable, "-m", "kit", "render", "-c", str(cfg), "-o", str(tmp_path / "out")],
                            capture_output=True, text=True, env={"COLUMNS": "300", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "note: engines.llama.cpp.spec_type auto: draft-mtp (m.gguf: llama.nextn_predict_layers = 2)" in result.stdout
    compose = yaml.safe_load((tmp_path / "out/compose.yaml").read_text())
    assert flag(compose["services"]["llama-cpp"]["command"], "--spec-type") == "draft-mtp"


def test_concurrency_drives_every_engine(tmp_path):
    config = make_config({"serve": {"concurrency": 8}, "model": {"ctx": 4096}})
    argv = list(resolve.engine(config, "llama.cpp").argv)
    assert (flag(argv, "--parallel"), flag(argv, "--kv-unified-per-slot")) == ("8", "4096")
    vllm = list(resolve.engine(make_config({"stack": {"primary": "vllm"}, "model": {"format": "hf"},
                                        "serve": {"concurrency": 8}}), "vllm").argv)
    assert flag(vllm, "--max-num-seqs") == "8"


def test_model_header_is_read_once_per_config(tmp_path, monkeypatch):
    from kit import modelinfo

    config = stack_with(tmp_path, 1)
    calls = []
    real = modelinfo.read
    monkeypatch.setattr(modelinfo, "read", lambda p: calls.append(p) or real(p))
    from kit import render

    render.collect(config)
    assert len(calls) == 1, calls


def test_context_past_the_trained_length_is_said(tmp_path):
    write_tiny_llama(tmp_path / "m.gguf", ctx=4096)
    config = make_config({"model": {"dir": str(tmp_path), "file": "m.gguf", "ctx": 16384}})
    (note,) = [n for n in resolve.notes(config) if n.startswith("model.ctx")]
    # 16384 / 4096 = 4: the RoPE scale that would stretch it
    assert "longer than m.gguf was trained for (4096)" in note and "--rope-scale, '4'" in note
    within = make_config({"model": {"dir": str(tmp_path), "file": "m.gguf", "ctx": 4096}})
    assert not [n for n in resolve.notes(within) if n.startswith("model.ctx")]


@pytest.mark.parametrize("preset", ["dual-v100-nvlink", "ninfer-primary", "cpu"])
def test_the_run_outputs_read_the_resolved_stack_and_nothing_else(tmp_path, monkeypatch, preset):
    """compose, the 1Panel apps and the manifests are functions of the ResolvedStack: once it is resolved, asking the
    catalog, the config's engine settings, the model header or the resolution stage again is an error here."""
    from kit import catalog, compose, k8s, modelinfo, serving
    from kit.config import StackConfig
    from kit.panel import export

    config = make_config({"preset": preset, "model": {"dir": str(tmp_path)}})
    names = export.runnable_apps(config)
    stack = resolve.stack(config, names)

    def asked(what):
        def fail(*args, **kwargs):
            raise AssertionError(f"a producer asked {what} again")
        return fail

    for owner, attr in ((catalog, "get"), (catalog, "all_engines"), (modelinfo, "read"), (resolve, "engine"),
                        (resolve, "flavor"), (resolve, "gpu"), (resolve, "model_size_gib"), (serving, "command"),
                        (serving, "flag_values")):
        monkeypatch.setattr(owner, attr, asked(f"{owner.__name__}.{attr}"))
    monkeypatch.setattr(StackConfig, "engine_settings", asked("config.engine_settings"))
    compose_files = compose.files(stack, tmp_path)
    manifests = k8s.files(stack, "kit-0123456789abcdef0123456789abcdef")
    apps = export.export_files(stack, names)
    # and what they read is the resolved argv, as it is: the primary's command in compose, k8s and the 1Panel app
    primary = stack.primary
    service = yaml.safe_load(compose_files["compose.yaml"])["services"][stack.services[0].name]
    assert service["command"] == list(primary.argv) and service["image"] == primary.image.tag
    pod = next(d for d in yaml.safe_load_all(manifests[f"k8s/{stack.services[0].name}.yaml"]) if d["kind"] == "Deployment")
    assert pod["spec"]["template"]["spec"]["containers"][0]["args"] == list(primary.argv)
    app = next(v for k, v in apps.items() if k.endswith("docker-compose.yml") and primary.image.tag.rsplit(":", 1)[1] in k)
    ctx_flag = next(a.flag for a in primary.entry.serve.args if a.value == "{ctx}")
    assert f"{ctx_flag} ${{CONTEXT_LENGTH}}" in app and f"{ctx_flag} {primary.ctx}" in " ".join(primary.argv)


@pytest.mark.parametrize("preset", ["dual-v100-nvlink", "ninfer-primary", "cpu"])
def test_the_dockerfiles_read_the_resolved_image_and_no_model(tmp_path, monkeypatch, preset):
    """An image is decided from the config and the catalog alone (ResolvedImage), so `kit build` runs where the model
    is not: with the model's header unreadable and the catalog and engine settings asked once, the Dockerfiles
    render and carry the resolved tag's toolkit."""
    from kit import catalog, dockerfile, modelinfo
    from kit.config import StackConfig

    config = make_config({"preset": preset, "model": {"dir": str(tmp_path / "elsewhere"), "size_gib": 15}})
    images = {name: resolve.image(config, name) for name in config.engine_names()}

    def asked(*args, **kwargs):
        raise AssertionError("asked again")

    for owner, attr in ((catalog, "get"), (modelinfo, "read"), (resolve, "engine"), (resolve, "flavor")):
        monkeypatch.setattr(owner, attr, asked)
    monkeypatch.setattr(StackConfig, "engine_settings", asked)
    for name, image in images.items():
        assert image.start_period_s == 60 + 10 * 15  # the model is not here: model.size_gib, 10 s per GiB
        text = dockerfile.render_files(config, name)["Dockerfile"]
        assert f'io.kit.engine="{name}"' in text and f"--start-period={image.start_period_s}s" in text
        if image.gpu:  # the tag says the toolkit the Dockerfile installs: cu<version>-sm70
            assert image.tag.endswith(f"-cu{image.cuda_version}-sm70") and image.cuda_version in text
        else:
            assert image.tag.endswith("-cpu")
