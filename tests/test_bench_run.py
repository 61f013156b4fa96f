"""kit bench's run on its own terms: which requests it sends, in what order, how many at once, and the errors that
stop it, read off the wire of tests/scriptserver.py (no timing involved, a few seconds in all). The expected
values come from images/bench.yaml as written (seed 20261202; short 64 tokens, medium 200, long 600) and are
spelled out here."""

from __future__ import annotations

import re
import threading

import pytest

from kit import bench
from kit.errors import KitError
from tests.scriptserver import LAST_CHUNK, HANG, Request, ScriptServer, chunk, event, response, stream_head

SHORT_POOL = {"Give a one-sentence definition of NVLink.", "Name three uses of a local LLM server.",
              "What does GGUF stand for? Answer briefly.", "Translate 'good morning' into French and German."}


def token_stream(n: int = 2) -> list[bytes]:
    token = {"choices": [{"index": 0, "delta": {"content": "t"}}]}
    return [stream_head(), *(chunk(event(token)) for _ in range(n)), chunk(event("[DONE]")), LAST_CHUNK]


class Server(ScriptServer):
    """Models at GET, a two-token stream at POST, and the most requests it ever held at once."""

    def __init__(self, hold_until: int = 0, models: bytes = b'{"data":[{"id":"served-model"}]}',
                 post=None) -> None:
        self.lock = threading.Condition()
        self.in_flight = 0
        self.arrived = 0
        self.most_in_flight = 0
        self.hold_until = hold_until  # hold each measured request until this many are in flight (2 s at most)
        self.models = models
        self.post = post
        super().__init__(self.answer)

    def answer(self, request: Request) -> list:
        if request.method == "GET":
            return [response(200, self.models)]
        if self.post:
            return self.post(request)
        prompt = request.json["messages"][0]["content"]
        if self.hold_until and prompt.startswith("[short-") and "-w-" not in prompt:
            with self.lock:
                # requests go in groups of hold_until: each waits for the last of its group to arrive
                group_end = (self.arrived // self.hold_until + 1) * self.hold_until
                self.arrived += 1
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                self.lock.notify_all()
                self.lock.wait_for(lambda: self.arrived >= group_end, timeout=2)
            steps = token_stream()
            with self.lock:
                self.in_flight -= 1
            return steps
        return token_stream()

    def posts(self) -> list[dict]:
        return [r.json for r in self.requests if r.method == "POST"]


def test_the_requests_of_a_run_in_order():
    with Server() as server:
        run = bench.run(server.url, api_key="k", names=["short", "medium"], concurrency=[2], requests_per=3)
    assert (run.url, run.model) == (server.url, "served-model")
    assert [r.method for r in server.requests][:2] == ["GET", "POST"]
    assert all("Authorization: Bearer k" in r.header_lines for r in server.requests)
    posts = server.posts()
    # the preflight: one token of "Say OK." with the table's seed
    assert posts[0]["messages"] == [{"role": "user", "content": "Say OK."}]
    assert (posts[0]["max_tokens"], posts[0]["seed"], posts[0]["model"]) == (1, 20261202, "served-model")
    # then per scenario: one warm-up (salt "w"), then three measured requests at concurrency 2 (salt "2")
    prompts = [p["messages"][0]["content"] for p in posts[1:]]
    assert prompts[0].startswith("[short-w-0] ")
    assert sorted(p.split("]")[0] + "]" for p in prompts[1:4]) == ["[short-2-0]", "[short-2-1]", "[short-2-2]"]
    assert prompts[4].startswith("[medium-w-0] ")
    assert sorted(p.split("]")[0] + "]" for p in prompts[5:]) == ["[medium-2-0]", "[medium-2-1]", "[medium-2-2]"]
    assert all(p.split("] ", 1)[1] in SHORT_POOL for p in prompts[:4])
    assert [p["max_tokens"] for p in posts[1:]] == [64] * 4 + [200] * 4
    assert all(p["seed"] == 20261202 for p in posts)
    # what comes back: the measured requests only, labelled with their scenario and concurrency, one summary each
    assert [(s.scenario, s.concurrency) for s in run.samples] == [("short", 2)] * 3 + [("medium", 2)] * 3
    assert [(r.scenario, r.concurrency, r.requests) for r in run.results] == [("short", 2, 3), ("medium", 2, 3)]
    assert all(0 < r.wall_s < 60 for r in run.results) and not run.interrupted


def test_the_same_seed_sends_the_same_prompts():
    with Server() as server:
        bench.run(server.url, names=["short"], concurrency=[1], requests_per=4, warmup=0)
        bench.run(server.url, names=["short"], concurrency=[1], requests_per=4, warmup=0)
    posts = [p["messages"][0]["content"] for p in server.posts() if p["max_tokens"] != 1]
    assert posts[:4] == posts[4:] and len(set(posts)) == 4


def test_defaults_one_warmup_concurrency_1_and_4_at_least_4_requests_each():
    with Server() as server:
        run = bench.run(server.url, names=["short"])
    prompts = [p["messages"][0]["content"].split("]")[0] + "]" for p in server.posts()[1:]]
    assert prompts[0] == "[short-w-0]" and prompts.count("[short-w-0]") == 1
    assert sorted(prompts[1:]) == ["[short-1-0]", "[short-1-1]", "[short-1-2]", "[short-1-3]",
                                   "[short-4-0]", "[short-4-1]", "[short-4-2]", "[short-4-3]"]
    assert [(r.concurrency, r.requests) for r in run.results] == [(1, 4), (4, 4)]


def test_above_four_the_request_count_follows_the_concurrency():
    with Server() as server:
        run = bench.run(server.url, names=["short"], concurrency=[5], warmup=0)
    assert [(r.concurrency, r.requests) for r in run.results] == [(5, 5)]


def test_every_scenario_when_none_is_named():
    with Server() as server:
        run = bench.run(server.url, concurrency=[1], requests_per=1, warmup=0)
    assert [r.scenario for r in run.results] == ["short", "medium", "long"]
    assert [p["max_tokens"] for p in server.posts()] == [1, 64, 200, 600]


def test_concurrency_is_what_was_asked_no_more():
    """Four requests at concurrency 2: the server holds each until two are in flight, so a pool of more workers
    would show more at once."""
    with Server(hold_until=2) as server:
        run = bench.run(server.url, names=["short"], concurrency=[2], requests_per=4, warmup=0)
    assert server.most_in_flight == 2 and run.results[0].failures == 0


def test_a_given_model_and_the_timeout_reach_the_requests():
    def post(request: Request) -> list:
        return [HANG] if "[short-1-" in request.json["messages"][0]["content"] else token_stream()

    with Server(post=post) as server:
        run = bench.run(server.url, model="mine", names=["short"], concurrency=[1], requests_per=1, warmup=0,
                        timeout_s=1)
    assert run.model == "mine" and all(p["model"] == "mine" for p in server.posts())
    assert run.samples[0].error == "timeout after 1s" and run.results[0].failures == 1


def test_each_level_is_echoed_as_it_finishes():
    lines: list[str] = []
    with Server() as server:
        run = bench.run(server.url, names=["short"], concurrency=[1, 2], requests_per=2, warmup=0, echo=lines.append)
    assert len(lines) == 2
    for line, result in zip(lines, run.results):
        match = re.fullmatch(r"short  x(\d): +([\d.]+) tok/s total, +([\d.]+) tok/s per request, 0 failed", line)
        assert match, line
        assert int(match.group(1)) == result.concurrency
        assert match.group(2) == f"{result.output_tps:.1f}" and match.group(3) == f"{result.decode_tps['median']:.1f}"
    assert float(re.search(r"([\d.]+) tok/s per request", lines[0]).group(1)) > 0


def test_a_stop_between_levels_returns_what_was_measured():
    stop = threading.Event()
    with Server() as server:
        run = bench.run(server.url, names=["short", "medium"], concurrency=[1, 2], requests_per=2, warmup=0,
                        stop=stop, echo=lambda line: stop.set())
    assert run.interrupted and [(r.scenario, r.concurrency) for r in run.results] == [("short", 1)]
    assert len(run.samples) == 2


def test_an_unknown_scenario_names_the_flag_and_the_choices():
    with pytest.raises(KitError) as err:
        bench.run("http://127.0.0.1:9", names=["short", "huge", "tiny"])
    assert err.value.line() == "--scenarios: unknown scenario 'huge'; use short, medium, long"


@pytest.mark.parametrize("status, line", [
    (401, "--api-key: {url} refused the key (401); pass the key from .env with --api-key"),
    (404, "--url: {url} has no /v1/chat/completions (404); point --url at the server root"),
])
def test_a_preflight_refused_is_one_line(status, line):
    with Server(post=lambda request: [response(status, b"{}")]) as server:
        with pytest.raises(KitError) as err:
            bench.run(server.url + "/v1", names=["short"], concurrency=[1], requests_per=1)
    assert err.value.line() == line.format(url=server.url)
    assert len(server.posts()) == 1  # nothing after the preflight


def test_a_preflight_failing_otherwise_lets_the_run_count_failures():
    lines: list[str] = []
    with Server(post=lambda request: [response(500, b"busy")]) as server:
        run = bench.run(server.url, names=["short"], concurrency=[1], requests_per=2, warmup=0, echo=lines.append)
    assert run.results[0].failures == 2 and run.results[0].errors == ["HTTP 500: busy"]
    # no request decoded anything: the per-request speed reads 0.0, not a made-up figure
    assert lines == ["short  x1:     0.0 tok/s total,    0.0 tok/s per request, 2 failed"]


def test_the_table_seed_picks_the_prompts(monkeypatch):
    """Warm-up and measured prompts both come from the table's seed: another seed, other picks (for these two seeds
    the warm-up's pick and the measured ones differ; random.Random of a string seed is the same on every machine)."""
    def sent(seed: int) -> list[str]:
        table = {**bench.scenarios(), "seed": seed}
        monkeypatch.setattr(bench, "scenarios", lambda: table)
        with Server() as server:
            bench.run(server.url, names=["short"], concurrency=[1], requests_per=4, warmup=1)
        return [p["messages"][0]["content"].split("] ", 1)[1] for p in server.posts()[1:]]

    first, second = sent(20261202), sent(8)
    assert first[0] != second[0] and first[1:] != second[1:]  # the warm-up's pick and the measured ones
    assert sent(20261202) == first


def test_a_request_stopped_mid_stream_is_left_out():
    """The stop lands while the second measured request is streaming: it ends at its next chunk, is not a sample,
    and the third never starts."""
    stop = threading.Event()
    release = threading.Event()
    measured = []

    def post(request: Request) -> list:
        if request.json["max_tokens"] == 1:  # the preflight
            return token_stream()
        measured.append(request)
        if len(measured) == 2:
            stop.set()
            return [stream_head(), chunk(event({"choices": [{"index": 0, "delta": {"content": "t"}}]})), release]
        return token_stream()

    with Server(post=post) as server:
        run = bench.run(server.url, names=["short"], concurrency=[1], requests_per=3, warmup=0, stop=stop)
        release.set()
    assert run.interrupted and len(measured) == 2
    assert [s.ok for s in run.samples] == [True] and run.results[0].requests == 1


def test_a_ctrl_c_without_the_cli_handler_stops_the_run_like_the_event():
    """A caller that leaves SIGINT to Python gets a KeyboardInterrupt in the thread waiting on the requests: the run
    stops as the CLI's Event stops it. The signal is sent once the main thread is inside concurrent.futures' wait
    (read off its stack, no sleeping on a guess), while the first request is held mid-stream."""
    import os
    import signal
    import sys

    main = threading.main_thread()

    def main_is_waiting() -> bool:
        frame = sys._current_frames().get(main.ident)
        while frame is not None:
            if frame.f_code.co_name == "wait" and "concurrent" in frame.f_code.co_filename:
                return True
            frame = frame.f_back
        return False

    stop = threading.Event()
    release = threading.Event()

    def interrupt() -> None:
        for _ in range(1000):  # 10 s at most
            if main_is_waiting():
                os.kill(os.getpid(), signal.SIGINT)
                break
            threading.Event().wait(0.01)
        stop.wait(10)  # the run saw the interrupt: let the held stream go on, so its reader sees the stop
        release.set()

    def post(request: Request) -> list:
        if request.json["max_tokens"] == 1:
            return token_stream()
        threading.Thread(target=interrupt, daemon=True).start()
        return [stream_head(), chunk(event({"choices": [{"index": 0, "delta": {"content": "t"}}]})), release,
                *token_stream()[1:]]

    # Python's own SIGINT behaviour, whatever the test runner installed (mutmut has a handler of its own)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Server(post=post) as server:
            run = bench.run(server.url, names=["short"], concurrency=[1], requests_per=2, warmup=0, stop=stop)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert run.interrupted and run.samples == [] and run.results == []
    assert len(server.posts()) == 2  # the preflight and the one held; the queued one was never sent
