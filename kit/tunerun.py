"""Where kit tune starts the engine for a trial, and how a trial is measured.

Two runners with one job each: put the engine on a stack config's serve settings and say where it answers.

- ``ComposeRunner``: the deployed compose stack. Each trial is ``kit deploy`` of the changed config (compose recreates
  only the engine whose command changed; no image is built), waited on until healthy, the engine's own port measured.
- ``ExecRunner``: the engine binary on this host (``--exec``), no Docker: the argv is the one compose would run, with
  the model path, address and port of this host. For a GPU box where only the engine binary is at hand.

A trial whose engine does not come up is a failed trial with the reason from kit's log signatures (OOM, no kernel
image, NCCL fallback...), never an error of the tune.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import requests

from kit import bench, benchstats, catalog, logscan, resolve, serving
from kit.config import StackConfig
from kit.errors import CheckFailed, KitError
from kit.tunesearch import FAILED, OK, OVER_LIMIT, PRUNED, Measurement


class TrialFailed(Exception):
    """The engine did not serve on these settings; the message says why."""


class Runner(Protocol):
    stays: bool  # the engine keeps running after the tune (the compose stack), or is stopped (a local process)

    def start(self, config: StackConfig) -> str: ...  # the URL the engine answers at; raises TrialFailed
    def argv(self) -> list[str]: ...  # the running engine process's argv
    def api_key(self) -> str | None: ...
    def log_text(self) -> str: ...  # the running engine's log since it started
    def close(self) -> None: ...


def process_argv(pid: int) -> list[str]:
    """A process's argv as the kernel holds it (what was really started, not what was asked for)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def reason_from_log(text: str, fallback: str) -> str:
    """The first known failure in an engine's log (kit's signatures), else its last line."""
    found = logscan.scan(text)
    if found:
        return f"{found[0].name}: {found[0].line}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{fallback}: {lines[-1][:200]}" if lines else fallback


