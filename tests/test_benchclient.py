"""kit bench's HTTP client on its own terms: what goes on the wire, what each way a server can fail becomes, and the
timing of a stream shaped like llama-server's, read with a scripted clock.

The server here is tests/scriptserver.py: it writes exactly the bytes a test gives, so a disconnect lands mid-chunk
and a pause waits for the client instead of a sleep. Event shapes follow llama.cpp's server at kit's pinned ref
(server-task.cpp ``server_task_result_cmpl_partial::to_json_oaicompat_chat``: the first chunk is a role-only delta
with ``"content": null``; ``server_task_result_cmpl_final::to_json_oaicompat_chat_stream``: a closing chunk with
``finish_reason`` and an empty delta, then ``choices: []`` with ``usage`` and the slot's ``timings``;
server-context.cpp: an error mid-stream is ``data: {"error": {...}}`` and no ``[DONE]``; a ping is ``:\\n\\n``).
Every expected value is written out here, not recomputed with the client's formula. Fast on purpose: mutation runs
call these once per mutant.
"""

from __future__ import annotations

import io
import threading

import pytest

from kit import benchclient
from kit.errors import KitError
from tests.scriptserver import (CLOSE, HANG, LAST_CHUNK, Request, ScriptServer, chunk, event, response,
                                stream_head)


def role_chunk() -> dict:
    return {"choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}],
            "object": "chat.completion.chunk"}


def content_chunk(text: str, field: str = "content") -> dict:
    return {"choices": [{"finish_reason": None, "index": 0, "delta": {field: text}}],
            "object": "chat.completion.chunk"}


def closing_chunk() -> dict:
    return {"choices": [{"finish_reason": "length", "index": 0, "delta": {}}], "object": "chat.completion.chunk"}


TIMINGS = {"cache_n": 0, "prompt_n": 9, "prompt_ms": 40.0, "predicted_n": 3, "predicted_ms": 30.0,
           "predicted_per_second": 100.0}


def usage_chunk(completion: int | None = 3, prompt: int | None = 9) -> dict:
    usage = {"total_tokens": 12, "prompt_tokens_details": {"cached_tokens": 0}}
    if completion is not None:
        usage["completion_tokens"] = completion
    if prompt is not None:
        usage["prompt_tokens"] = prompt
    return {"choices": [], "object": "chat.completion.chunk", "usage": usage, "timings": TIMINGS}


def llama_stream(*events: dict | str) -> list[bytes]:
    """A 200 stream of these events, each in its own chunk, then [DONE] and the last chunk."""
    return [stream_head(), *(chunk(event(e)) for e in events), chunk(event("[DONE]")), LAST_CHUNK]


class Clock:
    """Returns the listed instants in order: the client reads its clock once at the send and once per event."""

    def __init__(self, *instants: float) -> None:
        self.instants = list(instants)

    def __call__(self) -> float:
        return self.instants.pop(0)


# -- the URL and the key, before any request --------------------------------------------------------------------


@pytest.mark.parametrize("url", ["localhost:8080", "ftp://127.0.0.1:8080", "http://", "https://"])
def test_a_url_that_is_not_http_is_one_line_naming_the_flag(url):
    with pytest.raises(KitError) as err:
        benchclient.Client(url, None, None, 5)
    assert err.value.line() == f"--url: {url!r} is not an http(s) URL; write it like http://127.0.0.1:8080"


@pytest.mark.parametrize("url, base", [
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
    ("https://llm.example:443/", "https://llm.example:443"),
    ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),
    ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080"),
    ("http://127.0.0.1:8080/proxy/v1//", "http://127.0.0.1:8080/proxy"),
    ("http://127.0.0.1:8080/llm-X/", "http://127.0.0.1:8080/llm-X"),  # only slashes go
])
def test_the_base_url_drops_slashes_and_v1(url, base):
    assert benchclient.Client(url, None, None, 5).base == base


# -- probe: GET /v1/models ----------------------------------------------------------------------------------------


def models_reply(body: bytes, status: int = 200):
    return lambda request: [response(status, body)]


