"""The 1Panel HTTP API, as far as installing a local app needs it (../shared/reference/1panel.md §4).

Auth: ``1Panel-Token = md5("1panel" + API key + timestamp)`` with ``1Panel-Timestamp`` (works on every version).
Envelope: ``{"code": 200, "message": "", "data": ...}``; errors often arrive as HTTP 200 with another ``code``, so the
``code`` decides. Flow, as 1Panel's own Go source has it (agent/router/ro_app.go, agent/app/api/v2/app.go,
agent/app/dto/response/app.go):

- upload the app (``POST /apps/local/upload``, newer v2 panels; it syncs by itself), or copy it into the local-apps
  folder and ``POST /apps/sync/local`` (v1: ``/apps/sync``);
- ``GET /apps/:key`` with the local key (``local`` + key): a flat ``AppDTO`` (``model.App`` fields, ``versions``).
  Not ``/apps/search``: its ``name`` filter matches display names and short descriptions, never the key;
- ``GET /apps/detail/:appId/:version/app`` -> ``AppDetailDTO`` (``id`` = appDetailId, ``params.formFields``);
- ``POST /apps/install`` (``AppInstallCreate``), then poll ``POST /apps/installed/check`` (``AppInstalledCheck``:
  status, httpPort; it has no message), and take a failure's reason from ``POST /apps/installed/search``
  (``AppInstallDTO.message``);
- on a failure or a readiness timeout, the container's last log lines: ``POST /containers/download/log``
  (``dto.ContainerLog``: container, since, tail, containerType; the panel runs ``docker logs --tail N`` and serves
  the text as a file, an error as the JSON envelope), scanned with kit's log signatures.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
import yaml

from kit import logscan
from kit.errors import CheckFailed, KitError

RUNNING = "Running"
LOG_TAIL = 15  # log lines shown with a failure: llama-server's load error and its cause fit in this
RESTARTING = "Restarting"
# agent/constant/app.go status names; Restarting and Installing are waited out
FAILED = {"UpErr", "InstallErr", "Error", "DownloadErr", "UnHealthy", "Stopped"}


def token(api_key: str, timestamp: str) -> str:
    return hashlib.md5(f"1panel{api_key}{timestamp}".encode()).hexdigest()


def hmac_token(api_key: str, timestamp: str) -> str:
    """1Panel 2.3.2+: HMAC-SHA256(API key, "1panel:" + timestamp), sent with ``1Panel-Signature-Version``."""
    import hmac

    return hmac.new(api_key.encode(), f"1panel:{timestamp}".encode(), hashlib.sha256).hexdigest()


# The panel's API checks, in its order (core/app/auth/api_auth.go, APIAuthMiddleware), each a 401 with its own message
AUTH_CHECKS = ("the API interface is enabled (Panel settings > API interface)",
               "the timestamp is within the key's validity (this machine's clock; at most 60 s ahead)",
               "the API key",
               "this machine's IP is in the API IP whitelist (an empty whitelist rejects everyone)")


class PanelError(CheckFailed):
    """A 1Panel error envelope (HTTP 200 with another ``code``), with the panel's code and message kept apart."""

    def __init__(self, text: str, code: Any, message: str) -> None:
        super().__init__(text)
        self.code, self.message = code, message


