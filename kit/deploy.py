"""``kit deploy / status / logs / down``: the compose stack on this host, through the compose v2 CLI.

Deploy renders, checks the images exist, runs ``compose up -d`` (idempotent: an unchanged stack is left alone),
waits for every service to turn healthy, sends one chat completion and prints the endpoint. ``down`` never deletes
the model folder, and removes volumes only when asked.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from kit import compose, dockerhost, logscan, render
from kit.config import StackConfig
from kit.errors import CheckFailed, KitError
from kit.services import services, endpoint


def _compose(out: Path, *args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess[str]:
    out = out.resolve()
    if not (out / "compose.yaml").is_file():
        raise KitError("--output", f"{out} has no compose.yaml", "run `kit deploy` (or `kit render`) first")
    cmd = [*dockerhost.compose_cmd(), "-f", str(out / "compose.yaml"), "--env-file", str(out / ".env"), *args]
    result = subprocess.run(cmd, capture_output=capture, text=True, cwd=out)
    if check and result.returncode != 0:
        raise CheckFailed(f"`docker compose {' '.join(args)}` failed:\n{(result.stderr or '').strip()[-1500:]}")
    return result


def require_images(config: StackConfig) -> None:
    from docker.errors import ImageNotFound

    client = dockerhost.client()
    for service in services(config):
        try:
            client.images.get(service.image)
        except ImageNotFound:
            raise KitError(f"services.{service.name}", f"image {service.image} is not built",
                           "run `kit build` with the same config first") from None


def containers(config: StackConfig) -> list[Any]:
    return dockerhost.client().containers.list(all=True, filters={"label": f"com.docker.compose.project={config.stack.name}"})


def health(container: Any) -> str:
    container.reload()
    state = container.attrs.get("State", {})
    if state.get("Status") != "running":
        return state.get("Status", "unknown")
    return (state.get("Health") or {}).get("Status", "running")


def wait_healthy(config: StackConfig, timeout_s: float, echo: Callable[[str], None]) -> None:
    start = time.monotonic()
    deadline = start + timeout_s
    last = ""
    while True:
        states = {c.labels.get("com.docker.compose.service", c.name): health(c) for c in containers(config)}
        line = ", ".join(f"{k}: {v}" for k, v in sorted(states.items()))
        if line != last:
            echo(f"[{time.monotonic() - start:5.0f}s] {line}")
            last = line
        if states and all(v == "healthy" for v in states.values()):
            return
        bad = [k for k, v in states.items() if v in ("exited", "dead")]
        if bad or time.monotonic() > deadline:
            reason = f"{', '.join(bad)} stopped" if bad else f"not healthy after {timeout_s:.0f}s"
            raise CheckFailed(f"stack {reason}: {line} (see `kit logs --check`)")
        time.sleep(2)


def api_key(out: Path) -> str | None:
    return compose.read_env(out / ".env").get(compose.API_KEY_VAR)


def smoke(url: str, key: str | None, model: str, timeout_s: float = 120) -> str:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
    try:
        reply = requests.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=timeout_s)
    except requests.RequestException as exc:
        raise CheckFailed(f"smoke request to {url} failed: {exc}") from None
    if reply.status_code != 200:
        raise CheckFailed(f"smoke request to {url} answered {reply.status_code}: {reply.text[:300]}")
    data = reply.json()
    tokens = (data.get("usage") or {}).get("completion_tokens", 0)
    if not tokens:
        raise CheckFailed(f"smoke request to {url} returned no tokens: {str(data)[:300]}")
    return f"{tokens} tokens: {data['choices'][0]['message'].get('content', '')[:60]!r}"


def deploy(config: StackConfig, out: Path, timeout_s: float | None = None,
           echo: Callable[[str], None] = print) -> str:
    render.render_stack(config, out)
    require_images(config)
    _compose(out, "up", "-d", "--remove-orphans")
    wait_healthy(config, timeout_s or max(120.0, 2.0 * 60 + 20 * config.model.size_gib), echo)
    url = endpoint(config)
    echo(f"smoke: {smoke(url, api_key(out), config.model.name)}")
    return url


def status(config: StackConfig) -> list[dict[str, str]]:
    rows = []
    for c in containers(config):
        rows.append({"service": c.labels.get("com.docker.compose.service", c.name), "container": c.name,
                     "image": c.attrs["Config"]["Image"], "state": health(c),
                     "role": c.labels.get("io.kit.role", "")})
    return sorted(rows, key=lambda r: r["service"])


def logs(out: Path, tail: int = 2000) -> str:
    result = _compose(out, "logs", "--no-color", "--tail", str(tail))
    return result.stdout + result.stderr


def check_logs(out: Path) -> list[logscan.Finding]:
    return logscan.scan(logs(out))


def down(out: Path, volumes: bool = False) -> None:
    args = ["down", "--remove-orphans"] + (["--volumes"] if volumes else [])
    _compose(out, *args)
