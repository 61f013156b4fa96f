"""``kit deploy / status / logs / down``: the compose stack on this host, through the compose v2 CLI.

Deploy renders, checks the images exist, runs ``compose up -d`` (idempotent: an unchanged stack is left alone),
waits for every service to turn healthy, sends one chat completion and prints the endpoint. ``down`` never deletes
the model folder, and removes volumes only when asked.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from kit import compose, dockerhost, hosts, imagecopy, logscan, render, resolve
from kit.config import StackConfig
from kit.errors import CheckFailed, KitError
from kit.services import FRONT_DOOR, endpoint, services


def _compose(out: Path, *args: str, check: bool = True, capture: bool = True,
             target: hosts.Target | None = None) -> subprocess.CompletedProcess[str]:
    """``docker compose`` on the stack rendered in ``out``; ``target``: a replica host's, through its endpoint."""
    out = out.resolve()
    if not (out / "compose.yaml").is_file():
        raise KitError("--output", f"{out} has no compose.yaml", "run `kit deploy` (or `kit render`) first")
    cmd = [*dockerhost.compose_cmd(), "-f", str(out / "compose.yaml"), "--env-file", str(out / ".env"), *args]
    env = {**os.environ, **target.env()} if target else None
    result = subprocess.run(cmd, capture_output=capture, text=True, cwd=out, env=env)
    if check and result.returncode != 0:
        stderr = (result.stderr or "").strip()
        named = "".join(f"\n{f.name}: {f.advice}" for f in logscan.scan(stderr))
        where = f" on {target.describe()}" if target else ""
        raise CheckFailed(f"`docker compose {' '.join(args)}`{where} failed:\n{stderr[-1500:]}{named}")
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


def containers(config: StackConfig, client: Any = None) -> list[Any]:
    """The stack's containers on this machine, or on the host ``client`` reaches."""
    return (client or dockerhost.client()).containers.list(
        all=True, filters={"label": f"com.docker.compose.project={config.stack.name}"})


def health(container: Any) -> str:
    container.reload()
    state = container.attrs.get("State", {})
    if state.get("Status") != "running":
        return state.get("Status", "unknown")
    return (state.get("Health") or {}).get("Status", "running")


def wait_healthy(config: StackConfig, timeout_s: float, echo: Callable[[str], None],
                 fail_on_restart: bool = False, client: Any = None) -> None:
    """Until every service is healthy. ``fail_on_restart``: a container restarting counts as stopped (kit tune: the
    engine crashed at start on a trial's settings, and waiting out the timeout would only repeat the crash)."""
    start = time.monotonic()
    deadline = start + timeout_s
    last = ""
    while True:
        states = {c.labels.get("com.docker.compose.service", c.name): health(c) for c in containers(config, client)}
        line = ", ".join(f"{k}: {v}" for k, v in sorted(states.items()))
        if line != last:
            echo(f"[{time.monotonic() - start:5.0f}s] {line}")
            last = line
        if states and all(v == "healthy" for v in states.values()):
            return
        bad = [k for k, v in states.items() if v in ("exited", "dead") or fail_on_restart and v == "restarting"]
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


ENGINE_UID = 10001  # the non-root user of kit images


def require_model(config: StackConfig) -> None:
    """Every engine's model is on this host and readable: else a missing file waits out the health timeout."""
    from kit.modelinfo import split_parts

    for name in config.engine_names():
        path = resolve.host_model_path(config, name)
        field = resolve.model_field(config, name)
        fix = "put the model there, or fix model.dir / model.file in kit.yaml"
        if config.model.source:
            fix = f"get it with: kit model pull {config.model.source} --file {path.name}"
        for part in [path.with_name(n) for n in split_parts(path.name)]:  # a split GGUF: every part
            if not part.exists():
                raise KitError(field, f"{part} does not exist on this host", fix)
            info = part.stat()
            if part.is_file() and not info.st_mode & stat.S_IROTH and info.st_uid != ENGINE_UID:
                raise KitError(field, f"{part} is not readable",
                               f"chmod a+r {part} (the engine runs as uid 10001)")


def require_ports(config: StackConfig) -> None:
    """Published ports are free, or held by this stack's own containers (a second deploy is a no-op)."""
    import socket

    ours = {p.get("HostPort") for c in containers(config) for ports in
            (c.attrs.get("HostConfig", {}).get("PortBindings") or {}).values() for p in (ports or [])}
    for service in services(config):
        if str(service.host_port) in ours:
            continue
        host = "0.0.0.0" if config.serve.expose else "127.0.0.1"
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, service.host_port))
            except OSError:
                holder = _port_holder(service.host_port)
                raise KitError("serve.port", f"port {service.host_port} ({service.name}) is in use{holder}",
                               "stop that, or choose another serve.port") from None


