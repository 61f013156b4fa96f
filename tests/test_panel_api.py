"""`kit panel install` against a stand-in 1Panel (a contract test: 1Panel itself cannot run here).

The stand-in follows 1Panel's own Go source (1Panel-dev/1Panel), not the client's guesses:
- routes: agent/router/ro_app.go (`apps/sync/local`, `apps/search`, `apps/:key`, `apps/detail/:appId/:version/:type`,
  `apps/install`, `apps/installed/check`, `apps/installed/search`); `apps/local/upload` exists only on newer v2
  panels (`has_upload`), and gin answers a missing route with HTTP 404 "404 page not found";
- `SearchApp` -> repo `WithByLikeName`: `name like ? or short_desc_zh like ? or short_desc_en like ?`, never the key;
- `GetApp` -> `response.AppDTO`: `model.App` embedded (flat `id`, `key`, `name`, ...), `installed`, `versions`,
  `tags` - no `app` wrapper; an unknown key is an error envelope;
- `CheckAppInstalled` -> `response.AppInstalledCheck` (`isExist`, `name`, `app`, `version`, `status`, `appInstallId`,
  `containerName`, `installPath`, `httpPort`, `httpsPort`): no `message`;
- `SearchAppInstalled` -> page of `AppInstallDTO` (`model.AppInstall`: `name`, `status`, `message`, ...);
- the envelope (errors as HTTP 200 with another `code`) and the token check md5("1panel" + key + timestamp);
- v1 (backend/app/api/v1/app.go, `SyncApp`): `POST /apps/sync` runs `go appService.SyncAppListFromLocal()` and then
  `GetAppUpdate()`, which answers `CodeErrInternalServer` (500) when the remote store is unreachable - after the
  local sync has started (`version="v1"`, `store_reachable=False`);
- `AppInstalledCheck.httpPort`: the published port, where the engine's /health says when the model is loaded
  (Running only means the container is up);
- agent/router/ro_container.go `POST /containers/download/log` -> `DownloadContainerLogs`: `dto.ContainerLog`
  (`container` validate:"required", `since`, `tail` uint, `containerType`) through `helper.CheckBindAndValidate`
  (a bad body is `CodeErrBadRequest`), `cmd.CheckIllegal` on container/since/tail, then `docker logs --tail N` written
  to a temp file and served by `http.ServeContent` as an attachment (text, not the envelope).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time

import pytest
import yaml
from werkzeug.wrappers import Request, Response

from kit.errors import CheckFailed, KitError
from kit.panel import api
from tests.conftest import ROOT

KEY = "panel-secret-key"
STORE = ROOT / "appstore"


def envelope(data=None, code=200, message=""):
    return Response(json.dumps({"code": code, "message": message, "data": data}), status=200,
                    content_type="application/json")


class FakePanel:
    def __init__(self, fail_with: str | None = None, has_upload: bool = True, version: str = "v2",
                 store_reachable: bool = True, http_port: int = 0, signatures: tuple[str, ...] = ("md5",),
                 api_enabled: bool = True, whitelist: tuple[str, ...] = ("0.0.0.0/0",), validity_min: int = 120):
        self.apps: dict[str, dict] = {}
        self.uploaded: list[str] = []
        self.installs: dict[str, dict] = {}
        self.install_bodies: list[dict] = []
        self.routes: list[str] = []
        self.polls = 0
        self.fail_with = fail_with
        self.has_upload = has_upload
        self.pending: dict | None = None
        self.version, self.store_reachable, self.http_port = version, store_reachable, http_port
        self.signatures, self.api_enabled, self.whitelist = signatures, api_enabled, whitelist
        self.validity_min = validity_min
        self.auth_seen: list[str] = []
        self.container_logs: dict[str, str] = {}  # containerName -> what `docker logs` prints
        self.log_requests: list[dict] = []

    def auth_error(self, request: Request) -> str | None:
        """core/app/auth/api_auth.go APIAuthMiddleware, in its order; each failure is helper.BadAuth (code 401)
        with the i18n text of its key. `signatures`: md5 (isValid1PanelToken), hmac-sha256 (2.3.2+
        isValidHMACSHA256Token with `1Panel-Signature-Version`), or both."""
        import hmac

        ts = request.headers.get("1Panel-Timestamp", "")
        tok = request.headers.get("1Panel-Token", "")
        if not self.api_enabled:
            return "ErrApiConfigStatusInvalid: API interface is disabled"
        now = int(time.time())  # isValid1PanelTimestamp: < 0 never, 0 always, else 60 s ahead / validity + 60 s behind
        if self.validity_min < 0 or self.validity_min > 0 and (
                not ts.isdigit() or int(ts) > now + 60 or now - int(ts) > self.validity_min * 60 + 60):
            return "ErrApiConfigKeyTimeInvalid: API timestamp is out of the validity window"
        version = request.headers.get("1Panel-Signature-Version", "")
        self.auth_seen.append(version or "md5")
        ok_md5 = "md5" in self.signatures and version in ("", "v1", "md5") and \
            tok == hashlib.md5(f"1panel{KEY}{ts}".encode()).hexdigest()
        ok_hmac = "hmac-sha256" in self.signatures and version == "hmac-sha256" and \
            tok == hmac.new(KEY.encode(), f"1panel:{ts}".encode(), hashlib.sha256).hexdigest()
        if not (ok_md5 or ok_hmac):
            return "ErrApiConfigKeyInvalid: API key is invalid"
        if not self.whitelist:  # isIPInWhiteList: an empty list rejects everyone
            return "ErrApiConfigIPInvalid: IP is not in the API whitelist"
        return None

    def read_app(self, blob: bytes) -> dict:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            names = tar.getnames()
            data = yaml.safe_load(tar.extractfile(f"{names[0]}/data.yml").read())
            versions = sorted({n.split("/")[1] for n in names if n.endswith("/docker-compose.yml")})
            form = {v: yaml.safe_load(tar.extractfile(f"{names[0]}/{v}/data.yml").read()) for v in versions}
        props = data["additionalProperties"]
        return {"key": "local" + props["key"], "id": 7, "name": props["name"], "versions": versions, "form": form,
                "shortDescZh": props.get("shortDescZh", ""), "shortDescEn": props.get("shortDescEn", "")}

    def __call__(self, request: Request) -> Response:
        path = request.path.removeprefix(f"/api/{self.version}")
        self.routes.append(path)
        if path == "/apps/local/upload" and not self.has_upload:
            return Response("404 page not found", status=404, content_type="text/plain")
        error = self.auth_error(request)
        if error:
            return envelope(code=401, message=error)
        body = request.get_json(silent=True) or {}
        if path == "/apps/local/upload":
            app = self.read_app(request.files["file"].read())
            self.uploaded.append(app["key"])
            self.apps[app["key"]] = app  # the upload syncs the local apps itself
            return envelope(None)
        if path == "/apps/sync/local" and self.version == "v2" or path == "/apps/sync" and self.version == "v1":
            if self.pending:  # go appService.SyncAppListFromLocal()
                self.apps[self.pending["key"]] = self.pending
            if self.version == "v1" and not self.store_reachable:  # GetAppUpdate() -> CodeErrInternalServer
                return envelope(code=500, message="Get \"https://apps-assets.fit2cloud.com/stable/1panel.json\": "
                                                  "dial tcp: lookup apps-assets.fit2cloud.com: no such host")
            return envelope()
        if path == "/apps/search":
            # WithByLikeName: display name and short descriptions, never the key
            needle = body.get("name", "").lower()
            items = [{"id": a["id"], "key": k, "name": a["name"]} for k, a in self.apps.items()
                     if not needle or needle in a["name"].lower() or needle in a["shortDescZh"].lower()
                     or needle in a["shortDescEn"].lower()]
            return envelope({"items": items, "total": len(items)})
        if path.startswith("/apps/detail/"):
            _, _, _, app_id, version, kind = path.split("/")
            app = next(a for a in self.apps.values() if str(a["id"]) == app_id)
            return envelope({"id": 70 + app["versions"].index(version), "version": version, "enable": True,
                             "params": app["form"][version]["additionalProperties"]})
        if path == "/apps/install":
            self.install_bodies.append(body)
            self.installs[body["name"]] = {"status": "Installing", "message": ""}
            return envelope({"id": 1, "name": body["name"], "status": "Installing"})
        if path == "/apps/installed/check":
            self.polls += 1
            state = self.installs[body["name"]]
            if self.polls >= 2:
                state["status"] = self.fail_with or "Running"
                state["message"] = "compose up failed: image not found" if self.fail_with else ""
            # response.AppInstalledCheck: no message field
            return envelope({"isExist": True, "name": body["name"], "app": body["key"], "version": "x",
                             "status": state["status"], "appInstallId": 1, "containerName": f"1Panel-{body['name']}",
                             "installPath": "/opt/1panel/apps/local/x", "httpPort": self.http_port,
                             "httpsPort": 0})
        if path == "/apps/installed/search":
            items = [{"name": n, "status": s["status"], "message": s["message"]} for n, s in self.installs.items()
                     if body.get("name", "") in n]
            return envelope({"items": items, "total": len(items)})
        if path == "/containers/download/log":
            self.log_requests.append(body)
            container, tail = body.get("container"), body.get("tail", 0)
            if not container or not isinstance(tail, int) or tail < 0:  # ShouldBindJSON / validate:"required"
                return envelope(code=400, message="ErrInvalidParams")
            if any(c in container + str(body.get("since", "")) for c in "&|;$'`()\"\n\r<>"):  # cmd.CheckIllegal
                return envelope(code=500, message="ErrCmdIllegal")
            if container not in self.container_logs:  # docker logs: No such container
                return Response("Error response from daemon: No such container: " + container + "\n",
                                content_type="text/plain; charset=utf-8",
                                headers={"Content-Disposition": "attachment; filename*=utf-8''cmd_output_1.txt"})
            lines = self.container_logs[container].splitlines()
            text = "".join(line + "\n" for line in (lines[-tail:] if tail else lines))
            return Response(text, content_type="text/plain; charset=utf-8",
                            headers={"Content-Disposition": "attachment; filename*=utf-8''cmd_output_1.txt"})
        if path.startswith("/apps/"):
            key = path.removeprefix("/apps/")
            app = self.apps.get(key)
            if app is None:  # appService.GetApp: record not found
                return envelope(code=500, message="record not found")
            # response.AppDTO: model.App embedded, flat
            return envelope({"id": app["id"], "key": key, "name": app["name"], "installed": False,
                             "versions": app["versions"], "tags": []})
        return Response("404 page not found", status=404, content_type="text/plain")


@pytest.fixture
def panel(httpserver):
    fake = FakePanel()
    import re

    httpserver.expect_request(re.compile(r"^/api/v2/.*")).respond_with_handler(fake)
    return fake, httpserver.url_for("/").rstrip("/")


def test_token_formula():
    assert api.token("abc", "1700000000") == hashlib.md5(b"1panelabc1700000000").hexdigest()


def test_install_flow(panel):
    fake, url = panel
    client = api.PanelClient(url, KEY)
    lines = []
    result = api.install(client, STORE / "llama-cpp-v100", "llama-v100", {"MODEL_FILE": "qwen.gguf"},
                         poll_s=0.01, echo=lines.append)
    assert result["status"] == "Running"
    assert fake.uploaded == ["localllama-cpp-v100"]
    body = fake.install_bodies[0]
    assert body["appDetailId"] == 70 and body["name"] == "llama-v100"
    assert body["pullImage"] is False and body["gpuConfig"] is False and body["advanced"] is True
    assert body["params"]["MODEL_FILE"] == "qwen.gguf" and body["params"]["PANEL_APP_PORT_HTTP"] == 8080
    assert all(not isinstance(v, bool) for v in body["params"].values())
    # the upload syncs by itself: no second sync; the app is fetched by its key, never searched by name
    assert "/apps/sync/local" not in fake.routes and "/apps/search" not in fake.routes
    assert "/apps/localllama-cpp-v100" in fake.routes
    assert any("127.0.0.1 of the panel host" in line for line in lines)


def test_search_by_key_finds_nothing_on_a_real_panel(panel):
    """Why the client asks GET /apps/:key: 1Panel's search matches names and descriptions, not keys."""
    fake, url = panel
    client = api.PanelClient(url, KEY)
    client.upload(STORE / "llama-cpp-v100")
    found = client.call("POST", "/apps/search", json={"page": 1, "pageSize": 50, "name": "localllama-cpp-v100"})
    assert found["items"] == []
    assert client.find_app("localllama-cpp-v100")["versions"]


