"""Sweeps against the real embedded server (`decodecliff serve`, tiny, CPU), faults included."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import jsonschema
import proctree
import pytest
from test_sweep_keeper import daemonising, orphaned_daemon

from decodecliff.jsonio import write_json
from decodecliff.sweep import launcher
from decodecliff.sweep import runner as runner_module
from decodecliff.sweep.runner import SCHEMA_PATH, Chunk, Runner, SweepConfig

pytestmark = pytest.mark.slow  # every test starts a server and sweeps it, faults included

SERVE = (
    f"{sys.executable} -m decodecliff.cli serve --preset tiny --backend torch --page-size 1 "
    "--device cpu --host {host} --port {port}"
)
SCHEMA = json.loads(SCHEMA_PATH.read_text())
# Enough tokens that the server is still generating (about 4 ms a token on tiny/CPU) when a
# fault hits it on the first token: a short answer would already sit in the socket buffer.
GEN = 300


def _points(out: Path) -> dict[int, dict]:
    points = {}
    for path in sorted(out.glob("ctx*.json")):
        point = json.loads(path.read_text())
        jsonschema.validate(point, SCHEMA)
        points[point["requested_ctx"]] = point
    return points


def _sweep(out: Path, contexts: list[int], *args: str) -> subprocess.CompletedProcess:
    """`decodecliff sweep` of the tiny server (a later --server-cmd in ``args`` replaces it)."""
    argv = [sys.executable, "-m", "decodecliff.cli", "sweep"]
    if "--server-cmd" not in args:
        argv += ["--server-cmd", SERVE]
    argv += ["--name", "tiny", "--contexts", *map(str, contexts), "--gen-tokens", "6"]
    argv += ["--point-timeout", "60", "--chunk-timeout", "120", "--start-timeout", "60"]
    argv += ["--out", str(out), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=240)


def _faulty_sweep(out: Path, contexts: list[int], *fault: str) -> subprocess.CompletedProcess:
    """`decodecliff sweep` of tests/faulty_server.py with ``fault`` (its options), no warm-up."""
    faulty = Path(__file__).with_name("faulty_server.py")
    cmd = " ".join([sys.executable, str(faulty), "--port", "{port}", *fault])
    return _sweep(out, contexts, "--server-cmd", cmd, "--warmup-tokens", "0")


def _config(out: Path, contexts: list[int], point_timeout: float = 60.0, **kw) -> SweepConfig:
    return SweepConfig(
        name="tiny",
        chunks=[Chunk(contexts, timeout_s=180.0, point_timeout_s=point_timeout)],
        out=out,
        server_cmd=kw.pop("server_cmd", SERVE),
        gen_tokens=kw.pop("gen_tokens", GEN),
        start_timeout_s=60.0,
        stop_grace_s=3.0,
        progress=False,
        **kw,
    )


class _Fault:
    """On the first token of ``ctx``, send ``sig`` to the real server process."""

    def __init__(self, ctx: int, sig: signal.Signals) -> None:
        self.ctx, self.sig, self.pid = ctx, sig, None
        self.runner: Runner | None = None

    def __call__(self, ctx: int, t: float, tokens: int) -> None:
        if ctx == self.ctx and self.pid is None:
            self.pid = self.runner.server.pid
            os.kill(self.pid, self.sig)

    def cleanup(self) -> None:
        if self.pid is None:
            return
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


def _run_with_fault(out: Path, fault: _Fault, contexts: list[int], **kw) -> list[dict]:
    runner = Runner(_config(out, contexts, **kw), on_event=fault)
    fault.runner = runner
    try:
        return runner.run()
    finally:
        fault.cleanup()
        runner.server.stop()


def test_short_sweep_end_to_end_and_rerun_one_point(tmp_path):
    out = tmp_path / "tiny"
    done = _sweep(out, [48, 96])
    assert done.returncode == 0, done.stderr
    points = _points(out)
    assert sorted(points) == [48, 96]
    for ctx, p in points.items():
        assert p["status"] == "ok", p["reason"]
        assert p["prompt_tokens"] == ctx and p["warnings"] == []
        m = p["metrics"]
        assert m["completion_tokens"] == 6
        assert 0 < m["ttft_s"] <= m["e2e_s"]
        assert m["prefill_tok_s"] == pytest.approx(ctx / m["ttft_s"])
        assert m["decode_tok_s"] > 0 and m["itl_ms_p50"] > 0 and m["tpot_ms"] > 0
        assert p["token_timestamps"][-1][1] == 6
        assert p["server_info"]["max_total_num_tokens"] >= ctx + 6
        assert p["server_info"]["launch_id"]  # the launch's own (launcher.LAUNCH_ID_ENV)
        assert p["health"] == {"before": True, "after": True}
        assert Path(p["server_log"]).is_file()
        warm = p["warmup"]
        assert warm["ok"] and warm["error"] is None and warm["launch"] == p["server_launch"] == 1
        assert (warm["prompt_tokens"], warm["gen_tokens"], warm["completion_tokens"]) == (64, 4, 4)
    # The server numbers its requests: the warm-up was its first, unrecorded, request.
    assert [points[c]["meta_info"]["id"] for c in (48, 96)] == ["req-1", "req-2"]
    assert "server ready" in Path(points[48]["server_log"]).read_text()

    other = out / "ctx96.json"
    before = (other.read_bytes(), other.stat().st_mtime_ns)
    log = tmp_path / "rerun.log"
    done = _sweep(out, [48], "--server-log", str(log), "--warmup-tokens", "0")
    assert done.returncode == 0, done.stderr
    assert (other.read_bytes(), other.stat().st_mtime_ns) == before
    rerun = json.loads((out / "ctx48.json").read_text())
    assert rerun["warmup"] is None and rerun["config"]["warmup_tokens"] == 0
    assert rerun["meta_info"]["id"] == "req-0"  # without a warm-up the point is the first
    assert rerun["started_at"] != points[48]["started_at"]
    assert rerun["server_log"] == str(log) and "==== launch 1" in log.read_text()


def test_a_server_that_requires_a_key_is_swept_with_the_environment_s(tmp_path, monkeypatch):
    """$DECODECLIFF_API_KEY: the key the server it launches requires, and the key it sends."""
    monkeypatch.setenv(launcher.API_KEY_ENV, "s3cret")
    done = _sweep(tmp_path, [48])
    assert done.returncode == 0, done.stderr
    point = _points(tmp_path)[48]
    assert point["status"] == "ok", point["reason"]
    assert point["server_info"]["max_total_num_tokens"] >= 48  # read with the key as well


def test_server_killed_mid_point_is_a_failed_point_then_restarts(tmp_path):
    fault = _Fault(64, signal.SIGKILL)
    results = _run_with_fault(tmp_path, fault, [64, 80])
    killed, after = results
    assert killed["status"] == "failed"
    assert "server process died mid-point (killed by SIGKILL)" in killed["reason"]
    assert killed["metrics"]["completion_tokens"] < GEN  # timings so far are kept
    assert killed["token_timestamps"] and killed["metrics"]["ttft_s"] > 0
    assert after["status"] == "ok" and after["metrics"]["completion_tokens"] == GEN
    assert after["server_launch"] == killed["server_launch"] + 1
    assert after["warmup"]["ok"] and after["warmup"]["launch"] == after["server_launch"]
    assert sorted(_points(tmp_path)) == [64, 80]


def test_hung_server_trips_the_point_timeout_then_restarts(tmp_path):
    fault = _Fault(64, signal.SIGSTOP)
    results = _run_with_fault(tmp_path, fault, [64, 80], point_timeout=6.0)
    hung, after = results
    assert hung["status"] == "failed"
    assert hung["reason"].startswith("point timeout (6 s) after")
    assert hung["metrics"]["e2e_s"] is None and hung["metrics"]["ttft_s"] > 0
    # the round counts the tokens that came before the timeout
    (cut,) = hung["rounds"]
    assert cut["tokens"] == hung["metrics"]["completion_tokens"] > 0
    assert cut["tok_s"] == pytest.approx(cut["tokens"] / cut["wall_s"])
    assert after["status"] == "ok" and after["server_launch"] == hung["server_launch"] + 1
    assert after["warmup"]["ok"] and after["warmup"]["launch"] == after["server_launch"]
    assert sorted(_points(tmp_path)) == [64, 80]


def test_context_beyond_the_pool_is_skipped_not_sent_and_a_failed_warmup_fails_nothing(tmp_path):
    # The warm-up prompt does not fit the pool either: the server refuses it (HTTP 400).
    server_cmd = SERVE + " --max-total-tokens 200"
    cfg = _config(tmp_path, [32, 512], server_cmd=server_cmd, gen_tokens=8, warmup_tokens=250)
    runner = Runner(cfg)
    small, big = runner.run()
    assert small["status"] == "ok" and small["metrics"]["completion_tokens"] == 8
    warm = small["warmup"]
    assert not warm["ok"] and warm["error"].startswith("HTTP 400") and warm["launch"] == 1
    assert small["warnings"] == [f"warm-up request of launch 1 failed: {warm['error']}"]
    assert small["server_launch"] == 1  # a refused warm-up does not restart the server
    assert big["status"] == "skipped"
    assert big["reason"].endswith("max_total_num_tokens 200")
    assert big["token_timestamps"] == [] and big["metrics"] == {}
    assert sorted(_points(tmp_path)) == [32, 512]


def test_chunk_timeout_fails_the_rest_of_the_chunk(tmp_path):
    fault = _Fault(48, signal.SIGSTOP)
    cfg = _config(tmp_path, [48, 56, 64])
    # The chunk budget also pays for the server's start and warm-up (seconds on a loaded runner):
    # it must outlast them so that it runs out during the hung point, not before it.
    cfg.chunks = [Chunk([48, 56, 64], timeout_s=30.0, point_timeout_s=60.0)]
    runner = Runner(cfg, on_event=fault)
    fault.runner = runner
    try:
        hung, *rest = runner.run()
    finally:
        fault.cleanup()
    assert hung["status"] == "failed" and hung["reason"].startswith("chunk timeout (30 s) after")
    for point in rest:
        assert point["status"] == "failed"
        assert point["reason"] == "chunk timeout (30 s) before the point"
    assert sorted(_points(tmp_path)) == [48, 56, 64]


def test_url_server_is_used_not_launched_and_openai_api(tmp_path):
    port = launcher.free_port("127.0.0.1")
    argv = SERVE.format(host="127.0.0.1", port=port).split()
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "serve.log", "wb") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not launcher.healthy(url) and time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        argv = ["--url", url, "--name", "tiny", "--contexts", "40", "--gen-tokens", "6"]
        done = subprocess.run(
            [sys.executable, "-m", "decodecliff.cli", "sweep", *argv, "--api", "openai"]
            + ["--out", str(tmp_path / "out"), "--point-timeout", "60", "--heartbeat", "0.01"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        point = _points(tmp_path / "out")[40]
        assert point["status"] == "ok", point["reason"]
        assert point["server_command"] is None and point["server_log"] is None
        assert point["metrics"]["completion_tokens"] == 6 and point["metrics"]["ttft_s"] > 0
        assert server.poll() is None  # a server given by URL is left running
        assert re.search(r"tiny ctx 40: (prefill|decode \d/6 tokens), \d+ s", done.stderr)
    finally:
        server.kill()
        server.wait()


@pytest.mark.parametrize(
    ("nan_in", "reason"),
    [
        ("info", "server info unusable: /get_server_info: non-finite number NaN"),
        ("meta", "malformed stream chunk: non-finite number NaN"),
        ("after", "server info after the point unusable: /get_server_info: non-finite number NaN"),
    ],
)
def test_a_nan_from_the_server_fails_its_point_and_the_file_is_written(tmp_path, nan_in, reason):
    done = _faulty_sweep(tmp_path, [16, 24], "--nan-in", nan_in)
    assert done.returncode == 3, done.stderr  # no point succeeded
    points = _points(tmp_path)  # written, and valid JSON of the schema
    assert sorted(points) == [16, 24]
    for point in points.values():
        assert point["status"] == "failed"
        assert reason in point["reason"]


@pytest.mark.parametrize(
    ("shape", "reason"),
    [
        ("list-chunk", "malformed stream chunk: not a JSON object: [1, 2, 3]"),
        ("text-meta", "malformed stream chunk: a field of another type than the API's"),
    ],
)
def test_a_chunk_of_the_wrong_shape_fails_its_point_in_one_line(tmp_path, shape, reason):
    done = _faulty_sweep(tmp_path, [16], "--shape", shape)
    assert done.returncode == 3, done.stderr
    point = _points(tmp_path)[16]
    assert point["status"] == "failed" and reason in point["reason"], point["reason"]
    assert "Traceback" not in point["reason"] + done.stderr


@pytest.mark.parametrize(
    ("shape", "reason"),
    [
        ("negative-prompt", "prompt_tokens is -1, not a token count"),  # no token count
        ("abort", 'finished with 0 tokens: finish {"type": "abort"'),  # a request given up
    ],
)
def test_a_point_the_server_answers_badly_fails_and_the_sweep_goes_on(tmp_path, shape, reason):
    done = _faulty_sweep(tmp_path, [16, 24], "--shape", shape)
    assert done.returncode == 3, done.stderr  # no point succeeded, and the sweep went on
    points = _points(tmp_path)
    assert sorted(points) == [16, 24]
    for point in points.values():
        assert point["status"] == "failed"
        assert reason in point["reason"], point["reason"]


def test_optional_server_figures_of_the_wrong_kind_are_dropped_with_a_warning(tmp_path):
    done = _faulty_sweep(tmp_path, [16], "--shape", "bad-figures")
    assert done.returncode == 0, done.stderr
    point = _points(tmp_path)[16]
    assert point["status"] == "ok", point["reason"]
    m = point["metrics"]
    assert m["spec_verify_ct"] is None and m["verify_step_ms_server"] is None
    assert m["spec_accept_length"] is None and m["verify_steps"] is None
    dropped = [w for w in point["warnings"] if "not recorded" in w]
    assert len(dropped) == 3 and "spec_verify_ct 1.5" in " ".join(dropped), point["warnings"]


@pytest.mark.parametrize("shape", ["vocab0", "vocab-huge"])
def test_a_server_vocabulary_below_two_or_past_int32_is_taken_as_unknown(tmp_path, shape):
    _faulty_sweep(tmp_path, [16], "--shape", shape)
    point = _points(tmp_path)[16]
    assert point["status"] == "ok", point["reason"]
    assert point["prompt"]["id_range"]["source"] == "default"
    assert any("vocab size unknown (none usable in server info" in w for w in point["warnings"])


def test_an_error_event_mid_stream_fails_its_point_with_the_server_s_words(tmp_path):
    done = _faulty_sweep(tmp_path, [16, 24], "--error-mid-stream")
    assert done.returncode == 3, done.stderr  # no point succeeded, and the sweep went on
    points = _points(tmp_path)
    assert sorted(points) == [16, 24]
    for point in points.values():
        assert point["status"] == "failed"
        assert "server error" in point["reason"] and "CUDA out of memory" in point["reason"]
        # the one token before the error event, in the request and in its round
        assert point["requests"][0]["metrics"]["completion_tokens"] == 1
        assert point["rounds"][0]["tokens"] == 1


def test_concurrent_streams_are_each_recorded(tmp_path):
    done = _sweep(tmp_path, [40], "--requests-per-point", "2", "--concurrency", "3")
    assert done.returncode == 0, done.stderr
    point = _points(tmp_path)[40]
    assert point["status"] == "ok", point["reason"]
    reqs = point["requests"]
    assert [(r["round"], r["stream"]) for r in reqs] == [(r, s) for r in (0, 1) for s in (0, 1, 2)]
    assert len({r["prompt_salt"] for r in reqs}) == 6  # no two share a prompt
    assert len({r["meta_info"]["id"] for r in reqs}) == 6
    assert all(r["error"] is None and r["metrics"]["completion_tokens"] == 6 for r in reqs)
    assert point["metrics"]["requests"] == 6
    assert [x["streams"] for x in point["rounds"]] == [3, 3]
    assert all(x["tokens"] == 18 and x["tok_s"] > 0 for x in point["rounds"])
    steps = [r["metrics"]["verify_steps_s_client"] for r in reqs]
    assert min(steps) <= point["metrics"]["verify_steps_s_client"] <= max(steps)
    assert point["metrics"]["verify_steps"] == sum(r["metrics"]["verify_steps"] for r in reqs)
    assert point["server_info_after"]["fragmentation"]["defrag_runs"] == 0


def test_a_server_that_fails_to_start_records_its_command(tmp_path):
    done = _sweep(tmp_path, [16], "--server-cmd", "false --port {port}")
    assert done.returncode == 3, done.stderr  # no point succeeded
    point = _points(tmp_path)[16]
    assert point["status"] == "failed" and "failed to start" in point["reason"]
    assert point["server_command"][0] == "false" and point["server_launch"] == 1


def test_one_name_never_holds_two_server_commands(tmp_path):
    """A point of the tiny server drafting 16 tokens: the same --name drafting 8 is refused
    before its server starts, the point file left as it was; the same command on another host
    and port measures the point again."""
    out, sixteen = tmp_path / "tiny", f"{SERVE} --spec chain --draft-len 16"
    done = _sweep(out, [48], "--server-cmd", sixteen)
    assert done.returncode == 0, done.stderr
    before = (out / "ctx48.json").read_bytes()
    log = out / "server-tiny.log"
    assert log.read_text().count("==== launch ") == 1
    done = _sweep(out, [48], "--server-cmd", sixteen.replace("--draft-len 16", "--draft-len 8"))
    assert done.returncode == 2, done.stderr
    assert (
        f"{out / 'ctx48.json'} holds a point of server 'tiny' launched with another command "
        "(`--draft-len 16` where this sweep has `--draft-len 8`)"
    ) in done.stderr
    assert (out / "ctx48.json").read_bytes() == before
    assert log.read_text().count("==== launch ") == 1  # no server was started
    done = _sweep(out, [48], "--server-cmd", sixteen, "--host", "localhost")
    assert done.returncode == 0, done.stderr
    again = _points(out)[48]
    assert again["status"] == "ok" and again["server_info"]["speculative_num_draft_tokens"] == 16
    assert again["server_url"].startswith("http://localhost:")
    assert log.read_text().count("==== launch ") == 2


def test_a_chatty_server_s_log_keeps_its_start_and_latest_output_under_the_cap(tmp_path):
    """A server that logs much over a long chunk: a launch's output past the cap loses its
    middle, so the log keeps how the server came up and what it wrote last; a log over half the
    cap when a server is launched is moved to FILE.1 first, one earlier generation kept."""
    faulty = Path(__file__).with_name("faulty_server.py")
    cmd = f"{sys.executable} {faulty} --port {{port}} --chatty 100000"  # bytes per request
    log, cap = tmp_path / "server-tiny.log", 2**18
    for _ in range(2):
        done = _sweep(
            tmp_path, [16, 24, 32, 40], "--server-cmd", cmd, "--warmup-tokens", "0",
            "--server-log-cap", "0.25",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert [p["status"] for p in _points(tmp_path).values()] == ["ok"] * 4
        text = log.read_text()
        assert log.stat().st_size <= cap, log.stat().st_size
        assert text.startswith("\n==== launch 1 ") and "faulty server starting" in text
        # the middle is gone (which requests' ends stay depends on how the pipe's reads fell)
        assert "request 4 done" in text
        assert sum(f"request {i} done" in text for i in range(1, 5)) < 4
        assert "bytes of the server's output cut here" in text
    older = Path(f"{log}.1").read_text()  # the first sweep's
    assert older.startswith("\n==== launch 1 ") and "request 4 done" in older


@pytest.mark.slow  # a sweep and its server
@pytest.mark.parametrize("cap", ["0", "0.25"])
def test_a_server_log_that_is_a_pipe_is_written_through(tmp_path, cap):
    """A --server-log that cannot be read back or cut (a FIFO, a terminal) takes the server's
    output as it comes, whatever the cap (it failed every point: a log opened to be read too)."""
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    # held open for reading and writing: no writer waits for a reader, nor a read for its end
    held = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        faulty = Path(__file__).with_name("faulty_server.py")
        cmd = f"{sys.executable} {faulty} --port {{port}} --chatty 100"
        done = _sweep(tmp_path, [16], "--server-cmd", cmd, "--warmup-tokens", "0",
                      "--server-log", str(fifo), "--server-log-cap", cap)  # fmt: skip
        got = os.read(held, 1 << 16)
    finally:
        os.close(held)
    assert done.returncode == 0, done.stderr
    assert [p["status"] for p in _points(tmp_path).values()] == ["ok"]
    assert b"==== launch 1 " in got and b"faulty server starting" in got


def _serving(sweep: subprocess.Popen) -> int | None:
    """The sweep's server process, once it runs `decodecliff serve` (not before its exec)."""
    assert sweep.poll() is None, f"the sweep exited with {sweep.returncode}"
    for pid in proctree.descendants(sweep.pid):
        if proctree.argv(pid)[1:4] == ["-m", "decodecliff.cli", "serve"]:
            return pid
    return None


