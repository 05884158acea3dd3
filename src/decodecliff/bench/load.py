"""`decodecliff bench-load`: the server under concurrent streaming load, with clients walking away.

Starts `decodecliff serve` (tiny preset on CPU unless told otherwise), serves every request alone
first (greedy: the reference tokens), then sends them all at once as streams of mixed prompt and
output lengths, half through /generate and half through /v1/completions, with a quarter of the
clients closing their stream after a few chunks, while /health is polled. Checks: every completed
request has its requested token count and exactly its reference tokens, no 5xx, /health answered
200 throughout, the KV pool is empty afterwards, and the server ran and answered until it was
stopped. A stream that receives no event for --stall-timeout seconds is ended as stalled (its
first event, behind the queue and the prefill, may take the client's 600 s). Records
requests/s and latency percentiles with the hardware, versions and git revision into a JSON file;
exits 1 when a check fails (a server gone or hung under or after the load: the record says what it
did not answer, which streams stalled, and how it exited), or, with one line of why and no record,
when a request served alone fails. Ctrl-C, SIGTERM or SIGHUP stops the server and exits 128 + the
signal, with no record.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import queue
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
from httpx_sse import aconnect_sse

from decodecliff import envinfo
from decodecliff.helpformat import DefaultsHelpFormatter
from decodecliff.jsonio import unwritable, write_json
from decodecliff.server.tokenizer import ByteTokenizer
from decodecliff.sweep.client import silence
from decodecliff.sweep.launcher import strict_json
from decodecliff.sweep.runner import run_async
from decodecliff.values import is_int, is_positive_seconds

READY = "decodecliff server ready at "
# Loading a large preset and capturing CUDA graphs takes minutes on a GPU (the sweep's default)
START_TIMEOUT_S = 900.0
EXIT_SETTLE_S = 2.0  # for a server that dropped a connection to finish exiting, if it is
STOP_GRACE_S = 30.0  # for the server to end what is in flight and exit after SIGTERM
ANSWER_TIMEOUT_S = 10.0  # for /health, /get_server_info and /metrics: past it the server is hung
STALL_TIMEOUT_S = 120.0  # --stall-timeout: a stream without an event for so long has stalled
CLIENT_TIMEOUT_S = 600.0  # httpx's timeouts of a request (a stream's reads: the stall timeout's)
# A stream's first event comes after the requests queued before it and its prefill: a request
# waiting its turn has not stalled, so the first event may take the client's timeout.
FIRST_EVENT_S = CLIENT_TIMEOUT_S
PROMPT_LENS = (16, 64, 200, 500)
OUTPUT_LENS = (8, 32, 64, 128)
TOKENIZER = ByteTokenizer(512)  # set to the preset's vocabulary in cli()
T = TypeVar("T")


@dataclass
class Job:
    index: int
    api: str  # "generate" or "completions"
    prompt: list[int]
    max_tokens: int
    disconnect_after: int | None  # chunks read before closing the stream; None: read to the end
    reference: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    status: int | None = None
    error: str | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    stalled: bool = False  # ended for no event within the stall timeout
    silent_s: float | None = None  # how long it had gone without an event, where stalled


def make_jobs(n: int, disconnect_fraction: float, seed: int, vocab: int) -> list[Job]:
    rng = random.Random(seed)
    jobs = []
    leaving = set(rng.sample(range(n), round(n * disconnect_fraction)))
    for i in range(n):
        prompt = [rng.randrange(1, vocab) for _ in range(rng.choice(PROMPT_LENS))]
        out = rng.choice(OUTPUT_LENS)
        drop = rng.randrange(1, max(2, out // 2)) if i in leaving else None
        jobs.append(Job(i, ("generate", "completions")[i % 2], prompt, out, drop))
    return jobs


def body(job: Job, stream: bool) -> tuple[str, dict]:
    if job.api == "generate":
        sp = {"max_new_tokens": job.max_tokens, "ignore_eos": True, "temperature": 0.0}
        return "/generate", {"input_ids": job.prompt, "sampling_params": sp, "stream": stream}
    req = {"prompt": job.prompt, "max_tokens": job.max_tokens, "ignore_eos": True}
    return "/v1/completions", {**req, "temperature": 0.0, "stream": stream}


class BenchError(RuntimeError):
    """Ends the bench before its checks can run: the message is its one line on stderr."""


async def reference(client: httpx.AsyncClient, job: Job) -> None:
    """The request served alone, not streamed: the tokens every concurrent run must reproduce.
    BenchError where it fails: without them the load has nothing to be checked against."""
    path, payload = body(job, stream=False)
    failed = f"the reference request {job.index} ({path}) failed"
    try:
        resp = await client.post(path, json=payload)
    except httpx.HTTPError as exc:
        raise BenchError(f"{failed}: {exc!r}") from None
    text = resp.content.decode(errors="replace")  # whatever its bytes (a proxy's page)
    if resp.status_code != 200:
        raise BenchError(f"{failed}: HTTP {resp.status_code}: {text[:300]!r}")
    try:
        job.reference = _answer_tokens(job, strict_json(text))
    except ValueError as exc:
        raise BenchError(f"{failed}: malformed answer ({exc}): {text[:200]!r}") from None


def _answer_tokens(job: Job, data: object) -> list[int]:
    """The tokens of a whole answer; ValueError where it is not of the API's shape."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if job.api == "generate":
        if not isinstance(ids := data.get("output_ids"), list):
            raise ValueError("no list of output_ids")
        return ids
    choices = data.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    text = first.get("text") if isinstance(first, dict) else None
    if not isinstance(text, str):
        raise ValueError("no text in choices[0]")
    return TOKENIZER.encode(text)  # the byte tokenizer is reversible: text back to ids


