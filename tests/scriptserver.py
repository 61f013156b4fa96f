"""A raw HTTP/1.1 server on 127.0.0.1 that writes, byte for byte, what the test scripts, for kit bench's client.

``StreamServer`` (tests/streamserver.py) is a well-behaved OpenAI server with timing; this one answers whatever a
test needs to break the client with: a status line and headers of its choosing, chunk framing written by hand, a
connection closed in the middle of a chunk, a reply that never comes, a pause until the client has shown it read an
event. The request is recorded as it arrived on the wire (header names as sent, the JSON body).

The stream shapes the tests write are those of llama.cpp's server at kit's pinned ref (tools/server/ in the tree
llama-cpp-python 0.3.36 vendors): ``format_oai_sse`` (server-common.cpp) writes each event as ``data: <json>\\n\\n``,
``res->set_chunked_content_provider`` (server-http.cpp) sends them with chunked transfer encoding, a keep-alive ping
is ``:\\n\\n`` and the stream ends with ``data: [DONE]\\n\\n`` (server-context.cpp).
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Callable, Union

HANG = "hang"  # stop writing, keep the socket open until the server closes
CLOSE = "close"  # close the socket now (mid-chunk if the script says so)
Step = Union[bytes, threading.Event, str]


@dataclass
class Request:
    method: str
    path: str
    header_lines: list[str]  # as sent: "Authorization: Bearer k"
    body: bytes = b""
    arrived: threading.Event = field(default_factory=threading.Event)

    @property
    def json(self) -> dict:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        for line in self.header_lines:
            key, _, value = line.partition(":")
            if key.lower() == name.lower():
                return value.strip()
        return None


def response(status: int, body: bytes = b"", content_type: str = "application/json") -> bytes:
    reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 500: "Internal Server Error"}.get(status, "Status")
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode() + body)


def stream_head() -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


def event(obj: dict | str) -> bytes:
    """One SSE event as format_oai_sse writes it."""
    return b"data: " + (obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))).encode() + b"\n\n"


class ScriptServer:
    """Each request gets ``reply(request)``: a list of steps (bytes written as they are, an Event waited for, HANG,
    CLOSE). The connection closes after the script, and the replies say so (``Connection: close``): a client that
    pooled it would race the close on its next request."""

    def __init__(self, reply: Callable[[Request], list[Step]]) -> None:
        self.reply = reply
        self.requests: list[Request] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.closing = threading.Event()
        self.waits_timed_out = 0  # Event steps that were never set within their 10 s
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> "ScriptServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.closing.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept(): a closed socket alone keeps listening
        except OSError:
            pass
        self.sock.close()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
            head, _, body = data.partition(b"\r\n\r\n")
            request_line, *lines = head.decode("latin-1").split("\r\n")
            method, path, _ = request_line.split(" ", 2)
            request = Request(method, path, lines)
            length = int(request.header("Content-Length") or 0)
            while len(body) < length:
                body += conn.recv(65536)
            request.body = body
            self.requests.append(request)
            request.arrived.set()
            for step in self.reply(request):
                if isinstance(step, threading.Event):
                    if not step.wait(10):
                        self.waits_timed_out += 1
                elif step == HANG:
                    self.closing.wait(30)
                    return
                elif step == CLOSE:
                    conn.shutdown(socket.SHUT_RDWR)
                    return
                else:
                    try:
                        conn.sendall(step)
                    except OSError:  # the client has gone (it read [DONE] and closed): nothing more to say
                        return
