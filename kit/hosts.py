"""The Docker daemons a stack runs on (``hosts:`` in kit.yaml), each reached through its own endpoint.

No ``hosts:`` is one host, this machine's daemon: the single-box stack, unchanged. With several, the first host runs
the stack as configured and the front door; every further host runs a replica of the primary (no fallback, no front
door of its own), published on the host's address, which the front door balances onto by least connections.

An endpoint is what Docker itself understands: ``ssh://`` (the system ``ssh``, so the user's ssh config, keys and
known hosts apply, as for ``docker -H``), ``tcp://`` with TLS material, ``unix://``, or a Docker context's name. The
SDK and the compose CLI are pointed at the same endpoint, so what ``kit deploy`` checks is what compose starts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from kit.config import Host, StackConfig, replica_address
from kit.errors import KitError

LOCAL = "local"  # the one host of a stack with no hosts: (this machine's daemon)


@dataclass(frozen=True)
class Target:
    """One host as kit deploys to it."""

    index: int  # in hosts:, for the field an error names
    name: str
    docker: str  # the endpoint; "" = this machine's
    address: str  # where the front door dials a replica's engine; "" for the first host (the compose network)
    tls: str  # DOCKER_CERT_PATH for a tcp:// endpoint
    first: bool  # runs the stack as configured and the front door
    worker: bool = False  # lends its devices to the primary (rpc-server) instead of running a replica

    @property
    def docker_context(self) -> str:
        """A Docker context's name, when the endpoint is one."""
        return self.docker if self.docker and "://" not in self.docker else ""

    def env(self) -> dict[str, str]:
        """What the docker and compose CLIs need to reach this host (added to the environment)."""
        if not self.docker:
            return {}
        if self.docker_context:
            return {"DOCKER_CONTEXT": self.docker_context}
        env = {"DOCKER_HOST": self.docker}
        if self.tls:
            env.update(DOCKER_TLS_VERIFY="1", DOCKER_CERT_PATH=self.tls)
        return env

    def describe(self) -> str:
        return f"{self.name} ({self.docker or 'this machine'})"


def targets(config: StackConfig) -> list[Target]:
    """Every host of the stack, the first (the front door's) first."""
    if not config.hosts:
        return [Target(0, LOCAL, "", "", "", True)]
    return [Target(i, h.name, h.docker, "" if i == 0 else replica_address(h), h.tls, i == 0,
                   i > 0 and h.name in config.stack.rpc_workers)
            for i, h in enumerate(config.hosts)]


def folder(target: Target) -> str:
    """Where a further host's compose files are, inside the rendered folder (the first host's are at its top)."""
    return f"hosts/{target.name}"


ENV_FILE = "host.env"  # in a replica's folder: how to reach its Docker (what Target.env() gives the CLIs)


def env_text(target: Target) -> str:
    lines = [f"# kit: how docker and compose reach {target.name}; "
             f"e.g. env $(grep -v '^#' {ENV_FILE}) docker compose ps"]
    return "\n".join(lines + [f"{k}={v}" for k, v in target.env().items()]) + "\n"


def read_target(folder: Path, index: int) -> Target:
    """A further host as its rendered folder records it (``kit down`` and ``kit logs`` without the config)."""
    from kit.compose import read_env

    env = read_env(folder / ENV_FILE)
    docker = env.get("DOCKER_CONTEXT") or env.get("DOCKER_HOST", "")
    return Target(index, folder.name, docker, "", env.get("DOCKER_CERT_PATH", ""), False)


def rendered(out: Path) -> list[tuple[Path, Target]]:
    """The further hosts of a rendered folder: each one's compose folder, and how to reach it."""
    folders = sorted(p.parent for p in (out / "hosts").glob("*/compose.yaml"))
    return [(folder, read_target(folder, i)) for i, folder in enumerate(folders, start=1)]


def replicas(config: StackConfig) -> list[Target]:
    """Further hosts that run a copy of the primary behind the front door."""
    return [t for t in targets(config) if not t.first and not t.worker]


def workers(config: StackConfig) -> list[Target]:
    """Further hosts whose devices the primary uses through rpc-server (which serves every GPU it sees, or its CPU
    when it sees none), in ``stack.rpc_workers`` order: the order of ``--rpc``, which numbers their devices."""
    by_name = {t.name: t for t in targets(config) if t.worker}
    return [by_name[name] for name in config.stack.rpc_workers if name in by_name]


@dataclass(frozen=True)
class LentDevice:
    """A device another host lends to the primary through rpc-server, as the primary sees it."""

    host: str
    gpu: bool  # a GPU of the worker (else its CPU)
    memory_gib: float  # of one GPU (hardware.memory_gib of that host)
    weight: float  # its --tensor-split ratio: its memory over one local GPU's (1 for a CPU)