def _busy(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
        return httpx.get(url + "/get_server_info", timeout=5).json()["running_requests"] > 0
    return False


def _sweep_process(
    out: Path, leftovers: proctree.Leftovers, server_cmd: str, *extra: str
) -> subprocess.Popen:
    """A sweep of one point at context 64 into ``out`` (its stderr in out/sweep.stderr), tracked
    to be killed at the test's end if still running. ``extra``: more options (a later one
    replaces an earlier)."""
    argv = [sys.executable, "-m", "decodecliff.cli", "sweep", "--server-cmd", server_cmd]
    argv += ["--name", "tiny", "--contexts", "64", "--no-progress", "--stop-grace", "3"]
    argv += ["--out", str(out), *extra]
    with open(out / "sweep.stderr", "w") as err:  # a file: a pipe nobody reads can fill up
        return leftovers.popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=err,
            # Ctrl-C as in a terminal, even if this test runs where SIGINT is ignored
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )


def _start_sweep(
    out: Path, leftovers: proctree.Leftovers, server_cmd: str = SERVE, *extra: str
) -> tuple[subprocess.Popen, int, int]:
    """A sweep of one long point, once its server runs a request: (the sweep, the server's
    keeper, the server), all tracked to be killed at the test's end if still running. ``extra``:
    more options (a later one replaces an earlier)."""
    sweep = _sweep_process(out, leftovers, server_cmd, "--gen-tokens", "20000", *extra)
    server = leftovers.track(proctree.wait_for("the server", lambda: _serving(sweep), 120))
    keeper = leftovers.track(proctree.parent(server))
    args = proctree.argv(server)
    url = f"http://127.0.0.1:{args[args.index('--port') + 1]}"
    proctree.wait_for("the server to run a request", lambda: _busy(url), 120)
    return sweep, keeper, server


