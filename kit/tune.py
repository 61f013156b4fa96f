"""``kit tune``: the fastest serve settings for this box, this model and this load, measured, and kept on request.

config + the engine's search space (``tune:`` in its YAML) + an objective (``images/tune.yaml``) -> a search
(kit/tunesearch.py) whose every trial starts the engine on one point (kit/tunerun.py) and measures it with kit
bench's own client and scenarios. The report names the best, the runner-up and why every other trial lost; ``--write``
puts the winner into kit.yaml (only serve settings change: a re-render changes the engine's command, no image).
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from kit import config as cfg, configedit, paths, resolve, roofline, serving, tunespace
from kit.errors import KitError
from kit.tunerun import Runner, measure
from kit.tunesearch import OK, Journal, Result, Search, Settings, Trial, describe

UNITS = {"s": 1, "m": 60, "h": 3600}


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return yaml.safe_load((paths.images_dir() / "tune.yaml").read_text(encoding="utf-8"))


def objective(name: str) -> dict[str, Any]:
    objectives = table()["objectives"]
    if name not in objectives:
        raise KitError("--objective", f"unknown objective {name!r}", f"use one of {', '.join(objectives)}")
    return objectives[name]


def budget_seconds(text: str) -> float:
    """``30m``, ``90s``, ``1h``, ``1h30m`` or plain seconds."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    parts = re.findall(r"(\d+(?:\.\d+)?)([smh])", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise KitError("--budget", f"{text!r} is not a duration", "write it like 30m, 90s or 1h30m")
    return sum(float(n) * UNITS[u] for n, u in parts)


@dataclass
class Tune:
    engine: str
    objective: str
    users: int
    result: Result
    roofline: roofline.Roofline | None
    journal: Path | None
    replayed: int
    interrupted: bool = False

    @property
    def spec(self) -> dict[str, Any]:
        return objective(self.objective)


def run(raw: dict[str, Any], runner: Runner, *, engine: str | None = None,
        objective_name: str = "decode", budget_s: float = 1800, space_path: Path | None = None,
        users: int | None = None, requests_n: int | None = None, journal_path: Path | None = None,
        fresh: bool = False, echo: Callable[[str], None] = lambda _l: None) -> Tune:
    """Search the space on ``runner``; leave the engine on the best settings found (or the start, if none beat it)."""
    start_config = cfg.from_dict(raw)
    name = engine or start_config.stack.primary
    if name not in start_config.engine_names():
        raise KitError("--engine", f"{name} is not in this stack", f"use one of {', '.join(start_config.engine_names())}")
    spec = objective(objective_name)
    space = tunespace.load(name, space_path)
    knobs = table()["search"]
    for flag, value in (("--users", users), ("--requests", requests_n)):
        if value is not None and value < 1:
            raise KitError(flag, f"must be at least 1 (got {value})", "leave it out for the objective's default")
    users = users or (start_config.serve.concurrency if spec["users"] == "stack" else int(spec["users"]))
    requests_n = max(requests_n or int(knobs["requests"]), users)
    start = tunespace.current(start_config, name, space)
    header = {"engine": name, "objective": objective_name, "users": users, "requests": requests_n,
              "space": {k: d.values for k, d in space.space.items()}, "start": start}
    if journal_path is not None and fresh and journal_path.exists():
        journal_path.unlink()
    try:
        journal = Journal(journal_path, header)
    except ValueError:  # another tune's (another start, objective or space): kept aside, this one starts over
        assert journal_path is not None
        kept = journal_path.with_name(journal_path.name + ".prev")
        journal_path.replace(kept)
        echo(f"{journal_path} was another tune's (other start, objective or space): kept as {kept.name}")
        journal = Journal(journal_path, header)
    configs: dict[str, cfg.StackConfig] = {}

    def config_at(point: dict[str, Any]) -> cfg.StackConfig:
        k = tunespace.key(point)
        if k not in configs:
            configs[k] = tunespace.config_at(raw, name, point)
        return configs[k]

    def rejected(point: dict[str, Any]) -> str:
        try:
            config = config_at(point)
        except KitError as exc:
            return f"rule: {exc}"
        return tunespace.rejected(config, name, space)

    def applies(setting: str, point: dict[str, Any]) -> bool:
        config = config_at(point)
        return tunespace.applies(space, setting, serving.flag_values(config, resolve.engine(config, name)))

    deadline = time.monotonic() + budget_s
    settings = Settings(goal=spec["goal"], noise=float(knobs["noise"]), repeats=int(knobs["repeats"]),
                        prune=float(knobs["prune"]), rounds=int(knobs["rounds"]))

    def progress(line: str) -> None:
        left = max(0.0, deadline - time.monotonic())
        echo(f"{line}  [{left / 60:.0f} min left]")

    search = Search(
        space={k: d.values for k, d in space.space.items()}, applies=applies, rejected=rejected,
        measure=lambda point, prune_at: measure(runner, config_at(point), spec, users, requests_n,
                                                int(knobs["warmup"]), prune_at),
        settings=settings, journal=journal, budget_left=lambda: time.monotonic() < deadline, echo=progress)
    echo(f"tuning {name} for {objective_name} ({spec['summary']}) at {users} user(s); start: {describe(start, None)}")
    interrupted = False
    try:
        result = search.run(start)
    except KeyboardInterrupt:  # Ctrl-C: what was measured stands (and is in the journal); the trial in flight is not
        interrupted = True
        partial = search.partial(start)
        if partial is None:
            raise
        result = partial
        echo("interrupted: showing what was measured; the same command resumes from the journal")
    finally:
        best = search.best.point if search.best is not None else start
        try:
            runner.start(config_at(best))  # never leave the engine on a losing or crashed trial
        except Exception as exc:  # noqa: BLE001 - reported, the tune's result still stands
            echo(f"warning: could not restart on the best settings: {exc}")
        runner.close()
    roof, _note = roofline.roofline_for(start_config)
    return Tune(name, objective_name, users, result, roof, journal_path, journal.replayed, interrupted)


