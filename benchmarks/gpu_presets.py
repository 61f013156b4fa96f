"""Each GPU preset's rendered llama-server argv on a real GPU, and what 4 users get: default slots vs `--parallel 1`.

Two steps, because the GPU machine has no Docker, no network and no pydantic:

  python benchmarks/gpu_presets.py prepare --dir .gpu     # here: the argv of every preset, a 27B-shape GGUF
                                                           # header (real 151,936-token vocabulary, no MTP layers)
                                                           # and the llama.cpp source at kit's ref
  python3 benchmarks/gpu_presets.py run --dir .gpu --out OUT   # there: build llama-server for that GPU, start
                                                           # every argv on the sparse model, then the load table

The weights are a hole (zeros), so speeds show the serving shape (slots, batching, KV), not a model's quality;
speculative decoding is left out (its acceptance rate means nothing on random or zero weights).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL_NAME = "model-27b.gguf"
# what the source needs to build llama-server (the rest of the tree is docs, models and other tools' data)
SOURCE_SKIP = ("docs/", "models/", "media/", "benches/", "tests/", "examples/", "gguf-py/", "conversion/", ".git")
PROMPT_TOKENS, OUTPUT_TOKENS, USERS, ROUNDS = 1291, 128, 4, 3


def prepare(folder: Path, source: Path) -> None:
    from kit import config as cfg, dockerfile, resolve
    from tests.ggufmodels import SHAPES_27B, write_sparse_27b

    folder.mkdir(parents=True, exist_ok=True)
    model = Path(tempfile.mkdtemp()) / MODEL_NAME  # sparse, 15 GB apparent: never inside what travels
    write_sparse_27b(model, "Q4_0", {**SHAPES_27B}, arch="llama", vocab=True)
    # the header (keys, vocabulary, tensor table) travels; the run extends it with a hole to the full size
    head = _header_length(model)
    (folder / "model.head").write_bytes(model.open("rb").read(head))
    presets = {}
    for name in cfg.presets():
        config = cfg.from_dict({"preset": name, "model": {"dir": str(model.parent), "file": MODEL_NAME}})
        if "llama.cpp" not in config.engine_names() or config.hardware.gpus == 0:
            continue
        presets[name] = list(resolve.engine(config, "llama.cpp").argv)
    default = presets["dual-v100-nvlink"]
    old = _without(default, "--parallel", "--kv-unified-per-slot") + ["--ctx-size", "16384", "--parallel", "1"]
    # the two compiles exactly as the image's Dockerfile runs them (core without CUDA, then the CUDA module)
    facts = dockerfile.template_values(cfg.from_dict({"preset": "dual-v100-nvlink"}), "llama.cpp", ca_bundle=False)
    builds = {"core": {"flags": facts["cmake_flags"], "targets": facts["targets"], "files": None},
              "backend": {"flags": facts["backend"]["cmake_flags"], "targets": [facts["backend"]["target"]],
                          "files": facts["backend"]["files"]}}
    (folder / "plan.json").write_text(json.dumps({"size": model.stat().st_size, "presets": presets, "build": builds,
                                                  "load": {"default (--parallel 4)": default,
                                                           "before (--parallel 1)": old}}, indent=1))
    with tarfile.open(folder / "llama.cpp.tar.gz", "w:gz") as tar:
        for path in sorted(source.rglob("*")):
            rel = path.relative_to(source).as_posix()
            if path.is_file() and not rel.startswith(SOURCE_SKIP):
                tar.add(path, arcname=f"llama.cpp/{rel}")
    print(f"prepared {folder}: {len(presets)} presets, header {head} bytes of {model.stat().st_size}")


def _header_length(model: Path) -> int:
    """Bytes before the tensor data (keys, vocabulary, tensor table, alignment padding)."""
    from kit import ggufheader

    return ggufheader.read(model).data_offset


def _without(argv: list[str], *flags: str) -> list[str]:
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token in flags:
            skip = True
        else:
            out.append(token)
    return out


def build(folder: Path, out: Path, builds: dict) -> Path:
    """The image's two compiles (the core without CUDA; the CUDA backend module on its own) for this GPU's arch,
    put together in one folder as the image's /app is."""
    app = folder / "app"
    if (app / "llama-server").exists():
        return app / "llama-server"
    with tarfile.open(folder / "llama.cpp.tar.gz") as tar:
        tar.extractall(folder, filter="data")
    arch = os.environ.get("KIT_GPU_ARCH", "90-real")
    start = time.monotonic()
    app.mkdir(exist_ok=True)
    log = out / "build.log"
    with log.open("w") as f:
        for part, spec in builds.items():
            # this machine's arch and CUDA; the image's NCCL_ROOT and host compiler are the image's
            flags = [f"-D{k}={arch if k == 'CMAKE_CUDA_ARCHITECTURES' else v.strip(chr(34))}" for k, v in spec["flags"]
                     if k not in ("NCCL_ROOT", "CMAKE_CUDA_HOST_COMPILER")]
            tree = f"llama.cpp/build-{part}"
            subprocess.run(["cmake", "-S", "llama.cpp", "-B", tree, *flags], cwd=folder, check=True, stdout=f,
                           stderr=subprocess.STDOUT)
            targets = [x for t in spec["targets"] for x in ("--target", t)]
            subprocess.run(["cmake", "--build", tree, *targets, "-j", str(os.cpu_count() or 4)], cwd=folder,
                           check=True, stdout=f, stderr=subprocess.STDOUT)
            bin_dir = folder / tree / "bin"
            names = spec["files"] or [p.name for p in bin_dir.iterdir() if p.name == "llama-server" or ".so" in p.name]
            for name in names:
                shutil.copy2(bin_dir / name, app / name, follow_symlinks=True)
    print(f"built llama-server (core + {builds['backend']['files']}) for sm_{arch} in "
          f"{time.monotonic() - start:.0f}s", flush=True)
    return app / "llama-server"