def test_a_killed_sweep_takes_its_server_along(tmp_path, leftovers):
    # The server's shell daemonises a grandchild first (setsid, then orphaned): it goes too.
    pid_file = tmp_path / "daemon.pid"
    leftovers.pid_file(pid_file)
    sweep, keeper, server = _start_sweep(tmp_path, leftovers, daemonising(SERVE, pid_file))
    daemon = orphaned_daemon(pid_file, keeper, leftovers)
    assert proctree.session(daemon) not in (proctree.session(server), proctree.session(sweep.pid))
    sweep.kill()  # SIGKILL: no cleanup runs in the sweep
    sweep.wait(timeout=30)
    assert proctree.gone([server, daemon, keeper]), "the server's tree outlived the killed sweep"


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"]
)
def test_an_interrupted_point_is_written_as_interrupted(tmp_path, leftovers, sig):
    sweep, keeper, server = _start_sweep(tmp_path, leftovers)
    sweep.send_signal(sig)
    assert sweep.wait(timeout=60) == 128 + sig
    stderr = (tmp_path / "sweep.stderr").read_text()
    assert "Traceback" not in stderr, stderr[-3000:]
    point = _points(tmp_path)[64]
    assert point["status"] == "failed" and point["reason"] == f"interrupted by {sig.name}"
    # the sweep waited for its server's keeper, which waited for the server
    assert proctree.gone([server, keeper], timeout=1), "the server outlived the stopped sweep"