def _chunk_tokens(job: Job, data: object) -> None:
    """Fold one stream chunk into ``job.tokens``; ValueError where it is not of the API's shape."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if job.api == "generate":
        ids = data.get("output_ids", job.tokens)
        if not isinstance(ids, list):
            raise ValueError("output_ids is not a list")
        job.tokens = ids
        return
    choices = data.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise ValueError("choices is not a list of objects")
    for choice in choices:
        text = choice.get("text") or ""
        if not isinstance(text, str):
            raise ValueError("a choice's text is not a string")
        job.tokens += TOKENIZER.encode(text)


def _stream_error(data: object) -> tuple[str, object] | None:
    """(message, code) of an error event (OpenAI's shape, or any other: its JSON), else None."""
    if not isinstance(data, dict) or "error" not in data:
        return None
    error = data["error"]
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"], error.get("code")
    return json.dumps(error)[:300], None


async def run_stream(client: httpx.AsyncClient, job: Job, stall_s: float = STALL_TIMEOUT_S) -> None:
    """``job`` streamed; where no event comes for ``stall_s`` seconds after the first (that one:
    FIRST_EVENT_S from the send, or ``stall_s`` where longer), ended as stalled."""
    path, payload = body(job, stream=True)
    start = time.perf_counter()
    chunks = 0
    loop = asyncio.get_running_loop()
    # each wait for an event is the stall timeout's, however long it is: no read timeout under it
    limits = httpx.Timeout(CLIENT_TIMEOUT_S, read=None)
    wait = max(stall_s, FIRST_EVENT_S)
    try:
        async with (
            asyncio.timeout(wait) as stall,
            aconnect_sse(client, "POST", path, json=payload, timeout=limits) as source,
        ):
            resp = source.response
            job.status = resp.status_code
            if resp.status_code != 200:  # its body as text, whatever its bytes (a proxy's page)
                job.error = (await resp.aread()).decode(errors="replace")[:300]
                return
            done = False
            async for event in source.aiter_sse():
                wait = stall_s
                stall.reschedule(loop.time() + wait)
                if event.data == "[DONE]":
                    done = True
                if event.event == "error":
                    job.error = event.data[:300] or "an error event without a message"
                    return
                if not event.data or done:
                    continue
                # A chunk the server got wrong fails this request alone; the load and its
                # record go on.
                try:
                    data = strict_json(event.data)
                    if (error := _stream_error(data)) is not None:
                        job.error, code = error
                        job.status = code if isinstance(code, int) else job.status
                        return
                    if job.ttft_s is None:
                        job.ttft_s = time.perf_counter() - start
                    _chunk_tokens(job, data)
                except ValueError as exc:
                    job.error = f"malformed stream chunk ({exc}): {event.data[:200]}"
                    return
                chunks += 1
                if job.disconnect_after is not None and chunks >= job.disconnect_after:
                    return  # leaving the block closes the connection mid-stream
        if not done:  # the server closed the stream short of its end: not a completed request
            job.error = "stream ended before [DONE]"
            return
        job.latency_s = time.perf_counter() - start
    except TimeoutError:  # the stall timeout's: the client's own are httpx.TimeoutException
        job.stalled, job.silent_s = True, wait
        job.error = f"stalled: {silence(wait)}"
    except httpx.HTTPError as exc:
        job.error = repr(exc)


def stall_faults(jobs: list[Job]) -> list[str]:
    """One fault per API path and silence whose streams stalled: how many, for how long (before
    their first event or between two), and which."""
    stalled: dict[tuple[str, float], list[int]] = {}
    for job in jobs:
        if job.stalled and job.silent_s is not None:
            key = (body(job, stream=True)[0], job.silent_s)
            stalled.setdefault(key, []).append(job.index)
    faults = []
    for (path, silent_s), which in stalled.items():
        ids = ", ".join(map(str, which[:10])) + (", ..." if len(which) > 10 else "")
        many = "s" if len(which) > 1 else ""
        faults.append(
            f"{path}: {len(which)} stream{many} stalled: {silence(silent_s)} (request{many} {ids})"
        )
    return faults


async def poll_health(client: httpx.AsyncClient, stop: asyncio.Event, out: list) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        try:
            status = (await client.get("/health", timeout=ANSWER_TIMEOUT_S)).status_code
        except httpx.HTTPError as exc:
            status = repr(exc)
        out.append((status, time.perf_counter() - start))
        await asyncio.sleep(0.05)


async def wait_idle(client: httpx.AsyncClient, timeout: float = 60) -> dict:
    """The server's info once it runs and queues no request, or at ``timeout``; httpx.HTTPError
    or ValueError where the server does not answer with it."""
    deadline = time.monotonic() + timeout
    while True:
        resp = await client.get("/get_server_info", timeout=ANSWER_TIMEOUT_S)
        info = checked_info(strict_json(resp.raise_for_status().text))
        idle = info["running_requests"] == 0 and info["waiting_requests"] == 0
        if idle or time.monotonic() > deadline:
            return info
        await asyncio.sleep(0.1)


def checked_info(info: object) -> dict:
    """``info`` where it holds what the load's checks read; ValueError naming what it lacks."""
    pool = info.get("fragmentation") if isinstance(info, dict) else None
    read = {"running_requests": info, "waiting_requests": info, "free_pages": pool}
    read["num_pages"] = pool
    missing = [k for k, at in read.items() if not (isinstance(at, dict) and is_int(at.get(k)))]
    if missing:
        raise ValueError(f"no integer {', '.join(missing)} in the server info")
    return info


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    rank = math.ceil(q * len(xs) / 100)  # nearest rank: the smallest covering q% of the values
    return xs[min(len(xs) - 1, max(0, rank - 1))]


async def load(url: str, jobs: list[Job], stall_s: float = STALL_TIMEOUT_S) -> dict:
    limits = httpx.Limits(max_connections=len(jobs) + 8, max_keepalive_connections=len(jobs) + 8)
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S, limits=limits) as client:
        for job in jobs:
            await reference(client, job)
        health: list = []
        stop = asyncio.Event()
        poller = asyncio.create_task(poll_health(client, stop, health))
        try:
            start = time.perf_counter()
            await asyncio.gather(*(run_stream(client, job, stall_s) for job in jobs))
            wall = time.perf_counter() - start
            # what the server did not answer, under the streams and after them, and why
            faults = stall_faults(jobs)
            info = await answered(wait_idle(client), "/get_server_info", faults)
            stop.set()
            await poller
        finally:  # the load cancelled too (Ctrl-C): no poll of the client once it is closed
            poller.cancel()
        metrics = await answered(read_metrics(client), "/metrics", faults)
    size = None if metrics is None else len(metrics)
    return {"wall_s": wall, "health": health, "info": info, "metrics_bytes": size, "faults": faults}


