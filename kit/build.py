"""``kit build``: assemble a build context, build with the Docker SDK, tag, report; push only when asked.

The context is a temp folder holding the rendered Dockerfile and its ``kit/`` files, the engine source (``src/``:
``--source DIR`` or a clone of the pinned ref) or the wheelhouse (``wheels/``) and the CA bundle if configured.
The Dockerfile never downloads engine source itself, so a build from a local tree works offline.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from kit import dockerfile, dockerhost, render, resolve
from kit.config import StackConfig
from kit.errors import CheckFailed, KitError

STAGE = re.compile(r"^FROM \S+ AS (\S+)\s*$", re.M)
CODE = ("COPY src/", "COPY wheels/")  # the steps that need the engine's source or wheels in the context


def stages(dockerfile_text: str) -> dict[str, str]:
    """Each ``FROM ... AS name`` stage's text, in file order (the order the legacy builder builds them in)."""
    starts = list(STAGE.finditer(dockerfile_text))
    return {m.group(1): dockerfile_text[m.start():starts[i + 1].start() if i + 1 < len(starts) else None]
            for i, m in enumerate(starts)}


def needs_code(dockerfile_text: str, target: str) -> bool:
    """The legacy builder builds every stage above ``target`` too: any of them copying the source needs it."""
    for name, body in stages(dockerfile_text).items():
        if any(step in body for step in CODE):
            return True
        if name == target:
            return False
    return False


def _skip_source(root: Path):
    """Leave VCS data, earlier build trees (top level only) and model files out of the context."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n in (".git", "__pycache__", "node_modules") or n.endswith(".gguf")}
        if Path(folder) == root:
            skipped |= {n for n in names if (n == "build" or n.startswith("build-")) and (root / n).is_dir()}
        return skipped

    return ignore


@dataclass
class BuildResult:
    engine: str
    tag: str
    target: str
    image_id: str
    duration_s: float
    size_bytes: int
    nccl_pin: str | None
    archs: list[int]
    jobs: int
    pushed: bool = False
    labels: dict[str, str] = field(default_factory=dict)


def assemble_context(config: StackConfig, name: str, dest: Path, source: Path | None,
                     target: str) -> dockerfile.Recipe:
    """Write everything the Docker build needs into ``dest``; the recipe that decided it, for the build's report."""
    made = dockerfile.recipe(config, name, bool(config.mirrors.ca_bundle))
    files = made.files()
    known = list(stages(str(files["Dockerfile"])))
    if target not in known:
        raise KitError("--target", f"unknown stage {target!r} for this engine and flavor",
                       f"use one of {', '.join(known)}")
    render.write_tree(dest, files)
    code = needs_code(str(files["Dockerfile"]), target)
    SOURCES[made.source](config, name, dest, source, code)
    _local_sources(made, dest, code)
    return made


def _local_sources(made: dockerfile.Recipe, dest: Path, code: bool) -> None:
    """``dest/deps/<name>``: the folders the stack gives for what the engine's build would fetch from GitHub."""
    wanted = made.local_sources()
    if not wanted:
        return
    (dest / "deps").mkdir()
    for item in wanted:
        folder = Path(item["host"]).expanduser()
        if not folder.is_dir():
            if not code:
                continue
            raise KitError(f"engines.{made.engine.name}.local_sources.{item['name']}", f"{folder} is not a folder",
                           f"put a checkout of {item['git']} at {item['ref']} there")
        shutil.copytree(folder, dest / "deps" / item["name"], ignore=shutil.ignore_patterns(".git"), symlinks=True)


def _wheelhouse(config: StackConfig, name: str, dest: Path, source: Path | None, code: bool) -> None:
    """``dest/wheels``: the engine's built wheels (``--source`` or ``engines.<name>.wheelhouse``)."""
    wheelhouse = Path(source or resolve.image(config, name).settings.get("wheelhouse", ""))
    if code and not wheelhouse.is_dir():
        raise KitError(f"engines.{name}.wheelhouse", f"{wheelhouse} is not a folder of wheels",
                       "put the engine's .whl files there or pass --source DIR")
    if wheelhouse.is_dir():
        shutil.copytree(wheelhouse, dest / "wheels")
    else:
        (dest / "wheels").mkdir()


def _source_tree(config: StackConfig, name: str, dest: Path, source: Path | None, code: bool) -> None:
    """``dest/src``: the engine's source tree (``--source``, else a clone of the pinned ref when a stage compiles)."""
    image = resolve.image(config, name)
    engine = image.entry
    if source is not None:
        if not source.is_dir():
            raise KitError("--source", f"{source} is not a folder", "point it at an engine source tree")
        shutil.copytree(source, dest / "src", ignore=_skip_source(source), symlinks=True)
    elif code:
        clone(engine.source.git, str(image.settings.get("ref") or engine.source.ref), dest / "src")
    else:
        (dest / "src").mkdir()


# what a recipe builds from (dockerfile.Recipe.source) -> how it gets into the build folder
SOURCES = {"tree": _source_tree, "wheelhouse": _wheelhouse}


def clone(url: str, ref: str, dest: Path) -> None:
    if not url:
        raise KitError("--source", "this engine has no git source", "pass --source DIR")
    steps = [["git", "clone", "--quiet", "--filter=blob:none", url, str(dest)],
             ["git", "-C", str(dest), "checkout", "--quiet", ref]]
    for cmd in steps:
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise KitError("--source", f"cannot fetch {url}@{ref}: {result.stderr.strip()[-200:]}",
                           "pass --source DIR with a local checkout")


