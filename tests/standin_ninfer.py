"""A stand-in NInfer: a tiny OpenAI-compatible server (standard library only) that tests/wheelhouse.py packages as the
``ninfer`` wheel, under NInfer's entry-point name, to prove kit's ``wheel`` recipe end to end on a machine without a
GPU: built from a wheelhouse with no index, started with the argv kit renders, reached through the front door.

It is strict where a real GPU engine would fail: an unknown flag exits 2 (argparse), and, like a CUDA program in a
container, it stops when the NVIDIA hook did not give it the driver (no ``libcuda.so.1``) or fewer GPUs than its
tensor-parallel size (``NVIDIA_VISIBLE_DEVICES``). It loads the image's NCCL (``NCCL_SO_PATH``) and asks
``ncclGetVersion``, which needs no GPU, and prints what it found.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LIBCUDA = Path("/usr/lib/x86_64-linux-gnu/libcuda.so.1")
REPLY = "hello from the stand-in ninfer"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ninfer")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve")
    serve.add_argument("--model", required=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--quantization", choices=["nf4", "none"], default="none")
    serve.add_argument("--max-model-len", type=int, required=True)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument("--tensor-parallel-size", type=int, default=1)
    serve.add_argument("--dtype", choices=["float16"], default="float16")
    return parser.parse_args(argv)


def nccl_version() -> int:
    lib = ctypes.CDLL(os.environ["NCCL_SO_PATH"])
    version = ctypes.c_int()
    if lib.ncclGetVersion(ctypes.byref(version)) != 0:
        raise SystemExit("ncclGetVersion failed")
    return version.value


def handler(args: argparse.Namespace, key: str | None):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_a):  # quiet
            pass

        def send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorized(self) -> bool:
            if key and self.headers.get("Authorization") != f"Bearer {key}":
                self.send(401, {"error": {"message": "invalid api key"}})
                return False
            return True

        def do_GET(self):  # noqa: N802
            if self.path == "/health":
                self.send(200, {"status": "ok"})
            elif self.path == "/v1/models" and self.authorized():
                self.send(200, {"object": "list", "data": [{"id": Path(args.model).name, "object": "model"}]})
            elif self.path != "/v1/models":
                self.send(404, {"error": {"message": self.path}})

        def do_POST(self):  # noqa: N802
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                self.send(404, {"error": {"message": self.path}})
                return
            if not self.authorized():
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            words = REPLY.split()[: max(1, int(body.get("max_tokens") or 16))]
            chat = self.path.endswith("chat/completions")
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i, word in enumerate(words):
                    piece = word if i == 0 else " " + word
                    delta = {"delta": {"content": piece}} if chat else {"text": piece}
                    self.wfile.write(f"data: {json.dumps({'choices': [{'index': 0, **delta}]})}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(0.01)
                self.wfile.write(b"data: [DONE]\n\n")
                return
            text = " ".join(words)
            choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            self.send(200, {"object": "chat.completion" if chat else "text_completion", "model": body.get("model"),
                            "choices": [{"index": 0, "finish_reason": "length", **choice}],
                            "usage": {"prompt_tokens": 4, "completion_tokens": len(words),
                                      "total_tokens": 4 + len(words)}})

    return Handler


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if not Path(args.model).exists():
        print(f"error: model {args.model} not found", file=sys.stderr)
        return 1
    if not LIBCUDA.exists():
        print(f"error: CUDA driver not found ({LIBCUDA.name}: cannot open shared object file)", file=sys.stderr)
        return 1
    visible = [d for d in os.environ.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if d and d != "void"]
    if len(visible) < args.tensor_parallel_size:
        print(f"error: tensor parallel size {args.tensor_parallel_size} needs {args.tensor_parallel_size} GPUs, "
              f"{len(visible)} visible", file=sys.stderr)
        return 1
    print(f"ninfer stand-in: GPUs {','.join(visible)}, NCCL {nccl_version()}, model {args.model}, "
          f"ctx {args.max_model_len}", flush=True)
    server = ThreadingHTTPServer((args.host, args.port), handler(args, os.environ.get("NINFER_API_KEY")))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