def test_panel_without_upload_says_to_copy(httpserver):
    import re

    fake = FakePanel(has_upload=False)
    httpserver.expect_request(re.compile(r"^/api/v2/.*")).respond_with_handler(fake)
    client = api.PanelClient(httpserver.url_for("/").rstrip("/"), KEY)
    with pytest.raises(KitError) as err:
        api.install(client, STORE / "llama-cpp-v100", "x", {}, poll_s=0.01, echo=lambda _l: None)
    assert err.value.field == "--local-dir" and "no app upload (HTTP 404)" in err.value.problem
    assert "/opt/1panel/resource/apps/local" in err.value.fix


def test_wrong_key_is_an_error_even_inside_http_200(panel):
    _, url = panel
    client = api.PanelClient(url, "wrong-key")
    with pytest.raises(CheckFailed) as failure:
        client.sync_local()
    assert "code 401" in str(failure.value) and "API key" in str(failure.value)


def test_install_error_state_is_reported(httpserver):
    import re

    fake = FakePanel(fail_with="UpErr")
    httpserver.expect_request(re.compile(r"^/api/v2/.*")).respond_with_handler(fake)
    client = api.PanelClient(httpserver.url_for("/").rstrip("/"), KEY)
    with pytest.raises(CheckFailed) as failure:
        api.install(client, STORE / "llama-cpp-v100", "llama-v100", {}, poll_s=0.01, echo=lambda _l: None)
    assert "UpErr" in str(failure.value) and "image not found" in str(failure.value)


