"""Apply the compatibility table in ``images/rules.yaml`` to a stack config.

The table holds the facts (which versions drop Volta, which dtypes it lacks); this module holds a handful of generic
checks that the table names. A rule whose fields are not part of this stack (an engine not in use) is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import yaml

from kit import catalog, paths
from kit.config import StackConfig
from kit.errors import KitError
from kit.versions import at_least, is_version

Fields = dict[str, Any]
# A check returns None when the rule holds, or the values its message needs.
Check = Callable[[Fields, dict[str, Any]], dict[str, Any] | None]

_MISSING = object()
CHECKS: dict[str, Check] = {}


def check(fn: Check) -> Check:
    CHECKS[fn.__name__] = fn
    return fn


@lru_cache(maxsize=1)
def table() -> list[dict[str, Any]]:
    return yaml.safe_load((paths.images_dir() / "rules.yaml").read_text(encoding="utf-8"))["rules"]


def fields(config: StackConfig) -> Fields:
    """The config as flat dotted paths; engine settings only for the engines in the stack."""
    flat: Fields = {}
    dumped = config.model_dump(exclude={"engines"})
    for section, values in dumped.items():
        if isinstance(values, dict):
            for key, value in values.items():
                flat[f"{section}.{key}"] = value
    flat["engines.in_use"] = config.engine_names()
    for name in config.engine_names():
        for key, value in config.engine_settings(name).items():
            flat[f"engines.{name}.{key}"] = value
    return flat


def min_arch(f: Fields) -> int | None:
    archs = [a for a in f.get("hardware.archs", []) if isinstance(a, int)]
    return min(archs) if archs else None


def _version_text(value: Any) -> str:
    return str(value).strip().lstrip("v")


@check
def version_at_least_with_arch_below(f: Fields, p: dict[str, Any]) -> dict[str, Any] | None:
    value, arch = f.get(p["field"], _MISSING), min_arch(f)
    if value is _MISSING or arch is None or arch >= p["arch_below"] or not is_version(_version_text(value)):
        return None
    if not at_least(_version_text(value), p["min"]):
        return None
    return {"value": value, "arch": arch, "major": _version_text(value).split(".")[0]}


@check
def value_in_with_arch_below(f: Fields, p: dict[str, Any]) -> dict[str, Any] | None:
    """A value that drops the arch; with ``version_field`` only from ``version_min`` of that version on."""
    value, arch = f.get(p["field"], _MISSING), min_arch(f)
    if value is _MISSING or arch is None or arch >= p["arch_below"] or value not in p["values"]:
        return None
    version = _version_text(f.get(p["version_field"], "")) if "version_field" in p else ""
    if version and is_version(version) and not at_least(version, p["version_min"]):
        return None
    return {"value": value, "arch": arch, "version": version}


@check
def value_never(f: Fields, p: dict[str, Any]) -> dict[str, Any] | None:
    for value in f.get(p["field"], []):
        if isinstance(value, str) and value.strip().lower() in p["values"]:
            return {"value": value}
    return None


@check
def all_in(f: Fields, p: dict[str, Any]) -> dict[str, Any] | None:
    for value in f.get(p["field"], []):
        if value not in p["values"]:
            return {"value": value}
    return None


@check
def gpu_needs_archs(f: Fields, p: dict[str, Any]) -> dict[str, Any] | None:
    return {} if _gpu_engines(f) and not f.get("hardware.archs") else None


@check
def gpu_flavor_needs_gpus(f: Fields, p: dict[str, Any]) -> dict[str, Any] | None:
    gpu = _gpu_engines(f)
    return {"other": gpu[0]} if gpu and f.get("hardware.gpus") == 0 else None


def _gpu_engines(f: Fields) -> list[str]:
    engines = catalog.all_engines()
    out = []
    for name in f["engines.in_use"]:
        flavor = engines[name].flavors.get(f.get(f"engines.{name}.flavor", ""))
        if flavor is not None and flavor.gpu:
            out.append(name)
    return out


@check
def length_matches(f: Fields, p: dict[str, Any]) -> dict[str, Any] | None:
    value, other = f.get(p["field"], _MISSING), f.get(p["other"], _MISSING)
    if value is _MISSING or other is _MISSING or not isinstance(value, list):
        return None
    if other < p.get("from", 0):  # e.g. tensor ratios are read only with two GPUs or more
        return None
    if p.get("skip_when_empty") and not value and other <= 1:
        return None
    if len(value) == other or other <= 1 and p.get("skip_when_empty") and len(value) <= 1:
        return None
    return {"value": len(value), "other": other}


@check
def requires(f: Fields, p: dict[str, Any]) -> dict[str, Any] | None:
    if f.get(p["field"]) == p["value"] and f.get(p["other"]) != p["need"]:
        return {"value": p["value"], "other": f.get(p["other"])}
    return None


@check
def version_between(f: Fields, p: dict[str, Any]) -> dict[str, Any] | None:
    """A version outside [min, below) is refused; ``below`` may be left out (no upper end), and ``when_field`` /
    ``when`` limit the rule to configs where that field has that value."""
    if "when_field" in p and f.get(p["when_field"]) != p["when"]:
        return None
    value = _version_text(f.get(p["field"], ""))
    if not is_version(value) or (at_least(value, p["min"]) and not ("below" in p and at_least(value, p["below"]))):
        return None
    return {"value": value}


@check
def debian_packages_cuda(f: Fields, p: dict[str, Any]) -> dict[str, Any] | None:
    """cuda.source: debian needs a CUDA version some Debian release packages (images/cuda.yaml), and archs that
    toolkit can compile."""
    from kit import cudasource

    if f.get("cuda.source") != "debian":
        return None
    value = _version_text(f.get("cuda.version", ""))
    toolkit = cudasource.debian_toolkit(value) if is_version(value) else None
    if toolkit is None:
        problem, fix = cudasource.unknown_debian_version(value)
        return {"field": "cuda.version", "problem": problem, "fix": fix}
    if _gpu_engines(f):
        too_new = [a for a in f.get("hardware.archs") or [] if a > toolkit["max_arch"]]
        if too_new:
            return {"field": "hardware.archs",
                    "problem": f"Debian's CUDA {value} ({toolkit['suite']}) cannot compile sm_{too_new[0]}",
                    "fix": f"use a newer toolkit ({cudasource.debian_known()}) or cuda.source: image"}
    return None


@check
def no_url_credentials(f: Fields, p: dict[str, Any]) -> dict[str, Any] | None:
    for field in p["fields"]:
        value = str(f.get(field) or "")
        url = value if "://" in value else f"https://{value}"
        if value and urlsplit(url).password:
            return {"field": field}
    return None


def validate(config: StackConfig) -> None:
    """Raise the first broken rule as a KitError (one line: field, problem, fix)."""
    f = fields(config)
    for rule in table():
        found = CHECKS[rule["check"]](f, rule["params"])
        if found is not None:
            raise KitError(found.get("field", rule["field"]), rule["message"].format(**found),
                           rule["fix"].format(**found))


def load_valid(path: str | None) -> StackConfig:
    """Load and validate: the one entry point every command uses."""
    from kit.config import load

    config = load(path)
    validate(config)
    return config
