"""kit tune's search: coordinate descent over a space of serve settings, with pruning, repeats and a journal.

Pure: it knows nothing of engines or HTTP. It is given the starting point, the values of each setting, a
``rejected(point)`` that says why a point must not be started (rules, kit plan), and a ``measure(point, prune_at)``
that starts the engine on the point and returns a ``Measurement``. Why coordinate descent: serve settings interact
weakly (the seeds tuned them one at a time by hand), a pass costs the sum of the values, not their product, and every
trial differs from the best in one setting, so the report can say what each setting is worth.

Every measurement is appended to a journal (JSON lines) as it finishes; a search started again with the same journal
replays the recorded measurements in order instead of repeating them, so an interrupted tune resumes where it
stopped and reaches the same decisions.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

Point = dict[str, Any]

OK, REJECTED, FAILED, PRUNED, OVER_LIMIT = "ok", "rejected", "failed", "pruned", "over-limit"
INTERRUPTED = "interrupted"  # Ctrl-C came while this trial was in flight: nothing of it was kept


def point_key(point: Point) -> str:
    return json.dumps(point, sort_keys=True)


@dataclass
class Measurement:
    """One start of the engine on a point and what kit bench measured there."""

    status: str  # ok | failed (crashed, OOM, no kernel...) | pruned (clearly worse after half) | over-limit
    value: float | None = None  # the objective's metric
    reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)  # the engine process's argv, as the OS reported it
    wall_s: float = 0.0


@dataclass
class Trial:
    point: Point
    status: str = OK
    values: list[float] = field(default_factory=list)  # one per measurement (more when it was close to the best)
    reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    order: int = 0  # 1-based, in the order the search tried it

    @property
    def value(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def spread(self) -> tuple[float, float] | None:
        return (min(self.values), max(self.values)) if len(self.values) > 1 else None


class Journal:
    """Measurements as JSON lines, keyed by point; replayed in order on a resumed search."""

    def __init__(self, path: Path | None, header: dict[str, Any]) -> None:
        self.path = path
        self.recorded: dict[str, list[Measurement]] = {}
        self.replayed = 0
        if path is None:
            return
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
        if lines:
            first = json.loads(lines[0])
            if first.get("header") != header:
                raise ValueError(f"{path} was written by another tune ({first.get('header')})")
            for line in lines[1:]:
                entry = json.loads(line)
                self.recorded.setdefault(point_key(entry["point"]), []).append(Measurement(**entry["measurement"]))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"header": header}) + "\n", encoding="utf-8")

    def take(self, point: Point) -> Measurement | None:
        queue = self.recorded.get(point_key(point))
        if queue:
            self.replayed += 1
            return queue.pop(0)
        return None

    def add(self, point: Point, m: Measurement) -> None:
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"point": point, "measurement": asdict(m)}) + "\n")


@dataclass
class Settings:
    goal: str = "max"  # or min
    noise: float = 0.03
    repeats: int = 3
    prune: float = 0.25
    rounds: int = 2


@dataclass
class Result:
    trials: list[Trial]
    start: Trial
    best: Trial | None
    goal: str = "max"
    out_of_budget: bool = False

    @property
    def runner_up(self) -> Trial | None:
        return _best_of([t for t in self.trials if t is not self.best], self.goal)


def _score(value: float, goal: str) -> float:
    return value if goal == "max" else -value


def _best_of(trials: list[Trial], goal: str) -> Trial | None:
    ok = [t for t in trials if t.status == OK and t.value is not None]
    return max(ok, key=lambda t: _score(t.value, goal), default=None)


class Search:
    def __init__(self, space: dict[str, list[Any]], applies: Callable[[str, Point], bool],
                 rejected: Callable[[Point], str], measure: Callable[[Point, float | None], Measurement],
                 settings: Settings, journal: Journal, budget_left: Callable[[], bool] = lambda: True,
                 echo: Callable[[str], None] = lambda _l: None) -> None:
        self.space, self.applies, self.rejected, self._measure = space, applies, rejected, measure
        self.s, self.journal, self.budget_left, self.echo = settings, journal, budget_left, echo
        self.trials: dict[str, Trial] = {}
        self.best: Trial | None = None
        self.out_of_budget = False
        self.planned = 0

    # ---------------------------------------------------------------- one measurement
    def measure(self, trial: Trial, prune_at: float | None) -> Measurement:
        m = self.journal.take(trial.point)
        if m is None:
            m = self._measure(trial.point, prune_at)
            self.journal.add(trial.point, m)
        if m.status in (OK, PRUNED, OVER_LIMIT) and m.value is not None:
            trial.values.append(m.value)
        if m.status != OK:
            trial.status = m.status
        trial.reason = m.reason or trial.reason
        trial.metrics, trial.argv = m.metrics or trial.metrics, m.argv or trial.argv
        return m

    def better(self, a: Trial, b: Trial) -> bool:
        return _score(a.value, self.s.goal) > _score(b.value, self.s.goal)

    def close(self, a: Trial, b: Trial) -> bool:
        return abs(a.value - b.value) <= self.s.noise * abs(b.value)

    def prune_at(self) -> float | None:
        """The metric a trial must beat after half its requests to go on."""
        if self.best is None or self.best.value is None:
            return None
        factor = 1 - self.s.prune if self.s.goal == "max" else 1 + self.s.prune
        return self.best.value * factor

    # ---------------------------------------------------------------- one point
    def trial(self, point: Point) -> Trial | None:
        """Try ``point`` (once: a point seen before is not tried again); update the best."""
        k = point_key(point)
        if k in self.trials:
            return self.trials[k]
        if not self.budget_left():
            self.out_of_budget = True
            return None
        t = Trial(point=dict(point), order=len(self.trials) + 1)
        self.trials[k] = t
        why = self.rejected(point)
        if why:
            t.status, t.reason = REJECTED, why
            self.echo(f"trial {t.order} of ~{max(self.planned, t.order)}: {describe(point, self.best)} not started: {why}")
            return t
        self.measure(t, self.prune_at())
        if t.status == OK and self.best is not None and self.close(t, self.best):
            self.settle(t, self.best)
            if self.best.status != OK:  # the best failed when measured again: the best of the rest
                self.best = _best_of(list(self.trials.values()), self.s.goal)
        if t.status == OK and (self.best is None or self.better(t, self.best)):
            self.best = t
        value = "" if t.value is None else f" {t.value:.4g}"
        self.echo(f"trial {t.order} of ~{max(self.planned, t.order)}: {describe(point, None)} -> {t.status}{value}{': ' + t.reason if t.reason else ''}"
                  + (f"; best {self.best.value:.4g}" if self.best else ""))
        return t

    def settle(self, a: Trial, b: Trial) -> None:
        """Two trials within noise of each other: measure both again (up to ``repeats`` each) before either wins."""
        while (len(a.values) < self.s.repeats or len(b.values) < self.s.repeats) and self.budget_left():
            for t in (a, b):
                if len(t.values) < self.s.repeats and t.status == OK:
                    self.measure(t, None)
            if a.status != OK or b.status != OK or not self.close(a, b):
                break

    # ---------------------------------------------------------------- the whole space
    def run(self, start: Point) -> Result:
        # one pass over the space from the start: what "trial k of ~n" counts (a second pass adds to it)
        self.planned = 1 + sum(len([v for v in values if v != start[name]]) for name, values in self.space.items()
                               if self.applies(name, start))
        first = self.trial(start)
        assert first is not None
        for _ in range(self.s.rounds):
            before = self.best
            for name, values in self.space.items():
                base = dict(self.best.point if self.best else start)
                if not self.applies(name, base):
                    continue
                for value in values:
                    if value == base[name]:
                        continue
                    if self.trial({**base, name: value}) is None:
                        return self.result(first)
            if self.best is before:
                break
        return self.result(first)

    def partial(self, start: Point) -> Result | None:
        """What was measured before an interruption (None if the start itself was not)."""
        first = self.trials.get(point_key(start))
        if first is None or (first.status == OK and not first.values):
            return None
        for t in self.trials.values():
            if t.status == OK and not t.values:  # in flight: not measured, not in the journal
                t.status, t.reason = INTERRUPTED, "stopped before it was measured; a resumed tune tries it"
        return self.result(first)

    def result(self, first: Trial) -> Result:
        return Result(trials=sorted(self.trials.values(), key=lambda t: t.order), start=first, best=self.best,
                      goal=self.s.goal, out_of_budget=self.out_of_budget)


def describe(point: Point, against: Trial | None) -> str:
    """The settings that differ from ``against`` (all of them without one)."""
    base = against.point if against else {}
    changed = {k: v for k, v in point.items() if base.get(k) != v} if base else point
    return " ".join(f"{k}={v}" for k, v in changed.items()) or "(the best so far)"