def _port_holder(port: int) -> str:
    for c in dockerhost.client().containers.list():
        for bindings in (c.attrs.get("NetworkSettings", {}).get("Ports") or {}).values():
            if any(b.get("HostPort") == str(port) for b in bindings or []):
                return f" by container {c.name}"
    return " by another process"


def require_gpus(config: StackConfig, client: Any = None, where: str = "this Docker") -> None:
    """A GPU flavor needs Docker to hand out NVIDIA GPUs; else compose fails late with a driver error."""
    from kit import doctor

    gpu = [n for n in config.engine_names() if resolve.engine(config, n).gpu]
    if gpu and not doctor.gpu_runtime((client or dockerhost.client()).info()):
        raise KitError("hardware.gpus", f"{', '.join(gpu)} runs on GPUs, but {where} has no NVIDIA runtime, "
                       "hook or CDI spec", "install nvidia-container-toolkit and run `nvidia-ctk runtime configure` "
                       "(`kit doctor` checks it), or use the cpu preset")


def require_replicas_fit(config: StackConfig) -> None:
    """A replica host with its own hardware holds the model too (planned from the header on this machine): else
    that host waits out its health timeout on an out-of-memory loop."""
    from kit import plan

    info = resolve.model_info(config, config.stack.primary)
    if info is None:
        return
    for target, result in plan.on_replicas(config, info):
        if not result.fits:
            raise KitError(f"hosts[{target.index}].hardware", f"the model does not fit {target.name} at ctx "
                           f"{result.ctx}", result.fix or "give that host more GPUs, or lower model.ctx")


def preflight(config: StackConfig) -> None:
    """What `kit deploy` checks before it writes or starts anything."""
    require_model(config)
    require_replicas_fit(config)
    require_images(config)
    require_gpus(config)
    require_ports(config)


def require_replica_model(config: StackConfig, target: hosts.Target, client: Any) -> None:
    """The model is readable at the same path on a replica host, as the engine's user: asked of that host's Docker
    with a throwaway container of the engine's image (its files are not on this machine)."""
    from docker.errors import ContainerError

    from kit import serving

    name = config.stack.primary
    path = resolve.host_model_path(config, name)
    inside = f"{serving.MODEL_MOUNT}/{resolve.engine(config, name).model_file}"
    try:
        client.containers.run(services(config)[0].image, ["-r", inside], entrypoint=["test"], remove=True,
                              volumes={compose.host_model_dir(config): {"bind": serving.MODEL_MOUNT, "mode": "ro"}})
    except ContainerError:
        raise KitError(resolve.model_field(config, name), f"{path} is not readable on {target.describe()}",
                       "put the model at the same path on every host (the engine runs as uid 10001)") from None


def deploy_host(config: StackConfig, target: hosts.Target, out: Path, timeout_s: float,
                echo: Callable[[str], None]) -> None:
    """One further host: its images (copied when it lacks them and there is no registry), a replica's model, its
    GPUs, then ``compose up`` through its endpoint, until healthy. A worker's rpc-server needs no model: the
    primary sends it the layers."""
    on_host = hosts.host_config(config, target)
    client = hosts.client(target)
    echo(f"host {target.describe()}{': rpc-server for the primary' if target.worker else ''}")
    images = [services(on_host)[0].image] if target.worker else [s.image for s in services(on_host)]
    if not config.build.push:
        for tag in imagecopy.missing(images, client):
            imagecopy.copy(tag, dockerhost.client(), client, target.name, echo)
    if not target.worker:
        require_replica_model(on_host, target, client)
    require_gpus(on_host, client, f"the Docker of {target.describe()}")
    _compose(out / hosts.folder(target), "up", "-d", "--remove-orphans", target=target)
    wait_healthy(on_host, timeout_s, lambda line: echo(f"{target.name}: {line}"), client=client)


def deploy(config: StackConfig, out: Path, timeout_s: float | None = None,
           echo: Callable[[str], None] = print, fail_on_restart: bool = False) -> str:
    """Workers first (the primary connects to them as it starts), replicas next (the front door starts with its
    upstreams up), then this machine's stack, then one request."""
    preflight(config)
    render.render_stack(config, out)
    for note in resolve.notes(config):
        echo(f"note: {note}")
    timeout_s = timeout_s or max(120.0, 2.0 * 60 + 20 * resolve.model_size_gib(config))
    for target in hosts.workers(config) + hosts.replicas(config):
        deploy_host(config, target, out, timeout_s, echo)
    _compose(out, "up", "-d", "--remove-orphans")
    wait_healthy(config, timeout_s, echo, fail_on_restart)
    url = endpoint(config)
    echo(f"smoke: {smoke(url, api_key(out), config.model.name)}")
    return url