def visible_gpus() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return len([line for line in out.splitlines() if line.startswith("GPU ")])


def on_this_machine(argv: list[str], gpus: int) -> tuple[list[str], str]:
    """A two-GPU argv on a one-GPU machine: --device keeps the GPUs that exist (said in the results)."""
    if "--device" not in argv:
        return argv, ""
    i = argv.index("--device") + 1
    wanted = argv[i].split(",")
    if len(wanted) <= gpus:
        return argv, ""
    return argv[:i] + [",".join(wanted[:gpus])] + argv[i + 1:], f"--device {argv[i]} -> {','.join(wanted[:gpus])}"


def serve(binary: Path, argv: list[str], model: Path, port: int, log: Path, env: dict | None = None) -> subprocess.Popen:
    argv = [model.as_posix() if a == f"/models/{MODEL_NAME}" else a for a in argv]
    argv = _without(argv, "--port", "--host") + ["--host", "127.0.0.1", "--port", str(port)]
    argv, _ = on_this_machine(argv, visible_gpus())
    return subprocess.Popen([str(binary), *argv], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 240) -> float:
    import requests

    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return time.monotonic() - start
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"not healthy in {timeout_s:.0f}s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def load(url: str) -> dict:
    """USERS clients at once, ROUNDS times: unique ~1291-token prompts, 128 tokens each (ignore_eos)."""
    from kit import benchclient, benchstats

    client = benchclient.Client(url, None, None, 300)
    client.probe()
    samples, start = [], time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(USERS) as pool:
        futures = [pool.submit(client.one, "load", USERS, f"[{i}] " + "x" * (PROMPT_TOKENS - 10), OUTPUT_TOKENS, 1)
                   for i in range(USERS * ROUNDS)]
        samples = [f.result() for f in futures]
    summary = benchstats.summarize(samples, time.perf_counter() - start)
    return {"total_tps": round(summary.output_tps, 1), "ttft_median_s": round(summary.ttft.get("median", 0), 3),
            "ttft_p90_s": round(summary.ttft.get("p90", 0), 3),
            "decode_tps_median": round(summary.decode_tps.get("median", 0), 1), "failures": summary.failures,
            "prompt_tokens": summary.prompt_processed, "errors": summary.errors}


def setup(folder: Path, out: Path) -> tuple[dict, Path, Path]:
    """The plan, the sparse model (header + a hole to the full size) and llama-server built for this GPU."""
    out.mkdir(parents=True, exist_ok=True)
    plan = json.loads((folder / "plan.json").read_text())
    model = folder / MODEL_NAME
    if not model.exists():
        model.write_bytes((folder / "model.head").read_bytes())
        os.truncate(model, plan["size"])
    return plan, model, build(folder, out, plan["build"])