def test_unknown_param_and_bad_url(panel):
    _, url = panel
    client = api.PanelClient(url, KEY)
    with pytest.raises(KitError) as failure:
        api.install(client, STORE / "llama-cpp-v100", "x", {"MODEL": "a"}, poll_s=0.01, echo=lambda _l: None)
    assert "MODEL" in failure.value.line() and "MODEL_FILE" in failure.value.line()
    with pytest.raises(KitError) as bad:
        api.PanelClient("10.0.0.5:10086", KEY)
    assert bad.value.field == "--url"


def test_copy_to_local_dir(panel, tmp_path):
    fake, url = panel
    client = api.PanelClient(url, KEY)
    _pending_vllm(fake)  # a panel that reads the local folder: its sync finds the copied app
    api.install(client, STORE / "vllm-v100", "vllm", {}, local_dir=tmp_path, poll_s=0.01, echo=lambda _l: None)
    assert (tmp_path / "vllm-v100" / "data.yml").is_file()
    assert fake.uploaded == []


def _pending_vllm(fake: FakePanel) -> None:
    """A panel that finds the copied app in its local folder when it syncs."""
    version = next(d.name for d in (STORE / "vllm-v100").iterdir() if d.is_dir())
    fake.pending = {"key": "localvllm-v100", "id": 9, "name": "vLLM (V100)", "versions": [version],
                    "form": {version: yaml.safe_load((STORE / "vllm-v100" / version / "data.yml").read_text())}}


