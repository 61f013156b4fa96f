"""``kit bench``: the seeds' speed table for any OpenAI-compatible endpoint, measured the same way every time.

Streaming chat completions from worker threads (requests); per request: TTFT, every inter-chunk gap (ITL), E2EL,
output tokens (from ``usage`` when the server sends it, else counted content chunks - the report says which),
TPOT = (E2EL - TTFT) / (tokens - 1), decode tok/s = (tokens - 1) / (E2EL - TTFT). Metric names follow vLLM's
``bench serve``. Timeouts, HTTP errors and disconnects are counted as failures, never raised.
"""

from __future__ import annotations

import http.client
import json
import random
import statistics
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

import requests
import urllib3
import yaml

from kit import paths
from kit.errors import KitError

INTERRUPTED = "interrupted"  # a request Ctrl-C stopped: not a sample


@lru_cache(maxsize=1)
def scenarios() -> dict[str, Any]:
    return yaml.safe_load((paths.images_dir() / "bench.yaml").read_text(encoding="utf-8"))


@dataclass
class Sample:
    scenario: str
    concurrency: int
    ok: bool
    error: str = ""
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    chunks: int = 0
    tokens_from: str = "chunks"  # usage | chunks
    prompt_tokens: int = 0  # from usage: what the server says it processed for the prompt
    server_timings: dict[str, Any] | None = None
    started: float = 0.0

    @property
    def tpot(self) -> float | None:
        return (self.e2el - self.ttft) / (self.output_tokens - 1) if self.ok and self.output_tokens > 1 else None

    @property
    def decode_tps(self) -> float | None:
        return (self.output_tokens - 1) / (self.e2el - self.ttft) if self.tpot else None


class Client:
    def __init__(self, url: str, api_key: str | None, model: str | None, timeout_s: float,
                 clock: Callable[[], float] = time.perf_counter, stop: threading.Event | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise KitError("--url", f"{url!r} is not an http(s) URL", "write it like http://127.0.0.1:8080")
        self.base = url.rstrip("/").removesuffix("/v1")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.timeout_s = timeout_s
        self.clock = clock
        self.local = threading.local()
        # set on Ctrl-C: no new request starts, and a streaming one stops at its next chunk (an Event, not a
        # KeyboardInterrupt: an exception raised at an arbitrary point can leave a future's lock held, and the
        # worker that completes it then blocks the exit forever)
        self.stop = stop or threading.Event()

    def session(self) -> requests.Session:
        if not hasattr(self.local, "session"):
            self.local.session = requests.Session()
        return self.local.session

    def probe(self) -> str:
        """Fail fast with one line when nothing answers; learn the model name if none was given."""
        try:
            reply = self.session().get(f"{self.base}/v1/models", headers=self.headers, timeout=10)
        except requests.RequestException as exc:
            raise KitError("--url", f"nothing answers at {self.base} ({exc.__class__.__name__})",
                           "start the server or fix the URL") from None
        if reply.status_code == 401:
            raise KitError("--api-key", f"{self.base} refused the key (401)", "pass the key from .env with --api-key")
        if not self.model:
            try:
                self.model = reply.json()["data"][0]["id"]
            except (ValueError, KeyError, IndexError, TypeError):
                self.model = "default"
        return self.model or "default"

    def one(self, scenario: str, concurrency: int, prompt: str, max_tokens: int, seed: int) -> Sample:
        sample = Sample(scenario, concurrency, ok=False)
        body = {
            "model": self.model or "default", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "seed": seed, "ignore_eos": True,
            # llama-server reuses a slot's KV for a repeated prefix; a benchmark must measure prefill, not the cache
            "cache_prompt": False,
        }
        if self.stop.is_set():
            sample.error = INTERRUPTED
            return sample
        sample.started = self.clock()
        try:
            with self.session().post(f"{self.base}/v1/chat/completions", json=body, headers=self.headers,
                                     stream=True, timeout=self.timeout_s) as reply:
                if reply.status_code != 200:
                    sample.error = f"HTTP {reply.status_code}: {reply.text[:120]}"
                    return sample
                consume(sample, _sse_lines(reply, self.stop), self.clock)
                if self.stop.is_set() and not sample.ok:
                    sample.error = INTERRUPTED
                return sample
        except (requests.Timeout, urllib3.exceptions.ReadTimeoutError, TimeoutError):
            sample.error = f"timeout after {self.timeout_s:.0f}s"
            return sample
        except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError, urllib3.exceptions.HTTPError,
                http.client.HTTPException, OSError) as exc:
            sample.error = f"disconnected: {exc.__class__.__name__}"
            return sample