def run(folder: Path, out: Path) -> None:
    import requests

    plan, model, binary = setup(folder, out)
    results: dict = {"gpu": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True).stdout.strip(), "presets": {}, "load": {}}
    port = 18080
    for name, argv in plan["presets"].items():
        port += 1
        log = out / f"{name}.log"
        proc = serve(binary, argv, model, port, log)
        entry: dict = {"argv": argv}
        try:
            entry["load_s"] = round(wait_healthy(proc, f"http://127.0.0.1:{port}"), 1)
            reply = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})
            entry["completion"] = reply.status_code
            props = requests.get(f"http://127.0.0.1:{port}/props", timeout=10).json()
            entry["slots"] = props.get("total_slots")
            entry["n_ctx_slot"] = props.get("default_generation_settings", {}).get("n_ctx")
            entry["started"] = reply.status_code == 200
        except Exception as exc:  # noqa: BLE001 - a preset that fails is the result, with its log
            entry["started"] = False
            entry["error"] = str(exc)
        finally:
            stop(proc)
        text = log.read_text(errors="replace")
        entry["device_note"] = on_this_machine(argv, visible_gpus())[1]
        entry["offload"] = [line.strip() for line in text.splitlines() if "offloaded" in line][-1:]
        entry["log_tail"] = text.splitlines()[-6:]
        results["presets"][name] = entry
        print(f"{name}: {'started' if entry['started'] else 'FAILED'} {entry.get('load_s', '')}", flush=True)
    results["no_gpu"] = without_gpu(binary, plan["presets"]["dual-v100-nvlink"], model, out)
    print(f"no GPU visible: {results['no_gpu']}", flush=True)
    for label, argv in plan["load"].items():
        port += 1
        proc = serve(binary, argv, model, port, out / f"load-{label.split()[0]}.log")
        try:
            wait_healthy(proc, f"http://127.0.0.1:{port}")
            results["load"][label] = load(f"http://127.0.0.1:{port}")
        except Exception as exc:  # noqa: BLE001
            results["load"][label] = {"error": str(exc)}
        finally:
            stop(proc)
        print(f"{label}: {results['load'][label]}", flush=True)
    (out / "gpu_presets.json").write_text(json.dumps(results, indent=1))


def without_gpu(binary: Path, argv: list[str], model: Path, out: Path) -> dict:
    """The CUDA module cannot start (no GPU visible): --version still works (the module is loaded, not linked),
    and the default argv exits naming the device instead of serving from the CPU."""
    hidden = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, env=hidden, timeout=60)
    log = out / "no-gpu.log"
    proc = serve(binary, argv, model, 18099, log, env={"CUDA_VISIBLE_DEVICES": ""})
    try:
        code = proc.wait(120)
    except subprocess.TimeoutExpired:
        stop(proc)
        code = None
    text = log.read_text(errors="replace")
    return {"version_rc": version.returncode, "version": (version.stdout + version.stderr).strip().splitlines()[-2:],
            "serve_rc": code, "invalid_device_line": [l for l in text.splitlines() if "invalid device" in l][:1]}


def memory(folder: Path, out: Path) -> None:
    """What llama.cpp allocates for the default slots vs one slot vs a unified pool: its own log lines and
    nvidia-smi's used memory once the server is up."""
    import re

    plan, model, binary = setup(folder, out)
    default = plan["load"]["default (--parallel 4)"]
    variants = {"--parallel 4 --kv-unified-per-slot 16384 (kit)": default,
                "--parallel 4 --kv-unified-per-slot 16384 --kv-unified": default + ["--kv-unified"],
                "--parallel 1 --ctx-size 16384 (before)": plan["load"]["before (--parallel 1)"]}
    results = {}
    port = 18200
    for label, argv in variants.items():
        port += 1
        log = out / f"memory-{port}.log"
        proc = serve(binary, argv + ["-lv", "4"], model, port, log)
        try:
            wait_healthy(proc, f"http://127.0.0.1:{port}")
            used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True).stdout.strip()
            text = log.read_text(errors="replace")
            results[label] = {
                "gpu_used_mib": int(used.splitlines()[0]) if used else None,
                "kv": re.findall(r"KV buffer size = +([0-9.]+) MiB", text),
                "compute": re.findall(r"CUDA0 compute buffer size = +([0-9.]+) MiB", text),
                "model": re.findall(r"CUDA0 model buffer size = +([0-9.]+) MiB", text),
                "slots": re.findall(r"n_slots = \d+, n_ctx_slot = \d+, kv_unified = '\w+'", text),
            }
        except Exception as exc:  # noqa: BLE001
            results[label] = {"error": str(exc)}
        finally:
            stop(proc)
        print(f"{label}: {results[label]}", flush=True)
    (out / "gpu_memory.json").write_text(json.dumps(results, indent=1))


