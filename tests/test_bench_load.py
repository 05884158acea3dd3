"""`decodecliff bench-load`: its options are checked before the server starts, and a load where
every client walks away still gives its record and summary."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import proctree
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from decodecliff.bench import load


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--preset", "bogus"], "--preset 'bogus': one of"),
        (["--device", "gpu"], "--device 'gpu': cpu or cuda"),
        (["--requests", "0"], "--requests must be at least 1"),
        (["--threads", "0"], "--threads must be at least 1"),
        (["--max-running-requests", "0"], "--max-running-requests must be at least 1"),
        (["--disconnect-fraction", "2"], "--disconnect-fraction must be in 0..1"),
        (["--disconnect-fraction", "nan"], "--disconnect-fraction must be in 0..1"),
        (["--max-total-tokens", "10"], "--max-total-tokens must hold the longest request"),
        (["--start-timeout", "0"], "--start-timeout must be positive finite seconds"),
        (["--start-timeout", "inf"], "--start-timeout must be positive finite seconds"),
        (["--stall-timeout", "0"], "--stall-timeout must be positive finite seconds"),
        (["--stall-timeout", "-1"], "--stall-timeout must be positive finite seconds"),
        (["--stall-timeout", "nan"], "--stall-timeout must be positive finite seconds"),
    ],
)
def test_bad_options_are_refused_before_the_server_starts(tmp_path, capsys, args, said) -> None:
    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    with pytest.raises(SystemExit) as exc:
        load.parse_args([*args, "--out", str(kept)])
    assert exc.value.code == 2 and said in capsys.readouterr().err
    assert kept.read_text() == "{}"


def test_an_out_that_cannot_be_written_is_refused(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        load.parse_args(["--out", str(tmp_path)])
    assert "--out:" in capsys.readouterr().err


def test_a_server_that_does_not_start_is_a_clear_error(tmp_path, capsys) -> None:
    """A --server-arg the server refuses: its own message, then this command's, no traceback."""
    out = tmp_path / "load.json"
    assert load.cli(["--requests", "2", "--server-arg=--bogus", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "decodecliff bench-load: the server did not start (exit code " in err
    assert not out.exists()


@pytest.mark.slow  # a server and a load
def test_a_load_where_every_client_walks_away_is_recorded(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    cmd = [sys.executable, "-m", "decodecliff.cli", "bench-load", "--requests", "4"]
    cmd += ["--disconnect-fraction", "1", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(out.read_text())["summary"]
    assert summary["completed"] == 0 and summary["disconnected"] == 4
    assert "p99 latency -," in done.stdout and "checks passed" in done.stdout


@pytest.mark.parametrize(
    ("n", "q", "rank"),
    [(10, 50, 5), (100, 99, 99), (100, 50, 50), (4, 50, 2), (2, 50, 1), (10, 90, 9), (7, 99, 7)],
)
def test_percentiles_are_the_nearest_rank(n: int, q: float, rank: int) -> None:
    """The value at rank ceil(q% x n) of the sorted values (p50 of 1..10 is 5, p99 of 1..100 is
    99), whatever the order they came in."""
    values = [float(v) for v in range(n, 0, -1)]
    assert load.percentile(values, q) == rank
    assert load.percentile([], q) is None


def test_an_errored_request_is_not_counted_completed() -> None:
    """Two requests read to the end, one of them answered with an error: one completed, one
    errored, and its time is no latency of a completed request."""
    ok = load.Job(0, "generate", [1], 2, None, [5, 6], [5, 6], 200, None, 0.5, 0.1)
    bad = load.Job(1, "generate", [1], 2, None, [5, 6], [], 503, "HTTP 503", 9.0, None)
    run = {
        "wall_s": 1.0,
        "health": [(200, 0.01)],
        "info": {"fragmentation": {"free_pages": 8, "num_pages": 8}, "running_requests": 0},
        "faults": [],
    }
    summary = load.summarize([ok, bad], run)
    assert (summary["completed"], summary["errored"], summary["disconnected"]) == (1, 1, 0)
    assert summary["requests_per_s"] == 1.0 and summary["latency_s"]["max"] == 0.5
    assert not summary["checks"]["no_errors_on_completed"] and not summary["ok"]


def _run_stream(job: load.Job, answer: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """``job`` streamed by bench-load's client from a stand-in server that ``answer`` answers."""

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/generate", answer)
        app.router.add_post("/v1/completions", answer)
        async with TestServer(app) as srv, httpx.AsyncClient(base_url=str(srv.make_url(""))) as c:
            await asyncio.wait_for(load.run_stream(c, job), 30)

    asyncio.run(main())


def _sse(*payloads: bytes) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for payload in payloads:
            await resp.write(b"data: " + payload + b"\n\n")
        return resp

    return answer


@pytest.mark.parametrize(
    ("api", "chunk", "said"),
    [
        ("generate", b'{"output_ids": [5, 6', "malformed stream chunk"),
        ("generate", b"[5, 6]", "malformed stream chunk"),
        ("generate", b'{"output_ids": 7}', "malformed stream chunk"),
        ("completions", b'{"choices": ["ab"]}', "malformed stream chunk"),
        ("completions", b'{"choices": [{"text": 7}]}', "malformed stream chunk"),
        ("generate", b'{"error": "engine died"}', "engine died"),
    ],
)
def test_a_chunk_it_cannot_read_is_that_request_s_error(api: str, chunk: bytes, said: str) -> None:
    """A server's chunk that is no JSON object of the API's shape, or an error event of another
    shape than OpenAI's, fails that request with the reason; the load goes on (it was an
    exception that ended the whole bench with no record)."""
    job = load.Job(0, api, [1, 2], 4, None)
    first = b'{"output_ids": [5]}' if api == "generate" else b'{"choices": [{"text": "a"}]}'
    _run_stream(job, _sse(first, chunk, b"[DONE]"))
    assert job.error is not None and said in job.error
    assert job.latency_s is None and len(job.tokens) == 1


def test_an_error_answer_that_is_not_utf8_is_recorded() -> None:
    """A non-200 answer whose body is not UTF-8 (a proxy's page) is that request's error."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=502, body=b"<html>\xff\xfe bad gateway</html>")

    job = load.Job(0, "generate", [1, 2], 4, None)
    _run_stream(job, answer)
    assert job.status == 502 and "bad gateway" in job.error


def test_a_stream_that_ends_before_done_is_errored_not_completed() -> None:
    """A stream the server closed without [DONE] did not complete, whatever it carried: no
    latency among the completed requests' (it was counted completed)."""
    job = load.Job(0, "generate", [1, 2], 2, None)
    _run_stream(job, _sse(b'{"output_ids": [5]}', b'{"output_ids": [5, 6]}'))
    assert job.error == "stream ended before [DONE]" and job.latency_s is None
    job = load.Job(0, "generate", [1, 2], 2, None)
    _run_stream(job, _sse(b'{"output_ids": [5]}', b'{"output_ids": [5, 6]}', b"[DONE]"))
    assert job.error is None and job.latency_s is not None and job.tokens == [5, 6]


def test_events_are_read_as_sse_says() -> None:
    """A chunk over two data lines is one chunk; `event: error` fails the request with its
    message, whatever its data's shape (the first was malformed, the second ignored)."""
    job = load.Job(0, "generate", [1, 2], 2, None)
    _run_stream(job, _sse(b'{"output_ids":\ndata: [5, 6]}', b"[DONE]"))
    assert job.error is None and job.tokens == [5, 6]
    job = load.Job(0, "generate", [1, 2], 2, None)
    _run_stream(job, _sse(b'{"output_ids": [5]}', b"out of pages\nevent: error", b"[DONE]"))
    assert job.error == "out of pages" and job.latency_s is None


@pytest.mark.timeout(60)
def test_a_cancelled_load_stops_its_health_polls() -> None:
    """The load cancelled under its streams, as Ctrl-C cancels it: the /health poller is
    cancelled with it (it polled on, the client closed, and asyncio printed the RuntimeError it
    ended with as a traceback)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        text = "max_tokens" in body
        n = body["max_tokens"] if text else body["sampling_params"]["max_new_tokens"]
        if not body["stream"]:
            return web.json_response(
                {"choices": [{"text": "a" * n}]} if text else {"output_ids": [97] * n}
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.Event().wait()  # a stream that never ends
        return resp

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    def pollers() -> list[asyncio.Task]:
        return [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "poll_health"]

    async def main() -> list[asyncio.Task]:
        app = web.Application()
        app.router.add_post("/generate", answer)
        app.router.add_post("/v1/completions", answer)
        app.router.add_get("/health", health)
        async with TestServer(app) as srv:
            jobs = load.make_jobs(2, 0, 0, 512)
            task = asyncio.create_task(load.load(str(srv.make_url("")), jobs))
            while not pollers():  # the references served, the streams under way
                await asyncio.sleep(0.01)
            polling = pollers()
            task.cancel()
            await asyncio.wait([task, *polling])
            return polling

    polling = asyncio.run(main())
    assert len(polling) == 1 and polling[0].cancelled(), polling


def _stand_in(leftovers, started: list[subprocess.Popen], argv: Callable[[int], list[str]]):
    """A start_server for bench-load that runs ``argv(port)``'s stand-in server (appended to
    ``started``) once it printed the ready line."""

    def start_server(args, port: int) -> tuple[subprocess.Popen, list[str]]:
        cmd = [sys.executable, "-c", *argv(port)]
        started.append(leftovers.popen(cmd, stdout=subprocess.PIPE, text=True))
        assert started[-1].stdout.readline().startswith(load.READY)
        return started[-1], cmd

    return start_server


STUBBORN = (  # a server that ignores SIGTERM (hung in its shutdown)
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    f"print({load.READY!r} + 'http://127.0.0.1:1', flush=True); time.sleep(120)"
)


def test_a_server_that_outlives_sigterm_is_killed_and_the_record_kept(
    tmp_path, monkeypatch, leftovers, capsys
) -> None:
    """The load ran; the server then ignores SIGTERM: it is killed after the grace period, the
    record is written with its exit code (it was a TimeoutExpired traceback, no record, and a
    server left running)."""
    started: list[subprocess.Popen] = []
    start_server = _stand_in(leftovers, started, lambda _port: [STUBBORN])

    async def no_load(url: str, jobs: list[load.Job], stall_s: float) -> dict:  # not the test's
        for job in jobs:
            job.disconnect_after = 1  # every client walked away
        info = {"fragmentation": {"free_pages": 8, "num_pages": 8}, "running_requests": 0}
        return {"wall_s": 1.0, "health": [(200, 0.01)], "info": info, "faults": []}

    monkeypatch.setattr(load, "start_server", start_server)
    monkeypatch.setattr(load, "load", no_load)
    monkeypatch.setattr(load, "STOP_GRACE_S", 1.0, raising=False)
    out = tmp_path / "load.json"
    assert load.cli(["--requests", "2", "--out", str(out)]) == 0
    assert started[0].poll() == -9
    assert json.loads(out.read_text())["summary"]["server_exit_code"] == -9
    assert "did not stop within 1 s of SIGTERM" in capsys.readouterr().err


def test_a_second_ctrl_c_while_the_server_stops_kills_it(tmp_path, monkeypatch, leftovers) -> None:
    """Ctrl-C under the load, then again while the server takes its time to stop: it is killed
    at once and the bench exits 130 (the second one left it running, SIGTERM ignored)."""
    termed = tmp_path / "got-sigterm"
    stubborn = (  # notes SIGTERM and runs on
        f"import signal, time; signal.signal(signal.SIGTERM, lambda *_: open({str(termed)!r}, "
        f"'w').close()); print({load.READY!r} + 'http://127.0.0.1:1', flush=True); time.sleep(120)"
    )
    started: list[subprocess.Popen] = []
    start_server = _stand_in(leftovers, started, lambda _port: [stubborn])

    async def interrupted(url: str, jobs: list[load.Job], stall_s: float) -> dict:
        raise KeyboardInterrupt  # the first Ctrl-C

    def second_ctrl_c() -> None:  # once the server was asked to stop
        while not termed.exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(load, "start_server", start_server)
    monkeypatch.setattr(load, "load", interrupted)
    threading.Thread(target=second_ctrl_c, daemon=True).start()
    assert load.cli(["--requests", "2", "--out", str(tmp_path / "load.json")]) == 130
    assert started[0].poll() == -9


ANSWERING = """
import sys
from aiohttp import web

async def answer(request):
    await request.read()
    return web.Response(status=int(sys.argv[2]), text=sys.argv[3])

app = web.Application()
app.router.add_post("/generate", answer)
app.router.add_post("/v1/completions", answer)
ready = lambda _: print(READY + "http://127.0.0.1:" + sys.argv[1], flush=True)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=ready)
""".replace("READY", repr(load.READY))  # a server answering every request with argv's answer


@pytest.mark.parametrize(
    ("status", "answer", "said"),
    [
        (500, "engine died", "HTTP 500: 'engine died'"),
        (200, 'data: {"output_ids": [5]}\n\ndata: [DONE]', "malformed answer (Expecting value"),
        (200, '{"output_ids": 7}', "malformed answer (no list of output_ids)"),
        (200, '{"output_ids": [5], "x": NaN}', "malformed answer (non-finite number NaN"),
    ],
    ids=["error", "stream", "shape", "nan"],
)
def test_a_failed_reference_request_is_a_clear_error(
    tmp_path, monkeypatch, leftovers, capsys, status, answer, said
) -> None:
    """The server answers a request served alone with an error or what is no answer of its API:
    one line with the reason, the server stopped, no record (it was a traceback)."""
    started: list[subprocess.Popen] = []
    start_server = _stand_in(
        leftovers, started, lambda port: [ANSWERING, str(port), str(status), answer]
    )
    monkeypatch.setattr(load, "start_server", start_server)
    out = tmp_path / "load.json"
    assert load.cli(["--requests", "2", "--out", str(out)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and said in err[0], err
    assert err[0].startswith("decodecliff bench-load: the reference request 0 (/generate) failed: ")
    assert started[0].poll() is not None and not out.exists()


HANGING = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
GONE = (  # exits, its child still holding its output
    "import os, subprocess, sys; p = subprocess.Popen(['sleep', '600']); "
    "open(sys.argv[1], 'w').write(str(p.pid)); os._exit(3)"
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("server", "said"),
    [
        (HANGING, "the server was not ready within --start-timeout 2 s; killed"),
        (GONE, "the server did not start (exit code 3; its output: '')"),
    ],
    ids=["hangs", "exits, its child holding the pipe"],
)
def test_a_server_that_is_never_ready_is_a_clear_error(
    tmp_path, monkeypatch, leftovers, capsys, server: str, said: str
) -> None:
    """A launched server that never prints its ready line (hung; or gone, its child keeping its
    output open) ends the command after --start-timeout, killed with what it started (it was
    waited for forever)."""
    pid_file = tmp_path / "server.pid"
    leftovers.pid_file(pid_file)
    monkeypatch.setattr(
        load, "server_command", lambda args, port: [sys.executable, "-c", server, str(pid_file)]
    )
    out = tmp_path / "load.json"
    assert load.cli(["--requests", "2", "--start-timeout", "2", "--out", str(out)]) == 1
    assert f"decodecliff bench-load: {said}" in capsys.readouterr().err
    # the server hung, or the child of the one gone: killed with it (the child was left running)
    pid, deadline = int(pid_file.read_text()), time.monotonic() + 10
    while proctree.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILL sent: its delivery
    assert not proctree.alive(pid)
    assert not out.exists()


def _server(bench: int) -> int | None:
    """The pid of the `decodecliff serve` that ``bench`` launched, once it runs."""
    for pid in proctree.descendants(bench):
        if proctree.argv(pid)[1:4] == ["-m", "decodecliff.cli", "serve"]:
            return pid
    return None


def _in_flight(server: int) -> int:
    """Requests running or waiting in ``server`` (0 while it does not answer)."""
    args = proctree.argv(server)
    url = f"http://127.0.0.1:{args[args.index('--port') + 1]}/get_server_info"
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
        info = httpx.get(url, timeout=5).json()
        return info["running_requests"] + info["waiting_requests"]
    return 0


STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.mark.slow  # a server, and requests served alone
@pytest.mark.parametrize("sig", STOPS, ids=lambda sig: sig.name)
@pytest.mark.parametrize(
    ("when", "in_flight"), [("starting", 0), ("served alone", 1), ("load", 2)], ids=str
)
def test_a_stop_signal_stops_the_server_and_exits_128_plus_it(
    tmp_path, leftovers, sig, when, in_flight
) -> None:
    """Ctrl-C, a scheduler's cancel (SIGTERM) or a closed terminal (SIGHUP) while the server
    starts, while the requests are served one by one, or under the load: the server stopped,
    exit 128 + the signal with one line and no record (Ctrl-C was a traceback; SIGTERM and
    SIGHUP ended the command at once, its server left running)."""
    out = tmp_path / "load.json"
    cmd = [sys.executable, "-m", "decodecliff.cli", "bench-load", "--requests", "16"]
    cmd += ["--disconnect-fraction", "0", "--out", str(out)]
    with open(tmp_path / "stderr", "w") as err:  # a file: a pipe nobody reads can fill up
        bench = leftovers.popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=tmp_path,
            # each as in a terminal, even if this test runs where one is ignored (nohup)
            preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in STOPS],
        )
    server = leftovers.track(proctree.wait_for("the server", lambda: _server(bench.pid), 120))
    proctree.wait_for(f"{in_flight} requests", lambda: _in_flight(server) >= in_flight, 120)
    bench.send_signal(sig)
    assert bench.wait(timeout=120) == 128 + sig
    stderr = (tmp_path / "stderr").read_text()
    # The server's log may show its handlers failing to write to the streams cut short: its
    # matter; none of this command's frames, nor the KeyboardInterrupt, is shown.
    assert "KeyboardInterrupt" not in stderr and "bench/load.py" not in stderr, stderr[-3000:]
    said = "interrupted" if sig == signal.SIGINT else f"stopped by {sig.name}"
    assert stderr.splitlines()[-1] == f"decodecliff bench-load: {said}", stderr[-3000:]
    assert not proctree.alive(server) and not out.exists()


SERVING = """
import asyncio, json, os, signal, sys
from aiohttp import web

async def answer(request):
    body = await request.json()
    text = "max_tokens" in body  # /v1/completions: the tokens as text, "a" being token 97
    n = body["max_tokens"] if text else body["sampling_params"]["max_new_tokens"]
    if not body["stream"]:
        whole = {"choices": [{"text": "a" * n}]} if text else {"output_ids": [97] * n}
        return web.json_response(whole)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(1, n + 1):
        chunk = {"choices": [{"text": "a"}]} if text else {"output_ids": [97] * i}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\\n\\n")
        if request.path == sys.argv[2]:  # a stream of argv's path: its first chunk, then no more
            fault(request)
            if sys.argv[3] == "holds":  # this stream alone: the server answers the rest
                await asyncio.Event().wait()
    await resp.write(b"data: [DONE]\\n\\n")
    return resp

async def health(request):
    return web.Response(text="ok")

async def info(request):
    fault(request)
    if sys.argv[3] == "misshapen":  # JSON, but not the info the checks read
        return web.json_response({"running": 0})
    pool = {"free_pages": 8, "num_pages": 8}
    return web.json_response({"running_requests": 0, "waiting_requests": 0, "fragmentation": pool})

async def metrics(request):
    fault(request)
    return web.Response(text="")

def fault(request):
    if request.path == sys.argv[2] and sys.argv[3] == "exits":
        os._exit(3)
    if request.path == sys.argv[2] and sys.argv[3] == "exits slowly":  # drops the answer first
        request.transport.close()
        asyncio.get_running_loop().call_later(0.5, os._exit, 3)
    if request.path == sys.argv[2] and sys.argv[3] == "errs":
        raise web.HTTPInternalServerError(text="engine died")
    if request.path == sys.argv[2] and sys.argv[3] == "stalls":  # as a hung device would hold it
        os.kill(os.getpid(), signal.SIGSTOP)

app = web.Application()
app.router.add_post("/generate", answer)
app.router.add_post("/v1/completions", answer)
app.router.add_get("/health", health)
app.router.add_get("/get_server_info", info)
app.router.add_get("/metrics", metrics)
ready = lambda _: print(READY + "http://127.0.0.1:" + sys.argv[1], flush=True)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=ready)
""".replace("READY", repr(load.READY))  # serves the load; exits, errs or stalls at argv's path


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("path", "fault", "code"),
    [
        ("/get_server_info", "exits", 3),
        ("/get_server_info", "stalls", -9),
        ("/get_server_info", "errs", None),
        ("/get_server_info", "misshapen", None),
        ("/metrics", "exits", 3),
        ("/metrics", "exits slowly", 3),
    ],
    ids=[
        "info, exits",
        "info, stalls",
        "info, errs",
        "info, misshapen",
        "metrics, exits",
        "metrics, exits after dropping the answer",
    ],  # fmt: skip
)
def test_a_server_gone_after_the_streams_leaves_a_record_that_says_why(
    tmp_path, monkeypatch, leftovers, capsys, path, fault, code
) -> None:
    """The streams served, the server then exits, answers an error or other JSON than its info, or
    stops answering when asked for its info or metrics: the record is written, its checks failed
    with what the server did not answer and its exit code, one line, exit 1 (it was a traceback
    and no record, or a wait of 600 s)."""
    started: list[subprocess.Popen] = []
    start_server = _stand_in(leftovers, started, lambda port: [SERVING, str(port), path, fault])
    monkeypatch.setattr(load, "start_server", start_server)
    monkeypatch.setattr(load, "ANSWER_TIMEOUT_S", 1.0, raising=False)
    monkeypatch.setattr(load, "STOP_GRACE_S", 1.0)
    out = tmp_path / "load.json"
    assert load.cli(["--requests", "4", "--out", str(out)]) == 1
    summary = json.loads(out.read_text())["summary"]
    assert summary["completed"] == 3 and summary["disconnected"] == 1
    assert code is None or summary["server_exit_code"] == code
    assert not summary["ok"]
    assert not summary["checks"]["server_up_until_stopped"]
    assert any(f.startswith(f"{path}: ") for f in summary["faults"]), summary["faults"]
    if code is not None and code > 0:
        assert f"the server exited with code {code} before it was stopped" in summary["faults"]
    unchecked = ["kv_pool_empty_after", "no_request_left_running"] if path != "/metrics" else []
    assert summary["unchecked"] == unchecked
    assert all(not summary["checks"][name] for name in unchecked)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "checks FAILED" in lines[0] and f"{path}: " in lines[0], lines
    assert started[0].poll() is not None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["holds", "stalls"], ids=["holds its streams", "stops"])
def test_streams_the_server_stops_sending_end_as_stalled_in_the_record(
    tmp_path, monkeypatch, leftovers, capsys, fault
) -> None:
    """The server takes the streams and sends a /generate stream its first chunk, then no more
    events (those streams held while it answers the rest, or the whole server stopped as a hung
    device holds it): each stream without an event for --stall-timeout is ended as stalled, and
    the record is written, the stall in its faults, its checks failed, one line, exit 1 (it
    waited for the client's read timeout, 600 s, before any record)."""
    started: list[subprocess.Popen] = []
    start_server = _stand_in(
        leftovers, started, lambda port: [SERVING, str(port), "/generate", fault]
    )
    monkeypatch.setattr(load, "start_server", start_server)
    monkeypatch.setattr(load, "ANSWER_TIMEOUT_S", 1.0)
    monkeypatch.setattr(load, "STOP_GRACE_S", 1.0)
    monkeypatch.setattr(load, "FIRST_EVENT_S", 3.0)  # a stream stopped before its first event
    out = tmp_path / "load.json"
    assert load.cli(["--requests", "4", "--stall-timeout", "2", "--out", str(out)]) == 1
    record = json.loads(out.read_text())
    stalled = [r for r in record["requests"] if r["stalled"]]
    assert stalled, record["requests"]
    assert all(r["error"] == f"stalled: no event for the last {r['silent_s']:g} s"
               for r in stalled), stalled  # fmt: skip
    assert {r["silent_s"] for r in stalled} <= {2, 3}, stalled  # after an event, before one
    if fault == "holds":  # every /generate stream had its first chunk: stalled 2 s after it
        assert {r["silent_s"] for r in stalled if r["api"] == "generate"} == {2}, stalled
    summary = record["summary"]
    assert not summary["ok"] and not summary["checks"]["server_up_until_stopped"]
    said = [f for f in summary["faults"] if "stalled: no event for the last 2 s" in f]
    assert any(f.startswith("/generate: ") for f in said), summary["faults"]
    if fault == "holds":  # the rest served: the stall is the one fault
        assert said == summary["faults"] and summary["unchecked"] == []
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "checks FAILED" in lines[0] and "stalled" in lines[0], lines
    assert started[0].poll() is not None


@pytest.mark.slow  # a server, and requests served alone
def test_a_stream_waiting_its_turn_in_the_queue_has_not_stalled(tmp_path) -> None:
    """One request runs at a time, so the last streams wait for the others before their first
    event: longer than --stall-timeout, which counts the silence between events, not the queue
    (they were ended as stalled, and the server blamed)."""
    out = tmp_path / "load.json"
    argv = ["--requests", "32", "--max-running-requests", "1", "--disconnect-fraction", "0"]
    # 3 s: beyond a busy machine's pause between two events (the server's /health answered in
    # up to 1.5 s while a test suite ran beside it), short of the last streams' wait in the queue
    assert load.cli([*argv, "--stall-timeout", "3", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert not any(r["stalled"] for r in record["requests"])
    assert record["summary"]["ok"] and record["summary"]["faults"] == []
    assert max(r["ttft_s"] for r in record["requests"]) > 3  # the queue outlasted the timeout


@pytest.mark.slow  # a server, and requests served alone
def test_a_server_killed_under_the_load_leaves_a_failed_record(tmp_path, leftovers) -> None:
    """The server dies with streams in flight: they fail, each with its reason; the record says
    the server exited, and with what, and what it no longer answered; one line, exit 1 (it was
    a traceback and no record)."""
    out = tmp_path / "load.json"
    cmd = [sys.executable, "-m", "decodecliff.cli", "bench-load", "--requests", "16"]
    cmd += ["--disconnect-fraction", "0", "--out", str(out)]
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        bench = leftovers.popen(cmd, stdout=stdout, stderr=stderr, cwd=tmp_path)
    server = leftovers.track(proctree.wait_for("the server", lambda: _server(bench.pid), 120))
    proctree.wait_for("2 requests", lambda: _in_flight(server) >= 2, 120)
    os.kill(server, signal.SIGKILL)
    assert bench.wait(timeout=120) == 1
    stderr = (tmp_path / "stderr").read_text()
    assert "Traceback" not in stderr, stderr[-3000:]
    summary = json.loads(out.read_text())["summary"]
    assert summary["errored"] > 0 and not summary["checks"]["no_errors_on_completed"]
    assert summary["server_exit_code"] == -9 and not summary["checks"]["server_up_until_stopped"]
    assert "the server exited with code -9 before it was stopped" in summary["faults"]
    assert any(f.startswith("/get_server_info: ConnectError") for f in summary["faults"])
    lines = (tmp_path / "stdout").read_text().splitlines()
    assert len(lines) == 1 and "checks FAILED" in lines[0] and "code -9" in lines[0], lines
