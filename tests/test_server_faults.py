"""Faults a client or an operator can cause, each answered by a clean 4xx or a clean exit: the
fault probes of issue 26 (F1-F12), against the real server (tiny preset, CPU)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from openai import OpenAI
from test_server import Server, server

from decodecliff.engine.config import EngineConfig
from decodecliff.engine.engine import Engine
from decodecliff.server import protocol
from decodecliff.server.app import make_app
from decodecliff.server.guard import Settings, parse_body
from decodecliff.server.tokenizer import ByteTokenizer

GEN = b'"sampling_params": {"max_new_tokens": 2}'
NESTED = b"[" * 900 + b"]" * 900


@pytest.fixture(scope="module")
def srv() -> Iterator[Server]:
    with server("--max-total-tokens", "4096", "--upload-timeout", "1") as s:
        yield s


def post(srv: Server, content: bytes, **headers: str) -> httpx.Response:
    return httpx.post(srv.url + "/generate", content=content, headers=headers, timeout=60)


# (probe, body, headers, status, a fragment of the message)
PROBES = [
    ("F1 a 5000-digit integer", b'{"input_ids": [' + b"9" * 5000 + b"]}", {}, 400, "JSON"),
    *[
        (f"F2 charset {cs}", b'{"text": "hi"}', {"Content-Type": f"application/json; charset={cs}"},
         400, "charset")
        for cs in ("rot13", "base64", "hex", "zlib", "unknown", "klingon")
    ],
    ("F3 broken gzip", b"not gzip", {"Content-Encoding": "gzip"}, 400, "unreadable"),
    ("F3 broken deflate", b"not deflate", {"Content-Encoding": "deflate"}, 400, "unreadable"),
    ("F4 deep nesting in a big body", b'{"text": "' + b"a" * (2 << 20) + b'", "stream": '
     + NESTED + b"}", {}, 400, "nested too deeply"),
    ("F4 deep nesting", b'{"text": "a", "stream": ' + NESTED + b"}", {}, 400, "nested too deeply"),
    ("F4 nesting within the limit", b'{"text": "a", "stream": ' + b"[" * 20 + b"]" * 20 + b"}",
     {}, 400, "stream must be true or false"),
    ("F4 unbalanced brackets", b"[" * 200_000, {}, 400, "nested"),
    ("F5 text/plain", b'{"text": "hi"}', {"Content-Type": "text/plain"}, 415, "application/json"),
    ("F5 a form", b"text=hi", {"Content-Type": "application/x-www-form-urlencoded"}, 415,
     "application/json"),
    ("F5 a rebound Host", b'{"text": "hi"}', {"Host": "evil.example:80"}, 403, "Host"),
    ("F5 a foreign Origin", b'{"text": "hi"}', {"Origin": "https://evil.example"}, 403, "Origin"),
    ("F5 a sandboxed page", b'{"text": "hi"}', {"Origin": "null"}, 403, "Origin"),
    ("F5 an unclosed IPv6 Host", b'{"text": "hi"}', {"Host": "[::1"}, 400, "malformed Host"),
    ("F5 a bracketed non-address Host", b'{"text": "hi"}', {"Host": "[zz]:1"}, 400,
     "malformed Host"),
    ("F5 a malformed Origin", b'{"text": "hi"}', {"Origin": "http://[zz"}, 400, "malformed Origin"),
    ("F6 a fan-out of 2000 x 64", b'{"text": ["a"' + b', "a"' * 1999 + b'], "sampling_params": '
     b'{"n": 64}}', {}, 400, "at most 256"),
    ("unknown fields", b'{"text": "a", "mystery": 1}', {}, 400, "mystery"),
    ("a long value", b'{"text": "a", "stream": "' + b"x" * 100_000 + b'"}', {}, 400, "stream"),
    ("a stop string too long", b'{"text": "a", "sampling_params": {"stop": "' + b"x" * 4097
     + b'"}}', {}, 400, "at most 4096 characters"),
    ("a neutral list given as 0", b'{"text": "a", "lora_path": 0}', {}, 400, "lora_path = 0"),
    ("a false flag given as 0", b'{"text": "a", "return_hidden_states": 0}', {}, 400,
     "return_hidden_states = 0"),
]  # fmt: skip


@pytest.mark.parametrize("body,headers,status,fragment", [p[1:] for p in PROBES],
                         ids=[p[0] for p in PROBES])  # fmt: skip
def test_malformed_requests_get_a_short_4xx(srv, body, headers, status, fragment):
    resp = post(srv, body, **headers)
    assert resp.status_code == status, resp.text[:300]
    message = resp.json()["error"]["message"]
    assert fragment in message and len(message) < 400  # values are truncated
    assert srv.get("/health").status_code == 200


def test_a_stop_string_forming_is_held_back_by_one_pass_over_the_output() -> None:
    """What is held back is the longest proper prefix of a stop string that the output ends
    with, read token by token (never the whole output again: long stops cost no more)."""
    import random

    from decodecliff.server.jobs import _forming

    rng = random.Random(7)
    for _ in range(2000):
        stops = [tuple(rng.choices(range(3), k=rng.randint(1, 8))) for _ in range(3)]
        out, forming = [], [0] * len(stops)
        for token in rng.choices(range(3), k=40):
            out.append(token)
            forming = [_forming(s, k, token) for s, k in zip(stops, forming, strict=True)]
            held = max(
                k for s in stops for k in range(min(len(s) - 1, len(out)) + 1)
                if tuple(out[len(out) - k :]) == s[:k]
            )  # fmt: skip
            assert max(forming) == held, (stops, out)


def test_a_same_site_page_and_plain_clients_are_served(srv):
    ok = b'{"text": "hi", ' + GEN + b"}"
    assert post(srv, ok, Origin=f"http://localhost:{srv.port}").status_code == 200
    assert post(srv, ok, Host="localhost").status_code == 200
    assert post(srv, ok).status_code == 200  # no Content-Type: taken as JSON
    assert post(srv, ok, **{"Content-Type": "application/json; charset=utf-8"}).status_code == 200


def test_f9_a_stalled_upload_is_answered_and_closed(srv):
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        head = "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: 1000\r\n\r\n".encode() + b'{"text": "a')
        answer = b""
        while chunk := sock.recv(4096):  # the server closes the connection after answering
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408") and b"not received within 1 s" in answer


def test_a_batch_of_too_many_prompts_is_refused_before_each_is_read(srv):
    """A batch over the prompt bound is refused by its count before any prompt is read (reading
    300k prompts and their parameters first took tens of seconds of the interpreter the engine
    and the event loop share): its last prompt, which reading would refuse, is never reached."""
    content = json.dumps({"input_ids": [[1]] * 300_000 + [["x"]]}).encode()
    resp = post(srv, content)
    assert resp.status_code == 400 and "at most 256" in resp.json()["error"]["message"]


def test_many_repeated_stop_token_ids_leave_the_outputs_as_they_were(srv):
    """A million stop token ids (one repeated) shared by a batch of 16 are taken, and the
    outputs are those without them (the id never came)."""
    prompts = [[(7 * i + j) % 500 + 1 for j in range(20)] for i in range(16)]

    def outputs(extra: dict) -> list[list[int]]:
        body = {"input_ids": prompts, "sampling_params": {"max_new_tokens": 24, **extra}}
        resp = post(srv, json.dumps(body).encode())
        assert resp.status_code == 200, resp.text[:300]
        return [o["output_ids"] for o in resp.json()]

    plain = outputs({})
    unseen = min(set(range(500)) - {t for out in plain for t in out})
    assert outputs({"stop_token_ids": [unseen] * 1_000_000}) == plain


def test_a_batch_s_one_sampling_params_object_is_read_once(monkeypatch):
    """Sampling parameters given once for a batch are read once, not once per prompt (a long
    stop list was validated 16 times over); a list of them is read one by one."""
    reads: list[dict] = []
    read = protocol._sampling
    monkeypatch.setattr(protocol, "_sampling", lambda sp, *a: reads.append(sp) or read(sp, *a))
    lim = protocol.Limits(vocab_size=512, max_tokens=4096, tokenizer=ByteTokenizer(512))
    sp = {"max_new_tokens": 4, "stop_token_ids": [3] * 10_000}
    parsed = protocol.parse_generate({"input_ids": [[1, 2]] * 16, "sampling_params": sp}, lim)
    assert len(reads) == 1 and len(parsed.params) == 16
    reads.clear()
    protocol.parse_generate({"input_ids": [[1, 2]] * 2, "sampling_params": [sp, dict(sp)]}, lim)
    assert len(reads) == 2


def test_f7_a_big_body_is_decoded_and_validated_off_the_event_loop():
    threads: list[str] = []

    def parse(body: object) -> int:
        threads.append(threading.current_thread().name)
        return len(body["x"])

    async def handler(request: web.Request) -> web.Response:
        _, n = await parse_body(request, Settings(parse_off_loop=1000), parse)
        return web.json_response(n)

    async def main() -> list[int]:
        app = web.Application()
        app.router.add_post("/", handler)
        async with TestClient(TestServer(app)) as client:
            sizes = []
            for n in (10, 10_000):
                resp = await client.post("/", json={"x": [1] * n})
                sizes.append(await resp.json())
            return sizes

    assert asyncio.run(main()) == [10, 10_000]
    assert threads[0] == threading.main_thread().name != threads[1]


# a flood of requests --------------------------------------------------------------------------
def _until(srv: Server, key: str, value: int, deadline_s: float = 30) -> None:
    """Wait until the server's info shows ``key == value`` (it counts what the engine holds)."""
    deadline = time.monotonic() + deadline_s
    while (seen := srv.get("/get_server_info").json()[key]) != value:
        assert time.monotonic() < deadline, f"{key} stayed {seen}, not {value}"
        time.sleep(0.02)


