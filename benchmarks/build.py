"""Build benchmark: prints figures, asserts nothing (speed targets live here, not in tests).

    python benchmarks/build.py --source ~/.cache/kit-tests/llama.cpp [--cold]

1. wall time and peak host memory of the llama.cpp cpu-flavor build (--cold: without the layer cache);
2. cached rebuild after a change that touches only serve flags (ctx, draft, batch): must rebuild nothing, because
   serve flags live in compose, not in the image;
3. runtime image size vs builder image size.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kit import build, config as cfg, dockerfile, dockerhost, rules  # noqa: E402


def used_memory_gib() -> float:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kib = lambda key: int(info[key].split()[0])  # noqa: E731
    return (kib("MemTotal") - kib("MemAvailable")) / 2**20


class PeakMemory(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.baseline = used_memory_gib()
        self.peak = self.baseline
        self.running = True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, used_memory_gib())
            time.sleep(0.5)


def timed_build(config, source, **kw):
    steps: list[str] = []

    def echo(line: str) -> None:
        steps.append(line) if "Step " in line else None

    monitor = PeakMemory()
    monitor.start()
    start = time.monotonic()
    result = build.build_engine(config, "llama.cpp", source=source, echo=echo, verbose=False, **kw)
    wall = time.monotonic() - start
    monitor.running = False
    monitor.join()
    return result, wall, monitor.peak - monitor.baseline, len(steps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", type=Path, required=True, help="llama.cpp source tree")
    parser.add_argument("--config", type=Path, default=ROOT / "tests/fixtures/cpu-ci.yaml")
    parser.add_argument("--cold", action="store_true", help="first build without the layer cache")
    args = parser.parse_args()

    config = cfg.load(args.config)
    rules.validate(config)
    result, wall, peak, steps = timed_build(config, args.source, no_cache=args.cold)
    print(f"cpu-flavor build        : {wall:8.1f} s wall, peak host memory +{peak:.2f} GiB, {steps} steps, "
          f"{config.build_jobs()} jobs ({'cold' if args.cold else 'warm cache'})")

    raw = cfg.yaml.safe_load(args.config.read_text())
    raw.setdefault("engines", {}).setdefault("llama.cpp", {}).update(spec_draft_n_max=4, batch=1024)
    raw.setdefault("model", {})["ctx"] = 4096
    changed = cfg.from_dict(raw)
    rules.validate(changed)
    same = dockerfile.render_files(config, "llama.cpp")["Dockerfile"] == dockerfile.render_files(changed, "llama.cpp")["Dockerfile"]
    before = result.image_id
    again, wall2, _, _ = timed_build(changed, args.source)
    print(f"serve-flag-only rebuild : {wall2:8.1f} s wall, Dockerfile identical: {same}, "
          f"same image id: {again.image_id == before} (rebuilt nothing: {again.image_id == before})")

    builder = build.build_engine(config, "llama.cpp", source=args.source, target="builder", echo=lambda _l: None)
    runtime_size = dockerhost.client().images.get(result.tag).attrs["Size"]
    builder_size = dockerhost.client().images.get(builder.tag).attrs["Size"]
    print(f"image sizes             : runtime {runtime_size / 2**20:.0f} MiB, builder {builder_size / 2**20:.0f} MiB, "
          f"ratio runtime/builder {runtime_size / builder_size:.2f}")


if __name__ == "__main__":
    main()