def test_a_point_interrupted_while_its_server_starts_says_what_was_launched(tmp_path, leftovers):
    """SIGINT while the server starts (it never prints ready): the point said launch 0 and no
    command, as if nothing had been launched; it names the launch and its command."""
    never_ready = f"{sys.executable} -c 'import time; time.sleep(600)' --port {{port}}"
    sweep = _sweep_process(tmp_path, leftovers, never_ready, "--start-timeout", "300")

    def sleeping() -> bool:
        assert sweep.poll() is None, f"the sweep exited with {sweep.returncode}"
        return any("time.sleep(600)" in " ".join(proctree.argv(pid))
                   for pid in proctree.descendants(sweep.pid))  # fmt: skip

    proctree.wait_for("the server to be launched", sleeping, 60)
    sweep.send_signal(signal.SIGINT)
    assert sweep.wait(timeout=60) == 128 + signal.SIGINT
    point = _points(tmp_path)[64]
    assert point["reason"] == "interrupted by SIGINT"
    assert point["server_launch"] == 1 and "time.sleep(600)" in " ".join(point["server_command"])


# The tiny server with a child that ignores SIGTERM: stopping its tree takes the stop grace.
SLOW_TO_STOP = f"sh -c '(trap \"\" TERM; exec sleep 600) & exec {SERVE}'"