def test_probe_sends_the_key_and_learns_the_first_model():
    body = b'{"object":"list","data":[{"id":"qwen-27b","object":"model"},{"id":"other","object":"model"}]}'
    with ScriptServer(models_reply(body)) as server:
        client = benchclient.Client(server.url + "/v1", "s3cret", None, 5)
        assert client.probe() == "qwen-27b" and client.model == "qwen-27b"
    (request,) = server.requests
    assert (request.method, request.path) == ("GET", "/v1/models")
    assert "Authorization: Bearer s3cret" in request.header_lines


def test_probe_keeps_a_model_given_and_sends_no_key_without_one():
    with ScriptServer(models_reply(b'{"data":[{"id":"served"}]}')) as server:
        client = benchclient.Client(server.url, None, "mine", 5)
        assert client.probe() == "mine"
    assert server.requests[0].header("Authorization") is None


@pytest.mark.parametrize("body", [b"not json", b'{"data":[]}', b'{"object":"list"}', b'{"data":[{"name":"x"}]}',
                                  b"[1]", b'{"data":[{"id":""}]}', b'{"data":[{"id":null}]}'])
def test_probe_names_the_model_default_when_the_list_says_nothing(body):
    with ScriptServer(models_reply(body)) as server:
        client = benchclient.Client(server.url, None, None, 5)
        assert client.probe() == "default" and client.model == "default"


def test_probe_401_names_the_key_flag():
    with ScriptServer(models_reply(b"", status=401)) as server:
        with pytest.raises(KitError) as err:
            benchclient.Client(server.url, "wrong", None, 5).probe()
    assert err.value.line() == (f"--api-key: {server.url} refused the key (401); "
                                "pass the key from .env with --api-key")


def test_probe_other_statuses_are_not_a_key_problem():
    """Only 401 means the key: a 402 or 404 from /v1/models leaves the run to go on (the preflight decides)."""
    for status in (402, 404):
        with ScriptServer(models_reply(b"{}", status=status)) as server:
            assert benchclient.Client(server.url, "k", None, 5).probe() == "default"


def test_probe_with_nothing_listening_is_one_line_naming_the_url():
    with ScriptServer(models_reply(b"")) as server:
        url = server.url
    with pytest.raises(KitError) as err:
        benchclient.Client(url, None, None, 5).probe()
    assert err.value.line() == f"--url: nothing answers at {url} (ConnectionError); start the server or fix the URL"


# -- one request: the body on the wire ----------------------------------------------------------------------------


def test_one_request_sends_the_benchmark_body():
    with ScriptServer(lambda request: llama_stream(content_chunk("hi"))) as server:
        client = benchclient.Client(server.url, "k", "qwen", 5)
        sample = client.one("short", 3, "Write a haiku.", 64, 1234)
    assert sample.ok and (sample.scenario, sample.concurrency) == ("short", 3)
    (request,) = server.requests
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert "Authorization: Bearer k" in request.header_lines
    # what a benchmark must ask: a stream with usage at the end, the same greedy answer length every time, and no
    # reuse of a cached prompt prefix (llama-server's cache_prompt)
    assert request.json == {
        "model": "qwen", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Write a haiku."}], "max_tokens": 64,
        "temperature": 0, "seed": 1234, "ignore_eos": True, "cache_prompt": False,
    }


def test_one_request_without_a_model_asks_for_default():
    with ScriptServer(lambda request: llama_stream(content_chunk("hi"))) as server:
        benchclient.Client(server.url, None, None, 5).one("short", 1, "p", 8, 1)
    assert server.requests[0].json["model"] == "default"
    assert server.requests[0].header("Authorization") is None


# -- one request: timing of a llama-server stream ------------------------------------------------------------------