class PanelClient:
    def __init__(self, url: str, api_key: str, version: str = "v2", timeout_s: float = 30) -> None:
        if not url.startswith(("http://", "https://")):
            raise KitError("--url", f"{url!r} is not an http(s) URL", "write it like http://10.0.0.5:10086")
        self.base = f"{url.rstrip('/')}/api/{version}"
        self.version = version
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.signature = "md5"  # every panel version takes it; an HMAC-only revision gets HMAC after its 401
        self.auth_note = ""

    def headers(self) -> dict[str, str]:
        ts = str(int(time.time()))
        headers = {"1Panel-Timestamp": ts, "Accept-Language": "en"}  # English: the panel's messages are shown as-is
        if self.signature == "hmac-sha256":
            return {**headers, "1Panel-Token": hmac_token(self.api_key, ts), "1Panel-Signature-Version": "hmac-sha256"}
        return {**headers, "1Panel-Token": token(self.api_key, ts)}

    def send(self, method: str, path: str, **kwargs: Any) -> tuple[requests.Response, dict[str, Any] | None]:
        """One request with the token headers: the reply, and its JSON envelope (None when it is not JSON)."""
        try:
            reply = self.session.request(method, self.base + path, headers=self.headers(), timeout=self.timeout_s,
                                         **kwargs)
        except requests.RequestException as exc:
            raise CheckFailed(f"1Panel at {self.base} is unreachable: {exc.__class__.__name__}") from None
        try:
            body = reply.json()
        except ValueError:
            return reply, None
        if isinstance(body, dict) and body.get("code") == 401 and self.signature == "md5" and not self.auth_note:
            self.signature = "hmac-sha256"  # a revision that takes only HMAC-SHA256 answers MD5 with a 401
            retried, retried_body = self.send(method, path, **kwargs)
            if isinstance(retried_body, dict) and retried_body.get("code") != 401:
                self.auth_note = "the panel took HMAC-SHA256 (1Panel-Signature-Version), not MD5"
                return retried, retried_body
            self.signature = "md5"
            self.auth_note = "neither MD5 nor HMAC-SHA256 was accepted"
        return reply, body

    def call(self, method: str, path: str, json: Any = None, files: Any = None, data: Any = None) -> Any:
        reply, body = self.send(method, path, json=json, files=files, data=data)
        if body is None:
            raise CheckFailed(f"{method} {path}: HTTP {reply.status_code}, not a 1Panel JSON reply")
        code = body.get("code")
        if code != 200:
            message = body.get("message") or body.get("msg") or ""
            hint = f" (1Panel checks, in order: {'; '.join(AUTH_CHECKS)})" if code in (401, 403) else ""
            raise PanelError(f"{method} {path}: 1Panel code {code}: {message}{hint}", code, message)
        return body.get("data")

    # --- the routes the install flow uses
    def upload(self, app_dir: Path) -> Any:
        """Upload the app (newer v2 panels; it syncs the local apps itself). Older panels have no such route."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(app_dir, arcname=app_dir.name)
        files = {"file": (f"{app_dir.name}.tar.gz", buffer.getvalue(), "application/gzip")}
        reply, body = self.send("POST", "/apps/local/upload", files=files, data={"overwrite": "true"})
        if reply.status_code == 404 or body is None:
            raise KitError("--local-dir", f"this 1Panel ({self.version}) has no app upload (HTTP {reply.status_code})",
                           f"copy the app on the panel host instead: kit panel install ... --local-dir "
                           f"/opt/1panel/resource/apps/local (or scp -r {app_dir} <panel-host>:"
                           f"/opt/1panel/resource/apps/local/ and pass --local-dir there)")
        if body.get("code") != 200:
            raise CheckFailed(f"POST /apps/local/upload: 1Panel code {body.get('code')}: {body.get('message', '')}")
        return body.get("data")

    def find_app(self, key: str) -> dict[str, Any] | None:
        """The app by its panel key (``GET /apps/:key``), or None while the sync has not listed it yet."""
        try:
            return self.call("GET", f"/apps/{key}")
        except CheckFailed:
            return None

    def sync_local(self) -> str:
        """Start the panel's scan of its local-apps folder; what it said."""
        if self.version == "v1":
            # v1 (backend/app/api/v1/app.go, SyncApp): `go appService.SyncAppListFromLocal()` first, then
            # GetAppUpdate() asks the remote store and answers CodeErrInternalServer (500) when it is unreachable -
            # an offline panel's usual answer, with the local sync already running
            try:
                self.call("POST", "/apps/sync", json={})
            except PanelError as exc:
                if exc.code != 500:
                    raise
                return f"local sync started (the panel's app store is unreachable: {exc.message or 'code 500'})"
            return "local sync started"
        self.call("POST", "/apps/sync/local", json={"taskID": str(uuid.uuid4())})
        return "local sync started"

    def app(self, key: str) -> dict[str, Any]:
        return self.call("GET", f"/apps/{key}")

    def detail(self, app_id: int, version: str) -> dict[str, Any]:
        return self.call("GET", f"/apps/detail/{app_id}/{version}/app")

    def install(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.call("POST", "/apps/install", json=body)

    def installed(self, key: str, name: str) -> dict[str, Any]:
        return self.call("POST", "/apps/installed/check", json={"key": key, "name": name})

    def install_message(self, name: str) -> str:
        """The reason 1Panel recorded for an install (``AppInstallDTO.message``); AppInstalledCheck has none."""
        try:
            data = self.call("POST", "/apps/installed/search", json={"page": 1, "pageSize": 100, "name": name,
                                                                       "all": True})
        except CheckFailed:
            return ""
        items = (data or {}).get("items") or []
        return next((str(i.get("message") or "") for i in items if i.get("name") == name), "")

    def logs(self, container: str, tail: int = LOG_TAIL) -> list[str]:
        """The container's last log lines (``POST /containers/download/log``); empty when the panel cannot say."""
        if not container:
            return []
        try:
            reply, _ = self.send("POST", "/containers/download/log",
                                 json={"container": container, "since": "all", "tail": tail,
                                       "containerType": "container"})
        except CheckFailed:
            return []
        # the log comes as a text attachment; an error comes as the JSON envelope (a log line may look like JSON)
        if reply.status_code != 200 or "json" in reply.headers.get("Content-Type", ""):
            return []
        return reply.text.splitlines()[-tail:]


def log_report(client: PanelClient, state: dict[str, Any]) -> str:
    """What the engine said before it failed: its last log lines, and what kit's log signatures make of them."""
    container = str(state.get("containerName") or "")
    lines = client.logs(container)
    if not lines:
        return f"\n(the panel returned no log for container {container or '?'}; see the app's log in the panel)"
    found = logscan.scan("\n".join(lines))
    text = f"\nlast {len(lines)} log lines of {container}:\n" + "\n".join(f"  {line}" for line in lines)
    return text + "".join(f"\n{f.name}: {f.advice}" for f in found)


def wait_ready(client: PanelClient, state: dict[str, Any], allow_port: bool, deadline: float, poll_s: float,
               echo: Callable[[str], None]) -> dict[str, Any]:
    """1Panel's Running means the container is up, not that the model is loaded: poll the engine's /health through
    the published port until it answers 200. Reachable from here when the port is open (--allow-port) or kit runs
    on the panel host; otherwise say how to check."""
    from urllib.parse import urlsplit

    host = urlsplit(client.base).hostname or ""
    port = state.get("httpPort")
    local = host in ("127.0.0.1", "localhost", "::1")
    if not port or not (allow_port or local):
        echo(f"Running; the model may still be loading: on the panel host, curl http://127.0.0.1:{port or 'PORT'}/health")
        return state
    url = f"http://{host}:{port}/health"
    echo(f"Running; waiting for {url} (the model loads after the container starts)")
    last = ""
    while time.monotonic() < deadline:
        try:
            reply = requests.get(url, timeout=5)
            if reply.status_code == 200:
                return {**state, "ready": url}
            last = f"HTTP {reply.status_code}"
        except requests.RequestException as exc:
            last = exc.__class__.__name__
        time.sleep(poll_s)
    raise CheckFailed(f"{url} not ready before the timeout (last: {last})" + log_report(client, state))


def _local_version(app_dir: Path) -> str:
    versions = sorted(d.name for d in app_dir.iterdir() if d.is_dir() and (d / "docker-compose.yml").is_file())
    if not versions:
        raise KitError("--app", f"{app_dir} has no version folder", "run `kit panel export` first")
    return versions[-1]


def install(client: PanelClient, app_dir: Path, name: str, params: dict[str, str], *,
            local_dir: Path | None = None, allow_port: bool = False, timeout_s: float = 900,
            poll_s: float = 2.0, restarting_s: float = 60, echo: Callable[[str], None] = print) -> dict[str, Any]:
    if not (app_dir / "data.yml").is_file():
        raise KitError("--app", f"{app_dir} is not an exported app", "run `kit panel export` and pass --store")
    key = yaml.safe_load((app_dir / "data.yml").read_text(encoding="utf-8"))["additionalProperties"]["key"]
    version = _local_version(app_dir)
    if local_dir is not None:
        target = local_dir / app_dir.name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(app_dir, target)
        echo(f"copied {app_dir.name} into {local_dir}")
        echo(client.sync_local())
    else:
        client.upload(app_dir)
        echo(f"uploaded {app_dir.name} (the upload syncs the local apps)")
    if client.auth_note:
        echo(client.auth_note)
    panel_key = f"local{key}"
    deadline = time.monotonic() + 60
    app = client.find_app(panel_key)
    while app is None:  # the sync runs in the background on the panel
        if time.monotonic() > deadline:
            raise CheckFailed(f"1Panel does not list app {panel_key} 60 s after syncing "
                              f"(check the app with `kit panel check {app_dir}`)")
        time.sleep(poll_s)
        app = client.find_app(panel_key)
    versions = [v if isinstance(v, str) else v.get("version") for v in app.get("versions") or []]
    if version not in versions:
        raise CheckFailed(f"1Panel lists versions {versions} for {key}, not {version}")
    detail = client.detail(app["id"], version)
    defaults = {f["envKey"]: f["default"] for f in (detail.get("params") or {}).get("formFields") or []}
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise KitError("--param", f"{unknown} are not form fields of {key}", f"use {sorted(defaults)}")
    values = {**defaults, **params}
    # 1Panel's .env writer drops booleans and does not escape quotes: strings and numbers only
    values = {k: v if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v) for k, v in values.items()}
    installed = client.install({
        "appDetailId": detail["id"], "name": name, "params": values, "advanced": True, "allowPort": allow_port,
        "pullImage": False,  # kit images are built locally; a pull would fail the install
        "gpuConfig": False,  # the compose names device_ids; gpuConfig would overwrite them with count: all
        "editCompose": False, "dockerCompose": "", "cpuQuota": 0, "memoryLimit": 0, "memoryUnit": "M",
        "containerName": "", "taskID": str(uuid.uuid4()),
    })
    echo(f"install started: {installed.get('name', name)} ({installed.get('status', 'Installing')})")
    if not allow_port:
        echo("the port is published on 127.0.0.1 of the panel host only (pass --allow-port to open it)")
    deadline = time.monotonic() + timeout_s
    restarting_since: float | None = None
    while True:
        state = client.installed(panel_key, name)
        status = state.get("status", "")
        if status == RUNNING:
            return wait_ready(client, state, allow_port, deadline, poll_s, echo)
        # Restarting for longer than a start takes is a crash loop (the engine exits, Docker restarts it)
        restarting_since = (restarting_since or time.monotonic()) if status == RESTARTING else None
        looping = restarting_since is not None and time.monotonic() - restarting_since > restarting_s
        if status in FAILED or looping:
            reason = client.install_message(name) or "1Panel gave no reason; see the app's log in the panel"
            ended = f"kept {status} for {restarting_s:g} s (a crash loop)" if looping else f"ended in {status}"
            raise CheckFailed(f"1Panel install of {name} {ended}: {reason}" + log_report(client, state))
        if time.monotonic() > deadline:
            raise CheckFailed(f"1Panel install of {name} still {status or 'unknown'} after {timeout_s:.0f}s"
                              + log_report(client, state))
        time.sleep(poll_s)
