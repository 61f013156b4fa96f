"""kit doctor against recorded nvidia-smi outputs, replayed by a fake nvidia-smi on PATH."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys

import pytest

from kit import config as cfg
from kit import doctor, nvsmi
from tests.conftest import FIXTURES

SMI = FIXTURES / "nvsmi"
DOCKER_GPU = {"ServerVersion": "27.5.1", "Driver": "overlay2", "Runtimes": {"runc": {}, "nvidia": {}},
              "DockerRootDir": "/"}
TODAY = dt.date(2026, 12, 2)


@pytest.fixture
def fake_smi(monkeypatch):
    def use(scenario: str | None):
        path = os.environ["PATH"]
        if scenario:
            monkeypatch.setenv("KIT_FAKE_SMI_DIR", str(SMI / scenario))
            monkeypatch.setenv("PATH", f"{SMI}{os.pathsep}{path}")
        else:
            monkeypatch.setenv("PATH", "/usr/bin:/bin")
    return use


@pytest.fixture(autouse=True)
def docker_disk(monkeypatch):
    """The free space under DockerRootDir, pinned: the doctor's verdict must not depend on the disk of the machine
    that runs the tests (CI's had under the 40 GiB of images/drivers.yaml and turned a healthy box into a warning)."""
    free = {"gib": 100}

    def disk_usage(path):
        return shutil._ntuple_diskusage(200 * 2**30, (200 - free["gib"]) * 2**30, free["gib"] * 2**30)
    monkeypatch.setattr(doctor.shutil, "disk_usage", disk_usage)
    return free


def run(config_data: dict, docker=DOCKER_GPU):
    config = cfg.from_dict(config_data)
    return doctor.run(config, docker_info=lambda: docker, compose_ok=lambda: True, stack=False, today=TODAY)


def by_check(report):
    return {f.check: f for f in report.findings}


def test_parsers_read_recorded_outputs(fake_smi):
    fake_smi("sxm2-nvlink")
    gpus = nvsmi.gpus()
    assert [(g.index, g.name, g.memory_mib, g.arch, g.persistence) for g in gpus] == [
        (0, "Tesla V100-SXM2-16GB", 16384, 70, True), (1, "Tesla V100-SXM2-16GB", 16384, 70, True)]
    assert nvsmi.topology() == {(0, 1): "NV6", (1, 0): "NV6"}
    assert nvsmi.cuda_version() == "13.0"


@pytest.fixture
def model_here(tmp_path):
    """The stack's model on this machine (trained for 40960 tokens, like the seeds' 27B)."""
    from tests.ggufmodels import write_tiny_llama

    write_tiny_llama(tmp_path / "m.gguf", ctx=40960)
    return {"dir": str(tmp_path), "file": "m.gguf"}


def test_healthy_sxm2_nvlink(fake_smi, model_here):
    fake_smi("sxm2-nvlink")
    report = run({"model": model_here})
    checks = by_check(report)
    assert report.exit_code == 0, report.as_dicts()
    assert checks["gpu-link"].status == "ok" and "NV6" in checks["gpu-link"].detail
    assert checks["driver"].status == "ok" and "R580" in checks["driver"].detail
    assert checks["gpus"].status == "ok"
    assert all(f.status == "ok" for f in report.findings), report.as_dicts()


def test_little_room_for_images_is_a_warning(fake_smi, model_here, docker_disk):
    fake_smi("sxm2-nvlink")
    docker_disk["gib"] = 12
    checks = by_check(run({"model": model_here}))
    # images/drivers.yaml: min_docker_free_gib 40; 12 < 40
    assert checks["disk"].status == "warn"
    assert checks["disk"].detail == "12 GiB free in /; CUDA builds need ~40 GiB"


def test_context_past_the_trained_length_is_a_warning(fake_smi, model_here):
    fake_smi("sxm2-nvlink")
    checks = by_check(run({"model": {**model_here, "ctx": 65536}}))
    # 65536 / 40960 = 1.6: RoPE scale 2 (rounded up)
    assert checks["llama.cpp-context"].status == "warn"
    assert checks["llama.cpp-context"].detail.startswith(
        "model.ctx 65536 is longer than m.gguf was trained for (40960): llama-server caps each request at 40960")
    assert "--rope-scale, '2'" in checks["llama.cpp-context"].detail
    fine = by_check(run({"model": model_here}))["llama.cpp-context"]
    assert (fine.status, fine.detail) == ("ok", "4 requests x 16384 tokens (trained for 40960)")
    missing = by_check(run({"model": {"dir": "/nonexistent", "file": "m.gguf"}}))["llama.cpp-model"]
    assert missing.status == "warn" and "/nonexistent/m.gguf is not on this machine" in missing.detail


def test_pcie_phb_with_a_x4_gen2_card(fake_smi):
    fake_smi("pcie-phb-x4")
    report = run({"preset": "dual-v100-pcie", "engines": {"llama.cpp": {"split_mode": "row"}}})
    checks = by_check(report)
    assert checks["gpu1-pcie"].status == "warn" and "gen2 x4" in checks["gpu1-pcie"].detail
    assert "gpu0-pcie" not in checks
    assert checks["gpu-link"].status == "warn" and "PHB" in checks["gpu-link"].detail
    # 535 reached end of life in 2026-06; CUDA 12.9 images run on it through minor-version compatibility
    assert checks["driver"].status == "warn" and "end of life" in checks["driver"].detail
    assert "minor-version compatibility" in checks["driver"].detail
    layer = by_check(run({"preset": "dual-v100-pcie"}))
    assert layer["gpu-link"].status == "ok", "a layer split moves little between GPUs"


def test_nvlink_configured_but_absent(fake_smi):
    fake_smi("pcie-phb-x4")
    checks = by_check(run({"hardware": {"memory_gib": 32, "gpu_model": "Tesla V100-PCIE-32GB"}}))
    assert checks["gpu-link"].status == "fail" and "NVLink bridge" in checks["gpu-link"].detail


def test_hot_throttling_card(fake_smi):
    fake_smi("hot-throttling")
    report = run({})
    checks = by_check(report)
    assert checks["gpu1-temperature"].status == "warn" and "91 C" in checks["gpu1-temperature"].detail
    assert checks["gpu1-throttle"].status == "warn" and "HW thermal slowdown" in checks["gpu1-throttle"].detail
    assert checks["gpu1-persistence"].status == "warn"
    assert checks["gpu1-memory"].status == "warn" and "Above 4G" in checks["gpu1-memory"].detail
    assert checks["gpu1-ecc"].status == "warn"
    assert "gpu0-temperature" not in checks and "gpus" not in checks
    assert report.exit_code == 0  # warnings only


def test_driver_535_with_cuda13_image(fake_smi):
    fake_smi("driver535-cuda13")
    report = run({"cuda": {"version": "13.0.1"}})
    checks = by_check(report)
    assert checks["driver"].status == "fail" and ">= 580.65.06" in checks["driver"].detail
    assert checks["config"].status == "fail" and "CUDA 13 cannot compile for sm_70" in checks["config"].detail
    assert report.exit_code == 1


def test_no_gpu_runtime(fake_smi):
    fake_smi("sxm2-nvlink")
    checks = by_check(run({}, docker={**DOCKER_GPU, "Runtimes": {"runc": {}}}))
    assert checks["gpu-runtime"].status == "fail" and "nvidia-ctk" in checks["gpu-runtime"].detail
    assert by_check(run({}, docker=None))["docker"].status == "fail"


def test_no_driver_has_its_own_exit_code(fake_smi, tmp_path):
    fake_smi(None)
    report = run({})
    assert report.no_driver and report.exit_code == doctor.NO_DRIVER_EXIT
    assert "no NVIDIA driver" in by_check(report)["driver"].detail
    cpu = run({"preset": "cpu"})
    assert not cpu.no_driver and by_check(cpu)["driver"].status == "ok"
    env = {**os.environ, "PATH": f"/usr/bin:/bin:{os.path.dirname(sys.executable)}"}
    result = subprocess.run([sys.executable, "-m", "kit", "doctor", "--json"], capture_output=True, text=True, env=env,
                            cwd=tmp_path)
    assert result.returncode == 3
    assert json.loads(result.stdout)["exit_code"] == 3


def test_deploy_preflight_wants_a_gpu_runtime_for_gpu_flavors(monkeypatch, tmp_path):
    """`kit deploy` of a GPU stack on a Docker without the NVIDIA runtime stops before anything starts."""
    import pytest as _pytest

    from kit import deploy, dockerhost, doctor
    from kit.errors import KitError
    from tests.conftest import make_config

    class NoGpuDocker:
        def info(self):
            return {"ServerVersion": "28.2", "Runtimes": {"runc": {}}}

    monkeypatch.setattr(dockerhost, "client", lambda: NoGpuDocker())
    monkeypatch.setattr(doctor, "CDI_DIRS", [tmp_path / "cdi"])
    with _pytest.raises(KitError) as err:
        deploy.require_gpus(make_config({}))
    assert err.value.field == "hardware.gpus" and "no NVIDIA runtime, hook or CDI spec" in err.value.problem
    deploy.require_gpus(make_config({"preset": "cpu"}))  # a cpu stack needs none
    # the NVIDIA hook on PATH: dockerd registers its "nvidia" device driver (moby daemon/nvidia_linux.go, init)
    hook = tmp_path / "bin" / "nvidia-container-runtime-hook"
    hook.parent.mkdir()
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    monkeypatch.setenv("PATH", f"{hook.parent}:{os.environ['PATH']}")
    deploy.require_gpus(make_config({}))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    deploy.require_gpus(make_config({}))  # a CDI spec is enough


@pytest.mark.parametrize("data,expected", [
    ({}, False),                                                        # llama.cpp layer split: one hop per token
    ({"engines": {"llama.cpp": {"split_mode": "row"}}}, True),          # every layer cut across the GPUs
    ({"engines": {"llama.cpp": {"split_mode": "tensor"}}}, True),
    ({"stack": {"primary": "vllm"}}, True),                             # tensor parallel, always
    ({"preset": "single-v100-32g", "stack": {"primary": "vllm"}}, False),  # one GPU talks to nobody
])
def test_peer_traffic_follows_the_engines_memory_layout(data, expected):
    from kit import doctor
    from tests.conftest import make_config

    assert doctor.peer_traffic(make_config(data)) is expected


def test_a_driver_that_does_not_answer_is_named_by_its_own_words(monkeypatch, tmp_path):
    from kit import nvsmi

    # what nvidia-smi prints (exit 9) on a host whose kernel module is not loaded
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'Some header'\n"
                    "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\nexit 9\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")
    with pytest.raises(nvsmi.NoDriver, match=r"^NVIDIA-SMI has failed because it couldn't communicate with the "
                                             r"NVIDIA driver\.$"):
        nvsmi.gpus()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(nvsmi.NoDriver, match="^nvidia-smi is not on PATH$"):
        nvsmi.gpus()
