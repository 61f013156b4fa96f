"""How long `kit plan` takes to read a 27B (14 GB) GGUF's header and tensor table. Prints figures; the target is
"well under a second". Uses a sparse file with real tensor shapes, so it needs no disk.

    python benchmarks/plan_read.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kit import config, modelinfo, plan  # noqa: E402
from tests.ggufmodels import write_sparse_27b  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    path = write_sparse_27b(Path(tmp) / "27b.gguf")
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        info = modelinfo.read(path)
        plan.make_plan(config.from_dict({}), info)
        runs.append(time.perf_counter() - start)
    size = path.stat().st_size / 1e9
    print(f"read header + tensor table + plan of a {size:.1f} GB GGUF ({len(info.tensors)} tensors): "
          f"best {min(runs) * 1000:.1f} ms, median {sorted(runs)[2] * 1000:.1f} ms")