async def read_metrics(client: httpx.AsyncClient) -> str:
    resp = await client.get("/metrics", timeout=ANSWER_TIMEOUT_S)
    return resp.raise_for_status().text


async def answered(call: Awaitable[T], path: str, faults: list[str]) -> T | None:
    """What ``call`` returns; None, its reason added to ``faults``, where the server does not
    answer it (gone, hung, an error): the load ran, and its record says what failed after it."""
    try:
        return await call
    except (httpx.HTTPError, ValueError) as exc:
        faults.append(f"{path}: {_why(exc)}")
        return None


def _why(exc: Exception) -> str:
    """One line: a timeout as such, else the exception's type and its message's first line."""
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {ANSWER_TIMEOUT_S:g} s ({type(exc).__name__})"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def summarize(jobs: list[Job], run: dict) -> dict:
    stayed = [j for j in jobs if j.disconnect_after is None]  # read to the end, or meant to
    done = [j for j in stayed if j.error is None]  # completed: an errored request is not
    left = [j for j in jobs if j.disconnect_after is not None]
    latencies = [j.latency_s for j in done if j.latency_s is not None]
    ttfts = [j.ttft_s for j in done if j.ttft_s is not None]
    info = run["info"]  # None where the server did not answer: what it shows is unchecked
    frag = info["fragmentation"] if info is not None else None
    health_codes = [s for s, _ in run["health"]]
    checks = {
        "completed_have_requested_length": all(len(j.tokens) == j.max_tokens for j in stayed),
        "completed_match_served_alone": all(j.tokens == j.reference for j in stayed),
        "leavers_match_a_prefix": all(j.tokens == j.reference[: len(j.tokens)] for j in left),
        "no_5xx": all(not (isinstance(j.status, int) and j.status >= 500) for j in jobs),
        "no_errors_on_completed": len(done) == len(stayed),
        "health_always_200": bool(health_codes) and all(s == 200 for s in health_codes),
        "kv_pool_empty_after": frag is not None and frag["free_pages"] == frag["num_pages"],
        "no_request_left_running": info is not None and info["running_requests"] == 0,
        "server_up_until_stopped": not run["faults"],
    }
    return {
        "requests": len(jobs),
        "completed": len(done),
        "errored": len(stayed) - len(done),
        "disconnected": len(left),
        "wall_s": run["wall_s"],
        "requests_per_s": len(done) / run["wall_s"],
        "output_tokens_per_s": sum(len(j.tokens) for j in jobs) / run["wall_s"],
        "latency_s": {
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "max": max(latencies, default=None),
            "mean": statistics.fmean(latencies) if latencies else None,
        },
        "ttft_s": {"p50": percentile(ttfts, 50), "p99": percentile(ttfts, 99)},
        "health": {
            "polls": len(health_codes),
            "max_s": max((t for _, t in run["health"]), default=None),
            "p99_s": percentile([t for _, t in run["health"]], 99),
        },
        "checks": checks,
        "ok": all(checks.values()),
        "faults": run["faults"],
        "unchecked": ["kv_pool_empty_after", "no_request_left_running"] if info is None else [],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "decodecliff.cli", "serve", "--preset", args.preset]
    cmd += ["--device", args.device, "--port", str(port), "--threads", str(args.threads)]
    cmd += ["--max-total-tokens", str(args.max_total_tokens)]
    cmd += ["--max-running-requests", str(args.max_running_requests), *(args.server_arg or [])]
    return cmd