@pytest.mark.slow  # a server of its own
def test_a_full_queue_answers_503_with_retry_after_and_health_stays_fast():
    def send(prompts: int) -> httpx.Response:
        body = {"input_ids": [[1, 2, 3]] * prompts, "sampling_params": {"max_new_tokens": 4}}
        return httpx.post(s.url + "/generate", json=body, timeout=120)

    def background(body: dict) -> threading.Thread:
        # answered 503 "shutting down" when the server stops (the long one never finishes)
        thread = threading.Thread(
            target=lambda: httpx.post(s.url + "/generate", json=body, timeout=120), daemon=True
        )
        thread.start()
        return thread

    with server("--max-running-requests", "1", "--max-queued-requests", "3") as s:
        long = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 60000}}
        senders = [background(long)]
        _until(s, "running_requests", 1)
        senders.append(background({"input_ids": [[1, 2, 3]] * 2}))  # a fan-out of 2 queues
        _until(s, "waiting_requests", 2)
        busy = send(2)
        assert busy.status_code == 503, busy.text
        assert busy.headers["Retry-After"] == "1"
        assert "2 of 3 queued" in busy.json()["error"]["message"]
        never = send(4)
        assert never.status_code == 400 and "--max-queued-requests" in never.text
        senders.append(background({"input_ids": [4, 5, 6]}))  # the last free place
        _until(s, "waiting_requests", 3)
        assert send(1).status_code == 503
        start = time.monotonic()
        assert s.get("/health").status_code == 200 and time.monotonic() - start < 0.5
        assert s.get("/get_server_info").json()["max_queued_requests"] == 3
        assert s.stop() == 0
    for thread in senders:
        thread.join(30)


