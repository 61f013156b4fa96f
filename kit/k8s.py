"""``out/k8s/``: the stack as Kubernetes manifests, with compose's promises (``kit render --target k8s``).

- one Deployment and one ClusterIP Service per engine, named as its compose service, so the front door's nginx.conf
  (the same file compose mounts) finds its upstreams by the same names;
- ``command`` is the engine binary and ``args`` the argv as a list: the exec form, nothing for an image's entrypoint
  script to eat;
- GPUs by ``resources.limits["nvidia.com/gpu"]`` (the NVIDIA device plugin numbers them from 0 in the pod, as
  compose's ``device_ids`` do), on nodes whose ``nvidia.com/gpu.product`` label is the configured GPU
  (GPU feature discovery writes nvidia-smi's name with spaces as '-': k8s-device-plugin internal/lm/resource.go,
  ``productLabel``), ``/dev/shm`` in memory for NCCL (compose uses ``ipc: host``), ``Recreate`` so a new pod does not
  wait for the GPUs its predecessor holds;
- startup, readiness and liveness probes on the engine's health path; the startup probe waits as long as compose's
  start period;
- the model folder read-only from the node (``model.dir``), at the path the argv names;
- the API key only in ``api-key.env`` (mode 0600), turned into a Secret by kustomize's ``secretGenerator`` at
  ``kubectl apply -k``: no manifest holds it;
- every Service is ClusterIP unless ``serve.expose`` (then the entry Service is a NodePort); no hostPort, no
  hostNetwork. ``problems()`` checks these promises on the rendered objects, and ``files()`` refuses output that
  breaks one.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

from kit import __version__, compose, containerspec, serving
from kit.config import StackConfig
from kit.errors import KitError
from kit.resolve import ResolvedStack
from kit.services import FRONT_DOOR, Service

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
API_KEY_FILE = "api-key.env"
PROBE_PERIOD_S = 10
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC 1123, what a namespace name must be
HEADER = "# Rendered by kit {version}: edit kit.yaml and run `kit render --target k8s`, not this file.\n"


def product_label(gpu_model: str) -> str:
    """The value GPU feature discovery gives ``nvidia.com/gpu.product`` for a GPU nvidia-smi names ``gpu_model``."""
    return gpu_model.replace(" ", "-")


def _labels(config: StackConfig, service: Service) -> dict[str, str]:
    labels = {"app.kubernetes.io/name": service.name, "app.kubernetes.io/part-of": config.stack.name,
              "app.kubernetes.io/managed-by": "kit", "io.kit.role": service.role}
    if service.engine:
        labels["io.kit.engine"] = service.engine
    return labels


def _selector(config: StackConfig, service: Service) -> dict[str, str]:
    return {"app.kubernetes.io/name": service.name, "app.kubernetes.io/part-of": config.stack.name}


def _http_probe(path: str, port: int, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "timeoutSeconds": 5,
            "failureThreshold": failures}


def secret_name(config: StackConfig) -> str:
    return f"{config.stack.name}-api-key"


def _engine_container(stack: ResolvedStack, service: Service) -> dict[str, Any]:
    config = stack.config
    resolved = stack.engine(service.engine or "")
    engine = resolved.entry
    gpu = resolved.gpu
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in containerspec.engine_env(resolved, None).items()]
    if config.serve.api_key and engine.serve.api_key_env:
        env.append({"name": engine.serve.api_key_env,
                    "valueFrom": {"secretKeyRef": {"name": secret_name(config), "key": compose.API_KEY_VAR}}})
    # the start period as probe failures: the engine may load that long before the liveness probe counts
    startup_failures = math.ceil(resolved.start_period_s / PROBE_PERIOD_S)
    mounts = [{"name": "models", "mountPath": serving.MODEL_MOUNT, "readOnly": True}]
    if gpu:
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    container: dict[str, Any] = {
        "name": service.name,
        "image": service.image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(engine.entrypoint),
        "args": list(resolved.argv),
        "env": env,
        "ports": [{"name": "http", "containerPort": service.container_port}],
        "startupProbe": _http_probe(engine.health, service.container_port, PROBE_PERIOD_S, startup_failures),
        "readinessProbe": _http_probe(engine.health, service.container_port, PROBE_PERIOD_S, 3),
        "livenessProbe": _http_probe(engine.health, service.container_port, 15, 3),
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    if gpu:
        container["resources"] = {"limits": {GPU_RESOURCE: config.hardware.gpus}}
    return container


def _engine_pod(stack: ResolvedStack, service: Service) -> dict[str, Any]:
    config = stack.config
    container = _engine_container(stack, service)
    volumes: list[dict[str, Any]] = [
        {"name": "models", "hostPath": {"path": compose.host_model_dir(config), "type": "Directory"}}]
    pod: dict[str, Any] = {"containers": [container], "volumes": volumes}
    if stack.engine(service.engine or "").gpu:
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory"}})
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": PRODUCT_LABEL, "operator": "In",
                                   "values": [product_label(config.hardware.gpu_model)]}]}]}}}
    return pod


def _front_door_pod(config: StackConfig, service: Service) -> dict[str, Any]:
    health = "/kit/health"
    container = {
        "name": service.name, "image": service.image, "imagePullPolicy": "IfNotPresent",
        "command": ["/usr/sbin/nginx"], "args": ["-c", "/etc/kit/nginx.conf", "-g", "daemon off;"],
        "ports": [{"name": "http", "containerPort": service.container_port}],
        "readinessProbe": _http_probe(health, service.container_port, PROBE_PERIOD_S, 3),
        "livenessProbe": _http_probe(health, service.container_port, PROBE_PERIOD_S, 3),
        "volumeMounts": [{"name": "conf", "mountPath": "/etc/kit", "readOnly": True}],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    return {"containers": [container],
            "volumes": [{"name": "conf", "configMap": {"name": f"{config.stack.name}-front-door"}}]}


def deployment(stack: ResolvedStack, service: Service) -> dict[str, Any]:
    config = stack.config
    pod = _engine_pod(stack, service) if service.engine else _front_door_pod(config, service)
    gpu = service.engine is not None and stack.engine(service.engine).gpu
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": service.name, "labels": _labels(config, service)},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate" if gpu else "RollingUpdate"},
            "selector": {"matchLabels": _selector(config, service)},
            "template": {"metadata": {"labels": _labels(config, service)}, "spec": pod},
        },
    }


def service_object(config: StackConfig, service: Service, entry: bool) -> dict[str, Any]:
    """A ClusterIP Service at the compose host port's container port; the entry one a NodePort when exposed."""
    spec: dict[str, Any] = {
        "type": "NodePort" if entry and config.serve.expose else "ClusterIP",
        "selector": _selector(config, service),
        "ports": [{"name": "http", "port": service.container_port, "targetPort": "http"}],
    }
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": service.name, "labels": _labels(config, service)},
            "spec": spec}