def consume(sample: Sample, lines: Iterable[bytes], clock: Callable[[], float]) -> Sample:
    """Time one SSE stream into ``sample`` (whose ``started`` is the request's send time).

    Separate from the HTTP client so the statistics can be checked against a recorded stream and a fake clock:
    ``clock()`` is read once per event, when the event has arrived.
    """
    start, last, done = sample.started, None, False
    try:
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            event = json.loads(payload)
            if "error" in event:
                sample.error = f"server error: {str(event['error'])[:120]}"
                return sample
            now = clock()
            if event.get("usage"):
                sample.output_tokens = int(event["usage"].get("completion_tokens") or 0)
                sample.prompt_tokens = int(event["usage"].get("prompt_tokens") or 0)
                sample.tokens_from = "usage"
            if event.get("timings"):
                sample.server_timings = event["timings"]
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content"):
                    if last is None:
                        sample.ttft = now - start
                    else:
                        sample.itl.append(now - last)
                    last = now
                    sample.chunks += 1
    except ValueError as exc:
        sample.error = f"bad stream: {exc}"
        return sample
    if not done:
        sample.error = "disconnected: the stream ended before [DONE]"
        return sample
    sample.e2el = clock() - start
    if sample.tokens_from == "chunks":
        sample.output_tokens = sample.chunks
    sample.ok = sample.chunks > 0
    if not sample.ok:
        sample.error = "no tokens streamed"
    return sample


def _sse_lines(reply: requests.Response, stop: threading.Event | None = None):
    """Lines of an SSE stream as bytes arrive (read1: no waiting for a buffer to fill, chunked or not); ends early
    once ``stop`` is set."""
    raw = reply.raw
    buffer = b""
    while stop is None or not stop.is_set():
        data = raw.read1(65536) if hasattr(raw, "read1") else raw.read(1024)
        if not data:
            break
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r")
    if buffer:
        yield buffer


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pct(p: float) -> float:
        k = (len(ordered) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)

    return {"mean": statistics.fmean(ordered), "median": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
            "std": statistics.pstdev(ordered)}


@dataclass
class Result:
    scenario: str
    concurrency: int
    requests: int
    failures: int
    wall_s: float
    ttft: dict[str, float]
    tpot: dict[str, float]
    itl: dict[str, float]
    e2el: dict[str, float]
    decode_tps: dict[str, float]
    output_tps: float
    req_per_s: float
    tokens_from: str
    errors: list[str]
    server_decode_tps: float | None = None
    prompt_processed: float | None = None  # median prompt tokens the server processed (timings.prompt_n, else usage)


def summarize(samples: list[Sample], wall_s: float) -> Result:
    ok = [s for s in samples if s.ok]
    sources = {s.tokens_from for s in ok}
    server = [s.server_timings.get("predicted_per_second") for s in ok
              if s.server_timings and s.server_timings.get("predicted_per_second")]
    processed = [(s.server_timings or {}).get("prompt_n", s.prompt_tokens) for s in ok
                 if s.server_timings or s.prompt_tokens]
    return Result(
        scenario=samples[0].scenario, concurrency=samples[0].concurrency, requests=len(samples),
        failures=len(samples) - len(ok), wall_s=wall_s,
        ttft=percentiles([s.ttft for s in ok]), tpot=percentiles([s.tpot for s in ok if s.tpot is not None]),
        itl=percentiles([gap for s in ok for gap in s.itl]), e2el=percentiles([s.e2el for s in ok]),
        decode_tps=percentiles([s.decode_tps for s in ok if s.decode_tps]),
        output_tps=sum(s.output_tokens for s in ok) / wall_s if wall_s else 0.0,
        req_per_s=len(ok) / wall_s if wall_s else 0.0,
        tokens_from="usage" if sources == {"usage"} else ("chunks" if sources == {"chunks"} else "mixed"),
        errors=sorted({s.error for s in samples if not s.ok})[:5],
        server_decode_tps=statistics.fmean(server) if server else None,
        prompt_processed=statistics.median(processed) if processed else None,
    )


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
            pool = ThreadPoolExecutor(max_workers=c)
            futures = [pool.submit(client.one, name, c, p, max_tokens, seed) for p in prompts]
            pending = set(futures)
            try:
                while pending and not client.stop.is_set():
                    _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            except KeyboardInterrupt:  # a caller without the CLI's handler
                client.stop.set()
            # on a stop: drop what did not start; what is in flight ends at its next chunk
            pool.shutdown(wait=True, cancel_futures=True)
            wall = time.perf_counter() - start
            samples = [f.result() for f in futures if not f.cancelled() and f.result().error != INTERRUPTED]
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