def _ctrl_c_while_the_server_stops(out: Path, sweep: subprocess.Popen, server: int, keeper: int):
    """Ctrl-C once the server is gone and its keeper waits out the stop grace of the child that
    ignores SIGTERM: the sweep exits 130, without a traceback."""
    proctree.wait_for("the server to stop", lambda: not proctree.alive(server), 60)
    assert proctree.alive(keeper)
    sweep.send_signal(signal.SIGINT)
    assert sweep.wait(timeout=60) == 128 + signal.SIGINT
    stderr = (out / "sweep.stderr").read_text()
    assert "Traceback" not in stderr, stderr[-3000:]


def test_ctrl_c_while_the_last_server_stops_exits_130_without_a_traceback(tmp_path, leftovers):
    """Every point is written and the chunk's server is stopping (a child ignores SIGTERM, so it
    takes the stop grace) when Ctrl-C comes: the sweep exits 130 as for any Ctrl-C, without the
    traceback it printed, and the keeper still takes the server's tree down."""
    sweep = _sweep_process(
        tmp_path, leftovers, SLOW_TO_STOP, "--gen-tokens", "4", "--stop-grace", "20"
    )
    server = leftovers.track(proctree.wait_for("the server", lambda: _serving(sweep), 120))
    keeper = leftovers.track(proctree.parent(server))
    proctree.wait_for("the point's file", lambda: (tmp_path / "ctx64.json").exists(), 120)
    _ctrl_c_while_the_server_stops(tmp_path, sweep, server, keeper)
    assert _points(tmp_path)[64]["status"] == "ok"
    assert proctree.gone([keeper], timeout=60), "the server's tree outlived the stopped sweep"


