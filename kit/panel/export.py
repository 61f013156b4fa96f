"""Render 1Panel local apps, one per engine (``kit panel export``; ``appstore/`` in the repo is this output).

Layout per app: ``<key>/{data.yml, logo.png, README.md, README_en.md}`` and ``<key>/<version>/{data.yml,
docker-compose.yml}``. Rules followed (../shared/reference/1panel.md): key = folder name, tags from the official list,
``type: tool``, descriptions and labels in every language, no null values, no spaces in envKey, every ``${VAR}``
declared, ``container_name: ${CONTAINER_NAME}``, external ``1panel-network``, ``createdBy: "Apps"``, a 2-part port so
1Panel adds ``${HOST_IP}``, the GPU block written in the compose (local apps get no GPU checkbox), explicit
entrypoint.
"""

from __future__ import annotations

import shlex
from functools import lru_cache
from typing import Any

import yaml

from kit import catalog, containerspec, paths, resolve, serving, templating
from kit.config import StackConfig
from kit.errors import KitError
from kit.panel import logo
from kit.resolve import ResolvedEngine, ResolvedStack

# Port field: 1Panel checks every param whose key contains PANEL_APP_PORT against ports in use.
PORT = "PANEL_APP_PORT_HTTP"


@lru_cache(maxsize=1)
def panel_table() -> dict[str, Any]:
    return yaml.safe_load((paths.images_dir() / "1panel.yaml").read_text(encoding="utf-8"))


# where a language's text comes from when an engine's panel: does not give it (en and zh are required)
FALLBACK = {"zh-hant": "zh-Hant", "zh-Hant": "zh"}


def localized(texts: dict[str, str]) -> dict[str, str]:
    """Every language 1Panel reads: zh-hant mirrors zh-Hant, which falls back to zh; any other missing one to en."""
    out = {}
    for lang in panel_table()["languages"]:
        source = lang
        while source not in texts:
            source = FALLBACK.get(source, "en")
        out[lang] = texts[source]
    return out


def version_name(resolved: ResolvedEngine) -> str:
    """The image tag: never starts with 'v' (1Panel/Renovate convention)."""
    return resolved.image.tag.rsplit(":", 1)[1].lstrip("vV")


def gpu_field_keys(config: StackConfig) -> list[str]:
    """One form field per GPU of the stack: GPU_ID_1, GPU_ID_2, ..."""
    return [f"GPU_ID_{i + 1}" for i in range(len(config.hardware.device_ids))]


def _field(env_key: str, default: Any, type_: str, required: bool = True, label: str = "", n: int = 0,
           **extra: Any) -> dict[str, Any]:
    labels = {lang: text.replace("{n}", str(n)) for lang, text in localized(panel_table()["fields"][label or env_key]).items()}
    body: dict[str, Any] = {
        "default": default,
        "edit": True,
        "envKey": env_key,
        "labelEn": labels["en"],
        "labelZh": labels["zh"],
        "label": labels,
        "required": required,
        "type": type_,
    }
    body.update(extra)
    return body


def form_fields(config: StackConfig, resolved: ResolvedEngine) -> list[dict[str, Any]]:
    fields = [
        _field(PORT, config.serve.port, "number", rule="paramPort"),
        _field("MODEL_DIR", "/opt/models", "text"),
        _field("MODEL_FILE", resolved.model_file, "text"),
        _field("CONTEXT_LENGTH", resolved.ctx, "number"),
    ]
    if resolved.gpu:
        for i, (key, device) in enumerate(zip(gpu_field_keys(config), config.hardware.device_ids)):
            fields.append(_field(key, int(device) if device.isdigit() else device, "number" if device.isdigit()
                                 else "text", label="GPU_ID", n=i + 1))
    if resolved.entry.serve.api_key_env:
        fields.append(_field("API_KEY", "kitapikey", "password", random=True, rule="paramComplexity"))
    fields.append(_field("EXTRA_ARGS", "", "text", required=False))
    return fields


def command_string(resolved: ResolvedEngine) -> str:
    """The serve flags as one string with ``${VAR}`` for the form fields.

    1Panel form values are strings, so the app's command is one string that compose splits into argv without a
    shell (the entrypoint stays the engine binary). The model path is double-quoted, so a file name with spaces
    stays one argument; EXTRA_ARGS is last and may hold several flags.
    """
    model_path = f"{serving.MODEL_MOUNT}/{resolved.model_file}"
    argv = resolved.argv
    ctx_flags = {a.flag for a in resolved.entry.serve.args if a.value == "{ctx}"}
    words: list[str] = []
    for i, token in enumerate(argv):
        if token == model_path:
            words.append(f'"{serving.MODEL_MOUNT}/${{MODEL_FILE}}"')
        elif i > 0 and argv[i - 1] in ctx_flags and token == str(resolved.ctx):
            words.append("${CONTEXT_LENGTH}")
        else:
            words.append(shlex.quote(token).replace("$", "$$"))
    return " ".join(words + ["${EXTRA_ARGS}"])