class Progress:
    """Turns the daemon's JSON stream into step lines, elapsed time, and a tail kept for failures."""

    STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")
    HEARTBEAT_S = 30  # a long step (the compile) still says it is alive, with its latest output line

    def __init__(self, echo: Callable[[str], None], verbose: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.echo, self.verbose, self.clock = echo, verbose, clock
        self.step = ""
        self.tail: deque[str] = deque(maxlen=25)
        self.start = self.last_echo = clock()

    def say(self, line: str) -> None:
        self.last_echo = self.clock()
        self.echo(f"[{self.last_echo - self.start:6.0f}s] {line}")

    def feed(self, chunk: dict) -> None:
        if "error" in chunk:
            detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
            raise CheckFailed(self.failure(detail))
        text = chunk.get("stream", "")
        for line in text.splitlines():
            if not line.strip():
                continue
            match = self.STEP.match(line)
            if match:
                self.step = " ".join(line.split())[:150]
                self.say(self.step)
            else:
                self.tail.append(line.rstrip())
                if self.verbose:
                    self.echo(f"         {line.rstrip()[:200]}")
                elif self.clock() - self.last_echo >= self.HEARTBEAT_S:
                    self.say(f"  ... {self.step.split(' : ')[0]}: {line.strip()[:120]}")

    def tick_until(self, done: threading.Event) -> None:
        """While one step prints nothing (nvcc on one file can take minutes), say so every HEARTBEAT_S."""
        while not done.wait(5):
            if self.step and self.clock() - self.last_echo >= self.HEARTBEAT_S:
                self.say(f"  ... {self.step.split(' : ')[0]}: still running")

    def failure(self, detail: str) -> str:
        lines = "\n".join(f"    {l}" for l in self.tail)
        return f"build failed at {self.step or 'the start'}\n  {detail.strip()}\n  last output:\n{lines}"


def build_engine(config: StackConfig, name: str, *, source: Path | None = None, target: str = "runtime",
                 no_cache: bool = False, push: bool = False, tag: str | None = None,
                 echo: Callable[[str], None] = print, verbose: bool = False) -> BuildResult:
    base_tag = tag or resolve.image(config, name).tag
    full_tag = base_tag if target == "runtime" or tag else f"{base_tag}-{target}"
    jobs = config.build_jobs()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kit-build-") as tmp:
        ctx = Path(tmp) / "context"
        made = assemble_context(config, name, ctx, source, target)
        echo(f"building {full_tag} (target {target}, {jobs} compile jobs)")
        run_build(ctx, full_tag, target=target, no_cache=no_cache, jobs=jobs, echo=echo, verbose=verbose)
    image = dockerhost.client().images.get(full_tag)
    result = BuildResult(
        engine=name, tag=full_tag, target=target, image_id=image.id, duration_s=round(time.monotonic() - started, 1),
        size_bytes=int(image.attrs.get("Size", 0)), nccl_pin=made.nccl["version"] if made.nccl else None,
        archs=made.archs, jobs=jobs, labels=dict(image.labels or {}),
    )
    if push or config.build.push:
        push_image(full_tag, echo)
        result.pushed = True
    else:
        echo(f"built {full_tag}; not pushed (pass --push to push)")
    return result


def run_build(ctx: Path, tag: str, *, target: str | None = None, no_cache: bool = False, jobs: int = 1,
              echo: Callable[[str], None] = print, verbose: bool = False) -> None:
    """Build ``ctx`` with the legacy builder through the SDK; a failed step raises CheckFailed with its last lines."""
    progress = Progress(echo, verbose)
    stream = dockerhost.client().api.build(path=str(ctx), tag=tag, target=target, nocache=no_cache, rm=True,
                                           forcerm=True, decode=True, buildargs={"BUILD_JOBS": str(jobs)})
    done = threading.Event()
    ticker = threading.Thread(target=progress.tick_until, args=(done,), daemon=True)
    ticker.start()
    try:
        for chunk in stream:
            progress.feed(chunk)
    finally:
        done.set()


def push_image(tag: str, echo: Callable[[str], None]) -> None:
    repository, _, version = tag.rpartition(":")
    for chunk in dockerhost.client().api.push(repository, tag=version, stream=True, decode=True):
        if "error" in chunk:
            raise CheckFailed(f"push of {tag} failed: {chunk['error']} (log in with `docker login`, or build without --push)")
    echo(f"pushed {tag}")


def build_front_door(config: StackConfig, *, no_cache: bool = False, echo: Callable[[str], None] = print) -> BuildResult:
    """The nginx front door (only when the stack has one)."""
    from kit import compose
    from kit.services import front_door_image

    started = time.monotonic()
    tag = front_door_image(config)
    with tempfile.TemporaryDirectory(prefix="kit-build-") as tmp:
        ctx = Path(tmp) / "context"
        render.write_tree(ctx, compose.front_door_image_files(config))
        echo(f"building {tag}")
        run_build(ctx, tag, no_cache=no_cache, echo=echo)
    image = dockerhost.client().images.get(tag)
    return BuildResult("front-door", tag, "runtime", image.id, round(time.monotonic() - started, 1),
                       int(image.attrs.get("Size", 0)), None, [], 1)


def write_report(results: list[BuildResult], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n", encoding="utf-8")
