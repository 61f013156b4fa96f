"""Rendered Dockerfiles: golden files, structure (one NCCL, exec entrypoint, exact archs) and atomic output."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kit import catalog, dockerfile, render
from kit import config as cfg
from kit.errors import KitError
from tests.conftest import GOLDEN, make_config, nccl_versions, stages
from tests.golden_cases import CASES, render_case


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_golden(case):
    rendered = render_case(case)
    expected = {p.relative_to(GOLDEN / case).as_posix(): p.read_text() for p in (GOLDEN / case).rglob("*") if p.is_file()}
    assert sorted(rendered) == sorted(expected), "file list changed: run python tests/golden_cases.py --update"
    for rel, text in rendered.items():
        assert text == expected[rel], f"{case}/{rel} differs: run python tests/golden_cases.py --update and review"


def _dockerfiles(case):
    return {rel: text for rel, text in render_case(case).items()
            if rel.endswith("Dockerfile") and not rel.startswith("images/front-door/")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_nccl_version_in_every_stage(case, configure):
    config = configure(CASES[case])
    for rel, text in _dockerfiles(case).items():
        engine = catalog.get(rel.split("/")[1])
        gpu = engine.flavors[config.engine_settings(engine.name)["flavor"]].gpu
        by_stage = {name: nccl_versions(body) for name, body in stages(text).items()}
        if not gpu:
            assert not any(by_stage.values()), f"{rel}: a CPU image must not carry NCCL"
            continue
        assert by_stage["toolchain"] == {config.nccl.version}, rel
        assert by_stage["runtime-base"] == {config.nccl.version}, rel
        seen = set().union(*by_stage.values())
        assert seen == {config.nccl.version}, f"{rel}: NCCL versions {seen}"
        # both stages run the in-build check
        assert "nccl-check.sh builder" in stages(text)["toolchain"]
        assert "nccl-check.sh runtime" in stages(text)["runtime-base"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_final_entrypoint_is_engine_binary(case):
    for rel, text in _dockerfiles(case).items():
        engine = catalog.get(rel.split("/")[1])
        final = list(stages(text).values())[-1]
        entry = re.findall(r"^ENTRYPOINT (.+)$", final, flags=re.M)
        assert entry and json.loads(entry[-1]) == engine.entrypoint
        assert "nvidia_entrypoint" not in entry[-1]
        assert re.findall(r"^CMD (.+)$", final, flags=re.M)[-1] == "[]"
        assert re.search(r"^USER 10001$", final, flags=re.M), "runtime must not run as root"
        assert "HEALTHCHECK" in final


@pytest.mark.parametrize("case", sorted(CASES))
def test_arch_flags_are_exactly_the_configured_ones(case, configure):
    config = configure(CASES[case])
    for rel, text in _dockerfiles(case).items():
        cmake_archs = re.findall(r"CMAKE_CUDA_ARCHITECTURES=(\S+)", text)
        torch_archs = re.findall(r'TORCH_CUDA_ARCH_LIST="([^"]+)"', text)
        engine = catalog.get(rel.split("/")[1])
        gpu = engine.flavors[config.engine_settings(engine.name)["flavor"]].gpu
        archs = [int(a) for a in config.hardware.archs]
        if not gpu:
            assert not cmake_archs and not torch_archs
        elif engine.recipe == "cmake":
            assert cmake_archs == ['"' + ";".join(f"{a}-real" for a in archs) + '"']
        elif engine.recipe == "torch-source":
            assert torch_archs == [" ".join(f"{a // 10}.{a % 10}" for a in archs)]
        assert "native" not in text.lower().replace("ggml_native=off", "")


def test_llama_cpp_build_flags_fight_the_oom(configure):
    text = render_case("dual-v100-nvlink")["images/llama.cpp/Dockerfile"]
    for flag in ("LLAMA_BUILD_UI=OFF", "LLAMA_USE_PREBUILT_UI=OFF", "GGML_CUDA_FA_ALL_QUANTS=OFF", "GGML_NATIVE=OFF",
                 "GGML_CUDA_NCCL=ON"):
        assert f"-D{flag}" in text
    # jobs bounded by memory: 16 GiB / 4 GiB per job with 8 CPUs -> 4, used by the compile
    assert "ARG BUILD_JOBS=4" in text
    assert '-j"${BUILD_JOBS}"' in text


def test_build_jobs_bounded_by_memory(configure):
    assert configure({"build": {"cpus": 32, "memory_gib": 32}}).build_jobs() == 8
    assert configure({"build": {"cpus": 2, "memory_gib": 64}}).build_jobs() == 2
    assert configure({"build": {"cpus": 32, "memory_gib": 3}}).build_jobs() == 1
    assert configure({"build": {"jobs": 6}}).build_jobs() == 6
    assert configure({"build": {"cpus": 32, "memory_gib": 32, "memory_per_job_gib": 2}}).build_jobs() == 16


def test_manifest_records_the_facts(configure):
    manifest = json.loads(render_case("dual-v100-nvlink")["images/llama.cpp/kit/manifest.json"])
    assert manifest["nccl_pin"] == "2.27.3" and manifest["nccl_builder"] == "@NCCL_BUILDER@"
    assert manifest["archs"] == [70] and manifest["cuda"] == "12.9.1"
    assert manifest["backend"]["build_flags"]["CMAKE_CUDA_ARCHITECTURES"] == "70-real"
    assert manifest["backend"]["target"] == "ggml-cuda" and manifest["backend"]["files"] == ["libggml-cuda.so"]
    # the core is compiled without CUDA: no arch, no CUDA flag of the backend leaks into it
    assert manifest["build_flags"]["GGML_CUDA"] == "OFF" and "CMAKE_CUDA_ARCHITECTURES" not in manifest["build_flags"]


def test_cpu_and_cuda_images_share_the_compilers_and_core_layers(configure):
    """Docker reuses a layer when the parent and the step are the same: the stages up to the core compile must be
    the same text for the cpu and the cuda flavor on one base (CI builds both; the core is compiled once)."""
    from kit import config as cfg
    from tests.conftest import FIXTURES

    cpu = render.collect(cfg.load(FIXTURES / "cpu-ci.yaml"))["images/llama.cpp/Dockerfile"]
    cuda = render.collect(cfg.load(FIXTURES / "debian-cuda-ci.yaml"))["images/llama.cpp/Dockerfile"]
    def steps(text: str, stage: str) -> list[str]:
        return [line for line in stages(text)[stage].splitlines() if line.strip() and not line.startswith("#")]

    for stage in ("compilers", "core"):
        assert steps(cpu, stage) == steps(cuda, stage), stage
    assert "GGML_BACKEND_DL=ON" in stages(cuda)["core"] and "-DGGML_CUDA=OFF" in stages(cuda)["core"]
    assert "nvidia-cuda-toolkit" not in stages(cuda)["compilers"] and "nvidia-cuda-toolkit" in stages(cuda)["toolchain"]
    backend = stages(cuda)["gpu-backend"]
    assert "-DGGML_CUDA=ON" in backend and "--target ggml-cuda" in backend
    assert "cp build/bin/libggml-cuda.so /out/" in backend
    runtime = stages(cuda)["runtime"]
    assert "COPY --from=core /out/ /app/" in runtime and "COPY --from=gpu-backend /out/ /app/" in runtime


def test_mirrors_and_ca_bundle(configure, tmp_path):
    ca = tmp_path / "corp.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    config = configure({"mirrors": {"ca_bundle": str(ca), "registry": "mirror.example.cn/", "apt": "http://m.cn",
                                    "pip_index": "https://p.cn/simple"}})
    files = render.collect(config)
    text = files["images/llama.cpp/Dockerfile"]
    assert "ARG BUILDER_IMAGE=mirror.example.cn/nvidia/cuda:12.9.1-devel-ubuntu22.04" in text
    assert text.count("COPY kit/ca.crt /etc/ssl/certs/kit-ca.crt") == 2
    assert "ENV PIP_INDEX_URL=https://p.cn/simple" in text
    assert "#http://m.cn#g" in text
    assert files["images/llama.cpp/kit/ca.crt"] == ca
    # the image's source label is the engine's repository (images/llama.cpp.yaml source.git)
    assert 'org.opencontainers.image.source="https://github.com/ggml-org/llama.cpp"' in text
    # a base named in the config is used as written: the registry mirror prefixes only kit's defaults
    named = configure({"mirrors": {"registry": "mirror.example.cn/"}, "base": {"builder": "harbor.lan/cuda:devel"}})
    text = render.collect(named)["images/llama.cpp/Dockerfile"]
    assert "ARG BUILDER_IMAGE=harbor.lan/cuda:devel\n" in text
    assert "ARG RUNTIME_IMAGE=mirror.example.cn/nvidia/cuda:12.9.1-runtime-ubuntu22.04\n" in text


def test_apt_nccl_package_matches_cuda_minor(configure):
    text = render_case("vllm-dual-v100")["images/vllm/Dockerfile"]
    assert "libnccl2=2.27.3-1+cuda12.6" in text and "nvidia/cuda:12.6.3-devel" in text
    assert "torch==2.10.0" in text and "whl/cu126" in text


def test_wheel_engine_installs_offline_from_wheelhouse():
    text = render_case("ninfer-primary")["images/ninfer/Dockerfile"]
    assert 'pip install --no-index --find-links /wheels "ninfer"' in text
    assert json.loads(re.findall(r"^ENTRYPOINT (.+)$", text, flags=re.M)[-1]) == ["/opt/venv/bin/ninfer", "serve"]


def test_render_is_atomic(configure, tmp_path, monkeypatch):
    out = tmp_path / "out"
    render.render_stack(configure({}), out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    files = render.collect(configure({"preset": "cpu"}), out)

    # the disk fills up halfway through writing the new tree: the old output must stay whole
    written = []
    real_write = Path.write_text

    def write_then_fail(self, *args, **kwargs):
        written.append(self)
        if len(written) == 3:
            raise OSError(28, "No space left on device")
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_then_fail)
    with pytest.raises(OSError):
        render.write_tree(out, files)
    monkeypatch.undo()
    assert len(written) == 3, "the failure happened during the write"
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"], "no temp folder left behind"


def test_build_progress_has_a_heartbeat_during_a_long_step():
    """Not on a terminal, a 10-minute compile must still print a line at least every 30 s."""
    from kit.build import Progress

    now = [0.0]
    lines: list[str] = []
    progress = Progress(lines.append, clock=lambda: now[0])
    progress.feed({"stream": "Step 21/34 : RUN cmake --build build -j 2\n"})
    for t, out in [(10, "[ 10%] Building C object a.o"), (25, "[ 20%] b.o"), (31, "[ 30%] c.o"), (40, "[ 40%] d.o"),
                   (62, "[ 50%] e.o")]:
        now[0] = t
        progress.feed({"stream": out + "\n"})
    assert lines == ["[     0s] Step 21/34 : RUN cmake --build build -j 2",
                     "[    31s]   ... Step 21/34: [ 30%] c.o",
                     "[    62s]   ... Step 21/34: [ 50%] e.o"]


def test_vllm_compile_is_bounded_and_runtime_check_compares_with_the_builder():
    """Guards that only the golden files held before (#12): a golden update would have blessed their loss."""
    text = render_case("vllm-dual-v100")["images/vllm/Dockerfile"]
    builder = stages(text)["builder"]
    # jobs bounded by memory (ARG BUILD_JOBS), never $(nproc); one nvcc thread per job (seed: -j$(nproc) OOMs)
    assert "MAX_JOBS=${BUILD_JOBS}" in builder and "nproc" not in text
    assert "NVCC_THREADS=1" in builder
    # the runtime stage's NCCL check is given what the builder compiled against, not only the pin
    for case, rel in (("vllm-dual-v100", "images/vllm/Dockerfile"), ("dual-v100-nvlink", "images/llama.cpp/Dockerfile")):
        runtime = stages(render_case(case)[rel])["runtime-base"]
        assert "sh /opt/kit/nccl-check.sh runtime 2.27.3 /opt/kit/nccl-builder.txt" in runtime, case


def test_the_default_route_compiles_the_recipe_ci_compiles():
    """The nvidia/cuda 12.9.1 route (never built here: no NVIDIA registry) and the Debian 12.4 route that CI compiles
    differ in the compile only by where CUDA and NCCL come from: the host compiler Debian's nvcc needs and the pip
    NCCL's root. Everything else in the core, the CUDA backend and the runtime stage is the same text."""
    from tests.conftest import make_config

    default = render.collect(make_config({"preset": "dual-v100-nvlink"}))["images/llama.cpp/Dockerfile"]
    offline = render.collect(make_config({"preset": "dual-v100-nvlink", "cuda": {"source": "debian",
                                                                                  "version": "12.4.1"},
                                          "nccl": {"source": "pip"}}))["images/llama.cpp/Dockerfile"]
    allowed = {"      -DCMAKE_CUDA_HOST_COMPILER=g++-13 \\", "      -DNCCL_ROOT=/opt/kit/nccl/nvidia/nccl \\"}
    assert stages(default)["core"] == stages(offline)["core"]
    backend = [line for line in stages(offline)["gpu-backend"].splitlines() if line not in allowed]
    assert stages(default)["gpu-backend"].splitlines() == backend
    runtime = stages(offline)["runtime"].replace('io.kit.cuda="12.4.1"', 'io.kit.cuda="12.9.1"')
    assert stages(default)["runtime"] == runtime


def test_every_configured_arch_is_in_the_label():
    config = make_config({"preset": "dual-v100-nvlink", "hardware": {"archs": [70, 80]},
                          "cuda": {"version": "12.6.3"}})
    assert dockerfile.recipe(config, "llama.cpp", False).labels()["io.kit.archs"] == "70,80"


def test_a_direct_caller_with_a_cuda_debian_does_not_package_gets_the_rules_line():
    config = cfg.from_dict({"cuda": {"source": "debian", "version": "12.9.1"}, "nccl": {"source": "pip"}})  # no rules
    with pytest.raises(KitError) as err:
        dockerfile.base_images(config, "12.9.1", True)
    assert err.value.line() == ("cuda.version: no Debian release packages CUDA 12.9.1; Debian has 11.8 (bookworm), "
                                "12.4 (trixie); set cuda.version to one of those with cuda.source: debian")
