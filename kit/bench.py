"""``kit bench``: the seeds' speed table for any OpenAI-compatible endpoint, measured the same way every time.

Streaming chat completions from worker threads (requests); per request: TTFT, every inter-chunk gap (ITL), E2EL,
output tokens (from ``usage`` when the server sends it, else counted content chunks - the report says which),
TPOT = (E2EL - TTFT) / (tokens - 1), decode tok/s = (tokens - 1) / (E2EL - TTFT). Metric names follow vLLM's
``bench serve``. Timeouts, HTTP errors and disconnects are counted as failures, never raised.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import yaml

from kit import paths
from kit.benchclient import INTERRUPTED, Client, Sample
from kit.benchstats import Result, summarize
from kit.errors import KitError


@lru_cache(maxsize=1)
def scenarios() -> dict[str, Any]:
    return yaml.safe_load((paths.images_dir() / "bench.yaml").read_text(encoding="utf-8"))


@dataclass
class Run:
    url: str
    model: str
    results: list[Result] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    interrupted: bool = False


def prompts_for(name: str, count: int, seed: int, salt: str = "") -> list[str]:
    """``count`` prompts from the scenario's pool, each behind a prefix no other request of the run has, so no
    server answers a prompt from its prefix cache."""
    rng = random.Random(f"{seed}-{name}-{salt}")
    pool = scenarios()["scenarios"][name]["prompts"]
    return [f"[{name}-{salt or 'w'}-{i}] {rng.choice(pool)}" for i in range(count)]


def run(url: str, *, api_key: str | None = None, model: str | None = None, names: list[str] | None = None,
        concurrency: list[int] | None = None, requests_per: int | None = None, warmup: int = 1,
        timeout_s: float = 300, echo: Callable[[str], None] = lambda _l: None,
        stop: threading.Event | None = None) -> Run:
    """Every scenario at every concurrency level. Setting ``stop`` (the CLI does on Ctrl-C) ends the run early with
    what finished before it: requests in flight stop at their next chunk and are left out."""
    table = scenarios()
    names = names or list(table["scenarios"])
    unknown = [n for n in names if n not in table["scenarios"]]
    if unknown:
        raise KitError("--scenarios", f"unknown scenario {unknown[0]!r}", f"use {', '.join(table['scenarios'])}")
    client = Client(url, api_key, model, timeout_s, stop=stop)
    result = Run(url=client.base, model=client.probe())
    seed = int(table["seed"])
    first = client.one("preflight", 1, "Say OK.", 1, seed)
    if first.error.startswith("HTTP 401"):
        raise KitError("--api-key", f"{client.base} refused the key (401)", "pass the key from .env with --api-key")
    if first.error.startswith("HTTP 404"):
        raise KitError("--url", f"{client.base} has no /v1/chat/completions (404)", "point --url at the server root")
    for name in names:
        max_tokens = int(table["scenarios"][name]["max_tokens"])
        for _ in range(warmup):
            client.one(name, 1, prompts_for(name, 1, seed)[0], max_tokens, seed)
        for c in concurrency or [1, 4]:
            if client.stop.is_set():
                break
            count = requests_per or max(c, 4)
            prompts = prompts_for(name, count, seed, salt=str(c))
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=c) as pool:
                futures = [pool.submit(client.one, name, c, p, max_tokens, seed) for p in prompts]
                try:
                    wait(futures)
                except KeyboardInterrupt:  # a caller without the CLI's handler: stop as its Event would
                    client.stop.set()
            # after a stop, what was in flight ended at its next chunk and what was queued returned unsent: neither
            # is a sample
            wall = time.perf_counter() - start
            samples = [s for s in (f.result() for f in futures) if s.error != INTERRUPTED]
            if samples:
                result.samples += samples
                summary = summarize(samples, wall)
                result.results.append(summary)
                echo(f"{name:6s} x{c}: {summary.output_tps:7.1f} tok/s total, "
                     f"{summary.decode_tps.get('median', 0):6.1f} tok/s per request, {summary.failures} failed")
        if client.stop.is_set():
            result.interrupted = True
            break
    return result