def test_a_llama_server_stream_times_tokens_only():
    # send at t=100.0; events read at: role-only 100.2 (not a token: content null), reasoning 100.5 (first token),
    # content 100.6, content 100.9, closing chunk 101.0 (empty delta), usage 101.1, then [DONE]; E2EL read at 101.2
    clock = Clock(100.0, 100.2, 100.5, 100.6, 100.9, 101.0, 101.1, 101.2)
    events = (role_chunk(), content_chunk("think", "reasoning_content"), content_chunk("Hel"), content_chunk("lo"),
              closing_chunk(), usage_chunk(completion=3, prompt=9))
    with ScriptServer(lambda request: llama_stream(*events)) as server:
        sample = benchclient.Client(server.url, None, "m", 5, clock=clock).one("short", 1, "p", 3, 1)
    assert sample.ok is True and sample.error == ""
    assert sample.started == 100.0
    assert sample.ttft == pytest.approx(0.5)  # 100.5 - 100.0
    assert sample.itl == pytest.approx([0.1, 0.3])  # 100.6 - 100.5, 100.9 - 100.6
    assert sample.e2el == pytest.approx(1.2)  # 101.2 - 100.0
    assert sample.chunks == 3
    assert (sample.output_tokens, sample.tokens_from, sample.prompt_tokens) == (3, "usage", 9)
    assert sample.server_timings == TIMINGS
    assert clock.instants == []


def test_pings_and_other_lines_are_not_events():
    """llama-server's keep-alive ``:`` comment, an ``event:`` line and blank lines are skipped; ``data:`` without the
    space is still an event (the SSE format allows both)."""
    stream = [stream_head(), chunk(b":\n\n"), chunk(b"event: message\n"), chunk(b'data:{"choices":[{"index":0,'
              b'"delta":{"content":"a"}}]}\n\n'), chunk(b":\n\n"), chunk(event(content_chunk("b"))),
              chunk(event("[DONE]")), LAST_CHUNK]
    clock = Clock(0.0, 1.0, 3.0, 4.0)
    with ScriptServer(lambda request: stream) as server:
        sample = benchclient.Client(server.url, None, "m", 5, clock=clock).one("short", 1, "p", 2, 1)
    assert sample.ok and sample.chunks == 2 and sample.tokens_from == "chunks" and sample.output_tokens == 2
    assert sample.ttft == 1.0 and sample.itl == [2.0] and sample.e2el == 4.0


def test_a_usage_without_completion_tokens_leaves_the_chunks_counted():
    clock = Clock(0.0, 1.0, 2.0, 3.0, 4.0)
    events = (content_chunk("a"), content_chunk("b"), usage_chunk(completion=None, prompt=None))
    with ScriptServer(lambda request: llama_stream(*events)) as server:
        sample = benchclient.Client(server.url, None, "m", 5, clock=clock).one("short", 1, "p", 2, 1)
    assert sample.ok and (sample.output_tokens, sample.tokens_from, sample.prompt_tokens) == (2, "chunks", 0)


def test_a_usage_of_zero_completion_tokens_is_taken_as_said():
    clock = Clock(0.0, 1.0, 2.0, 3.0)
    with ScriptServer(lambda request: llama_stream(content_chunk("a"), usage_chunk(completion=0, prompt=0))) as s:
        sample = benchclient.Client(s.url, None, "m", 5, clock=clock).one("short", 1, "p", 2, 1)
    assert (sample.output_tokens, sample.tokens_from, sample.prompt_tokens) == (0, "usage", 0)


def test_one_token_is_a_sample_and_none_is_a_failure():
    with ScriptServer(lambda request: llama_stream(role_chunk(), content_chunk("x"))) as server:
        one = benchclient.Client(server.url, None, "m", 5).one("short", 1, "p", 1, 1)
    assert one.ok and one.chunks == 1 and one.itl == [] and one.tpot is None
    with ScriptServer(lambda request: llama_stream(role_chunk(), closing_chunk())) as server:
        none = benchclient.Client(server.url, None, "m", 5).one("short", 1, "p", 1, 1)
    assert none.ok is False and none.error == "no tokens streamed"


# -- one request: every way it can fail is a sample's error, never raised -------------------------------------------


def test_an_http_error_keeps_the_status_and_120_characters_of_the_body():
    body = ("x" * 119 + "ABCDEF").encode()  # the cut falls after the first A
    with ScriptServer(lambda request: [response(500, body, "text/plain")]) as server:
        sample = benchclient.Client(server.url, None, "m", 5).one("long", 4, "p", 8, 1)
    assert sample.ok is False and sample.error == "HTTP 500: " + "x" * 119 + "A"
    assert (sample.scenario, sample.concurrency) == ("long", 4)