# ---------------------------------------------------------------------------- report
def num(value: float) -> str:
    """Numbers as people read them in a speed table: 2011, 42.5, 0.183."""
    return f"{value:.0f}" if abs(value) >= 100 else (f"{value:.1f}" if abs(value) >= 1 else f"{value:.3g}")


def _value(t: Trial, unit: str) -> str:
    if t.value is None:
        return "-"
    spread = f" ({num(t.spread[0])}-{num(t.spread[1])}, n={len(t.values)})" if t.spread else ""
    return f"{num(t.value)} {unit}{spread}"


def why_lost(t: Trial, best: Trial | None, goal: str, unit: str) -> str:
    if t is best:
        return "best"
    if t.status != OK or t.value is None:
        return f"{t.status}: {t.reason}"
    if best is None or best.value is None:
        return "ok"
    gap = (best.value - t.value) / best.value if goal == "max" else (t.value - best.value) / best.value
    word = "below" if goal == "max" else "above"
    close = " (within noise, measured again)" if t.spread else ""
    return f"{100 * gap:.1f}% {word} the best{close}"


def rows(tune: Tune) -> list[list[str]]:
    """trial / settings changed from the start / objective / its limits / decode tok/s (% of roofline) / why it
    lost."""
    spec, res = tune.spec, tune.result
    out = []
    for t in res.trials:
        decode = t.metrics.get("decode_tps")
        roof = f" ({100 * decode / tune.roofline.tok_s:.0f}%)" if decode and tune.roofline and \
            tune.roofline.tok_s > 0 else ""
        limits = [f"{path} {num(t.metrics[path])} <= {limit['at_most']:g}"
                  for path, limit in (spec.get("limits") or {}).items() if path in t.metrics]
        out.append([str(t.order), describe(t.point, res.start) if t is not res.start else "(start)",
                    _value(t, spec["unit"]), ", ".join(limits) or "-", f"{decode:.1f}{roof}" if decode else "-",
                    why_lost(t, res.best, spec["goal"], spec["unit"])])
    return out


def summary(tune: Tune) -> list[str]:
    spec, res = tune.spec, tune.result
    lines = []
    if res.best is None:
        lines.append("no trial served within the limits: the engine is left on the starting settings")
    else:
        lines.append(f"best: {describe(res.best.point, None)} = {_value(res.best, spec['unit'])}")
        up = res.runner_up
        if up is not None:
            lines.append(f"runner-up: {describe(up.point, res.best)} = {_value(up, spec['unit'])}")
        if res.start.value is not None and res.best is not res.start:
            lines.append(f"start: {_value(res.start, spec['unit'])}")
    if tune.roofline is not None and tune.roofline.tok_s > 0:
        roof = tune.roofline
        best_decode = res.best.metrics.get("decode_tps") if res.best else None
        if best_decode:
            lines.append(f"decode {num(best_decode)} tok/s per request at {tune.users} user(s) = "
                         f"{100 * best_decode / roof.tok_s:.0f}% of the {num(roof.tok_s)} tok/s single-stream bandwidth "
                         f"limit ({roof.how}; {round(roof.bandwidth_gbs, 1):g} GB/s {roof.bandwidth_source})")
    if tune.interrupted:
        lines.append("interrupted: run the same command again to go on from the journal")
    if res.out_of_budget:
        lines.append("stopped at the time budget: run again with the same --journal to go on")
    if tune.replayed:
        lines.append(f"resumed: {tune.replayed} measurement(s) read from {tune.journal}")
    return lines


def changes(tune: Tune) -> dict[str, Any]:
    """The best point's settings that differ from the start: what --write puts into kit.yaml."""
    res = tune.result
    if res.best is None:
        return {}
    return {k: v for k, v in res.best.point.items() if res.start.point.get(k) != v}


def write(path: Path, tune: Tune) -> list[str]:
    """The winner into kit.yaml, each changed line with a comment recording the measurement."""
    spec, res = tune.spec, tune.result
    assert res.best is not None
    was = f" (was {num(res.start.value)})" if res.start.value is not None else ""
    note = (f"kit tune {dt.date.today().isoformat()}: {tune.objective} {num(res.best.value)} {spec['unit']}{was} "
            f"at {tune.users} user(s)")
    written = []
    for name, value in changes(tune).items():
        keys = name.split(".") if "." in name else ["engines", tune.engine, name]
        configedit.set_path(path, keys, value, note)
        written.append(f"{'.'.join(keys)}: {value}")
    return written


def plot(tune: Tune, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec, res = tune.spec, tune.result
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for t in res.trials:
        if t.value is None:
            ax.axvline(t.order, color="#dd4444", alpha=0.25)
            continue
        ax.plot([t.order] * len(t.values), t.values, "o", color="#2a6ebb" if t.status == OK else "#999999")
    if res.best is not None and res.best.value is not None:
        ax.axhline(res.best.value, color="#2a8a2a", linestyle="--", label=f"best: {describe(res.best.point, None)}")
        ax.legend(fontsize=7)
    ax.set_xlabel("trial (red line: failed or not started)")
    ax.set_ylabel(f"{spec['metric']} ({spec['unit']})")
    ax.set_title(f"kit tune {tune.engine}: {tune.objective}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