def lent_devices(config: StackConfig) -> list[LentDevice]:
    """Every worker's devices, in ``--rpc`` order (the order RPC0, RPC1, ... are numbered in)."""
    from kit import resolve

    out = []
    for target in workers(config):
        lent = host_config(config, target)
        gpu = resolve.gpu(lent, config.stack.primary)
        for _ in range(lent.hardware.gpus if gpu else 1):
            weight = lent.hardware.memory_gib / config.hardware.memory_gib if gpu else 1.0
            out.append(LentDevice(target.name, gpu, lent.hardware.memory_gib, weight))
    return out


def rpc_servers(config: StackConfig) -> list[str]:
    """The primary's ``--rpc`` list: each worker's address and rpc-server port."""
    from kit import catalog

    rpc = catalog.get(config.stack.primary).rpc
    return [f"{t.address}:{rpc.port}" for t in workers(config)] if rpc else []


def rpc_device_names(config: StackConfig, lent: list[LentDevice]) -> list[str]:
    """The workers' devices (``lent_devices``) as the primary names them, numbered in ``--rpc`` order."""
    from kit import catalog

    rpc = catalog.get(config.stack.primary).rpc
    if rpc is None:
        return []
    return [rpc.devices.format(i=i) for i in range(len(lent))]


def host_config(config: StackConfig, target: Target) -> StackConfig:
    """The stack as ``target`` runs it: the first host's is the config itself (its hardware is ``hardware:``); a
    further host's keeps only the primary, with the host's own hardware over the stack's."""
    if target.first:
        return config
    data = config.model_dump()
    data["stack"].update(fallback=None, front_door=False, rpc_workers=[])
    data["hosts"] = []
    host = _host(config, target.name)
    if host and host.hardware:
        data["hardware"].update({k: getattr(host.hardware, k) for k in host.hardware.model_fields_set})
    return StackConfig.model_validate(data)


def _host(config: StackConfig, name: str) -> Host | None:
    return next((h for h in config.hosts if h.name == name), None)


CA_ENV = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


@contextmanager
def _host_ca_only(tls: bool) -> Iterator[None]:
    """requests prefers REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE (which CA-bundle setups export) over a session's own CA
    (psf/requests#3829, open since 2017): the daemon's certificate, signed by the host's CA, would fail to verify.
    While the SDK client first talks to a TLS host they are out of the environment; afterwards the client no longer
    reads it (``trust_env = False``)."""
    saved = {k: os.environ.pop(k) for k in CA_ENV if tls and k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@lru_cache(maxsize=None)
def client(target: Target) -> Any:
    """The Docker SDK client for ``target``; this machine's is ``dockerhost.client()``."""
    from kit import dockerhost

    if not target.docker:
        return dockerhost.client()
    import docker
    from docker.errors import DockerException

    base_url, tls_dir = context_endpoint(target) if target.docker_context else (target.docker, target.tls)
    try:
        tls: Any = False
        if tls_dir:
            folder = Path(tls_dir)
            tls = docker.tls.TLSConfig(client_cert=(str(folder / "cert.pem"), str(folder / "key.pem")),
                                       ca_cert=str(folder / "ca.pem"), verify=True)
        with _host_ca_only(bool(tls_dir)):
            c = docker.DockerClient(base_url=base_url, tls=tls, timeout=600,
                                    use_ssh_client=base_url.startswith("ssh://"))
        if tls_dir:
            c.api.trust_env = False
        c.ping()
    except DockerException as exc:
        detail = str(exc).splitlines()[0][:200]
        raise KitError(f"hosts[{target.index}].docker", f"cannot reach the Docker daemon of {target.describe()}: "
                       f"{detail}", "check that `docker -H ENDPOINT info` works from this machine "
                       "(for ssh://: your ssh config, key and known_hosts)") from None
    return c


def context_endpoint(target: Target) -> tuple[str, str]:
    """A Docker context's endpoint and TLS folder, as the docker CLI itself reads its context store (the SDK's
    reader finds the store only beside an existing config.json, which a box without a registry login lacks)."""
    import json
    import subprocess

    found = subprocess.run(["docker", "context", "inspect", target.docker_context], capture_output=True, text=True)
    if found.returncode != 0:
        raise KitError(f"hosts[{target.index}].docker", f"no Docker context named {target.docker_context!r}",
                       "create it with `docker context create`, or write the endpoint (ssh://user@host)")
    (data,) = json.loads(found.stdout)
    material = (data.get("TLSMaterial") or {}).get("docker") or []
    tls_dir = str(Path(data["Storage"]["TLSPath"]) / "docker") if material else ""
    return data["Endpoints"]["docker"]["Host"], tls_dir
