#!/usr/bin/env python3
"""A stand-in for llama-server with a response surface the test knows, for kit tune.

It takes llama-server's own argv (the flags kit renders from images/llama.cpp.yaml: --parallel, --ubatch-size,
--batch-size, --host, --port, ...; unknown flags are ignored as llama-server would reject none of kit's), answers
/health, /v1/models and streaming /v1/chat/completions (tests/streamserver.py), and decodes one token every
``token_s(parallel, ubatch)`` seconds. ``--ubatch-size 1024`` dies at start with llama.cpp's CUDA OOM line (the line
ggml-cuda.cpp's ggml_backend_cuda_buffer_type_alloc_buffer logs), as a card that cannot hold the compute buffer does.

``--parallel 4`` serves, but first logs the WARN ggml-cuda.cu prints when NCCL cannot start (ggml_cuda_...: "NCCL init
failed (%s); falling back to internal AllReduce"): a silent 20% loss the seeds hit, which a tune must not keep.

``FAKE_ENGINE_HANG_UBATCH=N``: a start with ``--ubatch-size N`` never gets healthy (it sleeps), so a search that must
try that point cannot end before a test interrupts it, whatever the machine's speed.

The surface (ms per token): BASE_MS x UBATCH[ubatch] x PARALLEL[parallel]; its optimum is ubatch 256, parallel 1.
The factors are 3x apart or more, so the order of trials does not depend on the machine's timing noise.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.streamserver import Counter, make_handler  # noqa: E402

BASE_MS = 0.5
UBATCH = {128: 6.0, 256: 1.0, 512: 3.0}
PARALLEL = {1: 1.0, 2: 3.0, 4: 9.0}
NCCL_WARN = "NCCL init failed (unhandled system error); falling back to internal AllReduce"
OOM = ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1536.00 MiB on device 0: "
       "cudaMalloc failed: out of memory")


def token_s(parallel: int, ubatch: int) -> float:
    return BASE_MS * UBATCH[ubatch] * PARALLEL[parallel] / 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--ubatch-size", type=int, default=512)
    args, _ = parser.parse_known_args()
    print(f"fake llama-server: parallel {args.parallel}, ubatch {args.ubatch_size}", flush=True)
    if os.environ.get("FAKE_ENGINE_HANG_UBATCH") == str(args.ubatch_size):
        threading.Event().wait()
    if args.ubatch_size not in UBATCH:
        print(OOM, flush=True)
        sys.exit(1)
    if args.parallel == 4:
        print(NCCL_WARN, flush=True)
    handler = make_handler(0.001, token_s(args.parallel, args.ubatch_size), True, None, Counter())
    httpd = ThreadingHTTPServer((args.host, args.port), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print("main: server is listening", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
