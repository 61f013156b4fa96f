"""How an engine is started: its argv from the catalog's flag table, its environment, its health timing.

Used by compose, the 1Panel apps and the Dockerfile healthcheck, so the three never disagree.
"""

from __future__ import annotations

from typing import Any

from kit import catalog
from kit.config import StackConfig
from kit.errors import KitError

MODEL_MOUNT = "/models"


def context(config: StackConfig, name: str) -> dict[str, Any]:
    """Values the flag templates may use: engine settings plus stack facts."""
    engine = catalog.get(name)
    settings = config.engine_settings(name)
    model_file = settings.get("model_file") or config.model.file
    ctx: dict[str, Any] = dict(settings)
    ctx.update(
        model_path=f"{MODEL_MOUNT}/{model_file}",
        model_name=config.model.name,
        ctx=config.model.ctx if config.model.ctx != "auto" else _auto_ctx(config, name),
        port=engine.port,
        gpus=config.hardware.gpus,
        gpu=engine.flavors[settings["flavor"]].gpu and config.hardware.gpus > 0,
        multi_gpu=engine.flavors[settings["flavor"]].gpu and config.hardware.gpus > 1,
    )
    return ctx


def _auto_ctx(config: StackConfig, name: str) -> int:
    from kit.plan import auto_ctx

    return auto_ctx(config, name)


def _format(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def command(config: StackConfig, name: str) -> list[str]:
    """The argv after the entrypoint, one list item per token (so paths with spaces survive)."""
    engine = catalog.get(name)
    ctx = context(config, name)
    formatted = {k: _format(v) for k, v in ctx.items()}
    argv: list[str] = []
    for arg in engine.serve.args:
        if arg.when and not ctx.get(arg.when):
            continue
        argv.append(arg.flag)
        if arg.value is not None:
            try:
                argv.append(arg.value.format(**formatted))
            except KeyError as exc:
                raise KitError(f"images/{name}.yaml", f"serve flag {arg.flag} uses unknown {exc}", "fix the catalog")
    argv.extend(str(a) for a in ctx.get("extra_args", []))
    return argv


def environment(config: StackConfig, name: str) -> dict[str, str]:
    engine = catalog.get(name)
    formatted = {k: _format(v) for k, v in context(config, name).items()}
    return {key: value.format(**formatted) for key, value in engine.serve.env.items()}


def start_period_s(config: StackConfig) -> int:
    """Time before failed health checks count: 60 s plus 10 s per GiB of weights (a 15 GB model from a SATA SSD)."""
    return int(60 + 10 * config.model.size_gib)


def flavor(config: StackConfig, name: str) -> str:
    value = config.engine_settings(name)["flavor"]
    engine = catalog.get(name)
    if value not in engine.flavors:
        raise KitError(f"engines.{name}.flavor", f"unknown flavor {value!r}", f"use one of {sorted(engine.flavors)}")
    return value