def _streams_reset_at_once(port: int, streams: int, read_s: float) -> None:
    """``streams`` streams of /generate, read for ``read_s`` seconds, then all their sockets closed
    at once and abruptly (a reset, SO_LINGER 0), as a client process interrupted closes them."""
    sampling = {"max_new_tokens": 2000, "ignore_eos": True}
    body = json.dumps(
        {"input_ids": list(range(3, 40)), "sampling_params": sampling, "stream": True}
    )
    head = "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    socks = []
    with selectors.DefaultSelector() as sel:
        for _ in range(streams):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            socks.append(sock)
            sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode())
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ)
        end = time.monotonic() + read_s
        while time.monotonic() < end:  # read as a client does: the server streams at its pace
            for key, _ in sel.select(0.05):
                with contextlib.suppress(BlockingIOError):
                    key.fileobj.recv(1 << 16)
    for sock in socks:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


@pytest.mark.slow  # a server of its own, and rounds of streams
def test_streaming_clients_that_leave_at_once_log_no_traceback(tmp_path):
    """Rounds of many streaming clients closing their sockets at once, abruptly: a client that
    leaves mid-stream is no error of the server's. Its log shows no traceback (a write to a stream
    whose client had just left escaped the handler as aiohttp's ClientConnectionResetError, logged
    as "Error handling request" with its traceback, a few in most rounds), /health answers, and
    the requests are given up, their slots back in the pool."""
    log = tmp_path / "server.log"
    with (
        open(log, "w") as err,
        server("--max-total-tokens", "100000", "--max-running-requests", "32", stderr=err) as s,
    ):
        for _ in range(6):  # a busy loop, its streams' chunks long: a traceback in most rounds
            _streams_reset_at_once(s.port, 32, read_s=1.5)
            assert s.get("/health").status_code == 200
        _until(s, "running_requests", 0)
        frag = s.get("/get_server_info").json()["fragmentation"]
        assert frag["free_pages"] == frag["num_pages"]
    text = log.read_text()
    assert "Traceback" not in text and "Error handling request" not in text, text[-3000:]