def roofline(model_bytes: float, bandwidth_gbs: float, parallel_gpus: int = 1) -> float:
    """Decode tok/s if every token reads ``model_bytes`` once at full memory bandwidth (``parallel_gpus`` reading
    their shares at once)."""
    return bandwidth_gbs * 1e9 * parallel_gpus / model_bytes


@dataclass
class Roofline:
    """The single-stream decode limit of a stack: the bytes each token reads where they are, at that memory's
    bandwidth, with where each number came from."""

    tok_s: float
    read_bytes: float  # weights read per token (host-resident token embeddings: one row, left out)
    bandwidth_gbs: float
    bandwidth_source: str  # "datasheet (images/gpus.yaml)" or "measured: ..."
    how: str

    def line(self, best: float) -> str:
        return (f"{best:.1f} tok/s single-stream = {100 * best / self.tok_s:.0f}% of the {self.tok_s:.1f} tok/s "
                f"bandwidth limit ({self.how}; {round(self.bandwidth_gbs, 1):g} GB/s {self.bandwidth_source})")


def plan_roofline(gpu_weights: list[int], host_layer_bytes: int, split_mode: str, gpu_bandwidth_gbs: float,
                  host_bandwidth_gbs: float, host_source: str) -> Roofline:
    """From ``kit plan``'s split: with a layer split the GPUs take turns (a token reads every GPU's share one after
    the other); with row or tensor split they read their shares at once (the largest share sets the pace). A CPU
    stack reads its layers from host memory."""
    if not gpu_weights:
        return Roofline(host_bandwidth_gbs * 1e9 / host_layer_bytes, host_layer_bytes, host_bandwidth_gbs,
                        host_source, f"{host_layer_bytes / 1e9:.2f} GB of layers in host memory")
    total = float(sum(gpu_weights))
    if split_mode in ("row", "tensor") and len(gpu_weights) > 1:
        slowest = max(gpu_weights)
        return Roofline(gpu_bandwidth_gbs * 1e9 / slowest, total, gpu_bandwidth_gbs, "datasheet (images/gpus.yaml)",
                        f"{len(gpu_weights)} GPUs read {total / 1e9:.2f} GB at once, {slowest / 1e9:.2f} GB the largest")
    return Roofline(gpu_bandwidth_gbs * 1e9 / total, total, gpu_bandwidth_gbs, "datasheet (images/gpus.yaml)",
                    f"{total / 1e9:.2f} GB on {len(gpu_weights)} GPU(s), read in turn")


def host_bandwidth_gbs(size: int = 256 * 2**20, rounds: int = 3) -> float:
    """This machine's memory bandwidth from a copy test (one buffer copied into another: ``size`` read and written
    per round), the best of ``rounds``: the figure a CPU stack's decode is bound by."""
    src, dst = bytearray(size), bytearray(size)
    view = memoryview(dst)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        view[:] = src
        best = min(best, time.perf_counter() - start)
    return 2 * size / best / 1e9


