"""kit tune's search space: which serve settings, which values, and which combinations deserve a trial.

The space is data (``tune:`` in the engine's YAML, or a ``--space`` file of the same shape). A point is a dict of
setting -> value whose keys are engine settings (``ubatch``) or stack fields (``serve.concurrency``). A point is
turned into a whole stack config by the same loader every command uses, so the rules, ``kit plan`` and the serve
argv all judge the point exactly as ``kit deploy`` would; a point they reject is never started.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kit import catalog, config as cfg
from kit.catalog import TuneSpace
from kit.errors import KitError
from kit.fuzzy import did_you_mean

Point = dict[str, Any]


def load(engine: str, path: Path | None = None) -> TuneSpace:
    """The engine's own space, or the one in ``path`` (``--space``), each key checked against the engine."""
    if path is None:
        space = catalog.get(engine).tune
        field = f"images/{engine}.yaml:tune"
    else:
        field = "--space"
        if not path.is_file():
            raise KitError("--space", f"{path} does not exist", "write a tune.yaml with space: {setting: [values]}")
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
            space = TuneSpace.model_validate(raw.get("tune", raw) if isinstance(raw, dict) else raw)
        except yaml.YAMLError:
            raise KitError("--space", f"{path} is not valid YAML", "fix the indentation or quoting") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"]) or "(top)"
            raise KitError(f"--space: {loc}", first["msg"], "write space: {ubatch: [256, 512]} as in "
                           f"images/{engine}.yaml's tune:") from None
    if not space.space:
        raise KitError(field, f"no settings to tune for {engine}", "name at least one under space:")
    settings = catalog.get(engine).settings
    for key in [*space.space, *(c.setting for c in space.constraints), *(c.at_most for c in space.constraints)]:
        _check_key(key, settings, field)
    return space


def _check_key(key: str, settings: dict[str, Any], field: str) -> None:
    if "." in key:
        section, _, name = key.partition(".")
        model = cfg.StackConfig.model_fields.get(section)
        inner = getattr(model.annotation, "model_fields", {}) if model is not None else {}
        if name not in inner:
            raise KitError(f"{field}: {key}", "is not a field of kit.yaml", "use an engine setting or serve.concurrency")
    elif key not in settings:
        raise KitError(f"{field}: {key}", "is not a setting of this engine", did_you_mean(key, settings))


def key(point: Point) -> str:
    """A point's identity (the journal and the search compare points by it)."""
    return json.dumps(point, sort_keys=True)


def overrides(engine: str, point: Point) -> dict[str, Any]:
    """The point as a partial kit.yaml."""
    out: dict[str, Any] = {}
    for name, value in point.items():
        if "." in name:
            section, _, field = name.partition(".")
            out.setdefault(section, {})[field] = value
        else:
            out.setdefault("engines", {}).setdefault(engine, {})[name] = value
    return out


def config_at(raw: dict[str, Any], engine: str, point: Point) -> cfg.StackConfig:
    """The whole stack config with ``point`` applied: loaded and checked like any kit.yaml."""
    return cfg.from_dict(cfg.deep_merge(raw, overrides(engine, point)))


def current(config: cfg.StackConfig, engine: str, space: TuneSpace) -> Point:
    """The values the config has now, for every setting of the space: where the search starts."""
    settings = config.engine_settings(engine)
    point: Point = {}
    for name in space.space:
        if "." in name:
            section, _, field = name.partition(".")
            point[name] = getattr(getattr(config, section), field)
        else:
            point[name] = settings[name]
    return point


def value_of(config: cfg.StackConfig, engine: str, name: str) -> Any:
    if "." in name:
        section, _, field = name.partition(".")
        return getattr(getattr(config, section), field)
    return config.engine_settings(engine)[name]


def applies(space: TuneSpace, name: str, serve_context: dict[str, Any]) -> bool:
    """Whether the setting means anything on this stack (spec_draft_n_max without speculation does not)."""
    when = space.space[name].when
    return not when or bool(serve_context.get(when))


def rejected(config: cfg.StackConfig, engine: str, space: TuneSpace) -> str:
    """Why a point must not be started ('' when it may): the space's constraints, the rules, then kit plan's fit."""
    from kit import plan, resolve, rules

    for c in space.constraints:
        value, cap = value_of(config, engine, c.setting), value_of(config, engine, c.at_most)
        if isinstance(value, (int, float)) and isinstance(cap, (int, float)) and value > cap:
            return f"{c.setting} {value} > {c.at_most} {cap} (the engine caps it there: the same as {cap})"
    try:
        rules.validate(config)
        resolved = resolve.engine(config, engine)
        info = resolve.model_info(config, engine)
    except KitError as exc:
        return f"rule: {exc}"
    if info is not None:
        made = plan.make_plan(config, info, engine, resolved.ctx)
        if not made.fits:
            return f"does not fit (kit plan): {made.fix}"
    names = config.engine_names()
    if len(names) > 1 and resolved.gpu:  # a fallback on the same GPUs: the two must fit together (kit plan --stack)
        models = {name: resolve.model_info(config, name) for name in names}
        if all(m is not None for m in models.values()):
            together = plan.plan_stack(config, models)  # type: ignore[arg-type]
            if not together.fits:
                return f"the stack does not fit together (kit plan --stack): {together.fix(config)}"
    return ""