def test_v1_sync_answering_500_has_still_started_the_local_sync(httpserver, tmp_path):
    import re

    fake = FakePanel(version="v1", store_reachable=False, has_upload=False)
    _pending_vllm(fake)
    httpserver.expect_request(re.compile(r"^/api/v1/.*")).respond_with_handler(fake)
    client = api.PanelClient(httpserver.url_for("/").rstrip("/"), KEY, version="v1")
    lines: list[str] = []
    result = api.install(client, STORE / "vllm-v100", "vllm", {}, local_dir=tmp_path, poll_s=0.01, echo=lines.append)
    assert result["status"] == "Running" and "/apps/sync" in fake.routes
    assert any(l.startswith("local sync started (the panel's app store is unreachable: Get ") for l in lines), lines
    # any other error of the sync is still an error
    fake.store_reachable, fake.version = True, "v1"
    with pytest.raises(CheckFailed, match="1Panel code 401"):
        api.PanelClient(httpserver.url_for("/").rstrip("/"), "wrong", version="v1").sync_local()


def test_running_waits_for_the_model_through_the_published_port(httpserver, tmp_path):
    """The panel says Running when the container is up; kit waits for the engine's /health (503 while loading)."""
    import re

    from werkzeug.wrappers import Response as R

    health = {"calls": 0}

    def engine_health(_request):
        health["calls"] += 1
        return R("loading", status=503) if health["calls"] < 3 else R('{"status":"ok"}', status=200)

    fake = FakePanel(http_port=httpserver.port)
    httpserver.expect_request("/health").respond_with_handler(engine_health)
    httpserver.expect_request(re.compile(r"^/api/v2/.*")).respond_with_handler(fake)
    client = api.PanelClient(httpserver.url_for("/").rstrip("/"), KEY)
    lines: list[str] = []
    result = api.install(client, STORE / "llama-cpp-v100", "llama-v100", {}, poll_s=0.01, echo=lines.append)
    assert result["ready"] == f"http://localhost:{httpserver.port}/health" and health["calls"] == 3
    assert any("the model loads after the container starts" in l for l in lines)