def roofline_for(stack: Any, model_bytes: float | None = None, model_file: Path | None = None,
                 gpu: str | None = None, parallel_gpus: int = 1) -> tuple[Roofline | None, str]:
    """The decode limit to compare with, and a note when there is none: from the given weights size, else from
    kit plan's split of the stack's model when it is on this machine (GPU: datasheet bandwidth; cpu flavor: this
    host's, measured)."""
    from kit.plan import gpu_table

    gpus = gpu_table()["gpus"]
    name = gpu or (stack.hardware.gpu_model if stack is not None else "Tesla V100-SXM2-16GB")
    if (model_bytes or model_file) and name not in gpus:
        raise KitError("--gpu", f"unknown GPU {name!r}", f"use one of {', '.join(gpus)}")
    if model_file is not None:
        from kit import modelinfo

        model_bytes = float(modelinfo.read(model_file).weights_bytes)
    if model_bytes:
        bw = gpus[name]["bandwidth_gbs"]
        return Roofline(roofline(model_bytes, bw, parallel_gpus), model_bytes, bw, "datasheet (images/gpus.yaml)",
                        f"{model_bytes / 1e9:.2f} GB given, {parallel_gpus} GPU(s) at once"), ""
    if stack is None:
        return None, ""
    from kit import plan as planner, resolve

    primary = stack.stack.primary
    info = resolve.model_info(stack, primary)
    if info is None:
        return None, f"roofline: {resolve.host_model_path(stack, primary)} is not on this machine (pass --model-file)"
    resolved = resolve.engine(stack, primary)
    made = planner.make_plan(stack, info, primary, resolved.ctx)
    embeddings = sum(t.nbytes for t in info.tensors if t.name.startswith("token_embd"))
    split = str(resolved.settings.get("split_mode", "tensor"))
    host_bw = host_bandwidth_gbs() if not resolved.gpu else 0.0
    return plan_roofline([g.weights for g in made.gpus] if resolved.gpu else [], info.weights_bytes - embeddings,
                         split, gpus.get(stack.hardware.gpu_model, {}).get("bandwidth_gbs", 0.0), host_bw,
                         "measured (copy test on this host)"), ""


def to_json(runs: list[Run]) -> str:
    def sample_dict(s: Sample) -> dict[str, Any]:
        d = asdict(s)
        d.update(tpot=s.tpot, decode_tps=s.decode_tps)
        return d

    return json.dumps([{"url": r.url, "model": r.model, "interrupted": r.interrupted,
                        "results": [asdict(x) for x in r.results],
                        "samples": [sample_dict(s) for s in r.samples]} for r in runs], indent=2)


def table_rows(runs: list[Run]) -> list[list[str]]:
    """The seeds' layout: short / medium / long (single-stream decode tok/s), then 'N concurrent total'."""
    rows: list[list[str]] = []
    names = [n for n in scenarios()["scenarios"] if any(r.scenario == n for run in runs for r in run.results)]
    for name in names:
        row = [name]
        for run in runs:
            single = next((r for r in run.results if r.scenario == name and r.concurrency == 1), None)
            row.append(f"{single.decode_tps['median']:.1f} t/s" if single and single.decode_tps else "-")
        rows.append(row)
    levels = sorted({r.concurrency for run in runs for r in run.results if r.concurrency > 1})
    for c in levels:
        row = [f"{c} concurrent total"]
        for run in runs:
            hits = [r.output_tps for r in run.results if r.concurrency == c]
            row.append(f"{min(hits):.0f}-{max(hits):.0f} t/s" if len(hits) > 1 else
                       (f"{hits[0]:.0f} t/s" if hits else "-"))
        rows.append(row)
    return rows


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = sorted({(r.scenario, r.concurrency) for run in runs for r in run.results},
                    key=lambda k: (list(scenarios()["scenarios"]).index(k[0]), k[1]))
    width = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
        values = []
        for scenario, c in labels:
            hit = next((r for r in run.results if r.scenario == scenario and r.concurrency == c), None)
            values.append(hit.output_tps if hit else 0)
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=run.url)
    ax.set_xticks([x + width * (len(runs) - 1) / 2 for x in range(len(labels))])
    ax.set_xticklabels([f"{s}\nx{c}" for s, c in labels])
    ax.set_ylabel("output tok/s (total)")
    ax.set_title("kit bench")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
