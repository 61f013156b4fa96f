"""The stack's services by role: primary, optional fallback, optional front door; names, ports and images.

Compose, deploy and status all read this one list, so a service is named and numbered in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit import catalog, imagetag
from kit.config import StackConfig

FRONT_DOOR = "front-door"
FRONT_DOOR_PORT = 8080


@dataclass(frozen=True)
class Service:
    role: str  # primary | fallback | front-door
    name: str  # compose service key
    engine: str | None  # catalog name, None for the front door
    host_port: int
    container_port: int
    image: str


def front_door_image(config: StackConfig) -> str:
    from kit import __version__

    return f"{config.build.registry}/front-door:{__version__}"


def services(config: StackConfig) -> list[Service]:
    out: list[Service] = []
    port = config.serve.port
    # a front door needs something to choose from: a fallback, or the replicas on further hosts
    from kit import hosts

    front = bool(config.stack.front_door and config.stack.fallback) or bool(hosts.replicas(config))
    next_port = port + 1 if front else port
    for role, name in (("primary", config.stack.primary), ("fallback", config.stack.fallback)):
        if not name:
            continue
        engine = catalog.get(name)
        key = engine.slug if role == "primary" or name != config.stack.primary else f"{engine.slug}-fallback"
        out.append(Service(role, key, name, next_port, engine.port, imagetag.image_tag(config, name)))
        next_port += 1
    if front:
        out.append(Service(FRONT_DOOR, FRONT_DOOR, None, port, FRONT_DOOR_PORT, front_door_image(config)))
    return out


def endpoint(config: StackConfig) -> str:
    """Where clients talk to: the front door if there is one, else the primary."""
    entry = [s for s in services(config) if s.role in (FRONT_DOOR, "primary")]
    chosen = next((s for s in entry if s.role == FRONT_DOOR), entry[0])
    return f"http://127.0.0.1:{chosen.host_port}"