# who may call ------------------------------------------------------------------------------------
@pytest.mark.slow  # a server of its own
def test_f5_the_api_key_guards_everything_but_health():
    with server("--max-total-tokens", "1024", "--api-key", "s3cret") as s:
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
        denied = httpx.post(s.url + "/generate", json=body, timeout=30)
        assert denied.status_code == 401 and denied.json()["error"]["code"] == 401
        assert denied.headers["WWW-Authenticate"] == "Bearer"
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.post(s.url + "/generate", json=body, headers=wrong).status_code == 401
        key = {"Authorization": "Bearer s3cret"}
        assert httpx.post(s.url + "/generate", json=body, headers=key).status_code == 200
        assert httpx.get(s.url + "/get_server_info").status_code == 401
        for path in ("/health", "/ping", "/metrics"):
            assert httpx.get(s.url + path).status_code == 200, path
        client = OpenAI(base_url=s.url + "/v1", api_key="s3cret", max_retries=0)
        assert client.completions.create(model="tiny", prompt="a", max_tokens=2).choices
        # a key of bytes that are not UTF-8 (no client library sends one: a raw request)
        answer = _raw_request(
            s,
            b"GET /get_server_info HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer s3cr\xe9t\r\nConnection: close\r\n\r\n",
        )
        assert answer.startswith(b"HTTP/1.1 401"), answer[:300]
        assert s.get("/health").status_code == 200


def _raw_request(srv: Server, request: bytes) -> bytes:
    """The server's whole answer to ``request``, sent as bytes (the connection closed after)."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


# shutting down and starting ----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_f10_f11_a_signal_with_a_full_queue_takes_the_shutdown_path(sig):
    s = Server("--max-total-tokens", "2048")
    try:
        body = {"input_ids": [[1, 2, 3]] * 256, "sampling_params": {"max_new_tokens": 1000}}
        answers: list[httpx.Response] = []
        sender = threading.Thread(
            target=lambda: answers.append(httpx.post(s.url + "/generate", json=body, timeout=60))
        )
        sender.start()
        while s.get("/get_server_info").json()["waiting_requests"] < 200:
            time.sleep(0.05)
        s.proc.send_signal(sig)
        assert s.proc.wait(timeout=30) == 0  # the shutdown path, not death by the signal
        sender.join(30)
        assert answers and answers[0].status_code == 503
        assert "shutting down" in answers[0].json()["error"]["message"]
        assert "Traceback" not in s.proc.stderr.read()
    finally:
        s.proc.kill()


@pytest.mark.usefixtures("one_thread")
def test_a_request_whose_engine_stops_while_its_body_comes_gets_503_at_once():
    """A handler checks the engine, then awaits the body: an engine that stops meanwhile (a
    signal's shutdown) refuses the request at once, where its request sat in an inbox nobody read
    until the server's shutdown bound closed the connection unanswered. (In-process: a served
    server stops reading bodies once it closes, so the instant is made here by stopping the
    engine alone.)"""
    engine = Engine(EngineConfig(max_total_tokens=1024))
    engine.start()

    async def main() -> tuple[int, dict]:
        async with TestClient(TestServer(make_app(engine, Settings(), "tiny"))) as client:

            async def body() -> AsyncIterator[bytes]:
                yield b'{"input_ids": [1, 2, 3], '
                assert (await client.get("/health")).status == 200  # the handler has begun
                await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
                yield b'"sampling_params": {"max_new_tokens": 2}}'

            async with asyncio.timeout(30):  # the request used to wait here for good
                resp = await client.post("/generate", data=body())
                return resp.status, await resp.json()

    try:
        status, answer = asyncio.run(main())
    finally:
        engine.shutdown()
    assert status == 503 and answer["error"]["message"] == "server shutting down"


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--port", "70000"], "port 70000 is not in 1-65535 (or 0 for a free one)"),
        pytest.param(["--max-total-tokens", str(10**15)], "allocate", marks=pytest.mark.slow),
        pytest.param(["--max-running-requests", str(10**12)], "allocate", marks=pytest.mark.slow),
        (["--max-request-mb", "0"], "not a positive finite number"),
        (["--max-request-mb", "inf"], "not a positive finite number"),
        (["--max-request-mb", "1e-9"], "less than 0.000976562"),
        (["--upload-timeout", "inf"], "not a positive finite number"),
    ],
    ids=["port", "pool", "max-running", "body-limit", "body-inf", "body-tiny", "upload-inf"],
)
def test_f12_impossible_settings_are_one_line_errors(args, fragment):
    cmd = [sys.executable, "-m", "decodecliff.cli", "serve", "--device", "cpu", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert fragment in lines[-1] and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len([ln for ln in lines if "error" in ln]) == 1


@pytest.mark.slow  # starts a server that fails
def test_a_tokenizer_that_cannot_be_written_leaves_no_partial_file(tmp_path):
    """A file size limit (as a full disk) stops the tokenizer's write: a one-line error, and
    nothing half-written in the tokenizer's folder."""

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))

    folder = tmp_path / "tokenizer"
    cmd = [sys.executable, "-m", "decodecliff.cli", "serve", "--preset", "tiny", "--device"]
    cmd += ["cpu", "--port", "0", "--max-total-tokens", "1024", "--tokenizer-dir", str(folder)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, preexec_fn=small_files)
    assert done.returncode == 2 and "File too large" in done.stderr, done.stderr[-2000:]
    assert [p.name for p in folder.iterdir()] == []