def objects(stack: ResolvedStack) -> dict[str, list[dict[str, Any]]]:
    """The manifests by file name (without the namespace and the kustomization)."""
    config = stack.config
    if not DNS_LABEL.match(config.stack.name):
        raise KitError("stack.name", f"{config.stack.name!r} is not a Kubernetes namespace name",
                       "use lowercase letters, digits and '-' (at most 63), starting and ending with a letter or digit")
    all_services = stack.services
    entry = next((s for s in all_services if s.role == FRONT_DOOR), all_services[0])
    out: dict[str, list[dict[str, Any]]] = {}
    for service in all_services:
        docs = [deployment(stack, service), service_object(config, service, service is entry)]
        if service.role == FRONT_DOOR:
            docs.insert(0, {"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": f"{config.stack.name}-front-door", "labels": _labels(config, service)},
                            "data": {"nginx.conf": compose.nginx_conf(stack) or ""}})
        out[f"{service.name}.yaml"] = docs
    return out


def notes(stack: ResolvedStack) -> list[str]:
    """What a cluster must give these manifests that compose on one box does not need."""
    config = stack.config
    out: list[str] = []
    gpu_services = [s for s in stack.services if s.engine and stack.engine(s.engine).gpu]
    if len(gpu_services) > 1:
        names = " and ".join(s.name for s in gpu_services)
        out.append(f"k8s: {names} each ask for {config.hardware.gpus} {GPU_RESOURCE}: pods share no GPU unless the "
                   f"NVIDIA device plugin time-slices, so the node needs {len(gpu_services) * config.hardware.gpus} "
                   "GPUs (compose shares the same GPUs), or leave stack.fallback out")
    host = config.build.registry.split("/")[0]  # a registry host has a dot or a port; "kit" or "team" is a name
    if "." not in host and ":" not in host:
        out.append(f"k8s: the images are named {config.build.registry}/...; nodes pull them from a registry: set "
                   "build.registry to one they reach and run `kit build --push`, or load the images on every node")
    return out