def test_a_server_error_event_mid_stream():
    # server-context.cpp: format_error -> format_oai_sse(json {{"error", res_json}}), then the stream ends
    message = "the request exceeds the available context size, try increasing it " * 3
    error = {"code": 400, "message": message, "type": "exceed_context_size_error"}
    stream = [stream_head(), chunk(event(content_chunk("a"))), chunk(event({"error": error})), LAST_CHUNK]
    with ScriptServer(lambda request: stream) as server:
        sample = benchclient.Client(server.url, None, "m", 5).one("long", 1, "p", 8, 1)
    assert sample.ok is False and sample.error == "server error: " + str(error)[:120]
    assert len(sample.error) == len("server error: ") + 120


def test_a_stream_without_done_is_a_disconnect():
    stream = [stream_head(), chunk(event(content_chunk("a"))), LAST_CHUNK]
    with ScriptServer(lambda request: stream) as server:
        sample = benchclient.Client(server.url, None, "m", 5).one("short", 1, "p", 8, 1)
    assert sample.ok is False and sample.error == "disconnected: the stream ended before [DONE]"


def test_a_connection_cut_mid_chunk_is_a_disconnect():
    half = chunk(event(content_chunk("b")))[:12]
    with ScriptServer(lambda request: [stream_head(), chunk(event(content_chunk("a"))), half, CLOSE]) as server:
        sample = benchclient.Client(server.url, None, "m", 5).one("short", 1, "p", 8, 1)
    assert sample.ok is False and sample.error == "disconnected: ProtocolError"


def test_a_connection_closed_before_any_reply_is_a_disconnect():
    with ScriptServer(lambda request: [CLOSE]) as server:
        sample = benchclient.Client(server.url, None, "m", 5).one("short", 1, "p", 8, 1)
    assert sample.ok is False and sample.error == "disconnected: ConnectionError"


def test_a_bad_event_is_a_bad_stream():
    stream = [stream_head(), chunk(b"data: {not json\n\n"), LAST_CHUNK]
    with ScriptServer(lambda request: stream) as server:
        sample = benchclient.Client(server.url, None, "m", 5).one("short", 1, "p", 8, 1)
    assert sample.ok is False and sample.error.startswith("bad stream: Expecting property name")


def test_no_reply_and_a_stalled_stream_are_timeouts():
    with ScriptServer(lambda request: [HANG]) as server:
        silent = benchclient.Client(server.url, None, "m", 1).one("short", 1, "p", 8, 1)
    with ScriptServer(lambda request: [stream_head(), chunk(event(content_chunk("a"))), HANG]) as server:
        stalled = benchclient.Client(server.url, None, "m", 1).one("short", 1, "p", 8, 1)
    assert silent.ok is False and silent.error == "timeout after 1s"
    assert stalled.ok is False and stalled.error == "timeout after 1s"


# -- stopping: Ctrl-C sets an Event ---------------------------------------------------------------------------------


def test_a_stop_before_the_request_sends_nothing():
    stop = threading.Event()
    stop.set()
    with ScriptServer(lambda request: llama_stream(content_chunk("a"))) as server:
        sample = benchclient.Client(server.url, None, "m", 5, clock=Clock(), stop=stop).one("short", 1, "p", 8, 1)
    assert server.requests == []
    assert sample.ok is False and sample.error == benchclient.INTERRUPTED == "interrupted" and sample.started == 0.0


def test_a_stop_mid_stream_ends_at_the_next_chunk_as_interrupted():
    stop = threading.Event()
    sent_first = threading.Event()

    def clock_that_stops() -> float:  # the client reads its clock at the send, then on the first token: stop there
        if sent_first.is_set():
            stop.set()
        sent_first.set()
        return 0.0

    # the server holds the rest of the stream until it is released at the end of the test: only the stop can end
    # the read in time
    release = threading.Event()
    stream = [stream_head(), chunk(event(content_chunk("a"))), release, chunk(event(content_chunk("b"))),
              chunk(event("[DONE]")), LAST_CHUNK]
    with ScriptServer(lambda request: stream) as server:
        client = benchclient.Client(server.url, None, "m", 5, clock=clock_that_stops, stop=stop)
        done: dict = {}
        worker = threading.Thread(target=lambda: done.update(sample=client.one("short", 1, "p", 8, 1)))
        worker.start()
        worker.join(timeout=10)
        returned = not worker.is_alive()
        release.set()
    assert returned, "the request went on reading after the stop"
    sample = done["sample"]
    assert sample.ok is False and sample.error == benchclient.INTERRUPTED and sample.chunks == 1


