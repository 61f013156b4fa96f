"""``out/compose.yaml`` and ``out/.env``: a compose stack that cannot be misread.

- ``entrypoint:`` is always the engine binary and ``command:`` a YAML list (a model path with spaces survives);
- GPUs by ``deploy.resources.reservations.devices`` with ``device_ids`` (never together with ``count``);
- NCCL environment by interconnect, ``NCCL_DEBUG=WARN`` so silent fallbacks reach the logs;
- the API key only in ``.env`` (mode 0600), referenced as ``${KIT_API_KEY}``;
- ports on 127.0.0.1 unless ``serve.expose``; healthcheck start period from the model size.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kit import __version__, resolve, serving, templating
from kit.containerspec import GPU_ULIMITS, engine_env, gpu_block, healthcheck, logging_block
from kit.config import StackConfig
from kit.resolve import ResolvedStack
from kit.services import FRONT_DOOR, FRONT_DOOR_PORT, Service, front_door_image, services

API_KEY_VAR = "KIT_API_KEY"
MODEL_DIR_VAR = "KIT_MODEL_DIR"


def _ports(config: StackConfig, service: Service, address: str = "") -> list[str]:
    """Published on 127.0.0.1, on every interface with ``serve.expose``, or (a replica host's engine) on the
    address the front door dials."""
    bind = f"{address}:" if address else "" if config.serve.expose else "127.0.0.1:"
    return [f"{bind}{service.host_port}:{service.container_port}"]


def engine_service(stack: ResolvedStack, service: Service, address: str = "") -> dict[str, Any]:
    config = stack.config
    resolved = stack.engine(service.engine or "")
    env = engine_env(resolved, f"${{{API_KEY_VAR}}}" if config.serve.api_key else None)
    body: dict[str, Any] = {
        "image": service.image,
        "pull_policy": "never" if not config.build.push else "missing",
        "container_name": f"{config.stack.name}-{service.name}",
        "entrypoint": list(resolved.entry.entrypoint),
        "command": list(resolved.argv),
        "environment": env,
        "ports": _ports(config, service, address),
        "volumes": [f"${{{MODEL_DIR_VAR}}}:{serving.MODEL_MOUNT}:ro"],
        "ipc": "host",
        "healthcheck": healthcheck(resolved),
        "restart": "unless-stopped",
        "logging": logging_block(),
        "labels": {"io.kit.role": service.role, "io.kit.engine": resolved.name},
    }
    if resolved.gpu:
        body["ulimits"] = dict(GPU_ULIMITS)
        body["deploy"] = gpu_block(config.hardware.device_ids)
    return body


def front_door_service(config: StackConfig, service: Service, engines: list[Service]) -> dict[str, Any]:
    return {
        "image": service.image,
        "pull_policy": "never",
        "container_name": f"{config.stack.name}-{service.name}",
        "entrypoint": ["/usr/sbin/nginx"],
        "command": ["-c", "/etc/kit/nginx.conf", "-g", "daemon off;"],
        "ports": _ports(config, service),
        "volumes": ["./front-door/nginx.conf:/etc/kit/nginx.conf:ro"],
        "depends_on": {s.name: {"condition": "service_started"} for s in engines},
        "healthcheck": {"test": ["CMD", "curl", "-fsS", f"http://127.0.0.1:{service.container_port}/kit/health"],
                        "interval": "10s", "timeout": "3s", "retries": 3, "start_period": "10s"},
        "restart": "unless-stopped",
        "logging": logging_block(),
        "labels": {"io.kit.role": FRONT_DOOR},
    }


def compose_dict(stack: ResolvedStack, address: str = "") -> dict[str, Any]:
    """The stack's compose file; ``address``: a replica host's, where its engine publishes."""
    engines = [s for s in stack.services if s.engine]
    body: dict[str, Any] = {}
    for service in stack.services:
        if service.engine:
            body[service.name] = engine_service(stack, service, address)
        else:
            body[service.name] = front_door_service(stack.config, service, engines)
    return {"name": stack.config.stack.name, "services": body}


HEADER = (
    "# Rendered by kit {version}: edit kit.yaml and run `kit render`, not this file.\n"
    "# Secrets live in .env (mode 0600). Start with `kit deploy` or `docker compose --env-file .env up -d`.\n"
)


def compose_yaml(stack: ResolvedStack, address: str = "") -> str:
    text = yaml.safe_dump(compose_dict(stack, address), sort_keys=False, default_flow_style=False, width=1000,
                          allow_unicode=True)
    return HEADER.format(version=__version__) + text


def host_model_dir(config: StackConfig) -> str:
    """The host folder mounted read-only at the engine's model path, absolute."""
    return str(Path(config.model.dir).expanduser().resolve())


def api_key(existing: dict[str, str] | None = None) -> str:
    """The stack's API key: the one a previous render wrote (clients keep working), else a new one."""
    return (existing or {}).get(API_KEY_VAR) or "kit-" + secrets.token_urlsafe(24)


def env_text(config: StackConfig, existing: dict[str, str] | None = None) -> str:
    """``.env``: the model folder and the API key (kept across renders so clients keep working)."""
    lines = ["# kit: secrets and host paths for compose. Mode 0600; never commit.",
             f"{MODEL_DIR_VAR}={host_model_dir(config)}"]
    if config.serve.api_key:
        lines.append(f"{API_KEY_VAR}={api_key(existing)}")
    return "\n".join(lines) + "\n"


def read_env(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip().strip('"')
    return out


@dataclass(frozen=True)
class Upstream:
    """One server line of the front door's upstream."""

    address: str  # as nginx dials it: a compose service on this host, or a replica host's IP and published port
    backup: bool
    note: str  # which host, for a replica


def upstreams(stack: ResolvedStack) -> list[Upstream]:
    """The primary here, each replica host's primary, the fallback as backup: what the front door chooses from."""
    from kit import hosts

    config = stack.config
    by_role = {s.role: s for s in stack.services}
    primary = by_role["primary"]
    found = [Upstream(f"{primary.name}:{primary.container_port}", False, "")]
    for target in hosts.replicas(config):
        served = services(hosts.host_config(config, target))[0]
        found.append(Upstream(f"{target.address}:{served.host_port}", False, f"host {target.name}"))
    if "fallback" in by_role:
        fallback = by_role["fallback"]
        found.append(Upstream(f"{fallback.name}:{fallback.container_port}", True, ""))
    return found


def nginx_conf(stack: ResolvedStack) -> str | None:
    front = next((s for s in stack.services if s.role == FRONT_DOOR), None)
    if front is None:
        return None
    from kit import hosts

    return templating.render("front-door/nginx.conf.j2", {
        "kit_version": __version__, "upstreams": upstreams(stack), "balanced": bool(hosts.replicas(stack.config)),
        "port": front.container_port,
    })


def front_door_dockerfile(config: StackConfig) -> str:
    image = config.base.runtime or (config.mirrors.registry + "debian:bookworm-slim")
    return templating.render("dockerfile/front-door.Dockerfile.j2", {
        "kit_version": __version__, "image": image, "port": FRONT_DOOR_PORT, "ca_bundle": bool(config.mirrors.ca_bundle)})


def front_door_image_files(config: StackConfig) -> dict[str, str | Path]:
    """The front door's build context (Dockerfile, CA bundle), relative to ``images/front-door/``."""
    files: dict[str, str | Path] = {"Dockerfile": front_door_dockerfile(config)}
    if config.mirrors.ca_bundle:
        files["kit/ca.crt"] = Path(config.mirrors.ca_bundle)
    return files


def files(stack: ResolvedStack, out_dir: Path | None = None) -> dict[str, str | Path]:
    """compose.yaml, .env and the front door's nginx.conf, for the renderer (its image: render.image_files)."""
    existing = read_env(out_dir / ".env") if out_dir else {}
    existing = {**existing, API_KEY_VAR: api_key(existing)}  # one key for every host's .env
    result: dict[str, str | Path] = {"compose.yaml": compose_yaml(stack), ".env": env_text(stack.config, existing)}
    conf = nginx_conf(stack)
    if conf:
        result["front-door/nginx.conf"] = conf
    result.update(replica_files(stack, existing))
    return result


def replica_files(stack: ResolvedStack, existing: dict[str, str]) -> dict[str, str | Path]:
    """``hosts/<name>/``: each further host's compose.yaml (a replica's engine, or a worker's rpc-server), .env (the
    same API key and model path) and host.env (how to reach its Docker). A replica host's stack is resolved for its
    own config (its GPUs); a worker runs no engine, so its config gives only the image and the GPU request."""
    from kit import hosts

    config = stack.config
    result: dict[str, str | Path] = {}
    for target in hosts.targets(config)[1:]:
        on_host = hosts.host_config(config, target)
        folder = hosts.folder(target)
        if target.worker:
            result[f"{folder}/compose.yaml"] = HEADER.format(version=__version__) + yaml.safe_dump(
                worker_dict(stack, target), sort_keys=False, default_flow_style=False, width=1000)
        else:
            result[f"{folder}/compose.yaml"] = compose_yaml(resolve.stack(on_host), target.address)
        result[f"{folder}/.env"] = env_text(on_host, existing)
        result[f"{folder}/{hosts.ENV_FILE}"] = hosts.env_text(target)
    return result


RPC_WORKER = "rpc-worker"  # the io.kit.role of a host's rpc-server


def worker_dict(stack: ResolvedStack, target: Any) -> dict[str, Any]:
    """A worker host's compose file: rpc-server from the primary's image, its GPUs, published on the host's address
    (every interface only with ``stack.rpc_listen_all``: rpc-server has no authentication)."""
    from kit import hosts

    config = stack.config
    lent = hosts.host_config(config, target)
    name = stack.primary.name
    rpc = stack.primary.entry.rpc
    assert rpc is not None  # config._check_rpc_workers
    bind = "" if config.stack.rpc_listen_all else f"{target.address}:"
    body: dict[str, Any] = {
        "image": services(lent)[0].image,
        "pull_policy": "never" if not config.build.push else "missing",
        "container_name": f"{config.stack.name}-rpc-server",
        "entrypoint": list(rpc.entrypoint),
        "command": [arg.format(port=rpc.port) for arg in rpc.args],
        "ports": [f"{bind}{rpc.port}:{rpc.port}"],
        "ipc": "host",
        # listening, read from the kernel's socket table: rpc-server serves one client at a time with a backlog of
        # one (ggml-rpc transport.cpp listen(sockfd, 1)), so a probe that connects would queue behind the primary
        "healthcheck": {"test": ["CMD", "grep", "-q", f"00000000:{rpc.port:04X} 00000000:0000 0A", "/proc/net/tcp"],
                        "interval": "10s", "timeout": "3s", "retries": 3, "start_period": "10s"},
        "restart": "unless-stopped",
        "logging": logging_block(),
        "labels": {"io.kit.role": RPC_WORKER, "io.kit.engine": name},
    }
    if resolve.gpu(lent, name):
        body["ulimits"] = dict(GPU_ULIMITS)
        body["deploy"] = gpu_block(lent.hardware.device_ids)
    return {"name": config.stack.name, "services": {"rpc-server": body}}


__all__ = ["compose_dict", "compose_yaml", "env_text", "files", "front_door_image", "API_KEY_VAR"]