class ExecRunner:
    stays = False

    def __init__(self, binary: Path, engine: str, port: int, log: Path, timeout_s: float) -> None:
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise KitError("--exec", f"{binary} is not an executable file", "point it at the engine binary, "
                           "e.g. build/bin/llama-server")
        self.binary, self.engine, self.port, self.log, self.timeout_s = binary.resolve(), engine, port, log, timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.started: list[str] = []

    def command(self, config: StackConfig) -> list[str]:
        model_dir = str(Path(config.model.dir).expanduser().resolve())
        resolved = resolve.engine(config, self.engine)
        return [str(self.binary), *serving.command(config, resolved, model_dir=model_dir, host="127.0.0.1",
                                                   port=self.port)]

    def start(self, config: StackConfig) -> str:
        url = f"http://127.0.0.1:{self.port}"
        argv = self.command(config)
        if self.proc is not None and self.proc.poll() is None and argv == self.started:
            return url
        self.stop()
        env = {**os.environ, **resolve.engine(config, self.engine).env}
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:
            try:
                with sigint_deferred():
                    self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                 start_new_session=True)
            except OSError as exc:  # not a program this host can run (another machine's binary, a bad #!)
                raise TrialFailed(f"{self.binary} does not start: {exc.strerror}") from None
        self.started = argv
        health = catalog.get(self.engine).health
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TrialFailed(reason_from_log(self.log_text(), f"exited with code {self.proc.returncode}"))
            try:
                if requests.get(url + health, timeout=2).status_code == 200:
                    return url
            except requests.RequestException:
                pass
            time.sleep(0.25)
        self.stop()
        raise TrialFailed(reason_from_log(self.log_text(), f"not healthy after {self.timeout_s:.0f} s"))

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.is_file() else ""

    def argv(self) -> list[str]:
        return process_argv(self.proc.pid) if self.proc is not None else []

    def api_key(self) -> str | None:
        return os.environ.get(catalog.get(self.engine).serve.api_key_env) or None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def close(self) -> None:
        self.stop()


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Ctrl-C held back until the block ends, then delivered to whatever handled it before: a SIGINT that lands inside
    Popen (after the fork, before Popen returns) would leave an engine running that no attribute holds, which nothing
    would ever stop. Delivered, not raised: where SIGINT was ignored (``nohup``, a background job of a script) it
    stays ignored."""
    caught: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    except ValueError:  # not the main thread, where Python delivers signals: nothing to hold back
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        signal.raise_signal(signal.SIGINT)


class ComposeRunner:
    stays = True

    def __init__(self, out: Path, engine: str, timeout_s: float | None, echo: Callable[[str], None]) -> None:
        self.out, self.engine, self.timeout_s, self.echo = out, engine, timeout_s, echo
        self.config: StackConfig | None = None

    def start(self, config: StackConfig) -> str:
        from kit import deploy
        from kit.services import services

        self.config = config
        timeout = self.timeout_s or max(120.0, 60 + 20 * resolve.model_size_gib(config))
        try:
            deploy.deploy(config, self.out, timeout, echo=lambda _l: None, fail_on_restart=True)
        except CheckFailed as exc:
            text = deploy.logs(self.out, tail=200)
            raise TrialFailed(reason_from_log(text, str(exc).splitlines()[0])) from None
        port = next(s.host_port for s in services(config) if s.engine == self.engine)
        return f"http://127.0.0.1:{port}"

    def log_text(self) -> str:
        from kit import deploy
        from kit.services import services

        assert self.config is not None
        name = next(s.name for s in services(self.config) if s.engine == self.engine)
        return deploy.logs(self.out, tail=5000, service=name)

    def container(self) -> Any:
        from kit import deploy
        from kit.services import services

        assert self.config is not None
        name = next(s.name for s in services(self.config) if s.engine == self.engine)
        return next(c for c in deploy.containers(self.config)
                    if c.labels.get("com.docker.compose.service") == name)

    def argv(self) -> list[str]:
        c = self.container()
        c.reload()
        found = process_argv(int(c.attrs["State"].get("Pid") or 0))
        return found or [c.attrs["Path"], *c.attrs["Args"]]

    def api_key(self) -> str | None:
        from kit import deploy

        return deploy.api_key(self.out)

    def close(self) -> None:
        """The stack stays up: a tune leaves it serving (on the best settings)."""


# ---------------------------------------------------------------------------- measuring one trial
def metric(result: benchstats.Result, path: str) -> float | None:
    """``decode_tps.median`` / ``output_tps`` / ``ttft.p90`` of a kit bench result."""
    node: Any = asdict(result)
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return float(node) if isinstance(node, (int, float)) else None


def measure(runner: Runner, config: StackConfig, objective: dict[str, Any], users: int, requests_n: int,
            warmup: int, prune_at: float | None, timeout_s: float = 300) -> Measurement:
    """Start the engine on ``config``, then kit bench's scenario at ``users`` at once: half the requests, then (unless
    clearly worse than ``prune_at``) the rest; the objective over all of them."""
    began = time.monotonic()
    try:
        url = runner.start(config)
    except TrialFailed as exc:
        return Measurement(FAILED, reason=str(exc), wall_s=time.monotonic() - began)
    argv = runner.argv()
    name, goal = objective["scenario"], objective["goal"]
    key, model = runner.api_key(), config.model.name
    half = max(users, requests_n // 2)
    first = bench.run(url, api_key=key, model=model, names=[name], concurrency=[users], requests_per=half,
                      warmup=warmup, timeout_s=timeout_s)
    if first.interrupted:  # kit bench turns Ctrl-C into a short run; a tune must not record it as a measurement
        raise KeyboardInterrupt
    samples, wall = list(first.samples), sum(r.wall_s for r in first.results)
    summary = benchstats.summarize(samples, wall)
    value = metric(summary, objective["metric"])
    worse = value is not None and prune_at is not None and (value < prune_at if goal == "max" else value > prune_at)
    if not worse and requests_n > half and not summary.failures:
        rest = bench.run(url, api_key=key, model=model, names=[name], concurrency=[users],
                         requests_per=requests_n - half, warmup=0, timeout_s=timeout_s)
        if rest.interrupted:
            raise KeyboardInterrupt
        samples += rest.samples
        wall += sum(r.wall_s for r in rest.results)
        summary = benchstats.summarize(samples, wall)
        value = metric(summary, objective["metric"])
    limits = objective.get("limits") or {}
    metrics = {k: v for k, v in {
        "decode_tps": summary.decode_tps.get("median"), "output_tps": summary.output_tps,
        "ttft_p90": summary.ttft.get("p90"), "requests": float(len(samples)),
        **{path: metric(summary, path) for path in limits},
    }.items() if v is not None}
    done = time.monotonic() - began
    # an engine that served but logged a known silent failure (NCCL fell back, custom all-reduce off...) is not a
    # setting to keep, however fast it looked
    found = logscan.scan(runner.log_text())
    if found:
        return Measurement(FAILED, value, f"{found[0].name}: {found[0].line}", metrics, argv, done)
    if summary.failures:
        return Measurement(FAILED, None, f"{summary.failures} of {summary.requests} requests failed: "
                           f"{'; '.join(summary.errors)[:200]}", metrics, argv, done)
    if value is None:
        return Measurement(FAILED, None, f"no {objective['metric']} measured", metrics, argv, done)
    if worse:
        return Measurement(PRUNED, value, f"stopped after {len(samples)} requests: already "
                           f"{'below' if goal == 'max' else 'above'} {prune_at:.4g}", metrics, argv, done)
    for path, limit in limits.items():
        seen = metrics.get(path)
        if seen is not None and seen > limit["at_most"]:
            return Measurement(OVER_LIMIT, value, f"{path} {seen:.3g} > {limit['at_most']:g}", metrics, argv, done)
    return Measurement(OK, value, "", metrics, argv, done)
