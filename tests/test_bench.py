"""kit bench against a local streaming server with known timing, and against the real llama.cpp cpu server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kit import bench, benchclient, benchstats, resolve, roofline
from kit.errors import KitError
from tests.streamserver import StreamServer


class FakeClock:
    """A clock the recorded stream moves: reading an event sets "now" to the time it was recorded at."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def recorded(clock: FakeClock, events: list[tuple[float, bytes]]):
    """SSE lines as they arrived: (arrival time in s, line)."""
    for at, line in events:
        clock.now = at
        yield line


def token(text: str = "tok") -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"' + text.encode() + b'"}}]}'


def test_recorded_stream_gives_exact_ttft_itl_tpot_e2el():
    # A stream sent at t=0: first token at 0.25 s, then tokens at 0.30, 0.40, 0.45 s, usage, [DONE] at 0.50 s.
    clock = FakeClock()
    events = [(0.25, token()), (0.30, token()), (0.40, token()), (0.45, token()),
              (0.46, b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":4,"total_tokens":11}}'),
              (0.50, b"data: [DONE]")]
    sample = benchclient.consume(benchclient.Sample("short", 1, ok=False, started=0.0), recorded(clock, events), clock)
    assert sample.ok and sample.tokens_from == "usage"
    assert sample.ttft == pytest.approx(0.25)
    # ITL: the gaps between tokens only, never the first-token gap: 0.05, 0.10, 0.05
    assert sample.itl == pytest.approx([0.05, 0.10, 0.05])
    assert sample.e2el == pytest.approx(0.50)
    # TPOT = (E2EL - TTFT) / (tokens - 1) = (0.50 - 0.25) / 3 = 0.08333 s (not / 4 = 0.0625)
    assert sample.tpot == pytest.approx(0.25 / 3)
    assert sample.decode_tps == pytest.approx(3 / 0.25)  # 12 tok/s
    assert sample.prompt_tokens == 7


def test_summary_statistics_are_exact():
    # Ten requests with TTFT 0.1 .. 1.0 s; percentiles by linear interpolation over the sorted values:
    # median = (0.5 + 0.6) / 2 = 0.55; p90 at rank 8.1 = 0.9 + 0.1 * 0.1 = 0.91; p99 at rank 8.91 = 0.9 + 0.091 = 0.991
    samples = [benchclient.Sample("short", 2, ok=True, ttft=0.1 * i, e2el=0.1 * i + 1.0, itl=[0.01 * i],
                            output_tokens=11, chunks=11, tokens_from="usage") for i in range(1, 11)]
    samples.append(benchclient.Sample("short", 2, ok=False, error="HTTP 500: boom"))
    summary = benchstats.summarize(samples, wall_s=5.0)
    assert summary.requests == 11 and summary.failures == 1
    assert summary.ttft["median"] == pytest.approx(0.55)
    assert summary.ttft["p90"] == pytest.approx(0.91)
    assert summary.ttft["p99"] == pytest.approx(0.991)
    assert summary.ttft["mean"] == pytest.approx(0.55)
    # every request decodes 10 tokens after the first in 1.0 s: TPOT 0.1 s, 10 tok/s
    assert summary.tpot["median"] == pytest.approx(0.1) and summary.decode_tps["p99"] == pytest.approx(10.0)
    assert summary.itl["median"] == pytest.approx(0.055)
    # total: 10 ok x 11 tokens / 5 s wall = 22 tok/s; 10 / 5 = 2 req/s
    assert summary.output_tps == pytest.approx(22.0) and summary.req_per_s == pytest.approx(2.0)
    assert summary.errors == ["HTTP 500: boom"]
    assert summary.scenario == "short" and summary.concurrency == 2 and summary.wall_s == 5.0
    assert summary.tokens_from == "usage" and summary.server_decode_tps is None and summary.prompt_processed is None
    # population standard deviation of 0.1 .. 1.0: sqrt(mean of squares - mean^2) = sqrt(0.385 - 0.3025) = 0.2872
    assert summary.ttft["std"] == pytest.approx(0.28723, abs=1e-5)
    # E2EL 1.1 .. 2.0: median (1.5 + 1.6) / 2
    assert summary.e2el["median"] == pytest.approx(1.55)


def test_summary_of_what_the_server_says_and_mixed_token_counts():
    """llama-server's own timings (predicted_per_second, prompt_n) are summarized beside the client's figures; a
    sample without them counts its usage prompt tokens; a run where some counts came from chunks says "mixed"."""
    a = benchclient.Sample("long", 4, ok=True, ttft=0.5, e2el=1.5, output_tokens=11, tokens_from="usage",
                           prompt_tokens=100, server_timings={"predicted_per_second": 20.0, "prompt_n": 1000})
    b = benchclient.Sample("long", 4, ok=True, ttft=0.5, e2el=1.5, output_tokens=11, tokens_from="chunks",
                           prompt_tokens=700, server_timings={"predicted_per_second": 30.0})
    c = benchclient.Sample("long", 4, ok=True, ttft=0.5, e2el=1.5, output_tokens=11, tokens_from="usage",
                           prompt_tokens=800)
    d = benchclient.Sample("long", 4, ok=False, error="timeout after 300s", prompt_tokens=5,
                           server_timings={"predicted_per_second": 99.0, "prompt_n": 5})
    summary = benchstats.summarize([a, b, c, d], wall_s=2.0)
    assert summary.scenario == "long" and summary.concurrency == 4
    assert summary.server_decode_tps == pytest.approx(25.0)  # mean of 20 and 30; c has none, d failed
    # prompt tokens processed: a's timings (1000, not its usage 100), b's usage (700, no prompt_n), c's usage (800):
    # median 800
    assert summary.prompt_processed == 800
    assert summary.tokens_from == "mixed"
    only_chunks = benchstats.summarize([b], wall_s=1.0)
    assert only_chunks.tokens_from == "chunks"
    # no wall time (nothing finished): rates are 0, not a division error; at most 5 distinct errors are kept
    failed = [benchclient.Sample("long", 4, ok=False, error=f"HTTP 50{i}") for i in range(7)]
    empty = benchstats.summarize(failed, wall_s=0.0)
    assert (empty.output_tps, empty.req_per_s) == (0.0, 0.0)
    assert empty.errors == ["HTTP 500", "HTTP 501", "HTTP 502", "HTTP 503", "HTTP 504"]


def test_stream_cut_before_done_is_a_failure():
    clock = FakeClock()
    sample = benchclient.consume(benchclient.Sample("short", 1, ok=False), recorded(clock, [(0.1, token()), (0.2, token())]), clock)
    assert not sample.ok and sample.error.startswith("disconnected")


def test_live_stream_respects_the_servers_timing():
    # Real sockets, real threads: only causal bounds are exact here (a client cannot see a token before the
    # server sent it); the speed itself is a benchmark, not a test.
    with StreamServer(ttft_s=0.1, token_s=0.02) as server:
        run = bench.run(server.url, names=["short"], concurrency=[1, 4], requests_per=4, warmup=0)
    single, four = run.results
    assert single.failures == 0 and four.failures == 0
    assert all(s.output_tokens == 64 and s.tokens_from == "usage" for s in run.samples)
    for s in run.samples:
        assert s.ttft >= 0.1 and s.e2el >= 0.1 + 63 * 0.02 and len(s.itl) == 63
    # every request had its own prompt, and asked the server not to reuse a cached prefix
    prompts = server.counter.prompts[1:]  # after the preflight
    assert len(prompts) == 8 and len(set(prompts)) == 8
    assert all(b["cache_prompt"] is False for b in server.counter.bodies)


def test_counts_chunks_when_no_usage():
    with StreamServer(ttft_s=0.01, token_s=0.001, usage=False) as server:
        run = bench.run(server.url, names=["short"], concurrency=[1], requests_per=2, warmup=0)
    assert run.results[0].tokens_from == "chunks" and run.samples[0].output_tokens == 64


def test_failures_are_counted_not_raised():
    with StreamServer(ttft_s=0.01, token_s=0.001) as server:
        client = benchclient.Client(server.url, None, None, timeout_s=1)
        client.probe()
        bad = client.one("short", 1, "__500__", 16, 1)
        drop = client.one("short", 1, "__drop__", 16, 1)
        hang = client.one("short", 1, "__hang__", 16, 1)
        good = client.one("short", 1, "hello", 16, 1)
    assert not bad.ok and bad.error.startswith("HTTP 500")
    assert not drop.ok
    assert not hang.ok and "timeout" in hang.error
    assert good.ok and good.output_tokens == 16
    summary = benchstats.summarize([bad, drop, hang, good], wall_s=1.0)
    assert summary.failures == 3 and summary.requests == 4


def test_bad_url_and_key_are_one_line_errors():
    with pytest.raises(KitError) as err:
        benchclient.Client("localhost:8080", None, None, 5)
    assert err.value.field == "--url"
    with pytest.raises(KitError) as err:
        benchclient.Client("http://127.0.0.1:9", None, None, 5).probe()
    assert "nothing answers" in err.value.line()
    with StreamServer(api_key="sekrit") as server:
        with pytest.raises(KitError) as err:
            bench.run(server.url, api_key="wrong", names=["short"], concurrency=[1], requests_per=1, warmup=0)
    assert err.value.field == "--api-key" and "refused the key (401)" in err.value.problem


def test_cli_table_json_plot_roofline_and_compare(tmp_path):
    with StreamServer(ttft_s=0.02, token_s=0.002) as a, StreamServer(ttft_s=0.02, token_s=0.004) as b:
        result = subprocess.run([sys.executable, "-m", "kit", "bench", "--url", a.url, "--compare", b.url,
                                 "--scenarios", "short,medium", "--concurrency", "1,2", "--requests", "2",
                                 "--warmup", "0", "--json", str(tmp_path / "o.json"), "--plot", str(tmp_path / "o.png"),
                                 "--model-bytes", "15e9"], capture_output=True, text=True, timeout=120,
                                env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "2 concurrent total" in result.stdout and "medium" in result.stdout
    assert "of the 60.0 tok/s bandwidth limit" in result.stdout  # 900 GB/s / 15 GB
    data = json.loads((tmp_path / "o.json").read_text())
    assert len(data) == 2 and len(data[0]["samples"]) == 2 * 2 * 2
    assert (tmp_path / "o.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_takes_the_stack_config(tmp_path):
    """#15 item 11: `kit bench -c kit.yaml` finds the endpoint (serve.port), the key (out/.env) and the model name
    (model.name) of the stack; the roofline comes from kit plan's split of the stack's model (cpu: host memory)."""
    from tests.ggufmodels import write_tiny_llama

    (tmp_path / "models").mkdir()
    write_tiny_llama(tmp_path / "models" / "tiny.gguf")
    with StreamServer(ttft_s=0.01, token_s=0.002, api_key="s3cret") as server:
        port = int(server.url.rsplit(":", 1)[1])
        (tmp_path / "kit.yaml").write_text(
            f"preset: cpu\nserve: {{port: {port}}}\nmodel: {{dir: {tmp_path / 'models'}, file: tiny.gguf, name: tiny}}\n")
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / ".env").write_text("KIT_API_KEY=s3cret\n")
        result = subprocess.run([sys.executable, "-m", "kit", "bench", "--scenarios", "short", "--concurrency", "1",
                                 "--requests", "2", "--warmup", "0"], capture_output=True, text=True, timeout=120,
                                cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
        bodies = list(server.counter.bodies)
    assert result.returncode == 0, result.stderr
    assert f"http://127.0.0.1:{port}" in result.stdout
    assert bodies and all(b["model"] == "tiny" for b in bodies)
    assert "bandwidth limit" in result.stdout and "layers in host memory" in result.stdout
    assert "measured (copy test on this host)" in result.stdout


def test_roofline():
    assert roofline.roofline(15e9, 900) == 60.0
    assert roofline.roofline(15e9, 900, 2) == 120.0


@pytest.mark.docker
@pytest.mark.slow
def test_against_real_llama_server(cpu_image, tiny_gguf, docker_ready):
    from tests.conftest import wait_ok
    from tests.test_docker_build import FIXTURES
    from kit import config as cfg

    config = cfg.load(FIXTURES / "cpu-ci.yaml")
    container = docker_ready.containers.run(
        cpu_image.tag, command=list(resolve.engine(config, "llama.cpp").argv), detach=True,
        ports={"8080/tcp": ("127.0.0.1", None)}, volumes={str(tiny_gguf.parent): {"bind": "/models", "mode": "ro"}})
    try:
        container.reload()
        url = f"http://127.0.0.1:{container.attrs['NetworkSettings']['Ports']['8080/tcp'][0]['HostPort']}"
        wait_ok(f"{url}/health", 120)
        run = bench.run(url, names=["short", "medium"], concurrency=[1], requests_per=2, warmup=1)
    finally:
        container.remove(force=True)
    assert all(r.failures == 0 for r in run.results), [r.errors for r in run.results]
    for sample in run.samples:
        timings = sample.server_timings
        assert timings, "llama-server reports its own timings in the last chunk"
        assert sample.tokens_from == "usage"
        assert sample.output_tokens == timings["predicted_n"]  # ignore_eos: exactly max_tokens
        # the server's own prompt + decode time lies inside the client's end-to-end wall time (same host clock)
        assert sample.e2el >= (timings["prompt_ms"] + timings["predicted_ms"]) / 1000 - 1e-3, (sample.e2el, timings)
        # unique prompts and cache_prompt false: the server processed the whole prompt, not a cached prefix
        assert timings["prompt_n"] == sample.prompt_tokens > 8, timings
    assert all(s.output_tokens == 200 for s in run.samples if s.scenario == "medium")


def test_a_stop_mid_run_keeps_what_finished_and_never_hangs():
    """Ctrl-C is an Event, not an exception raised at an arbitrary point: the run returns what finished, the request
    in flight stops at its next chunk and is left out, and nothing waits on it."""
    import threading

    with StreamServer(ttft_s=0.01, token_s=0.01) as server:
        stop = threading.Event()
        out: dict = {}
        worker = threading.Thread(target=lambda: out.update(run=bench.run(
            server.url, names=["short"], concurrency=[2], requests_per=1000, warmup=0, stop=stop)))
        worker.start()
        assert server.counter.wait_for(6, timeout_s=120), "no requests arrived"  # preflight + 5
        stop.set()
        worker.join(timeout=60)
        assert not worker.is_alive(), "bench.run did not return after the stop"
    result = out["run"]
    assert result.interrupted
    assert result.samples and all(s.error != benchclient.INTERRUPTED for s in result.samples)
    assert len(result.samples) < 1000 and result.results[0].concurrency == 2


def test_ctrl_c_prints_what_was_measured(tmp_path):
    import signal

    with StreamServer(ttft_s=0.01, token_s=0.01) as server:
        proc = subprocess.Popen([sys.executable, "-m", "kit", "bench", "--url", server.url, "--scenarios", "short",
                                 "--concurrency", "1", "--requests", "1000", "--warmup", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
        # the preflight and two measured requests have finished: Ctrl-C now lands while the third is in flight
        assert server.counter.wait_for(3, timeout_s=120), "kit bench sent no requests"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert "interrupted: showing what was measured" in out, out + err
    assert "short" in out and "t/s" in out