def kustomization(config: StackConfig, names: list[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                            "namespace": config.stack.name, "resources": ["namespace.yaml", *names]}
    if config.serve.api_key:
        body["secretGenerator"] = [{"name": secret_name(config), "envs": [API_KEY_FILE]}]
    return body


def _yaml(docs: list[dict[str, Any]]) -> str:
    return HEADER.format(version=__version__) + yaml.safe_dump_all(
        docs, sort_keys=False, default_flow_style=False, width=1000, allow_unicode=True)


def problems(docs: list[dict[str, Any]], expose: bool, secret: str = "") -> list[str]:
    """Promises a set of manifests breaks: a Secret with data in it, ``secret`` (the API key) anywhere, a Service
    reachable from outside the cluster without ``serve.expose``, a hostPort or the host's network, a shell command."""
    found: list[str] = []
    for doc in docs:
        kind, name = doc.get("kind", "?"), (doc.get("metadata") or {}).get("name", "?")
        where = f"{kind}/{name}"
        if kind == "Secret" and (doc.get("data") or doc.get("stringData")):
            found.append(f"{where}: a Secret with its values in the manifest")
        if secret and secret in yaml.safe_dump(doc):
            found.append(f"{where}: holds the API key")
        spec = doc.get("spec") or {}
        if kind == "Service" and spec.get("type", "ClusterIP") != "ClusterIP" and not expose:
            found.append(f"{where}: type {spec['type']} is reachable from outside without serve.expose")
        pod = ((spec.get("template") or {}).get("spec")) or {}
        if pod.get("hostNetwork"):
            found.append(f"{where}: uses the host's network")
        for c in pod.get("containers", []):
            if any("hostPort" in p for p in c.get("ports", [])):
                found.append(f"{where}: container {c.get('name')} publishes a hostPort")
            command = c.get("command") or []
            if not command or command[0] in ("sh", "bash", "/bin/sh", "/bin/bash"):
                found.append(f"{where}: container {c.get('name')} has no exec-form command")
    return found


def files(stack: ResolvedStack, api_key: str) -> dict[str, str]:
    """``k8s/*``: the namespace, one file per service, the kustomization and the key's env file (mode 0600)."""
    config = stack.config
    by_file = objects(stack)
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": config.stack.name, "labels": {"app.kubernetes.io/managed-by": "kit"}}}
    docs = [namespace, *(d for file_docs in by_file.values() for d in file_docs)]
    broken = problems(docs, config.serve.expose, api_key)
    if broken:  # kit's own output: a bug, never the user's to fix
        raise KitError("k8s", "; ".join(broken), "report this: kit rendered manifests that break its own rules")
    out = {"k8s/namespace.yaml": _yaml([namespace])}
    out.update({f"k8s/{name}": _yaml(file_docs) for name, file_docs in by_file.items()})
    out["k8s/kustomization.yaml"] = _yaml([kustomization(config, list(by_file))])
    if config.serve.api_key:
        out[f"k8s/{API_KEY_FILE}"] = f"{compose.API_KEY_VAR}={api_key}\n"
    return out
