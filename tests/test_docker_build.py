"""Real builds and real inspection (needs Docker; CI runs these with KIT_REQUIRE_DOCKER=1)."""

from __future__ import annotations

import json
import re
import time

import pytest
import requests

from kit import build, config as cfg, dockerfile, resolve, rules, verify
from kit.errors import CheckFailed
from tests.conftest import FIXTURES, stages

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def by_name(results):
    return {r.name: r for r in results}


def test_cpu_image_verifies(cpu_image):
    results = by_name(verify.verify(cpu_image.tag))
    for name in ("entrypoint", "libs", "runs", "user", "healthcheck", "secrets"):
        assert results[name].status == "ok", (name, results[name].detail)
    for name in ("nccl-runtime", "nccl-builder", "cuda-arch"):
        assert results[name].status == "skip", (name, results[name].detail)
    # the tag and --version name the same source: the pinned ref
    assert "commit 0c1e57098" in results["runs"].detail and "0c1e57098" in cpu_image.tag, results["runs"].detail
    assert cpu_image.labels["io.kit.engine"] == "llama.cpp"
    assert cpu_image.size_bytes > 0 and cpu_image.nccl_pin is None


def test_cpu_image_serves_tiny_gguf(cpu_image, tiny_gguf, docker_ready):
    config = cfg.load(FIXTURES / "cpu-ci.yaml")
    argv = list(resolve.engine(config, "llama.cpp").argv)
    container = docker_ready.containers.run(
        cpu_image.tag, command=argv, detach=True, ports={"8080/tcp": ("127.0.0.1", None)},
        volumes={str(tiny_gguf.parent): {"bind": "/models", "mode": "ro"}},
    )
    try:
        container.reload()
        port = container.attrs["NetworkSettings"]["Ports"]["8080/tcp"][0]["HostPort"]
        url = f"http://127.0.0.1:{port}"
        deadline, status = time.monotonic() + 120, None
        while time.monotonic() < deadline:
            try:
                status = requests.get(f"{url}/health", timeout=2).status_code
                if status == 200:
                    break
            except requests.ConnectionError:
                pass
            container.reload()
            assert container.status == "running", container.logs()[-2000:].decode()
            time.sleep(1)
        assert status == 200, container.logs()[-2000:].decode()
        reply = requests.post(f"{url}/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0})
        body = reply.json()
        assert reply.status_code == 200, body
        assert body["usage"]["completion_tokens"] > 0
    finally:
        container.remove(force=True)


@pytest.fixture(scope="session")
def cuda_stage_images(base_image):
    """The cuda flavor's toolchain and runtime-base stages (CUDA + NCCL from PyPI wheels), no compile."""
    config = cfg.load(FIXTURES / "cuda-wheels-ci.yaml")
    rules.validate(config)
    toolchain = build.build_engine(config, "llama.cpp", target="toolchain")
    runtime_base = build.build_engine(config, "llama.cpp", target="runtime-base")
    return config, toolchain, runtime_base


def test_cuda_11_8_route_builds_to_runtime_base(bookworm_image, docker_ready):
    """Debian bookworm's CUDA 11.8 toolkit: the toolchain and runtime stages with NCCL checked in both (the compile
    itself is the 12.4 route's, in the cuda_compile tier)."""
    config = cfg.load(FIXTURES / "debian-cuda-11-8-ci.yaml")
    rules.validate(config)
    runtime_base = build.build_engine(config, "llama.cpp", target="runtime-base")
    assert _nccl_in(runtime_base.tag, docker_ready) == "2.27.3"
    # the toolkit's runtime libraries from bookworm's non-free (libcudart11.0, libcublas11), not the driver's
    libs = docker_ready.containers.run(runtime_base.tag, entrypoint=["ldconfig", "-p"], command=[],
                                       remove=True).decode()
    assert "libcudart.so.11.0" in libs and "libcublas.so.11" in libs and "libcuda.so.1" not in libs


def _nccl_in(image: str, client) -> str:
    return client.containers.run(image, entrypoint=["kit-nccl-version"], command=[], remove=True).decode().strip()


def test_cuda_stages_carry_the_pinned_nccl(cuda_stage_images, docker_ready):
    config, toolchain, runtime_base = cuda_stage_images
    assert _nccl_in(toolchain.tag, docker_ready) == config.nccl.version == "2.27.3"
    assert _nccl_in(runtime_base.tag, docker_ready) == config.nccl.version
    recorded = docker_ready.containers.run(runtime_base.tag, entrypoint=["cat", "/opt/kit/nccl-builder.txt"],
                                           command=[], remove=True).decode().strip()
    assert recorded == "2.27.3"


def test_runtime_nccl_mismatch_fails_the_build(cuda_stage_images, tmp_path):
    """The seed's bug: the runtime stage gets NCCL 2.32.3 while the builder has 2.27.3."""
    config, _, _ = cuda_stage_images
    ctx = tmp_path / "ctx"
    build.assemble_context(config, "llama.cpp", ctx, None, "runtime-base")
    text = (ctx / "Dockerfile").read_text()
    runtime = stages(text)["runtime-base"]
    poisoned = runtime.replace('"nvidia-nccl-cu12==2.27.3"', '"nvidia-nccl-cu12==2.32.3"')
    assert poisoned != runtime
    (ctx / "Dockerfile").write_text(text.replace(runtime, poisoned))
    with pytest.raises(CheckFailed) as failure:
        build.run_build(ctx, "kit/test:nccl-mismatch", target="runtime-base")
    message = str(failure.value)
    assert "nccl-check.sh runtime" in message
    assert re.search(r"NCCL mismatch in the runtime stage: the loader resolves NCCL 2\.32\.3 but nccl\.version pins 2\.27\.3",
                     message), message


def test_verify_catches_mismatch_made_without_the_check(cuda_stage_images, docker_ready, tmp_path):
    config, _, runtime_base = cuda_stage_images
    manifest = dockerfile.template_values(config, "llama.cpp", ca_bundle=False)["manifest"]
    manifest["nccl_builder"] = "2.27.3"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "Dockerfile").write_text(
        f"FROM {runtime_base.tag}\n"
        'RUN python3 -m pip install --no-deps --target /opt/other "nvidia-nccl-cu12==2.32.3" \\\n'
        " && echo /opt/other/nvidia/nccl/lib > /etc/ld.so.conf.d/000-aaa-other.conf && ldconfig\n"
        "COPY manifest.json /opt/kit/manifest.json\n"
    )
    build.run_build(tmp_path, "kit/test:nccl-unchecked")
    results = by_name(verify.verify("kit/test:nccl-unchecked", only=["nccl-runtime", "nccl-builder"]))
    assert results["nccl-runtime"].status == "fail"
    assert "2.32.3" in results["nccl-runtime"].detail and "2.27.3" in results["nccl-runtime"].detail
    # a manifest that records the pin is not enough: the compile's own record is missing
    assert results["nccl-builder"].status == "fail"
    assert "no /opt/kit/nccl-linked.txt: the build did not capture what the compile linked" in \
        results["nccl-builder"].detail