# (label, --parallel, tokens per slot, --ubatch-size, --flash-attn): the compute buffer's inputs, one at a time
COMPUTE_VARIANTS = [
    ("kit default", 4, 16384, 512, "on"), ("ubatch 256", 4, 16384, 256, "on"), ("ubatch 1024", 4, 16384, 1024, "on"),
    ("1 slot of 4096", 1, 4096, 512, "on"), ("4 slots of 32768", 4, 32768, 512, "on"),
    ("flash off", 4, 16384, 512, "off"), ("flash off, 1 slot", 1, 16384, 512, "off"),
    ("flash off, 4 x 4096", 4, 4096, 512, "off"), ("flash off, ubatch 256", 4, 16384, 256, "off"),
]


def compute(folder: Path, out: Path) -> None:
    """llama.cpp's compute buffer and the CUDA context for each COMPUTE_VARIANTS entry: its own log lines, and
    nvidia-smi's used memory less what the log accounts for (model, KV, compute) as the context."""
    import re

    plan, model, binary = setup(folder, out)
    base = _without(plan["load"]["default (--parallel 4)"], "--parallel", "--kv-unified-per-slot", "--batch-size",
                    "--ubatch-size", "--flash-attn", "--device", "--split-mode", "--tensor-split")
    results = {}
    port = 18300
    for label, slots, ctx, ubatch, flash in COMPUTE_VARIANTS:
        port += 1
        argv = base + ["--parallel", str(slots), "--kv-unified-per-slot", str(ctx), "--batch-size",
                       str(max(ubatch, 512)), "--ubatch-size", str(ubatch), "--flash-attn", flash]
        log = out / f"compute-{port}.log"
        proc = serve(binary, argv + ["-lv", "4"], model, port, log)
        try:
            wait_healthy(proc, f"http://127.0.0.1:{port}")
            used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True).stdout.strip()
            text = log.read_text(errors="replace")
            mib = lambda pattern: sum(float(x) for x in re.findall(pattern, text))  # noqa: E731
            entry = {"slots": slots, "ctx": ctx, "ubatch": ubatch, "flash": flash,
                     "gpu_used_mib": int(used.splitlines()[0]) if used else None,
                     "model_mib": mib(r"CUDA0 model buffer size = +([0-9.]+) MiB"),
                     "kv_mib": mib(r"CUDA0 KV buffer size = +([0-9.]+) MiB"),
                     "compute_mib": mib(r"CUDA0 compute buffer size = +([0-9.]+) MiB"),
                     "host_compute_mib": mib(r"CUDA_Host compute buffer size = +([0-9.]+) MiB"),
                     "outputs": re.findall(r"n_outputs_max += (\d+)", text)[:1]}
            if entry["gpu_used_mib"]:
                entry["context_mib"] = round(entry["gpu_used_mib"] - entry["model_mib"] - entry["kv_mib"]
                                             - entry["compute_mib"], 1)
            results[label] = entry
        except Exception as exc:  # noqa: BLE001
            results[label] = {"error": str(exc)}
        finally:
            stop(proc)
        print(f"{label}: {results[label]}", flush=True)
    (out / "gpu_compute.json").write_text(json.dumps(results, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["prepare", "run", "memory", "compute"])
    parser.add_argument("--dir", type=Path, default=ROOT / ".gpu")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    parser.add_argument("--source", type=Path, default=Path.home() / ".cache/kit-tests/llama.cpp")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.dir, args.source)
    elif args.step == "memory":
        memory(args.dir, args.out)
    elif args.step == "compute":
        compute(args.dir, args.out)
    else:
        run(args.dir, args.out)


if __name__ == "__main__":
    main()