def start_server(args: argparse.Namespace, port: int) -> tuple[subprocess.Popen, list[str]]:
    """The server once it printed its ready line; RuntimeError, the server killed, where it
    exited or went --start-timeout without one."""
    cmd = server_command(args, port)
    # its own session: stopped and killed with whatever it started, and Ctrl-C is the bench's
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = first_line(proc, args.start_timeout)
    except KeyboardInterrupt:  # not serving yet: nothing to end gracefully
        kill_tree(proc)
        raise
    if line is not None and line.startswith(READY):
        return proc, cmd
    hung = proc.poll() is None
    code = kill_tree(proc)
    if line is None and hung:
        raise RuntimeError(
            f"the server was not ready within --start-timeout {args.start_timeout:g} s; killed"
        )
    raise RuntimeError(f"the server did not start (exit code {code}; its output: {line or ''!r})")


def first_line(proc: subprocess.Popen, timeout_s: float) -> str | None:
    """The first line of ``proc``'s output; None where it exited, or ``timeout_s`` passed, before
    one came. Read in a thread: a hung server, or its child still holding the pipe after it
    exited, blocks the read."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return lines.get(timeout=0.1)
        except queue.Empty:
            if proc.poll() is not None or time.monotonic() > deadline:
                return None


def stop_server(proc: subprocess.Popen) -> int:
    """SIGTERM, then SIGKILL after STOP_GRACE_S: a server hung in its shutdown neither outlives
    the bench (its port, its device memory) nor costs the record of the load; its exit code."""
    _signal_tree(proc, signal.SIGTERM)
    try:
        return proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        print(
            f"decodecliff bench-load: the server did not stop within {STOP_GRACE_S:g} s of "
            "SIGTERM; killed",
            file=sys.stderr,
        )
        return kill_tree(proc)
    except KeyboardInterrupt:  # a second Ctrl-C while it stops: no more waiting for it
        kill_tree(proc)
        raise


def exit_code(proc: subprocess.Popen, wait_s: float) -> int | None:
    """Its exit code where it has exited, given ``wait_s`` to; None while it runs."""
    try:
        return proc.wait(timeout=wait_s) if wait_s > 0 else proc.poll()
    except subprocess.TimeoutExpired:
        return None


def kill_tree(proc: subprocess.Popen) -> int:
    """SIGKILL to the server and all it started (its session's group); its exit code."""
    _signal_tree(proc, signal.SIGKILL)
    return proc.wait()


def _signal_tree(proc: subprocess.Popen, sig: int) -> None:
    # the group outlives its leader while any of it runs (a child holding the server's output)
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:  # all gone, or a process that leads no group: itself alone
        proc.send_signal(sig)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="decodecliff bench-load",
        description=__doc__.split("\n\n")[0],
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--requests", type=int, default=64, help="streams sent at once")
    p.add_argument("--disconnect-fraction", type=float, default=0.25,
                   help="share of clients closing their stream after a few chunks")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="prompts, lengths and who disconnects")
    p.add_argument("--preset", default="tiny", help="model preset of the served engine")
    p.add_argument("--device", default="cpu", help="device the server runs on (cpu, cuda)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    p.add_argument("--max-total-tokens", type=int, default=16384, help="the server's KV pool")
    p.add_argument("--max-running-requests", type=int, default=16,
                   help="requests the server runs at once (the rest wait)")  # fmt: skip
    p.add_argument("--server-arg", action="append", default=None,
                   help="extra `decodecliff serve` argument (repeat for several)")  # fmt: skip
    p.add_argument("--start-timeout", type=float, default=START_TIMEOUT_S, metavar="S",
                   help="seconds the server may take to print its ready line")  # fmt: skip
    p.add_argument("--stall-timeout", type=float, default=STALL_TIMEOUT_S, metavar="S",
                   help="seconds a stream may go without an event before it is ended as "
                        "stalled, a fault of the record (its first event, behind the queue: "
                        f"{FIRST_EVENT_S:g} s, or this where longer)")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("results/load/bench-load.json"),
                   help="JSON record to write")  # fmt: skip
    args = p.parse_args(argv)
    check_args(p, args)
    return args


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what would fail once the server is up, or after the load ran (a record lost)."""
    from decodecliff.engine.config import PRESETS

    if args.preset not in PRESETS:
        p.error(f"--preset {args.preset!r}: one of {', '.join(sorted(PRESETS))}")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        p.error(f"--device {args.device!r}: cpu or cuda[:N]")
    for name in ("requests", "threads", "max_running_requests"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not is_positive_seconds(args.start_timeout):
        p.error(f"--start-timeout must be positive finite seconds, got {args.start_timeout}")
    if not is_positive_seconds(args.stall_timeout):
        p.error(f"--stall-timeout must be positive finite seconds, got {args.stall_timeout}")
    if not 0 <= args.disconnect_fraction <= 1:  # NaN too
        p.error(f"--disconnect-fraction must be in 0..1, got {args.disconnect_fraction}")
    if args.max_total_tokens < (need := max(PROMPT_LENS) + max(OUTPUT_LENS)):
        p.error(f"--max-total-tokens must hold the longest request, {need} tokens")
    if (why := unwritable(args.out)) is not None:
        p.error(f"--out: {why}")


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised as Ctrl-C is: the same way out stops the server launched."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def cli(argv: list[str]) -> int:
    args = parse_args(argv)
    # SIGTERM (a scheduler's cancel) and SIGHUP (a closed terminal) unwind as Ctrl-C does, where
    # nothing else took them (nohup's ignore is kept): left to kill this process, they orphaned
    # the server.
    main = threading.current_thread() is threading.main_thread()  # only it may set handlers
    taken = [
        s for s in (signal.SIGTERM, signal.SIGHUP) if main and signal.getsignal(s) is signal.SIG_DFL
    ]
    for sig in taken:
        signal.signal(sig, _stop)
    try:
        return bench(args)
    except KeyboardInterrupt as exc:  # the server it launched is stopped on the way out
        sig = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        said = "interrupted" if sig == signal.SIGINT else f"stopped by {signal.Signals(sig).name}"
        print(f"decodecliff bench-load: {said}", file=sys.stderr)
        return 128 + sig
    finally:
        for sig in taken:
            signal.signal(sig, signal.SIG_DFL)


def bench(args: argparse.Namespace) -> int:
    """The server started, the load run and its record written: the command's exit code."""
    from decodecliff.engine.config import PRESETS

    global TOKENIZER
    vocab = PRESETS[args.preset].vocab_size
    TOKENIZER = ByteTokenizer(vocab)
    jobs = make_jobs(args.requests, args.disconnect_fraction, args.seed, vocab)
    port = free_port()
    try:
        proc, cmd = start_server(args, port)
    except RuntimeError as exc:  # its own error (a bad --server-arg ...) is on stderr above
        print(f"decodecliff bench-load: {exc}", file=sys.stderr)
        return 1
    try:
        # a stop signal cancels the load, then raises once its loop is closed (not in a task)
        run = run_async(load(f"http://127.0.0.1:{port}", jobs, args.stall_timeout))
        # exited on its own: a fault of the load, whatever its code (one that dropped a request
        # may be exiting still)
        gone = exit_code(proc, EXIT_SETTLE_S if run["faults"] else 0.0)
    except BenchError as exc:  # no load ran: nothing to record
        print(f"decodecliff bench-load: {exc}", file=sys.stderr)
        return 1
    finally:
        code = stop_server(proc)
    if gone is not None:
        run["faults"].insert(0, f"the server exited with code {gone} before it was stopped")
    summary = summarize(jobs, run)
    summary["server_exit_code"] = code
    record = {
        "bench": "load",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "server_command": cmd[1:],
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "summary": summary,
        "env": envinfo.collect(),
        "requests": [
            {k: v for k, v in asdict(j).items() if k not in ("prompt", "reference", "tokens")}
            | {"prompt_tokens": len(j.prompt), "output_tokens": len(j.tokens)}
            for j in jobs
        ],
    }
    write_json(args.out, record)
    s = summary
    why = f" ({'; '.join(s['faults'])})" if s["faults"] else ""
    print(
        f"{s['completed']} completed, {s['errored']} errored, {s['disconnected']} disconnected "
        f"in {s['wall_s']:.2f} s: "
        f"{s['requests_per_s']:.2f} req/s, p99 latency {_s(s['latency_s']['p99'])}, "
        f"/health max {_s(s['health']['max_s'])}; checks "
        + ("passed" if s["ok"] else f"FAILED: {[k for k, v in s['checks'].items() if not v]}")
        + f"{why} -> {args.out}"
    )
    return 0 if s["ok"] else 1


def _s(seconds: float | None) -> str:
    """Seconds for the summary line; "-" where nothing was timed (every client walked away)."""
    return "-" if seconds is None else f"{seconds:.3f} s"


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