@pytest.fixture(scope="session")
def nvidia_entrypoint_image(base_image, tmp_path_factory):
    folder = tmp_path_factory.mktemp("nvidia-entrypoint")
    (folder / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        "RUN mkdir -p /opt/nvidia && printf '#!/bin/sh\\nexec \"$@\"\\n' > /opt/nvidia/nvidia_entrypoint.sh"
        " && chmod +x /opt/nvidia/nvidia_entrypoint.sh\n"
        'ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh"]\n'
    )
    build.run_build(folder, "kit/test:nvidia-entrypoint")
    return "kit/test:nvidia-entrypoint"


def test_verify_catches_the_nvidia_entrypoint(nvidia_entrypoint_image):
    results = by_name(verify.verify(nvidia_entrypoint_image))
    assert results["entrypoint"].status == "fail"
    assert "nvidia_entrypoint.sh" in results["entrypoint"].detail
    assert results["user"].status == "fail" and results["healthcheck"].status == "fail"


def test_verify_catches_secrets(base_image, tmp_path):
    (tmp_path / "Dockerfile").write_text(f"FROM {base_image}\nENV OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwx\n")
    build.run_build(tmp_path, "kit/test:secret")
    results = by_name(verify.verify("kit/test:secret", only=["secrets"]))
    assert results["secrets"].status == "fail" and "OPENAI_API_KEY" in results["secrets"].detail