def compose_for(config: StackConfig, resolved: ResolvedEngine, key: str) -> dict[str, Any]:
    engine = resolved.entry
    env = containerspec.engine_env(resolved, "${API_KEY}")
    service: dict[str, Any] = {
        "image": resolved.image.tag,
        "container_name": "${CONTAINER_NAME}",
        "restart": "unless-stopped",
        "networks": ["1panel-network"],
        "ports": [f"${{{PORT}}}:{engine.port}"],
        "volumes": [f"${{MODEL_DIR}}:{serving.MODEL_MOUNT}:ro"],
        "entrypoint": list(engine.entrypoint),
        "command": command_string(resolved),
        "environment": env,
        "ipc": "host",
    }
    if resolved.gpu:
        service["ulimits"] = dict(containerspec.GPU_ULIMITS)
        # one device_ids entry per GPU, each from its own form field: CDI (Docker >= 29.2) resolves
        # nvidia.com/gpu=0 and nvidia.com/gpu=1, never nvidia.com/gpu=0,1
        service["deploy"] = containerspec.gpu_block([f"${{{key}}}" for key in gpu_field_keys(config)])
    service["healthcheck"] = containerspec.healthcheck(resolved)
    service["logging"] = containerspec.logging_block()
    service["labels"] = {"createdBy": "Apps"}
    return {"services": {key: service}, "networks": {"1panel-network": {"external": True}}}


def app_data(engine: catalog.Engine) -> dict[str, Any]:
    info = panel_app(engine)
    base = panel_table()["app"]
    description = localized(info.description)
    return {
        "name": info.name,
        "tags": list(base["tags"]),
        "title": description["zh"],
        "description": description["zh"],
        "additionalProperties": {
            "key": info.key,
            "name": info.name,
            "tags": list(base["tags"]),
            "shortDescZh": description["zh"],
            "shortDescEn": description["en"],
            "description": description,
            "type": base["type"],
            "crossVersionUpdate": base["crossVersionUpdate"],
            "limit": base["limit"],
            "recommend": base["recommend"],
            "batchInstallSupport": base["batchInstallSupport"],
            "website": engine.homepage or "https://github.com/",
            "github": engine.source.git or engine.homepage or "https://github.com/",
            "document": info.document or engine.homepage or "https://github.com/",
            "gpuSupport": base["gpuSupport"],
            "memoryRequired": base["memoryRequired"],
            "architectures": list(base["architectures"]),
        },
    }


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False, width=1000)


def _mtp_args(resolved: ResolvedEngine) -> str:
    """The serve flags that switch MTP speculative decoding on, for a README to offer (empty if the engine has none)."""
    rule = resolved.entry.model_dependent.get("spec_type")
    if rule is None:
        return ""
    return f"--spec-type {rule.with_mtp} --spec-draft-n-max {resolved.settings.get('spec_draft_n_max', 3)}"


def app_files(stack: ResolvedStack, name: str) -> dict[str, str | bytes]:
    config, resolved = stack.config, stack.engine(name)
    engine = resolved.entry
    info = panel_app(engine)
    key = info.key
    version = version_name(resolved)
    readme_ctx = {
        "name": info.name,
        "description": localized(info.description),
        "image": resolved.image.tag,
        "archs": ", ".join(f"sm_{a}" for a in config.hardware.archs) if resolved.gpu else "CPU",
        "nccl": config.nccl.version if resolved.gpu else "",
        "entrypoint": " ".join(engine.entrypoint),
        "speculative": resolved.speculative,
        "mtp_args": _mtp_args(resolved),
        # only engines whose flag table takes serve.concurrency promise it
        "slots": config.serve.concurrency if any(a.value == "{slots}" for a in engine.serve.args) else 0,
        "model_file": resolved.model_file,
    }
    return {
        f"{key}/data.yml": _yaml(app_data(engine)),
        f"{key}/logo.png": logo.png(tuple(info.logo_rgb)),
        f"{key}/README.md": templating.render("1panel/README.md.j2", readme_ctx),
        f"{key}/README_en.md": templating.render("1panel/README_en.md.j2", readme_ctx),
        f"{key}/{version}/data.yml": _yaml({"additionalProperties": {"formFields": form_fields(config, resolved)}}),
        f"{key}/{version}/docker-compose.yml": _yaml(compose_for(config, resolved, key)),
    }


def export_files(stack: ResolvedStack, names: list[str]) -> dict[str, str | bytes]:
    """The apps of ``names`` (resolved in ``stack``), under the stack's settings."""
    files: dict[str, str | bytes] = {}
    for name in names:
        files.update(app_files(stack, name))
    return files


def runnable_apps(config: StackConfig) -> list[str]:
    """Engines with a 1Panel entry that can run on this stack: a GPU flavor needs GPUs (a cpu stack gets no vLLM)."""
    return [name for name, engine in catalog.all_engines().items() if engine.panel is not None
            and (config.hardware.gpus > 0 or not engine.flavors[resolve.flavor(config, name)].gpu)]


def panel_app(engine: catalog.Engine) -> catalog.PanelApp:
    if engine.panel is None:
        raise KitError(f"images/{engine.name}.yaml", "has no panel: section, so it has no 1Panel app",
                       "add panel: (key, name, description) to the engine's YAML")
    return engine.panel


def app_key(name: str) -> str:
    return panel_app(catalog.get(name)).key


__all__ = ["export_files", "app_files", "app_key", "version_name"]