def status(config: StackConfig | None) -> list[dict[str, str]]:
    """The stack's containers on every host; with no config, every container kit's labels mark (``io.kit.role``),
    any stack, on this machine."""
    if config is None:
        found = [(hosts.LOCAL, c) for c in
                 dockerhost.client().containers.list(all=True, filters={"label": "io.kit.role"})]
    else:
        found = []
        for t in hosts.targets(config):
            try:
                found += [(t.name, c) for c in containers(hosts.host_config(config, t), hosts.client(t))]
            except KitError as exc:  # one host down must not hide the others
                found.append((t.name, exc))
    rows = []
    for host, c in found:
        if isinstance(c, KitError):
            rows.append({"host": host, "stack": config.stack.name if config else "", "service": "", "container": "",
                         "image": "", "state": f"unreachable: {c.problem}", "role": ""})
            continue
        rows.append({"host": host, "stack": c.labels.get("com.docker.compose.project", ""),
                     "service": c.labels.get("com.docker.compose.service", c.name), "container": c.name,
                     "image": c.attrs["Config"]["Image"], "state": health(c),
                     "role": c.labels.get("io.kit.role", "")})
    order = {t.name: i for i, t in enumerate(hosts.targets(config))} if config else {}
    return sorted(rows, key=lambda r: (order.get(r["host"], 0), r["stack"], r["service"]))


def front_door_view(config: StackConfig) -> list[dict[str, str]]:
    """Each upstream as the front door reaches it: its engine's /health asked from inside the front door's container
    (so a replica the front door cannot route to shows, even when its own host calls it healthy)."""
    front = [c for c in containers(config) if c.labels.get("io.kit.role") == FRONT_DOOR]
    if not front or health(front[0]) in ("exited", "dead", "created"):
        return []
    rows = []
    for upstream in compose.upstreams(resolve.stack(config)):
        probe = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "3",
                 f"http://{upstream.address}/health"]
        code, output = front[0].exec_run(probe)
        answer = output.decode(errors="replace").strip()
        state = "healthy" if answer == "200" else "loading" if answer == "503" else \
            f"unreachable (curl exit {code})" if answer in ("", "000") else f"HTTP {answer}"
        rows.append({"upstream": upstream.address, "host": upstream.note.removeprefix("host ") or hosts.targets(
            config)[0].name, "backup": "yes" if upstream.backup else "", "state": state})
    return rows


def logs(out: Path, tail: int = 2000, service: str | None = None) -> str:
    """Every host's logs: this machine's, then each further host's (its rendered folder says how to reach it), each
    of their lines led by the host's name."""
    result = _compose(out, "logs", "--no-color", "--tail", str(tail), *([service] if service else []))
    text = result.stdout + result.stderr
    for folder, target in hosts.rendered(out):
        other = _compose(folder, "logs", "--no-color", "--tail", str(tail), *([service] if service else []),
                         target=target, check=False)
        text += "".join(f"{target.name}: {line}\n" for line in (other.stdout + other.stderr).splitlines())
    return text


def check_logs(out: Path, config: StackConfig | None = None) -> list[logscan.Finding]:
    """Known failures in the logs, and (with the config) engines that keep restarting or have exited."""
    findings = logscan.scan(logs(out))
    if config is not None:
        findings += crash_loops(config)
    return findings


def crash_loops(config: StackConfig) -> list[logscan.Finding]:
    """A container that restarted or exited with an error: the silent failure ``restart: unless-stopped`` makes."""
    found = []
    on_hosts = [(t, c) for t in hosts.targets(config)
                for c in containers(hosts.host_config(config, t), hosts.client(t))]
    for target, c in on_hosts:
        c.reload()
        state = c.attrs.get("State", {})
        restarts, code = int(c.attrs.get("RestartCount", 0)), int(state.get("ExitCode", 0))
        name = c.labels.get("com.docker.compose.service", c.name)
        name = name if target.first else f"{target.name}: {name}"
        if state.get("Restarting") or restarts >= 2 or state.get("Status") == "exited" and code != 0:
            found.append(logscan.Finding(
                "crash-loop", f"{name}: {state.get('Status')}, restarted {restarts} times, last exit code {code}",
                "the engine exits at start: the lines above say why; `kit logs` shows the whole log"))
    return found


def down(out: Path, volumes: bool = False, config: StackConfig | None = None) -> None:
    """Take the stack down on every host from its rendered folder (a replica's folder says how to reach it); with
    only the config (the folder is gone), by its compose project name on each host, which compose finds by its own
    labels on the containers. Only this stack's containers: other stacks and the models stay."""
    args = ["down", "--remove-orphans"] + (["--volumes"] if volumes else [])
    rendered = (out / "compose.yaml").is_file()
    if rendered or config is None:
        for folder, target in hosts.rendered(out):
            _compose(folder, *args, target=target)
        _compose(out, *args)
        return
    for target in reversed(hosts.targets(config)):
        cmd = [*dockerhost.compose_cmd(), "-p", config.stack.name, *args]
        env = {**os.environ, **target.env()}
        result = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            raise CheckFailed(f"`docker compose -p {config.stack.name} down` on {target.describe()} failed:\n"
                              f"{result.stderr.strip()[-1500:]}")
