"""How many streamed tokens per second kit bench's client consumes on one core, from a local server that streams
as fast as it can. It must stay far above the ~480 tok/s the fastest seed engine makes, so the client never
bottlenecks a real measurement. Prints figures (one run, ratios in the same run).

    python benchmarks/bench_overhead.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kit import benchclient  # noqa: E402
from tests.streamserver import StreamServer  # noqa: E402

SEED_FASTEST = 480.0  # NInfer, 4 concurrent total (seed 000)


def main() -> None:
    try:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # client (and server threads) on one core
    except (AttributeError, OSError):
        pass
    with StreamServer(ttft_s=0.0, token_s=0.0) as server:
        client = benchclient.Client(server.url, None, None, timeout_s=60)
        client.probe()
        for label, conc in (("1 stream", 1), ("4 streams", 4)):
            from concurrent.futures import ThreadPoolExecutor

            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=conc) as pool:
                samples = list(pool.map(lambda _i: client.one("long", conc, "x", 4000, 1), range(conc * 5)))
            wall = time.perf_counter() - start
            tokens = sum(s.output_tokens for s in samples if s.ok)
            rate = tokens / wall
            print(f"{label:9s}: {tokens} tokens in {wall:.2f} s = {rate:10.0f} tok/s consumed "
                  f"({rate / SEED_FASTEST:.0f}x the fastest seed engine's {SEED_FASTEST:.0f} tok/s)")


if __name__ == "__main__":
    main()
