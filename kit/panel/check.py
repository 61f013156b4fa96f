"""The 1Panel app validator's rules, applied to a folder of apps.

Rules from the official ``validate_app_package.py`` and from the local-app loader in 1Panel's code
(../shared/reference/1panel.md §1.2, §2, §3). Problems are errors; things the official apps themselves do are
warnings. It must accept the real apps in the reference folder (tests check that).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REQUIRED_LANGS = ["en", "es-es", "ja", "ms", "pt-br", "ru", "ko", "zh", "tr"]  # + zh-Hant or zh-hant
APP_KEYS = ["key", "name", "tags", "description", "type", "limit"]
PANEL_VARS = {"CONTAINER_NAME", "HOST_IP", "HOST_ADDRESS"}
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:?[-?][^}]*)?\}")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Problem:
    level: str  # error | warning
    where: str
    what: str


# Rules that only the official validator script enforces; 1Panel itself loads apps that break them, and the official
# store ships such apps. With strict=False (reading other people's apps) they are warnings; kit's apps are strict.
VALIDATOR_ONLY = (
    "additionalProperties has no", "differs from the folder name", "lacks languages", "not official tag keys",
    "README", "starts with 'v'", "has no additionalProperties.formFields", "needs rule: paramPort",
    "lacks the external 1panel-network", "createdBy", "container_name", "undeclared variables", "scripts/ is empty",
    "is null",  # the loader rejects nulls in local apps; remote apps (all official ones) get away with them
)
RUNTIME_TYPES = {"runtime", "php", "node", "go", "java", "dotnet", "python"}  # compose fetched at sync time


def _load(path: Path) -> Any:
    # Go's yaml.v3 (1Panel) takes tabs as trailing whitespace; PyYAML does not
    text = re.sub(r"[ \t]+$", "", path.read_text(encoding="utf-8"), flags=re.M)
    return yaml.safe_load(text)


def _has_langs(block: Any) -> list[str]:
    if not isinstance(block, dict):
        return REQUIRED_LANGS + ["zh-Hant"]
    missing = [lang for lang in REQUIRED_LANGS if lang not in block]
    if "zh-Hant" not in block and "zh-hant" not in block:
        missing.append("zh-Hant")
    return missing


def _nulls(node: Any, path: str = "") -> list[str]:
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if value is None:
                found.append(f"{path}{key}")
            found += _nulls(value, f"{path}{key}.")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _nulls(value, f"{path}{i}.")
    return found


def check_app(folder: Path, official_tags: set[str], require_logo: bool = True, strict: bool = True) -> list[Problem]:
    problems = _check_app(folder, official_tags, require_logo)
    if strict:
        return problems
    return [Problem("warning", p.where, p.what) if any(k in p.what for k in VALIDATOR_ONLY) else p for p in problems]


def _check_app(folder: Path, official_tags: set[str], require_logo: bool) -> list[Problem]:
    problems: list[Problem] = []
    where = folder.name

    def error(what: str, at: str = where) -> None:
        problems.append(Problem("error", at, what))

    def warn(what: str, at: str = where) -> None:
        problems.append(Problem("warning", at, what))

    data_file = folder / "data.yml"
    if not data_file.is_file():
        return [Problem("error", where, "no data.yml")]
    try:
        data = _load(data_file)
    except yaml.YAMLError as exc:
        return [Problem("error", where, f"data.yml does not parse: {exc}")]
    props = (data or {}).get("additionalProperties") or {}
    for key in APP_KEYS:
        if key not in props:
            error(f"data.yml additionalProperties has no {key}")
    if props.get("key") != folder.name:
        error(f"key {props.get('key')!r} differs from the folder name {folder.name!r}")
    missing = _has_langs(props.get("description"))
    if missing:
        error(f"description lacks languages {missing}")
    unknown_tags = [t for t in props.get("tags") or [] if t not in official_tags]
    if unknown_tags:
        error(f"tags {unknown_tags} are not official tag keys (1Panel drops them silently)")
    logo = folder / "logo.png"
    if require_logo:
        if not logo.is_file():
            error("no logo.png (the local-app loader skips the app)")
        elif logo.read_bytes()[:8] != PNG_MAGIC:
            error("logo.png is not a PNG")
    readme = folder / "README.md"
    if not readme.is_file():
        error("no README.md")
    elif "## 产品介绍" not in readme.read_text(encoding="utf-8"):
        warn("README.md has no '## 产品介绍' section")
    readme_en = folder / "README_en.md"
    if not readme_en.is_file():
        warn("no README_en.md")
    elif "## Introduction" not in readme_en.read_text(encoding="utf-8"):
        warn("README_en.md has no '## Introduction' section")

    versions = [d for d in sorted(folder.iterdir()) if d.is_dir() and (d / "docker-compose.yml").is_file()]
    if not versions:
        error("no version folder with a docker-compose.yml")
    runtime = props.get("type") in RUNTIME_TYPES
    for version in versions:
        problems += check_version(version, f"{where}/{version.name}", runtime)
    return problems


def check_version(version: Path, where: str, runtime: bool = False) -> list[Problem]:
    problems: list[Problem] = []

    def error(what: str) -> None:
        problems.append(Problem("error", where, what))

    def warn(what: str) -> None:
        problems.append(Problem("warning", where, what))

    if version.name.lower().startswith("v"):
        error("version folder name starts with 'v'")
    data_file = version / "data.yml"
    if not data_file.is_file():
        error("no data.yml")
        return problems
    try:
        data = _load(data_file) or {}
    except yaml.YAMLError as exc:
        error(f"data.yml does not parse: {exc}")
        return problems
    fields = (data.get("additionalProperties") or {}).get("formFields")
    if fields is None:
        if not runtime:
            error("data.yml has no additionalProperties.formFields")
        fields = []
    declared: set[str] = set()
    has_db_service = False
    for i, field in enumerate(fields):
        at = f"formFields[{i}]"
        for null in _nulls(field):
            error(f"{at}.{null} is null (1Panel rejects the version: ErrAppParamKey)")
        env_key = str(field.get("envKey", ""))
        if " " in env_key:
            error(f"{at}.envKey {env_key!r} contains a space")
        declared.add(env_key)
        child = field.get("child") if isinstance(field.get("child"), dict) else {}
        if field.get("type") == "service" or child.get("type") == "service":
            has_db_service = True
        if "label" in field and _has_langs(field["label"]):
            warn(f"{at}.label lacks languages {_has_langs(field['label'])}")
        if env_key.startswith("PANEL_APP_PORT") and (field.get("rule") != "paramPort" or field.get("type") != "number"):
            error(f"{at} ({env_key}) needs rule: paramPort and type: number")
        if child.get("envKey"):
            declared.add(str(child["envKey"]))
    compose_text = (version / "docker-compose.yml").read_text(encoding="utf-8")
    try:
        compose = yaml.safe_load(compose_text) or {}
    except yaml.YAMLError as exc:
        error(f"docker-compose.yml does not parse: {exc}")
        return problems
    services = compose.get("services") or {}
    if not services:
        error("docker-compose.yml has no services")
    host_network = services and all(isinstance(s, dict) and s.get("network_mode") == "host" for s in services.values())
    networks = compose.get("networks") or {}
    if not host_network and not (networks.get("1panel-network") or {}).get("external"):
        error("docker-compose.yml lacks the external 1panel-network")
    if "createdBy" not in compose_text:
        error("no service has labels createdBy")
    if "${CONTAINER_NAME}" not in compose_text:
        error("no container_name: ${CONTAINER_NAME}")
    allowed = PANEL_VARS | ({"PANEL_DB_PORT"} if has_db_service else set())
    # a variable with a default (${X:-y}) is safe; runtimes get theirs at sync time
    undeclared = sorted({v for v, default in VAR.findall(compose_text) if not default and v not in declared | allowed})
    if undeclared and not runtime:
        error(f"compose uses undeclared variables {undeclared}")
    for name, service in services.items():
        image = str(service.get("image", "")) if isinstance(service, dict) else ""
        if image and (image.endswith(":latest") or ":" not in image.rsplit("/", 1)[-1]) and "${" not in image:
            warn(f"service {name} uses an untagged or :latest image")
        if isinstance(service, dict) and service.get("privileged"):
            warn(f"service {name} is privileged")
    scripts = version / "scripts"
    if scripts.is_dir() and not any(scripts.iterdir()):
        error("scripts/ is empty")
    return problems


def official_tags(store_data: Path | None = None) -> set[str]:
    from kit.panel.export import panel_table

    if store_data and store_data.is_file():
        data = _load(store_data)
        return {t["key"] for t in data["additionalProperties"]["tags"]}
    return set(panel_table()["official_tags"])


def check_store(root: Path, require_logo: bool = True, store_data: Path | None = None,
                strict: bool = True) -> list[Problem]:
    """Every app of a store folder, or ``root`` itself when it is one app (it has the app's ``data.yml``)."""
    if not root.is_dir():
        from kit.errors import KitError

        raise KitError("FOLDER", f"{root} is not a folder", "pass a folder of apps (appstore/) or one app's folder")
    tags = official_tags(store_data)
    if (root / "data.yml").is_file():
        return check_app(root, tags, require_logo, strict)
    problems: list[Problem] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        problems += check_app(folder, tags, require_logo, strict)
    return problems
