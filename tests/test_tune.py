"""kit tune: the search on a surface the test knows, the space's judgments, and the whole verb on a stand-in engine.

The search's oracle is a formula written here (its optimum worked out by hand below), never kit's own code; the
process-level test starts tests/fakeengine.py, a llama-server-shaped process whose speed is that formula, through
the real ExecRunner and the real kit bench client, and reads each started process's argv from /proc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kit import config as cfg, resolve, tune, tunespace
from kit.errors import KitError
from kit.tunesearch import FAILED, OK, PRUNED, REJECTED, Journal, Measurement, Search, Settings
from tests.ggufmodels import write_sparse_27b, write_tiny_llama
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------ the search, on a known surface
# tok/s = 100 - 10*|a - 3| - 5*|b - 20|  for a in 1..5, b in {10, 20, 30}: the optimum is a=3, b=20 (100 tok/s).
# a=5 crashes (an OOM, say); (a=1, b=30) is rejected before it starts (a plan that does not fit).
SPACE = {"a": [1, 2, 3, 4, 5], "b": [10, 20, 30]}


def surface(point):
    return 100 - 10 * abs(point["a"] - 3) - 5 * abs(point["b"] - 20)


class Bench:
    """Counts starts, answers from the surface, honours prune_at like kit.tunerun.measure (a worse half stops)."""

    def __init__(self):
        self.started: list[dict] = []

    def __call__(self, point, prune_at):
        self.started.append(dict(point))
        if point["a"] == 5:
            return Measurement(FAILED, reason="cuda-oom: cudaMalloc failed: out of memory")
        value = float(surface(point))
        if prune_at is not None and value < prune_at:
            return Measurement(PRUNED, value, f"below {prune_at}")
        return Measurement(OK, value, metrics={"decode_tps": value})


def rejected(point):
    return "does not fit (kit plan)" if point == {"a": 1, "b": 30} else ""


def search(bench, journal=None, budget=lambda: True, space=SPACE, **settings):
    return Search(space, applies=lambda _n, _p: True, rejected=rejected, measure=bench,
                  settings=Settings(**{"noise": 0.0, **settings}), journal=journal or Journal(None, {}),
                  budget_left=budget)


def test_coordinate_descent_finds_the_known_optimum_and_never_starts_a_rejected_point():
    bench = Bench()
    result = search(bench).run({"a": 1, "b": 10})
    assert result.best.point == {"a": 3, "b": 20} and result.best.value == 100
    # round 1 along a (b=10): a=1 (start, 70), 2 (80), 3 (90), 4 (80), 5 crashes -> best a=3; along b (a=3):
    # 20 (100), 30 (90) -> best (3, 20). Round 2 moved nothing new: a=1,2,4,5 at b=20, then b=10 and 30 are tried
    # only where not tried before. (1, 30) is never reached: it differs from every best in two settings.
    started = [tuple(p.values()) for p in bench.started]
    assert started[:7] == [(1, 10), (2, 10), (3, 10), (4, 10), (5, 10), (3, 20), (3, 30)]
    assert len(started) == len(set(started)), "a point is measured once (no repeats: noise 0)"
    by_point = {tuple(t.point.values()): t for t in result.trials}
    assert by_point[(5, 10)].status == FAILED and "cuda-oom" in by_point[(5, 10)].reason
    assert result.runner_up.value == 90


def test_a_rejected_point_is_recorded_and_never_started():
    bench = Bench()
    # b first, from (1, 20): along b the search reaches (1, 10) and (1, 30)
    result = search(bench, space={"b": SPACE["b"], "a": SPACE["a"]}).run({"a": 1, "b": 20})
    trial = next(t for t in result.trials if t.point == {"a": 1, "b": 30})
    assert trial.status == REJECTED and trial.reason == "does not fit (kit plan)"
    assert {"a": 1, "b": 30} not in bench.started


def test_a_clearly_worse_trial_stops_after_half_its_requests():
    bench = Bench()
    # prune 0.15: a trial below 0.85 x the best stops early. From (3, 20) (100): a=1 (80) and a=5 crash; a=2 (90) and
    # a=4 (90) go on; b=10 and b=30 (95) go on.
    result = search(bench, prune=0.15).run({"a": 3, "b": 20})
    status = {tuple(t.point.values()): t.status for t in result.trials}
    assert status[(1, 20)] == PRUNED and status[(2, 20)] == OK and status[(4, 20)] == OK
    assert result.best.point == {"a": 3, "b": 20}


def test_two_close_trials_are_measured_again_and_the_spread_reported():
    # b=20 and b=30 measure 100 and 99 first (within 3% noise), then 96 and 101, 97 and 100 (three repeats):
    # means 97.67 and 100.0, so b=30 wins on the repeats though it lost the first measurement.
    script = {20: [100.0, 96.0, 97.0], 30: [99.0, 101.0, 100.0]}

    def bench(point, prune_at):
        return Measurement(OK, script[point["b"]].pop(0))

    s = Search({"b": [20, 30]}, lambda _n, _p: True, lambda _p: "", bench, Settings(noise=0.03, repeats=3),
               Journal(None, {}))
    result = s.run({"b": 20})
    assert result.best.point == {"b": 30}
    assert result.best.spread == (99.0, 101.0) and len(result.best.values) == 3
    assert result.runner_up.spread == (96.0, 100.0)


def test_an_interrupted_search_resumes_from_its_journal(tmp_path):
    journal = tmp_path / "tune.jsonl"
    header = {"engine": "x"}
    whole = search(Bench()).run({"a": 1, "b": 10})

    budget = iter([True] * 4 + [False] * 100)  # the budget ends after four points
    first = Bench()
    stopped = search(first, Journal(journal, header), budget=lambda: next(budget)).run({"a": 1, "b": 10})
    assert stopped.out_of_budget and len(first.started) == 4
    again = Bench()
    resumed_journal = Journal(journal, header)
    resumed = search(again, resumed_journal).run({"a": 1, "b": 10})
    assert resumed_journal.replayed == 4, "the four measured points are read, not measured again"
    assert again.started == whole_started_after(4)
    assert resumed.best.point == whole.best.point and [t.point for t in resumed.trials] == [t.point for t in whole.trials]
    with pytest.raises(ValueError, match="another tune"):
        Journal(journal, {"engine": "y"})


def whole_started_after(n):
    bench = Bench()
    search(bench).run({"a": 1, "b": 10})
    return bench.started[n:]


# ------------------------------------------------------------------ the space, judged as kit deploy would
@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    return write_sparse_27b(tmp_path_factory.mktemp("m") / "model-27b.gguf", "IQ4_XS")


def test_points_the_rules_or_the_plan_reject_are_never_started(big_model):
    raw = {"model": {"dir": str(big_model.parent), "file": big_model.name, "ctx": 16384}}
    space = tunespace.load("llama.cpp")
    ok = tunespace.config_at(raw, "llama.cpp", {"serve.concurrency": 2, "ubatch": 512})
    assert tunespace.rejected(ok, "llama.cpp", space) == ""
    # 27B IQ4_XS is ~14 GiB of weights over 2 x 16 GiB; 8 slots x 16384 tokens of f16 KV is 8 x 4 GiB by hand
    # (64 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 256 KiB per token; x 16384 = 4 GiB per slot): no fit.
    many = tunespace.config_at(raw, "llama.cpp", {"serve.concurrency": 8})
    assert tunespace.rejected(many, "llama.cpp", space).startswith("does not fit (kit plan)")
    capped = tunespace.config_at(raw, "llama.cpp", {"ubatch": 1024, "batch": 512})
    assert "ubatch 1024 > batch 512" in tunespace.rejected(capped, "llama.cpp", space)
    # the rules: Volta has no bf16, however a tune got there
    bf16 = tunespace.config_at(raw, "llama.cpp", {"model.dtype": "bfloat16"})
    assert tunespace.rejected(bf16, "llama.cpp", space).startswith("rule: model.dtype: sm_70 (Volta) has no bf16")


def test_settings_that_mean_nothing_here_are_left_out():
    space = tunespace.load("llama.cpp")
    from kit import serving

    one_gpu = cfg.from_dict({"preset": "single-v100-32g"})
    assert not tunespace.applies(space, "split_mode", serving.flag_values(one_gpu, resolve.engine(one_gpu, "llama.cpp")))
    assert tunespace.applies(space, "split_mode", serving.flag_values(cfg.from_dict({}), resolve.engine(cfg.from_dict({}), "llama.cpp")))
    # no MTP layers (the model is not here: assumed none) -> no speculation -> no draft length to tune
    assert not tunespace.applies(space, "spec_draft_n_max", serving.flag_values(cfg.from_dict({}), resolve.engine(cfg.from_dict({}), "llama.cpp")))


@pytest.mark.parametrize("text,field", [
    ("space: {ubatchh: [1]}\n", "--space: ubatchh"),
    ("space: {serve.concurency: [1]}\n", "--space: serve.concurency"),
    ("space: {ubatch: []}\n", "--space: space.ubatch.values"),
    ("space: {}\n", "--space"),
    ("space: [1, 2\n", "--space"),
])
def test_a_bad_space_file_is_one_line_naming_the_field(tmp_path, text, field):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(KitError) as exc:
        tunespace.load("llama.cpp", path)
    assert exc.value.field == field


@pytest.mark.parametrize("text,seconds", [("30m", 1800), ("90s", 90), ("1h30m", 5400), ("45", 45)])
def test_budget(text, seconds):
    assert tune.budget_seconds(text) == seconds


@pytest.mark.parametrize("text", ["soon", "30x", "m30", ""])
def test_a_bad_budget_names_the_flag(text):
    with pytest.raises(KitError) as exc:
        tune.budget_seconds(text)
    assert exc.value.field == "--budget"


# ------------------------------------------------------------------ the verb, on a stand-in engine process
def kit(*args, cwd):
    return subprocess.run([sys.executable, "-m", "kit", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_kit_tune_exec_restarts_the_engine_per_trial_and_writes_the_winner(tmp_path):
    write_tiny_llama(tmp_path / "model.gguf")
    engine = tmp_path / "llama-server"
    # the interpreter running the tests, not whatever python3 is on PATH
    engine.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv[0] = {str(ROOT / 'tests/fakeengine.py')!r}\n"
                      f"runpy.run_path(sys.argv[0], run_name='__main__')\n")
    engine.chmod(0o755)
    (tmp_path / "kit.yaml").write_text(
        "preset: cpu\n"
        "model:\n  dir: .\n  file: model.gguf\n"
        "serve:\n  concurrency: 2   # mine\n"
        "engines:\n  llama.cpp:\n    flavor: cpu\n    ubatch: 512\n")
    (tmp_path / "space.yaml").write_text("space:\n  serve.concurrency: [1, 2, 4]\n  ubatch: [128, 256, 512, 1024]\n")
    port = free_port()
    args = ("tune", "-c", "kit.yaml", "--exec", str(engine), "--port", str(port), "--space", "space.yaml",
            "--requests", "4", "--budget", "10m")
    done = kit(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kit.yaml keeps them only with --write" in done.stdout
    assert "concurrency: 2   # mine" in (tmp_path / "kit.yaml").read_text()
    # resumed: the same tune again reads every measurement back from its journal and writes the same winner
    again = kit(*args, "--write", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr

    # the surface's optimum (tests/fakeengine.py): ubatch 256, parallel 1, written back with the measurement
    written = yaml.safe_load((tmp_path / "kit.yaml").read_text())
    assert written["serve"]["concurrency"] == 1 and written["engines"]["llama.cpp"]["ubatch"] == 256
    text = (tmp_path / "kit.yaml").read_text()
    assert "concurrency: 1  # kit tune" in text and "ubatch: 256  # kit tune" in text and "flavor: cpu" in text

    lines = [json.loads(line) for line in (tmp_path / "tune-llama-cpp.jsonl").read_text().splitlines()]
    trials = lines[1:]
    assert lines[0]["header"]["objective"] == "decode"
    started = [t for t in trials if t["measurement"]["argv"]]
    assert len(started) >= 6
    for t in started:  # each trial really restarted the engine with its own flags, as /proc saw them
        argv = t["measurement"]["argv"]
        assert argv[argv.index("--parallel") + 1] == str(t["point"]["serve.concurrency"])
        assert argv[argv.index("--ubatch-size") + 1] == str(t["point"]["ubatch"])
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
    oom = [t for t in trials if t["point"]["ubatch"] == 1024]
    assert oom and all(t["measurement"]["status"] == "failed" and "cuda-oom" in t["measurement"]["reason"]
                       for t in oom)
    # parallel 4 served, but its log has NCCL's fallback: never a winner, and the report says why
    warned = [t for t in trials if t["point"]["serve.concurrency"] == 4]
    assert warned and all(t["measurement"]["status"] == "failed" and
                          t["measurement"]["reason"].startswith("nccl-fallback: NCCL init failed") for t in warned)
    assert "best: serve.concurrency=1 ubatch=256" in done.stdout
    assert "runner-up:" in done.stdout

    assert f"resumed: {len(trials)} measurement(s)" in again.stdout
    # from the written settings it is another tune: the old journal is kept aside and the start is already the best
    third = kit(*args, cwd=tmp_path)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "kept as tune-llama-cpp.jsonl.prev" in third.stdout
    assert "the starting settings were the best" in third.stdout
    # the tune stops what it started
    left = subprocess.run(["pgrep", "-f", str(engine)], capture_output=True, text=True).stdout.split()
    assert not left


def test_kit_tune_bad_input_is_one_line(tmp_path):
    (tmp_path / "kit.yaml").write_text("preset: cpu\n")
    for args, field in [(("--objective", "fastest"), "--objective"), (("--budget", "soon"), "--budget"),
                        (("--exec", str(tmp_path / "nope")), "--exec")]:
        done = kit("tune", "-c", "kit.yaml", *args, cwd=tmp_path)
        assert done.returncode == 2 and done.stderr.startswith(f"error: {field}:"), done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    nowrite = kit("tune", "--write", cwd=tmp_path / "..")
    assert nowrite.returncode == 2


def test_ctrl_c_keeps_what_was_measured_and_the_same_command_resumes(tmp_path):
    """SIGINT once two measurements are in the journal (polled, not timed): the report of what finished, exit 0, and
    the journal holds only whole measurements; the same command then goes on from them."""
    import signal
    import time

    write_tiny_llama(tmp_path / "model.gguf")
    engine = tmp_path / "llama-server"
    engine.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv[0] = {str(ROOT / 'tests/fakeengine.py')!r}\n"
                      f"runpy.run_path(sys.argv[0], run_name='__main__')\n")
    engine.chmod(0o755)
    (tmp_path / "kit.yaml").write_text("preset: cpu\nmodel: {dir: ., file: model.gguf}\nserve: {concurrency: 2}\n")
    (tmp_path / "space.yaml").write_text("space:\n  serve.concurrency: [1, 2]\n  ubatch: [128, 256, 512]\n")
    args = [sys.executable, "-m", "kit", "tune", "-c", "kit.yaml", "--exec", str(engine), "--port", str(free_port()),
            "--space", "space.yaml", "--requests", "4"]
    # ubatch 128 never gets healthy, so the search cannot end before the signal; the restart on the best known
    # settings (concurrency 1, ubatch 512 after two trials, or the start) is never that point
    env = {**os.environ, "FAKE_ENGINE_HANG_UBATCH": "128"}
    # preexec_fn: Ctrl-C as from a terminal, even where this pytest was started with SIGINT ignored (a script's
    # background job), which the child would inherit and so ignore the test's signal
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    journal = tmp_path / "tune-llama-cpp.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.is_file() and len(journal.read_text().splitlines()) >= 3:  # the header + two measurements
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stdout + stderr
    assert "interrupted" in stdout and "best:" in stdout
    assert "ubatch=128" not in stdout.split("best:")[1]  # the point in flight is not a result
    recorded = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    assert all(r["point"]["ubatch"] != 128 for r in recorded)
    assert all(r["measurement"]["status"] in ("ok", "pruned", "failed") and r["measurement"]["argv"] for r in recorded)
    again = kit(*args[3:], cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resumed: {len(recorded)} measurement(s)" in again.stdout
    assert "best: serve.concurrency=1 ubatch=256" in again.stdout


def test_a_point_where_primary_and_fallback_no_longer_fit_together_is_not_started(big_model):
    # primary and fallback (two copies of the 27B IQ4_XS model, ~13.6 GiB of weights each) on the same 2 x 16 GiB.
    # By hand, per GPU and per copy: ~6.8 GiB of weights; f16 KV = 64 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes
    # = 256 KiB per token, half on each GPU, so one slot of 16384 tokens = 2 GiB per GPU. Alone: ~9 GiB of 16 (fits).
    # Together: ~18 GiB of 16 (does not). With ctx 4096 the two copies fit together (~15 GiB).
    raw = {"model": {"dir": str(big_model.parent), "file": big_model.name, "ctx": 16384},
           "stack": {"fallback": "llama.cpp"}}
    space = tunespace.load("llama.cpp")
    point = tunespace.config_at(raw, "llama.cpp", {"serve.concurrency": 1})
    assert tunespace.rejected(point, "llama.cpp", space).startswith("the stack does not fit together (kit plan --stack)")
    alone = tunespace.config_at({**raw, "stack": {}}, "llama.cpp", {"serve.concurrency": 1})
    assert tunespace.rejected(alone, "llama.cpp", space) == ""
    short = tunespace.config_at({**raw, "model": {**raw["model"], "ctx": 4096}}, "llama.cpp", {"serve.concurrency": 1})
    assert tunespace.rejected(short, "llama.cpp", space) == ""


def test_a_ctrl_c_between_fork_and_popen_returning_leaves_no_engine(tmp_path, monkeypatch):
    """The race CI hit under load: SIGINT arriving inside Popen, after the child exists and before ``runner.proc``
    holds it. Reproduced with the real signal: the real Popen runs, then this process sends itself SIGINT before
    returning. The interrupt must still come (Ctrl-C is not lost), and the engine must be the runner's to stop."""
    import signal
    import time

    from kit import tunerun

    engine = tmp_path / "llama-server"
    engine.write_text("#!/bin/sh\nexec sleep 300\n")
    engine.chmod(0o755)
    real, started = subprocess.Popen, []

    def popen_then_sigint(*args, **kwargs):
        started.append(real(*args, **kwargs))
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # Python runs the handler here, between bytecodes: still inside Popen for the caller
        return started[-1]

    write_tiny_llama(tmp_path / "model.gguf")
    config = cfg.from_dict({"preset": "cpu", "model": {"dir": str(tmp_path), "file": "model.gguf"}})
    monkeypatch.setattr(tunerun.subprocess, "Popen", popen_then_sigint)
    # Ctrl-C as a terminal gives it, whatever this pytest inherited (a script's background job starts with it ignored)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        runner = tunerun.ExecRunner(engine, "llama.cpp", free_port(), tmp_path / "engine.log", timeout_s=5)
        with pytest.raises(KeyboardInterrupt):
            runner.start(config)
        assert runner.proc is started[0], "the engine started must be the runner's"
        runner.close()
        assert started[0].poll() is not None, "close() left the engine running"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C is Ctrl-C again

        # started with SIGINT ignored (nohup): the same signal inside Popen is ignored, not turned into an interrupt
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        runner = tunerun.ExecRunner(engine, "llama.cpp", free_port(), tmp_path / "engine2.log", timeout_s=1)
        with pytest.raises(Exception) as failure:  # the engine (sleep) never gets healthy: the start times out
            runner.start(config)
        assert not isinstance(failure.value, KeyboardInterrupt), failure.value
        assert runner.proc is started[1]
        runner.close()
        assert started[1].poll() is not None
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, inherited)
