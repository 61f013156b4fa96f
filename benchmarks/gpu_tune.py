"""`kit tune --exec` on a real GPU: parallel slots, ubatch and the K/V cache types of a 27B-shape GGUF.

Two steps, because the GPU machine has no Docker and no network:

  python benchmarks/gpu_tune.py prepare --dir .gpu-tune     # here: the llama.cpp source at kit's ref, a 27B-shape
                                                             # GGUF header (real 151,936-token vocabulary, no MTP
                                                             # layers), and wheels of kit's own dependencies
  python3 benchmarks/gpu_tune.py run --dir .gpu-tune --out OUT --budget 330   # there: build llama-server for that
                                                             # GPU (as the image builds it), install kit from the
                                                             # wheels, then `kit tune --exec` itself

The run is the real verb: kit's search, kit's serve argv for every trial, kit bench's client; only the runner is the
local process (no Docker there). The weights are a hole (zeros), so speeds show the serving shape (slots, batching,
KV types), not a model's quality; speculative decoding is left out (its acceptance rate means nothing there).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# what kit imports for `kit tune --exec` (the rest of its dependencies serve Docker, 1Panel and the hubs)
RUNTIME = ["pydantic", "typer", "rich", "pyyaml", "requests"]
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
SPACE = """\
# parallel slots, ubatch and the K/V cache types (issue #16's GPU run); speculative decoding is off on random weights
space:
  serve.concurrency: [1, 2, 4, 8]
  ubatch: [256, 512, 1024]
  cache_type_k: [f16, q8_0]
  cache_type_v: [f16, q8_0]
constraints:
  - {setting: ubatch, at_most: batch}
"""


def prepare(folder: Path, source: Path) -> None:
    from benchmarks import gpu_presets

    gpu_presets.prepare(folder, source)
    wheels = folder / "wheels"
    wheels.mkdir(exist_ok=True)
    for version in PYTHONS:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version",
                        version, "--implementation", "cp", "--platform", "manylinux2014_x86_64", "--platform",
                        "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64", "-d", str(wheels), *RUNTIME],
                       check=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d",
                    str(wheels), "gguf"], check=True)  # its numpy is the GPU machine's own
    (folder / "space.yaml").write_text(SPACE)
    print(f"prepared {folder}")


def install(folder: Path) -> Path:
    site = folder / "site"
    if not (site / "pydantic").is_dir():
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(folder / "wheels"),
               "--target", str(site)]
        subprocess.run([*pip, *RUNTIME], check=True)
        subprocess.run([*pip, "--no-deps", "gguf"], check=True)
    return site


def run(folder: Path, out: Path, budget_s: float) -> None:
    from benchmarks import gpu_presets

    began = time.monotonic()
    folder, out = folder.resolve(), out.resolve()
    plan, model, binary = gpu_presets.setup(folder, out)
    site = install(folder)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.splitlines()[0].split(", ")
    (folder / "kit.yaml").write_text(
        "# the GPU machine: one GPU as nvidia-smi names it, the 27B-shape model, 4 users at 16K each\n"
        f"hardware: {{gpu_model: {gpu[0]}, gpus: 1, memory_gib: {int(gpu[1]) / 1024:.1f}, archs: [90], "
        "interconnect: none, device_ids: ['0']}\n"
        f"model: {{dir: {folder.resolve()}, file: {model.name}, name: qwen-27b-shape, ctx: 16384}}\n"
        "serve: {concurrency: 4}\n"
        "engines:\n  llama.cpp: {split_mode: none, tensor_split: [1]}\n")
    left = budget_s - (time.monotonic() - began)
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    cmd = [sys.executable, "-m", "kit", "tune", "-c", str(folder / "kit.yaml"), "--exec", str(binary),
           "--space", str(folder / "space.yaml"), "--objective", "throughput", "--budget", f"{max(60, left):.0f}",
           "--journal", str(folder / "gpu-tune-h200.jsonl"), "--plot", str(out / "gpu-tune-h200.png"), "--timeout", "240"]
    print("$ " + " ".join(cmd), flush=True)
    with (out / "gpu-tune-h200.txt").open("w") as log:
        done = subprocess.run(cmd, env={**env, "COLUMNS": "200"}, cwd=folder, stdout=log, stderr=subprocess.STDOUT)
    # the journal stays in --dir (a second call on the same machine resumes from it); a copy comes back
    for name, kept in (("gpu-tune-h200.jsonl", "gpu-tune-h200.jsonl"), ("tune-llama-cpp.log", "gpu-tune-engine.log")):
        if (folder / name).exists():
            shutil.copy2(folder / name, out / kept)
    print((out / "gpu-tune-h200.txt").read_text()[-6000:], flush=True)
    print(f"kit tune exited {done.returncode} after {time.monotonic() - began:.0f}s in all", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=["prepare", "run"])
    parser.add_argument("--dir", type=Path, default=Path(".gpu-tune"))
    parser.add_argument("--out", type=Path, default=Path("gpu-tune-results"))
    parser.add_argument("--budget", type=float, default=330, help="seconds for build + tune together")
    parser.add_argument("--source", type=Path, default=Path.home() / ".cache/kit-tests/llama.cpp")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.dir, args.source)
    else:
        run(args.dir, args.out, args.budget)


if __name__ == "__main__":
    main()