@pytest.mark.parametrize("cause", ["interrupt", "point timeout"])
def test_a_signal_while_the_server_stops_loses_no_point_and_no_reason(tmp_path, leftovers, cause):
    """The point is over (interrupted, or timed out) and its server is stopping when SIGINT
    comes: the point is written with its own reason, the sweep exits 130 without a traceback,
    and the keeper still takes the server's tree down."""
    timeout = ["--point-timeout", "5"] if cause == "point timeout" else []
    sweep, keeper, server = _start_sweep(
        tmp_path, leftovers, SLOW_TO_STOP, "--stop-grace", "8", *timeout
    )
    if cause == "interrupt":
        sweep.send_signal(signal.SIGINT)
    _ctrl_c_while_the_server_stops(tmp_path, sweep, server, keeper)
    point = _points(tmp_path)[64]
    assert point["status"] == "failed"
    if cause == "interrupt":
        assert point["reason"] == "interrupted by SIGINT"
    else:
        assert point["reason"].startswith("point timeout (5 s) after"), point["reason"]
    assert proctree.gone([keeper], timeout=60), "the server's tree outlived the stopped sweep"


@pytest.mark.slow  # a sweep and its server
def test_the_fit_check_counts_the_draft_tokens_of_a_verify_step(tmp_path):
    # 190 + 8 tokens fit a 200-token pool; with a chain of 8 drafts the step needs 7 more
    server_cmd = SERVE + " --max-total-tokens 200 --spec chain --draft-len 8"
    cfg = _config(tmp_path, [32, 190], server_cmd=server_cmd, gen_tokens=8, warmup_tokens=16)
    small, big = Runner(cfg).run()
    assert small["status"] == "ok"
    assert big["status"] == "skipped" and "7 draft tokens" in big["reason"]
    assert launcher.info_field(small["server_info"], "speculative_num_draft_tokens") == 8