def test_verify_cli_json_and_exit_code(cpu_image, nvidia_entrypoint_image):
    import subprocess
    import sys

    ok = subprocess.run([sys.executable, "-m", "kit", "verify", cpu_image.tag, "--json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert {r["name"] for r in json.loads(ok.stdout)} >= {"nccl-runtime", "entrypoint", "libs", "cuda-arch"}
    bad = subprocess.run([sys.executable, "-m", "kit", "verify", nvidia_entrypoint_image], capture_output=True,
                         text=True)
    assert bad.returncode == 1 and "entrypoint" in bad.stderr


def test_doctor_compares_running_nccl_with_the_manifest(cuda_stage_images, docker_ready, tmp_path):
    """The seed's 2-hour debugging session: a running engine that loads another NCCL than it was built for."""
    from kit import doctor

    test_verify_catches_mismatch_made_without_the_check(cuda_stage_images, docker_ready, tmp_path)
    config = cfg.from_dict({"stack": {"name": "kitdoctor"}})
    container = docker_ready.containers.run(
        "kit/test:nccl-unchecked", entrypoint=["sleep", "300"], command=[], detach=True,
        labels={"com.docker.compose.project": "kitdoctor", "io.kit.engine": "llama.cpp"},
        environment={"NCCL_DEBUG": "WARN", "NCCL_P2P_LEVEL": "NVL"})
    try:
        report = doctor.Report()
        doctor.check_stack(config, report)
        checks = {f.check: f for f in report.findings}
        nccl = checks[f"{container.name}-nccl"]
        assert nccl.status == "fail" and "loads NCCL 2.32.3, image built for 2.27.3" in nccl.detail
        assert checks[f"{container.name}-nccl-env"].status == "ok"
    finally:
        container.remove(force=True)


@pytest.fixture(scope="session")
def sm70_image(base_image, llama_source):
    """llama.cpp's cuda flavor, compiled for sm_70 only with GGML_CUDA_NCCL against the pinned NCCL."""
    config = cfg.load(FIXTURES / "debian-cuda-ci.yaml")
    rules.validate(config)
    return build.build_engine(config, "llama.cpp", source=llama_source)


@pytest.mark.cuda_compile
def test_sm70_image_has_only_sm70_code_and_the_pinned_nccl(sm70_image):
    results = by_name(verify.verify(sm70_image.tag))
    assert results["cuda-arch"].status == "ok", results["cuda-arch"].detail
    assert "sm [70] only" in results["cuda-arch"].detail
    # the NCCL that libggml-cuda.so resolves (the loader in trace mode: libcuda.so.1 is the driver's, absent here)
    assert results["nccl-runtime"].status == "ok", results["nccl-runtime"].detail
    assert results["nccl-runtime"].detail.startswith("/opt/kit/nccl/nvidia/nccl/lib/libnccl.so.2: NCCL 2.27.3")
    # what the compile itself found: CMake's NCCL_INCLUDE_DIR / NCCL_LIBRARY from the pinned wheel (NCCL_ROOT)
    assert results["nccl-builder"].status == "ok", results["nccl-builder"].detail
    assert results["nccl-builder"].detail.endswith(
        "the compile's nccl.h NCCL_VERSION_CODE and libnccl (/opt/kit/nccl/nvidia/nccl/lib/libnccl.so) are 2.27.3 "
        "(captured by the build)")
    assert results["libs"].status == "ok" and "libcuda.so.1" in results["libs"].detail
    assert results["entrypoint"].status == "ok"
    # the CUDA backend is a module llama-server loads at start: --version runs on a machine without the driver
    assert results["runs"].status == "ok" and "commit 0c1e57098" in results["runs"].detail, results["runs"].detail
    for name in ("user", "healthcheck", "secrets"):
        assert results[name].status == "ok", (name, results[name].detail)
    assert sm70_image.labels["io.kit.archs"] == "70" and sm70_image.labels["io.kit.nccl"] == "2.27.3"


@pytest.mark.cuda_compile
def test_sm70_image_without_a_gpu_refuses_to_serve_from_the_cpu(sm70_image, tiny_gguf, docker_ready):
    """No libcuda.so.1 here: the CUDA module cannot load, and the default argv must stop, naming the device."""
    from kit import logscan

    config = cfg.from_dict({"preset": "dual-v100-nvlink", "model": {"dir": str(tiny_gguf.parent),
                                                                   "file": tiny_gguf.name}})
    container = docker_ready.containers.run(
        sm70_image.tag, command=list(resolve.engine(config, "llama.cpp").argv), detach=True,
        volumes={str(tiny_gguf.parent): {"bind": "/models", "mode": "ro"}})
    try:
        code = container.wait(timeout=120)["StatusCode"]
        logs = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    assert code != 0 and "invalid device: CUDA0" in logs, logs[-2000:]
    assert "gpu-not-visible" in {f.name for f in logscan.scan(logs)}


@pytest.mark.cuda_compile
def test_fatbin_reader_agrees_with_cuobjdump_on_the_real_library(sm70_image, docker_ready, tmp_path):
    import io
    import tarfile

    from kit import fatbin
    from tests.test_fatbin import NVCC, cuobjdump

    real = docker_ready.containers.run(sm70_image.tag, entrypoint=["readlink", "-f", "/app/libggml-cuda.so"],
                                       command=[], remove=True).decode().strip()
    container = docker_ready.containers.create(sm70_image.tag)
    try:
        stream, _ = container.get_archive(real)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            (tmp_path / "lib.so").write_bytes(tar.extractfile(tar.getmembers()[0]).read())
    finally:
        container.remove(force=True)
    assert fatbin.archs(tmp_path / "lib.so") == {"sass": [70], "ptx": []}
    if NVCC:
        assert cuobjdump(tmp_path / "lib.so") == {"sass": [70], "ptx": []}
