"""How long `kit plan` takes to read a real-shaped 27B GGUF (14 GB, a 151,936-token vocabulary) and plan it, next to
`gguf.GGUFReader` on the same file in the same run. Target: well under 0.3 s for kit. A sparse file, so no disk.

    python benchmarks/plan_read.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gguf  # noqa: E402

from kit import config, modelinfo, plan  # noqa: E402
from tests.ggufmodels import write_sparse_27b  # noqa: E402


def best_of(n: int, fn) -> float:
    runs = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return min(runs)


with tempfile.TemporaryDirectory() as tmp:
    path = write_sparse_27b(Path(tmp) / "27b.gguf", vocab=True)
    stack = config.from_dict({})
    ours = best_of(5, lambda: plan.make_plan(stack, modelinfo.read(path)))
    theirs = best_of(1, lambda: gguf.GGUFReader(str(path)))
    info = modelinfo.read(path)
    print(f"{path.stat().st_size / 1e9:.1f} GB GGUF, {len(info.tensors)} tensors, {info.n_vocab} tokens")
    print(f"kit: header + tensor table + plan: {ours * 1000:.0f} ms (best of 5)")
    print(f"gguf.GGUFReader alone:             {theirs * 1000:.0f} ms")
    print(f"ratio: {theirs / ours:.0f}x")
