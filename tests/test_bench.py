"""kit bench against a local streaming server with known timing, and against the real llama.cpp cpu server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kit import bench
from kit.errors import KitError
from tests.streamserver import StreamServer


def close(value: float, expected: float, tolerance: float = 0.05) -> bool:
    return abs(value - expected) <= tolerance * expected


def test_known_timing_within_5_percent():
    with StreamServer(ttft_s=0.1, token_s=0.02) as server:
        run = bench.run(server.url, names=["short"], concurrency=[1, 4], requests_per=4, warmup=0)
    single, four = run.results
    assert single.failures == 0 and four.failures == 0
    assert close(single.ttft["median"], 0.100), single.ttft
    assert close(single.tpot["median"], 0.020), single.tpot
    assert close(single.itl["median"], 0.020), single.itl
    assert close(single.e2el["median"], 0.100 + 63 * 0.020), single.e2el
    assert close(single.decode_tps["median"], 50.0)
    assert single.tokens_from == "usage"
    assert all(s.output_tokens == 64 for s in run.samples)
    # 4 in parallel: each still 50 tok/s, total about 4x
    assert close(four.decode_tps["median"], 50.0)
    assert four.output_tps > 3.3 * single.output_tps


def test_counts_chunks_when_no_usage():
    with StreamServer(ttft_s=0.01, token_s=0.001, usage=False) as server:
        run = bench.run(server.url, names=["short"], concurrency=[1], requests_per=2, warmup=0)
    assert run.results[0].tokens_from == "chunks" and run.samples[0].output_tokens == 64


def test_failures_are_counted_not_raised():
    with StreamServer(ttft_s=0.01, token_s=0.001) as server:
        client = bench.Client(server.url, None, None, timeout_s=1)
        client.probe()
        bad = client.one("short", 1, "__500__", 16, 1)
        drop = client.one("short", 1, "__drop__", 16, 1)
        hang = client.one("short", 1, "__hang__", 16, 1)
        good = client.one("short", 1, "hello", 16, 1)
    assert not bad.ok and bad.error.startswith("HTTP 500")
    assert not drop.ok
    assert not hang.ok and "timeout" in hang.error
    assert good.ok and good.output_tokens == 16
    summary = bench.summarize([bad, drop, hang, good], wall_s=1.0)
    assert summary.failures == 3 and summary.requests == 4


def test_bad_url_and_key_are_one_line_errors():
    with pytest.raises(KitError) as err:
        bench.Client("localhost:8080", None, None, 5)
    assert err.value.field == "--url"
    with pytest.raises(KitError) as err:
        bench.Client("http://127.0.0.1:9", None, None, 5).probe()
    assert "nothing answers" in err.value.line()
    with StreamServer(api_key="sekrit") as server:
        with pytest.raises(KitError):
            bench.run(server.url, api_key="wrong", names=["short"], concurrency=[1], requests_per=1, warmup=0)


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


def test_roofline():
    assert bench.roofline(15e9, 900) == 60.0
    assert bench.roofline(15e9, 900, 2) == 120.0


@pytest.mark.docker
@pytest.mark.slow
def test_against_real_llama_server(cpu_image, tiny_gguf, docker_ready):
    from tests.test_docker_build import FIXTURES
    from kit import config as cfg, serving
    import requests
    import time

    config = cfg.load(FIXTURES / "cpu-ci.yaml")
    container = docker_ready.containers.run(
        cpu_image.tag, command=serving.command(config, "llama.cpp"), detach=True,
        ports={"8080/tcp": ("127.0.0.1", None)}, volumes={str(tiny_gguf.parent): {"bind": "/models", "mode": "ro"}})
    try:
        container.reload()
        url = f"http://127.0.0.1:{container.attrs['NetworkSettings']['Ports']['8080/tcp'][0]['HostPort']}"
        for _ in range(120):
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(1)
        run = bench.run(url, names=["short", "medium"], concurrency=[1], requests_per=2, warmup=1)
    finally:
        container.remove(force=True)
    assert all(r.failures == 0 for r in run.results), [r.errors for r in run.results]
    for sample in run.samples:
        timings = sample.server_timings
        assert timings, "llama-server reports its own timings in the last chunk"
        assert sample.tokens_from == "usage"
        assert sample.output_tokens == timings["predicted_n"]  # ignore_eos: exactly max_tokens
    medium = next(r for r in run.results if r.scenario == "medium")
    assert all(s.output_tokens == 200 for s in run.samples if s.scenario == "medium")
    # our client-side decode rate agrees with the server's own predicted_per_second
    assert medium.server_decode_tps and abs(medium.decode_tps["median"] - medium.server_decode_tps) \
        <= 0.35 * medium.server_decode_tps, (medium.decode_tps, medium.server_decode_tps)


def test_ctrl_c_prints_what_was_measured(tmp_path):
    import signal
    import time as _time

    with StreamServer(ttft_s=0.01, token_s=0.02) as server:
        proc = subprocess.Popen([sys.executable, "-m", "kit", "bench", "--url", server.url, "--scenarios", "short",
                                 "--concurrency", "1", "--requests", "50", "--warmup", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
        _time.sleep(6)  # start-up, preflight, then a few 1.3 s requests
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert "interrupted: showing what was measured" in out, out + err
    assert "short" in out and "t/s" in out