@pytest.mark.slow  # a sweep and its server
def test_a_server_launched_again_mid_point_is_fit_checked_by_its_own_pool(tmp_path):
    """A server that fails the health check before a point is launched again; the new launch
    may hold a smaller KV pool (SGLang sizes it by the GPU memory free at its start), and the
    point is checked against that one, not the pool of the launch before."""
    faulty, pool = Path(__file__).with_name("faulty_server.py"), tmp_path / "pool"
    pool.write_text("100000")
    # /health: one answer to the start, one before and one after the first point; then 503
    serve = f"{sys.executable} {faulty} --port {{port}} --unhealthy-after 3"
    cmd = f"""sh -c 'exec {serve} --max-total-tokens "$(cat {pool})"'"""
    cfg = _config(tmp_path, [16, 24], server_cmd=cmd, gen_tokens=4, warmup_tokens=0)
    runner = Runner(cfg)
    new_result = runner._new_result

    def between_points(ctx: int, index: int, chunk: Chunk) -> dict:
        if ctx == 24:  # the next launch reads a smaller pool
            pool.write_text("20")
        return new_result(ctx, index, chunk)

    runner._new_result = between_points
    first, second = runner.run()
    assert first["status"] == "ok" and first["server_info"]["max_total_num_tokens"] == 100000
    assert second["server_launch"] == 2 and second["health"]["before"] is False
    assert second["server_info"]["max_total_num_tokens"] == 20
    assert second["status"] == "skipped", second["reason"]
    assert second["reason"] == "prompt 24 + 4 generated tokens exceed the server's " + (
        "max_total_num_tokens 20"
    )
    assert second["requests"] == []  # nothing was sent


def _stalling(tmp_path: Path, chunk_s: float, where: str, at: int, warmup: int) -> list[dict]:
    """The points 16 and 24 of one chunk of ``chunk_s`` s against a server that stalls on its
    ``at``-th request to ``where`` (tests/faulty_server.py --stall-on)."""
    faulty = Path(__file__).with_name("faulty_server.py")
    cmd = f"{sys.executable} {faulty} --port {{port}} --stall-on {where} --stall-at {at}"
    cfg = _config(tmp_path, [16, 24], server_cmd=cmd, gen_tokens=4, warmup_tokens=warmup)
    cfg.chunks = [Chunk([16, 24], timeout_s=chunk_s, point_timeout_s=chunk_s)]
    return Runner(cfg).run()


@pytest.mark.slow  # a sweep and its server
def test_a_server_stalled_at_the_deadline_gets_no_health_check_and_no_launch_past_it(tmp_path):
    """A server that stalls in its warm-up holds the point to the chunk's deadline (the start
    timeout is longer). The health check before the point then has no time left: the point
    fails as out of time, and no server is launched again past the deadline."""
    stalled, rest = _stalling(tmp_path, 15.0, "generate", 1, warmup=16)
    assert stalled["warmup"]["error"].startswith("warm-up timeout")
    assert stalled["status"] == "failed"
    assert stalled["reason"].startswith("chunk timeout (15 s) before the point"), stalled["reason"]
    assert stalled["server_launch"] == 1
    assert rest["status"] == "failed" and rest["reason"] == "chunk timeout (15 s) before the point"
    assert (tmp_path / "server-tiny.log").read_text().count("==== launch ") == 1


@pytest.mark.slow  # a sweep and its server
def test_a_server_stalled_after_a_point_is_asked_about_it_no_longer_than_the_chunk_lasts(tmp_path):
    """A server that stalls on the server info asked for after a point (its second: the first
    answers the start): the info and the health check after the point take no longer than what
    is left of the chunk, less than their own timeouts here; the measured point stands."""
    point, rest = _stalling(tmp_path, 10.0, "info", 2, warmup=0)
    assert point["status"] == "ok", point["reason"]
    late = "chunk timeout (10 s) before the server checks after the point ended"
    assert late in point["warnings"], point["warnings"]
    assert point["health"]["after"] is not True
    assert rest["status"] == "failed" and rest["reason"] == "chunk timeout (10 s) before the point"


@pytest.mark.slow  # a sweep and its server
def test_a_server_stalled_on_its_first_info_is_asked_no_longer_than_the_chunk_lasts(
    tmp_path, monkeypatch
):
    """A server that stalls on the server info the start asks for once it is healthy: that read
    is held to the chunk's deadline, as the calls around a point are (its own limit is 10 s, more
    than the chunk's 9 s). The reads are watched, each passed on to the server as asked."""
    asked = []
    ask = launcher.server_info

    def watched(url: str, timeout: float = 10.0) -> dict:
        asked.append(timeout)
        return ask(url, timeout)

    monkeypatch.setattr(launcher, "server_info", watched)
    point, rest = _stalling(tmp_path, 9.0, "info", 1, warmup=0)
    assert asked, "the server was not healthy within the chunk: nothing asked"
    assert max(asked) <= 9.0, asked
    assert point["status"] == "failed" and point["server_launch"] == 1
    assert point["reason"].startswith("chunk timeout (9 s) before the point"), point["reason"]
    assert rest["status"] == "failed" and rest["reason"] == "chunk timeout (9 s) before the point"


