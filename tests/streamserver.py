"""A local OpenAI-style streaming server with known timing, for kit bench's tests and overhead benchmark.

ttft_s before the first token, then one token every token_s (0 = as fast as possible). Prompts containing
``__500__`` get an HTTP 500, ``__drop__`` a disconnect mid-stream, ``__hang__`` no reply until the client gives up.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"tok "}}]}\n\n'


class Counter:
    """Completed streams, so a test can wait for "n requests done" instead of sleeping and hoping."""

    def __init__(self) -> None:
        self.done = 0
        self.prompts: list[str] = []
        self.bodies: list[dict] = []
        self.cond = threading.Condition()

    def add(self, prompt: str, body: dict) -> None:
        with self.cond:
            self.done += 1
            self.prompts.append(prompt)
            self.bodies.append(body)
            self.cond.notify_all()

    def wait_for(self, n: int, timeout_s: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.done >= n, timeout_s)


def make_handler(ttft_s: float, token_s: float, usage: bool, api_key: str | None, counter: Counter):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked transfer encoding, as llama.cpp and vLLM stream

        def send_event(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):
            body = json.dumps({"object": "list", "data": [{"id": "stub-model", "object": "model"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            request = json.loads(self.rfile.read(length))
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            prompt = request["messages"][-1]["content"]
            n = int(request.get("max_tokens", 16))
            if "__500__" in prompt:
                self.send_response(500)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", "4")
                self.end_headers()
                self.wfile.write(b"boom")
                return
            if "__hang__" in prompt:
                time.sleep(5)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            start = time.perf_counter()
            time.sleep(ttft_s)
            for i in range(n):
                if token_s and i:
                    # schedule against the start so sleeps do not drift
                    target = start + ttft_s + i * token_s
                    delay = target - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                if "__drop__" in prompt and i == n // 2:
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                self.send_event(TOKEN_EVENT)
                if token_s:
                    self.wfile.flush()
            if usage:
                self.send_event(b"data: " + json.dumps({"choices": [], "usage": {
                    "prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}}).encode() + b"\n\n")
            self.send_event(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            counter.add(prompt, request)

    return Handler


class StreamServer:
    def __init__(self, ttft_s: float = 0.1, token_s: float = 0.02, usage: bool = True, api_key: str | None = None):
        self.counter = Counter()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(ttft_s, token_s, usage, api_key, self.counter))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "StreamServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
