"""kit bench's HTTP client: one streaming chat completion timed into a ``Sample`` (TTFT, every inter-chunk gap, E2EL,
output tokens from ``usage`` or counted chunks). The SSE reading (``consume``) is apart from the HTTP, so the
statistics can be checked against a recorded stream and a fake clock. Timeouts, HTTP errors and disconnects are a
sample's ``error``, never raised.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

import requests
import urllib3

from kit.errors import KitError

INTERRUPTED = "interrupted"  # a request Ctrl-C stopped: not a sample


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
                pass
            self.model = self.model or "default"  # the list said nothing usable (or an empty id)
        return self.model

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
            usage = event.get("usage")
            if usage:
                sample.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                if usage.get("completion_tokens") is not None:  # a usage without it leaves the chunks counted
                    sample.output_tokens = int(usage["completion_tokens"])
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