@pytest.mark.slow  # a sweep and its server
def test_an_unexpected_error_fails_its_point_only(tmp_path):
    """A fault in the sweep's own code (injected: no input causes one) fails that point, with
    its traceback; the server is stopped and started again for the next point."""
    runner = Runner(_config(tmp_path, [16, 24, 32]))
    describe = runner._describe_server

    def broken(res: dict) -> None:
        if res["requested_ctx"] == 24:
            raise RuntimeError("a bug in the sweep")
        describe(res)

    runner._describe_server = broken
    first, hit, last = runner.run()
    assert first["status"] == last["status"] == "ok"
    assert hit["status"] == "failed" and hit["reason"].startswith("sweep error: ")
    assert "RuntimeError: a bug in the sweep" in hit["reason"]
    assert (first["server_launch"], last["server_launch"]) == (1, 2)
    assert sorted(_points(tmp_path)) == [16, 24, 32]  # every point written


def test_a_url_server_back_after_it_went_away_is_warmed_up_and_described_again(tmp_path):
    """A server given by URL that its owner stopped between two points and started again: the
    point after is measured on the new server, warmed up, with its own server info."""
    port = launcher.free_port("127.0.0.1")
    url = launcher.http_url("127.0.0.1", port)
    faulty = Path(__file__).with_name("faulty_server.py")
    servers: list[subprocess.Popen] = []

    def serve(tag: str) -> None:  # the tag comes back as the server info's launch_id
        env = {**os.environ, launcher.LAUNCH_ID_ENV: tag}
        argv = [sys.executable, str(faulty), "--port", str(port)]
        servers.append(subprocess.Popen(argv, env=env))
        deadline = time.monotonic() + 60
        while not launcher.healthy(url) and time.monotonic() < deadline:
            time.sleep(0.1)

    cfg = SweepConfig(
        name="url",
        chunks=[Chunk([16, 24, 32], timeout_s=180.0, point_timeout_s=60.0)],
        out=tmp_path,
        url=url,
        gen_tokens=4,
        start_timeout_s=3.0,
        progress=False,
    )
    runner = Runner(cfg)
    new_result = runner._new_result

    def between_points(ctx: int, index: int, chunk: Chunk) -> dict:
        if ctx == 24:  # its owner stops it
            servers[-1].terminate()
            servers[-1].wait(timeout=30)
        if ctx == 32:  # and starts it again
            serve("second")
        return new_result(ctx, index, chunk)

    runner._new_result = between_points
    serve("first")
    try:
        first, gone, back = runner.run()
    finally:
        for server in servers:
            server.kill()
            server.wait()
    assert first["status"] == back["status"] == "ok"
    assert first["server_info"]["launch_id"] == "first"
    assert gone["status"] == "failed"
    assert gone["reason"].startswith("server not reachable (start timeout 3 s)")
    assert back["server_info"]["launch_id"] == "second"  # not the stopped server's
    assert back["warmup"]["ok"] and back["warmup"] != first["warmup"]
    assert sorted(_points(tmp_path)) == [16, 24, 32]


@pytest.mark.slow  # a sweep and its server
def test_a_signal_while_a_point_is_written_loses_no_point(tmp_path, monkeypatch):
    """Ctrl-C landing while a measured point's file is written (injected: a signal cannot be
    timed to land there): the point is still written whole, then the sweep exits 130."""
    calls = []

    def interrupted_once(path: Path, doc: dict, **kw: object) -> None:
        calls.append(path)
        if len(calls) == 1:  # as the handler raises it, before the file is replaced
            raise KeyboardInterrupt
        write_json(path, doc, **kw)

    monkeypatch.setattr(runner_module, "write_json", interrupted_once)
    faulty = Path(__file__).with_name("faulty_server.py")
    cmd = f"{sys.executable} {faulty} --port {{port}}"
    runner = Runner(_config(tmp_path, [16, 24], server_cmd=cmd, gen_tokens=4, warmup_tokens=0))
    raised: BaseException | None = None
    try:
        runner.run()
    except BaseException as exc:  # noqa: BLE001 (a KeyboardInterrupt must not end pytest)
        raised = exc
    assert isinstance(raised, SystemExit) and raised.code == 128 + signal.SIGINT
    points = _points(tmp_path)
    assert sorted(points) == [16] and points[16]["status"] == "ok"
    assert runner.server.proc is None  # stopped on the way out


@pytest.mark.slow  # a sweep and its server
def test_a_server_that_died_between_points_is_relaunched_and_its_death_recorded(tmp_path):
    faulty = Path(__file__).with_name("faulty_server.py")
    cmd = f"{sys.executable} {faulty} --port {{port}}"
    runner = Runner(_config(tmp_path, [16, 24], server_cmd=cmd, gen_tokens=4, warmup_tokens=0))
    new_result = runner._new_result

    def between_points(ctx: int, index: int, chunk: Chunk) -> dict:
        if ctx == 24:  # after the first point was written: the server dies on its own
            os.kill(runner.server.pid, signal.SIGKILL)
            proctree.wait_for("its keeper to exit", lambda: runner.server.exit_code() is not None)
        return new_result(ctx, index, chunk)

    runner._new_result = between_points
    first, after = runner.run()
    assert first["status"] == after["status"] == "ok"
    assert after["server_launch"] == first["server_launch"] + 1
    assert "the server of launch 1 exited between points (killed by SIGKILL)" in after["warnings"]