def test_running_on_a_remote_panel_without_open_port_says_how_to_check():
    client = api.PanelClient("http://10.0.0.5:10086", KEY)
    lines: list[str] = []
    state = api.wait_ready(client, {"status": "Running", "httpPort": 8080}, False, time.monotonic() + 1, 0.01,
                           lines.append)
    assert "ready" not in state and lines == ["Running; the model may still be loading: on the panel host, "
                                              "curl http://127.0.0.1:8080/health"]


@pytest.mark.parametrize("signatures,expected", [
    (("md5",), ["md5"]),                                   # every version
    (("md5", "hmac-sha256"), ["md5"]),                     # 2.3.2+: either; kit keeps MD5
    (("hmac-sha256",), ["md5", "hmac-sha256"]),            # a revision that takes only HMAC: one 401, then HMAC
])
def test_auth_variants(httpserver, signatures, expected):
    import re

    fake = FakePanel(signatures=signatures)
    httpserver.expect_request(re.compile(r"^/api/v2/.*")).respond_with_handler(fake)
    client = api.PanelClient(httpserver.url_for("/").rstrip("/"), KEY)
    lines: list[str] = []
    result = api.install(client, STORE / "llama-cpp-v100", "llama-v100", {}, poll_s=0.01, echo=lines.append)
    assert result["status"] == "Running"
    # the first request signs with MD5; every later one with what the panel took
    assert fake.auth_seen[0] == expected[0] and set(fake.auth_seen[1:]) == {expected[-1]}
    said = "the panel took HMAC-SHA256 (1Panel-Signature-Version), not MD5"
    assert (said in lines) == (signatures == ("hmac-sha256",))


@pytest.mark.parametrize("panel_args,phrase", [
    ({"api_enabled": False}, "API interface is disabled"),
    ({"whitelist": ()}, "IP is not in the API whitelist"),
    ({"validity_min": -1}, "out of the validity window"),
])
def test_auth_refusals_say_the_panels_reason_and_the_checks(httpserver, panel_args, phrase):
    import re

    fake = FakePanel(**panel_args)
    httpserver.expect_request(re.compile(r"^/api/v2/.*")).respond_with_handler(fake)
    client = api.PanelClient(httpserver.url_for("/").rstrip("/"), KEY)
    with pytest.raises(CheckFailed) as failure:
        client.find_app("localx") or client.app("localx")
    text = str(failure.value)
    assert "1Panel code 401" in text and phrase in text
    assert "an empty whitelist rejects everyone" in text and client.auth_note == "neither MD5 nor HMAC-SHA256 was accepted"