def test_a_stop_after_a_finished_stream_keeps_the_sample():
    stop = threading.Event()

    def clock() -> float:
        return 0.0

    with ScriptServer(lambda request: llama_stream(content_chunk("a"))) as server:
        client = benchclient.Client(server.url, None, "m", 5, clock=clock, stop=stop)
        sample = client.one("short", 1, "p", 8, 1)
        stop.set()  # after: the finished sample stays a sample
    assert sample.ok and sample.error == ""


# -- the line reader ----------------------------------------------------------------------------------------------


class Pieces(io.RawIOBase):
    """A response body arriving in the given pieces, read1 returning one piece per call (urllib3 2's HTTPResponse
    has read1)."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = list(pieces)

    def read1(self, size: int = -1) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


class ReadOnly:
    """A body with read() only, as urllib3 1.26's HTTPResponse: read(n) returns up to n bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.sizes: list[int] = []

    def read(self, size: int) -> bytes:
        self.sizes.append(size)
        out, self.data = self.data[:size], self.data[size:]
        return out


class Reply:
    def __init__(self, raw) -> None:
        self.raw = raw


def test_lines_split_across_reads_and_crlf_endings():
    raw = Pieces(b"data: {\"a\"", b":1}\r\n\r\nid: X\r\nretry: 1 \r\nda", b"ta: [DONE]\r", b"\n",
                 b"tail without newline ")
    # only the CR of a CRLF goes: "id: X" keeps its X, "retry: 1 " and the tail their spaces
    assert list(benchclient._sse_lines(Reply(raw))) == [b'data: {"a":1}', b"", b"id: X", b"retry: 1 ",
                                                        b"data: [DONE]", b"tail without newline "]


def test_a_body_without_read1_is_read_in_kilobytes():
    raw = ReadOnly(b"data: x\n" * 300)  # 2400 bytes: three reads of 1024 and the empty one that ends it
    lines = list(benchclient._sse_lines(Reply(raw)))
    assert lines == [b"data: x"] * 300
    assert raw.sizes == [1024, 1024, 1024, 1024]


def test_the_reader_stops_when_told():
    stop = threading.Event()
    stop.set()
    assert list(benchclient._sse_lines(Reply(Pieces(b"data: x\n")), stop)) == []


def test_the_first_event_is_read_before_the_next_is_sent():
    """The reader must hand over an event as soon as its bytes arrive (read1), not wait for a buffer to fill: the
    server sends the rest of the stream only after the client has timed the first token."""
    first_timed = threading.Event()
    reads = []

    def clock() -> float:
        reads.append(1)
        if len(reads) == 2:  # the send, then the first token
            first_timed.set()
        return float(len(reads))

    stream = [stream_head(), chunk(event(content_chunk("a"))), first_timed, chunk(event(content_chunk("b"))),
              chunk(event("[DONE]")), LAST_CHUNK]
    with ScriptServer(lambda request: stream) as server:
        sample = benchclient.Client(server.url, None, "m", 30, clock=clock).one("short", 1, "p", 2, 1)
    # had the reader waited for more bytes, the server would have waited out its 10 s for first_timed
    assert sample.ok and sample.ttft == 1.0 and server.waits_timed_out == 0


def test_request_objects_record_what_arrived():
    request = Request("GET", "/", ["Authorization: Bearer k", "Host: x"])
    assert request.header("authorization") == "Bearer k" and request.header("Content-Length") is None


def test_each_worker_thread_keeps_its_own_session():
    """requests.Session is not thread-safe: one per worker thread, reused for its requests (keep-alive), never
    shared."""
    client = benchclient.Client("http://127.0.0.1:9", None, None, 5)
    mine = client.session()
    other: list = []
    worker = threading.Thread(target=lambda: other.append(client.session()))
    worker.start()
    worker.join()
    assert client.session() is mine and other[0] is not mine