def test_a_container_that_keeps_restarting_is_a_crash_loop(httpserver):
    import re

    fake = FakePanel(fail_with="Restarting")
    httpserver.expect_request(re.compile(r"^/api/v2/.*")).respond_with_handler(fake)
    client = api.PanelClient(httpserver.url_for("/").rstrip("/"), KEY)
    with pytest.raises(CheckFailed) as failure:
        api.install(client, STORE / "llama-cpp-v100", "llama-v100", {}, poll_s=0.01, restarting_s=0.2,
                    timeout_s=30, echo=lambda _l: None)
    assert "kept Restarting for 0.2 s (a crash loop): compose up failed: image not found" in str(failure.value)


# llama-server 0c1e57098's start-up on a missing model, as the cpu build printed it (tests/test_deploy.STARTUP_LINES)
MISSING_MODEL_LOG = "".join(f"0.00.0{i}0.000 I line {i} of the model loader\n" for i in range(20)) + (
    "0.00.010.962 E gguf_init_from_file: failed to open GGUF file '/models/qwen.gguf' (No such file or directory)\n"
    "0.00.010.970 E llama_model_load_from_file_impl: failed to load model\n")


def test_a_crash_loop_shows_the_engines_last_log_lines_and_what_they_mean(httpserver):
    import re

    fake = FakePanel(fail_with="Restarting")
    fake.container_logs["1Panel-llama-v100"] = MISSING_MODEL_LOG
    httpserver.expect_request(re.compile(r"^/api/v2/.*")).respond_with_handler(fake)
    client = api.PanelClient(httpserver.url_for("/").rstrip("/"), KEY)
    with pytest.raises(CheckFailed) as failure:
        api.install(client, STORE / "llama-cpp-v100", "llama-v100", {}, poll_s=0.01, restarting_s=0.1,
                    timeout_s=30, echo=lambda _l: None)
    text = str(failure.value).splitlines()
    # dto.ContainerLog as the panel binds it: tail a uint, not a string
    assert fake.log_requests == [{"container": "1Panel-llama-v100", "since": "all", "tail": 15,
                                  "containerType": "container"}]
    assert text[0].startswith("1Panel install of llama-v100 kept Restarting for 0.1 s (a crash loop): ")
    assert text[1] == "last 15 log lines of 1Panel-llama-v100:"
    # 22 lines were logged; the last 15 are lines 7..19 of the loader, then the two errors
    assert text[2] == "  0.00.070.000 I line 7 of the model loader"
    assert text[16] == "  0.00.010.970 E llama_model_load_from_file_impl: failed to load model"
    assert text[17].startswith("model-missing: ")


def test_a_readiness_timeout_names_the_health_url_and_shows_the_log(httpserver):
    import re

    from werkzeug.wrappers import Response as R

    fake = FakePanel(http_port=httpserver.port)
    fake.container_logs["1Panel-llama-v100"] = "0.00.010.403 I srv    load_model: loading model\n"
    httpserver.expect_request("/health").respond_with_handler(lambda _r: R("loading", status=503))
    httpserver.expect_request(re.compile(r"^/api/v2/.*")).respond_with_handler(fake)
    client = api.PanelClient(httpserver.url_for("/").rstrip("/"), KEY)
    with pytest.raises(CheckFailed) as failure:
        api.install(client, STORE / "llama-cpp-v100", "llama-v100", {}, poll_s=0.01, timeout_s=0.5,
                    echo=lambda _l: None)
    assert str(failure.value).splitlines() == [
        f"http://localhost:{httpserver.port}/health not ready before the timeout (last: HTTP 503)",
        "last 1 log lines of 1Panel-llama-v100:",
        "  0.00.010.403 I srv    load_model: loading model"]


def test_a_panel_that_cannot_give_the_log_says_so():
    """An error envelope (here: CheckIllegal's answer) is not a log line."""
    client = api.PanelClient("http://127.0.0.1:1", KEY)
    assert client.logs("") == []
    assert "the panel returned no log for container ?" in api.log_report(client, {})


def test_an_illegal_container_name_is_answered_with_the_envelope_not_a_log(panel):
    fake, url = panel
    client = api.PanelClient(url, KEY)
    fake.container_logs["a;b"] = "secret\n"
    assert client.logs("a;b") == [] and fake.log_requests[-1]["container"] == "a;b"
