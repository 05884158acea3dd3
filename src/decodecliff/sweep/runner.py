"""Chunked context sweeps: one server per chunk, one point at a time, one JSON file per point.

Every server launch (restarts included; a server given by URL once it is first reached, and once
it is back after it was not) gets one short unrecorded warm-up request before its first point,
as SGLang's bench_serving sends one, so one-time costs (JIT compiles, CUDA graph capture,
allocator growth) stay out of the first point.
A warm-up that fails is written into the points that follow and fails nothing by itself: a dead
server shows up in the next point.

Each point runs ``requests_per_point`` rounds after the warm-up; a round sends ``concurrency``
streams at once, each with its own prompt (no shared prefix). Every request is recorded; the
point's ``metrics`` are the medians over them (see metrics.point_summary), and the server's
self-description is read again after the point (defragmentation, graphs captured during it).

A failed point is data, not a crash: a timeout, a dead or hung server is written down as a failed
point (with its reason and the timings so far), the server is restarted for the next point, and
files already written are never touched again. Each file is checked against point.schema.json
(a record that breaks it is a bug and ends the sweep) and written atomically, inside the point's
guard: a value JSON cannot hold (a server's NaN) fails that point, not the sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import math
import re
import shlex
import signal
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from decodecliff import envinfo
from decodecliff.jsonio import unwritable, write_json
from decodecliff.sweep import client, launcher, metrics, point, prompts
from decodecliff.sweep.point import SCHEMA_PATH  # noqa: F401 (where the point files are defined)
from decodecliff.values import is_finite_number, is_int, is_positive_seconds

SCHEMA = point.schema()["$id"]  # the point files' "schema", e.g. decodecliff.sweep-point/2
# How long a later point waits for a URL server that stayed unreachable through a whole start
# timeout (nothing here can start it again; its owner may restart it, so each point looks once).
URL_RECHECK_S = 5.0
# How long the requests around a point may take (the server info's two paths in all), each
# less where the chunk has less left.
HEALTH_S, FLUSH_S, INFO_S = 5.0, 30.0, launcher.INFO_S
PointHook = Callable[[int, float, int], None]  # (requested_ctx, seconds since send, tokens)


@dataclass(frozen=True)
class Chunk:
    """Context points run against one server launch, with a time budget for the whole chunk."""

    contexts: list[int]
    timeout_s: float
    point_timeout_s: float

    def __post_init__(self) -> None:
        if not self.contexts:
            raise ValueError("a chunk needs at least one context")
        if not all(map(is_int, self.contexts)) or min(self.contexts) < 1:
            raise ValueError(f"contexts must be positive integers, got {self.contexts}")
        if not (is_positive_seconds(self.timeout_s) and is_positive_seconds(self.point_timeout_s)):
            raise ValueError(
                "chunk and point timeouts must be positive finite seconds, got "
                f"{self.timeout_s!r} and {self.point_timeout_s!r}"
            )


@dataclass
class SweepConfig:
    """Everything a sweep needs; recorded verbatim in every point file."""

    name: str
    chunks: list[Chunk]
    out: Path
    server_cmd: str | None = None
    url: str | None = None
    gen_tokens: int = 24
    # Loading a large preset and capturing CUDA graphs takes minutes on a GPU; the study's
    # configs give 900 s too (config.schema.yaml's default for sweep.start_timeout_s).
    start_timeout_s: float = 900.0
    api: str = "generate"
    seed: int = 0
    vocab_size: int | None = None
    host: str = "127.0.0.1"
    stop_grace_s: float = 10.0
    model: str = "default"
    progress: bool = True
    heartbeat_s: float = 60.0
    server_log: Path | None = None  # default: <out>/server-<name>.log
    server_log_cap_mb: float = 32.0  # MiB the server log may hold (launcher.Server); 0: no cap
    warmup_tokens: int = 64  # prompt tokens of the warm-up request after each launch; 0: none
    warmup_gen_tokens: int = 4  # tokens it generates (prefill plus a few decode/verify steps)
    requests_per_point: int = 1  # recorded rounds per point, after the warm-up
    concurrency: int = 1  # streams sent at once in each round

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise ValueError(f"name {self.name!r}: use letters, digits, '.', '_' and '-'")
        if not self.chunks:
            raise ValueError("a sweep needs at least one chunk")
        if self.gen_tokens < 2:  # the first token is the prefill's: one leaves no step to time
            raise ValueError(f"gen tokens must be at least 2, got {self.gen_tokens}")
        if self.api not in client.APIS:
            raise ValueError(f"unknown api {self.api!r}; choose one of {client.APIS}")
        if self.seed < 0:
            raise ValueError(f"seed must be non-negative, got {self.seed}")
        if self.warmup_tokens < 0:
            raise ValueError(
                f"warm-up tokens must be >= 0 (0: no warm-up), got {self.warmup_tokens}"
            )
        if self.warmup_gen_tokens < 1:
            raise ValueError(f"warm-up gen tokens must be >= 1, got {self.warmup_gen_tokens}")
        if self.requests_per_point < 1:
            raise ValueError(f"requests per point must be >= 1, got {self.requests_per_point}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        for name in ("stop_grace_s", "heartbeat_s"):  # 0 is allowed: no grace, no heartbeat
            value = getattr(self, name)
            if not (value == 0 or is_positive_seconds(value)):
                raise ValueError(f"{name} must be finite seconds >= 0, got {value!r}")
        cap = self.server_log_cap_mb
        if not (is_finite_number(cap) and cap >= 0):
            raise ValueError(f"the server log cap must be finite MiB >= 0 (0: none), got {cap!r}")
        if not is_positive_seconds(self.start_timeout_s):
            raise ValueError(
                f"the start timeout must be positive finite seconds, got {self.start_timeout_s!r}"
            )
        seen = [c for ch in self.chunks for c in ch.contexts]
        if len(seen) != len(set(seen)):
            raise ValueError(f"a context appears twice in the sweep: {seen}")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["out"] = str(self.out)
        d["server_log"] = None if self.server_log is None else str(self.server_log)
        return d


def draft_reserve(info: dict) -> int:
    """KV slots a verify step takes beyond a request's output: its draft tokens but one (the
    speculative server's speculative_num_draft_tokens - 1; 0 without speculation)."""
    algorithm = launcher.info_field(info, "speculative_algorithm")
    drafts = launcher.info_field(info, "speculative_num_draft_tokens")
    if str(algorithm).lower() in ("none", "") or not isinstance(drafts, int) or drafts < 1:
        return 0
    return drafts - 1


T = TypeVar("T")


def point_path(out: Path, ctx: int) -> Path:
    return out / f"ctx{ctx}.json"


def _recorded(path: Path) -> dict:
    """The point file at ``path`` as recorded, {} where there is none (or it does not parse)."""
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def _recorded_template(recorded: dict) -> str | None:
    """The server command template a point file was measured with (None: a server by URL, or no
    such record): ``config.server_cmd``; a point of schema /1 kept it as ``server_command``."""
    config = recorded.get("config")
    if isinstance(config, dict) and "server_cmd" in config:
        template = config["server_cmd"]
    else:
        template = recorded.get("server_command")
    return template if isinstance(template, str) else None


def _launch_words(template: str) -> list[str] | None:
    """What ``template`` launches, word by word (leading VAR=value first), {host} and {port} left
    as placeholders: they change from launch to launch, the server they start does not."""
    try:
        env, argv = launcher.render_command(template, "{host}", "{port}")
    except ValueError:
        return None
    return [f"{key}={value}" for key, value in env.items()] + argv


def _quoted(words: list[str]) -> str:
    return f"`{shlex.join(words)}`" if words else "nothing"


def _command_difference(recorded: str, template: str) -> str | None:
    """Where two server command templates launch different servers, as "`--draft-len 16` where
    this sweep has `--draft-len 8`" (the first difference, after the word before it); None
    where they differ only in spacing, quoting, or the host and port of a launch."""
    old, new = _launch_words(recorded), _launch_words(template)
    if old is None or new is None:
        return None if recorded == template else f"`{recorded}` where this sweep has `{template}`"
    diff = difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in diff:
        if tag != "equal":
            before = 1 if i1 and j1 else 0  # the word before the difference, for its context
            return (
                f"{_quoted(old[i1 - before : i2])} where this sweep has "
                f"{_quoted(new[j1 - before : j2])}"
            )
    return None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _as_exit(exc: BaseException) -> SystemExit:
    """Ctrl-C as the exit a shell reports for it (130); SystemExit as it is."""
    if isinstance(exc, SystemExit):
        return exc
    return SystemExit(128 + signal.SIGINT)


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main), with the SIGTERM and SIGHUP handlers its command installed (they end
    the sweep, or bench-load) run once the event loop has stopped. Run inside the loop, a
    handler's SystemExit surfaces in whichever task was running, and asyncio logs that task's
    exception as a traceback; instead such a signal cancels ``main``, as asyncio does for Ctrl-C."""
    handlers = {s: h for s in (signal.SIGTERM, signal.SIGHUP) if callable(h := signal.getsignal(s))}
    if threading.current_thread() is not threading.main_thread():
        handlers = {}  # only the main thread may set handlers (and only it runs them)
    got: list[int] = []

    async def guarded() -> T:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()

        def on_signal(sig: int, _frame: object) -> None:
            got.append(sig)
            loop.call_soon_threadsafe(task.cancel)

        for sig in handlers:
            signal.signal(sig, on_signal)
        try:
            return await main
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    try:
        return asyncio.run(guarded())
    except asyncio.CancelledError:
        if not got:
            raise
    finally:
        if got:  # also when ``main`` swallowed its cancellation
            handlers[got[0]](got[0], None)


def _signal_name(code: object) -> str:
    if isinstance(code, int) and code > 128:
        with contextlib.suppress(ValueError):
            return signal.Signals(code - 128).name
    return f"exit {code}"


def _left(deadline: float, limit: float) -> float:
    """``limit`` s, or what is left to ``deadline`` where that is less (<= 0: nothing)."""
    return min(limit, deadline - time.monotonic())


def _salt(index: int) -> int:
    """Prompt salt of a point's ``index``-th request: the first keeps the point's own prompt."""
    return 0 if index == 0 else 100 + index


def _finite(obj: object) -> object:
    """``obj`` with every NaN or infinity replaced by None (JSON has no such numbers)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


class Runner:
    """Runs a :class:`SweepConfig`; ``on_event`` sees every token-bearing chunk of every point."""

    def __init__(self, cfg: SweepConfig, on_event: PointHook | None = None) -> None:
        self.cfg = cfg
        self.on_event = on_event
        if cfg.server_cmd is not None:
            launcher.render_command(cfg.server_cmd, cfg.host, 0)  # bad templates fail early
        self.log_path = None
        if cfg.server_cmd is not None:
            self.log_path = cfg.server_log or cfg.out / f"server-{cfg.name}.log"
        self._check_outputs()
        self.server = launcher.Server(
            cfg.server_cmd,
            cfg.url,
            cfg.host,
            self.log_path,
            cfg.stop_grace_s,
            log_cap=int(cfg.server_log_cap_mb * 2**20),
        )
        self.info: dict = {}
        self.up = False
        # The context at which a URL server stayed unreachable for a whole start timeout: later
        # points probe it for URL_RECHECK_S only, as no one here can start it again.
        self.url_gone_at: int | None = None
        self.warmup: dict | None = None  # the warm-up of the current launch
        self.console = Console(stderr=True, soft_wrap=True)
        self.written: list[Path] = []

    # -- the sweep -----------------------------------------------------------------------------

    def run(self) -> list[dict]:
        """Run every chunk; return the point results (each also written to its file)."""
        results: list[dict] = []
        for index, chunk in enumerate(self.cfg.chunks):
            results += self.run_chunk(index, chunk)
        return results

    def run_chunk(self, index: int, chunk: Chunk) -> list[dict]:
        deadline = time.monotonic() + chunk.timeout_s
        results = []
        ending: BaseException | None = None  # what ends the sweep, the first of them
        try:
            for ctx in chunk.contexts:
                res = self._new_result(ctx, index, chunk)
                self._run_point_safely(res, chunk, deadline)
                results.append(res)
        except KeyboardInterrupt as exc:  # between points: the exit a shell reports, no traceback
            ending = _as_exit(exc)
        except BaseException as exc:  # a signal's exit, a write that failed: once it is stopped
            ending = exc
        try:
            self._stop()
        except KeyboardInterrupt as exc:  # while the last server stops: its keeper goes on
            ending = ending or _as_exit(exc)
        if ending is not None:
            raise ending
        return results

    # -- one point ------------------------------------------------------------------------------

    def _new_result(self, ctx: int, index: int, chunk: Chunk) -> dict:
        return {
            "schema": SCHEMA,
            "name": self.cfg.name,
            "requested_ctx": ctx,
            "prompt_tokens": None,
            "gen_tokens": self.cfg.gen_tokens,
            "requests_per_point": self.cfg.requests_per_point,
            "concurrency": self.cfg.concurrency,
            "status": "ok",
            "reason": None,
            "warnings": [],
            "metrics": {},
            "api": self.cfg.api,
            "server_url": self.server.url,
            "server_info": {},
            "server_info_after": None,
            "server_command": self.server.command,
            "server_log": str(self.log_path) if self.log_path else None,
            "server_launch": self.server.launches,
            "warmup": None,
            "chunk": {"index": index, **asdict(chunk)},
            "config": self.cfg.as_dict(),
            "env": envinfo.collect(),
            "started_at": _now(),
            "finished_at": None,
            "prompt": None,
            "health": {"before": None, "after": None},
            "flushed_cache": None,
            "finish_reason": None,
            "meta_info": {},
            "stream": None,
            "token_timestamps": [],
            "requests": [],
            "rounds": [],
        }

    def _say_launch(self, res: dict) -> None:
        """What was launched (or tried) for the point, so a failed one says how to reproduce it
        (a start cut short left the point's fields as they were before it)."""
        res.update(
            server_command=self.server.command,
            server_launch=self.server.launches,
            server_url=self.server.url,
        )

    def _fail(self, res: dict, reason: str) -> None:
        res["status"], res["reason"] = "failed", reason
        self.console.print(f"[red]{self.cfg.name} ctx {res['requested_ctx']}: failed: {reason}")

    def _run_point_safely(self, res: dict, chunk: Chunk, deadline: float) -> None:
        """Run and write the point; an unexpected error fails this point only (hours of sweep
        stay). Only an OSError of the write itself (a full disk) ends the sweep. A signal that
        ends the sweep (SIGINT, or SIGTERM/SIGHUP as SystemExit) writes the point as interrupted
        first (one that comes while the point is written: the point as it is); then the sweep
        exits with 128 + the signal's number, without a traceback.

        A server to be stopped (a failed point's) is stopped once the point is written: a signal
        during its stop (up to the stop grace) then neither loses the point nor replaces its
        reason, and ends the sweep with its keeper stopping the server."""
        interrupted: SystemExit | None = None
        try:
            if time.monotonic() >= deadline:
                self._fail(res, f"chunk timeout ({chunk.timeout_s:g} s) before the point")
            else:
                self._run_point(res, chunk, deadline)
        except Exception as exc:  # noqa: BLE001 (recorded in the point, not swallowed)
            self._fail(res, f"sweep error: {''.join(traceback.format_exception(exc))[-2000:]}")
            self.up = False
            self._say_launch(res)
        except (KeyboardInterrupt, SystemExit) as exc:
            interrupted = _as_exit(exc)
            self._fail(res, f"interrupted by {_signal_name(interrupted.code)}")
            self.up = False
            self._say_launch(res)
        try:
            res["finished_at"] = _now()
            self._write_point(res)
        except (KeyboardInterrupt, SystemExit) as exc:
            # The signal cut the write short and left the file as it was; the point is whole, so
            # it is written before the sweep ends (a second signal ends it at once).
            interrupted = interrupted or _as_exit(exc)
            self._write_point(res)
        if not self.up:
            try:
                self._stop()
            except (KeyboardInterrupt, SystemExit) as exc:  # its lifeline closed, the keeper
                interrupted = interrupted or _as_exit(exc)  # goes on stopping the server
        if interrupted is not None:
            raise interrupted from None

    def _write_point(self, res: dict) -> None:
        try:
            self._write(res)
        except ValueError as exc:  # a value JSON cannot hold, e.g. a NaN the server sent
            clean = _finite(res)
            self._fail(clean, f"result not writable as JSON ({exc}); non-finite numbers nulled")
            res.clear()
            res.update(clean)
            self._write(res)

    def _run_point(self, res: dict, chunk: Chunk, deadline: float) -> None:
        ctx, late = res["requested_ctx"], f"chunk timeout ({chunk.timeout_s:g} s)"
        if not self._ensure_up(res, deadline) or not self._fits(res):
            return
        if (wait := _left(deadline, HEALTH_S)) <= 0:
            return self._fail(res, f"{late} before the point")
        problem = launcher.health_problem(self.server.url, wait)
        res["health"]["before"] = problem is None
        if problem is not None and time.monotonic() >= deadline:
            self.up = False
            return self._fail(res, f"{late} before the point (health check: {problem})")
        if problem is not None:
            # A launched server is restarted once, a URL server waited for as when first reached
            # (its owner may start it again): the server that comes up is another, so it is
            # warmed up, described and checked anew (its KV pool may be smaller), not measured
            # cold with the gone one's info.
            self.up = False
            if not self._ensure_up(res, deadline) or not self._fits(res):
                return
        if (wait := _left(deadline, FLUSH_S)) > 0:  # else the round says the time is up
            res["flushed_cache"] = launcher.flush_cache(self.server.url, wait)
        rng = self._id_range(res, ctx)
        for r in range(self.cfg.requests_per_point):
            reason = self._round(res, rng, r, chunk, deadline)
            if reason is not None:
                self._finish(res)
                self._fail(res, reason)
                self.up = False  # a failed point leaves the server in an unknown state: stopped
                return
        self._finish(res)
        if (wait := _left(deadline, INFO_S)) > 0:
            after = launcher.server_info(self.server.url, wait)
            res["server_info_after"] = after
            if launcher.INVALID in after:
                why = after[launcher.INVALID]
                return self._fail(res, f"server info after the point unusable: {why}")
        if (wait := _left(deadline, HEALTH_S)) > 0:
            res["health"]["after"] = launcher.healthy(self.server.url, wait)
        if not res["health"]["after"]:
            if time.monotonic() >= deadline:
                res["warnings"].append(f"{late} before the server checks after the point ended")
            else:
                res["warnings"].append("server not healthy after the point; restarting it")
            self.up = False  # stopped once the point is written
        self._summary(res)

    def _fits(self, res: dict) -> bool:
        """Describe the server in ``res``; False where the point cannot run on it: its info is
        unusable (failed), or the point's tokens exceed its KV pool (skipped)."""
        ctx, gen, k = res["requested_ctx"], self.cfg.gen_tokens, self.cfg.concurrency
        self._describe_server(res)
        if launcher.INVALID in self.info:
            self._fail(res, f"server info unusable: {self.info[launcher.INVALID]}")
            return False
        max_total = launcher.info_field(self.info, "max_total_num_tokens")
        drafts = draft_reserve(self.info)
        if isinstance(max_total, int) and k * (ctx + gen + drafts) > max_total:
            res["status"] = "skipped"
            streams = f"{k} streams of " if k > 1 else ""
            also = f" + {drafts} draft tokens of a verify step" if drafts else ""
            res["reason"] = (
                f"{streams}prompt {ctx} + {gen} generated tokens{also} exceed the server's "
                f"max_total_num_tokens {max_total}"
            )
            self.console.print(f"{self.cfg.name} ctx {ctx}: skipped: {res['reason']}")
            return False
        return True

    def _round(self, res: dict, rng: prompts.IdRange, r: int, chunk: Chunk, deadline: float):
        """One round of ``concurrency`` streams, each recorded into the point; why it failed."""
        ctx, k, n = res["requested_ctx"], self.cfg.concurrency, self.cfg.requests_per_point
        timeout = _left(deadline, chunk.point_timeout_s)
        where = f" (round {r + 1} of {n})" if n > 1 else ""
        if timeout <= 0:
            return f"chunk timeout ({chunk.timeout_s:g} s) before round {r + 1} of {n}"
        salts = [_salt(r * k + i) for i in range(k)]
        ids = [prompts.make_input_ids(ctx, rng, self.cfg.seed, ctx, salt) for salt in salts]
        start = time.monotonic()
        recs, reason = self._stream(ctx, ids, timeout, chunk)
        wall = time.monotonic() - start
        for rec in recs:
            if reason is not None and rec.error is None and not rec.done:
                rec.error = reason  # cut short by the timeout or the server's death
        for i, (rec, salt) in enumerate(zip(recs, salts, strict=True)):
            res["requests"].append(self._request_record(res, rec, ctx, r, i, salt))
        tokens = sum(rec.completion_tokens or 0 for rec in recs)
        res["rounds"].append(
            {"round": r, "streams": k, "wall_s": wall, "tokens": tokens, "tok_s": tokens / wall}
        )
        return None if reason is None else reason + where

    def _finish(self, res: dict) -> None:
        """The point's summary over its requests; the first request fills the v1 fields."""
        reqs = res["requests"]
        if not reqs:
            return
        first = reqs[0]
        res["prompt_tokens"] = first["prompt_tokens"]
        res["meta_info"], res["finish_reason"] = reqs[-1]["meta_info"], first["finish_reason"]
        res["stream"], res["token_timestamps"] = first["http"], first["token_timestamps"]
        ok = [q for q in reqs if q["error"] is None]
        if len(ok) == len(reqs):
            res["metrics"] = metrics.point_summary(reqs)
            if res["rounds"]:
                rates = [x["tok_s"] for x in res["rounds"]]
                res["metrics"]["round_tok_s"] = metrics.median(rates)
        else:  # the failing request's timings so far
            bad = next(q for q in reqs if q["error"] is not None)
            res["metrics"] = dict(bad["metrics"]) | {"requests": len(reqs)}
            res["token_timestamps"], res["stream"] = bad["token_timestamps"], bad["http"]

    def _ensure_up(self, res: dict, deadline: float) -> bool:
        code = self.server.exit_code()
        if self.up and code is None:
            return True
        if self.up:  # it passed the last point's checks: its crash is on record only here
            launch, how = self.server.launches, _exit_text(code)
            res["warnings"].append(f"the server of launch {launch} exited between points ({how})")
            self.console.print(f"[yellow]{self.cfg.name}: {res['warnings'][-1]}; launching again")
        wait = self.cfg.start_timeout_s
        if self.url_gone_at is not None:
            wait = min(wait, URL_RECHECK_S)
        budget = _left(deadline, wait)
        try:
            self.info = self.server.start(timeout_s=max(budget, 0.001), info_deadline=deadline)
        except launcher.ServerError as exc:
            self.up = False
            self.server.stop()
            self._say_launch(res)
            self._fail(res, self._start_failure(budget, wait, exc))
            if not self.server.launched and budget >= wait and self.url_gone_at is None:
                self.url_gone_at = res["requested_ctx"]  # a whole start timeout: gone
            return False
        self.up, self.url_gone_at = True, None
        self.warmup = self._warm_up(deadline)
        return True

    def _start_failure(self, budget: float, wait: float, exc: Exception) -> str:
        """Why the server is not up after waiting ``budget`` of the ``wait`` it was given."""
        if self.server.launched:
            limit = "chunk timeout" if budget < wait else "start timeout"
            return f"server failed to start ({limit} {budget:.3g} s): {exc}"
        if budget < wait:
            return f"server not reachable (chunk timeout {budget:.3g} s): {exc}"
        if self.url_gone_at is not None:
            return (
                f"server not reachable (rechecked for {budget:.3g} s; unreachable through the "
                f"whole start timeout at ctx {self.url_gone_at}): {exc}"
            )
        return f"server not reachable (start timeout {budget:.3g} s): {exc}"

    def _warm_up(self, deadline: float) -> dict | None:
        """One short unrecorded request; what happened, never an exception (None: disabled)."""
        cfg = self.cfg
        if cfg.warmup_tokens == 0:
            return None
        timeout = max(_left(deadline, cfg.start_timeout_s), 0.001)
        info = {
            "launch": self.server.launches,
            "prompt_tokens": cfg.warmup_tokens,
            "gen_tokens": cfg.warmup_gen_tokens,
            "timeout_s": timeout,
            "ok": False,
            "completion_tokens": None,
            "seconds": None,
            "error": None,
        }
        start = time.monotonic()
        try:
            rng = self._prompt_ids()
            ids = prompts.make_input_ids(
                cfg.warmup_tokens, rng, cfg.seed, cfg.warmup_tokens, prompts.WARMUP_SALT
            )
            rec = run_async(self._warm_up_async(ids, timeout))
            info["completion_tokens"] = rec.completion_tokens
            info["error"] = rec.error
            info["ok"] = rec.error is None and rec.done
        except TimeoutError:
            info["error"] = f"warm-up timeout ({timeout:.3g} s)"
        except Exception as exc:  # noqa: BLE001 (recorded; the next point shows a dead server)
            info["error"] = f"warm-up error: {exc!r}"[:2000]
        info["seconds"] = time.monotonic() - start
        if not info["ok"]:
            self.console.print(f"[yellow]{cfg.name}: warm-up request failed: {info['error']}")
        return info

    async def _warm_up_async(self, ids: list[int], timeout: float) -> client.StreamRecord:
        rec = client.StreamRecord()
        limits = httpx.Timeout(connect=30.0, read=None, write=None, pool=None)
        async with httpx.AsyncClient(timeout=limits, headers=launcher.auth()) as http:
            cfg = self.cfg
            request = client.stream(
                http, self.server.url, cfg.api, ids, cfg.warmup_gen_tokens, rec, None, cfg.model
            )
            await asyncio.wait_for(request, timeout)
        return rec

    def _stop(self) -> None:
        self.server.stop()
        self.up = False

    def _describe_server(self, res: dict) -> None:
        res.update(
            server_url=self.server.url,
            server_info=self.info,
            server_command=self.server.command,
            server_launch=self.server.launches,
            warmup=self.warmup,
        )
        if self.warmup is not None and not self.warmup["ok"]:
            warning = f"warm-up request of launch {self.warmup['launch']} failed: "
            warning += str(self.warmup["error"])
            if warning not in res["warnings"]:
                res["warnings"].append(warning)

    def _prompt_ids(self) -> prompts.IdRange:
        """The ids prompts draw from: the server's vocabulary where it gives a usable one (an int
        of 2 up to what an int32 token id holds), else --vocab-size, else the default range."""
        vocab = launcher.info_field(self.info, "vocab_size")
        usable = isinstance(vocab, int) and not isinstance(vocab, bool) and 2 <= vocab <= 2**31
        return prompts.id_range(vocab if usable else None, self.cfg.vocab_size)

    def _id_range(self, res: dict, ctx: int) -> prompts.IdRange:
        rng = self._prompt_ids()
        if rng.source == "default":
            res["warnings"].append(
                f"vocab size unknown (none usable in server info, no --vocab-size): prompt ids "
                f"drawn from the default range [{rng.low}, {rng.high})"
            )
        res["prompt"] = {"tokens": ctx, "seed": self.cfg.seed, "id_range": rng.as_dict()}
        return rng

    # -- streaming with a deadline and a watch on the server process -----------------------------

    def _stream(
        self, ctx: int, ids: list[list[int]], timeout: float, chunk: Chunk
    ) -> tuple[list[client.StreamRecord], str | None]:
        """Stream one request per prompt at once; (records, None) or (records so far, why)."""
        with _PointProgress(self, ctx) as on_event:
            return run_async(self._stream_async(ids, timeout, chunk, on_event))

    async def _stream_async(
        self, ids: list[list[int]], timeout: float, chunk: Chunk, on_event: client.OnEvent
    ) -> tuple[list[client.StreamRecord], str | None]:
        recs = [client.StreamRecord() for _ in ids]
        limits = httpx.Timeout(connect=30.0, read=None, write=None, pool=None)
        pool = httpx.Limits(max_connections=len(ids) + 4)
        async with httpx.AsyncClient(timeout=limits, limits=pool, headers=launcher.auth()) as http:
            cfg = self.cfg
            tasks = [
                asyncio.create_task(
                    client.stream(
                        http, self.server.url, cfg.api, p, cfg.gen_tokens, rec, hook, cfg.model
                    )
                )
                for i, (p, rec) in enumerate(zip(ids, recs, strict=True))
                for hook in [on_event if i == 0 else None]
            ]
            try:
                reason = await self._watch(tasks, recs, timeout, chunk)
            finally:
                # Every stream ends before the client closes, on every path: a point timeout, a
                # dead server, a stop signal that cancelled this task.
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            for t in tasks:  # a stream that failed on its own (a bug): the point's error
                if not t.cancelled() and t.exception() is not None:
                    raise t.exception()
        if reason is None:
            bad = [(i, rec) for i, rec in enumerate(recs) if rec.error is not None]
            if bad:
                i, rec = bad[0]
                reason = self._error_reason(rec)
                reason += f" (stream {i + 1} of {len(recs)})" if len(recs) > 1 else ""
        return recs, reason

    async def _watch(
        self,
        tasks: list[asyncio.Task],
        recs: list[client.StreamRecord],
        timeout: float,
        chunk: Chunk,
    ) -> str | None:
        """Wait for the streams; why they had to stop early (None: they all ended)."""
        start = time.monotonic()
        while not all(t.done() for t in tasks):
            await asyncio.wait(tasks, timeout=0.1, return_when=asyncio.ALL_COMPLETED)
            code = self.server.exit_code()
            if code is not None:
                return f"server process died mid-point ({_exit_text(code)})"
            if time.monotonic() - start >= timeout and not all(t.done() for t in tasks):
                which = "point" if timeout >= chunk.point_timeout_s - 1e-9 else "chunk"
                limit = chunk.point_timeout_s if which == "point" else chunk.timeout_s
                late = next(rec for rec, t in zip(recs, tasks, strict=True) if not t.done())
                return f"{which} timeout ({limit:g} s) {self._phase(late)}"
        return None

    def _phase(self, rec: client.StreamRecord) -> str:
        got = rec.events[-1][1] if rec.events else 0
        where = "in prefill (no token yet)" if not got else f"after {got} tokens"
        if rec.last_byte_s is None:
            return f"{where}; no event received"
        return f"{where}; {client.silence(rec.elapsed() - rec.last_byte_s)}"

    def _error_reason(self, rec: client.StreamRecord) -> str:
        # A killed server closes the socket a moment before its exit is visible.
        for _ in range(20):
            code = self.server.exit_code()
            if code is not None:
                return f"server process died mid-point ({_exit_text(code)}): {rec.error}"
            if not self.server.launched:
                break
            time.sleep(0.05)
        return rec.error or "unknown error"

    def _request_record(
        self, res: dict, rec: client.StreamRecord, ctx: int, r: int, i: int, salt: int
    ) -> dict:
        """One request of the point as recorded: its metrics, meta_info and token times."""
        m = metrics.compute(rec.events, rec.prompt_tokens, rec.e2e_s, rec.completion_tokens)
        meta = rec.meta_info
        label = f"request {len(res['requests']) + 1}"
        figures, notes = metrics.server_figures(meta)  # the server's values are not trusted
        res["warnings"] += [f"{label}: {note}" for note in notes]
        for key in ("spec_accept_length", "spec_verify_ct"):
            m[key] = figures[key]
        verify_ct, n = figures["spec_verify_ct"], m["completion_tokens"]
        if m["spec_accept_length"] is None and verify_ct:
            # bench_serving's accept length: generated tokens per verify step
            m["spec_accept_length"] = n / verify_ct
        m |= metrics.step_rates(m, figures)
        if rec.prompt_tokens is not None and rec.prompt_tokens != ctx:
            res["warnings"].append(
                f"{label}: prompt token mismatch: sent {ctx}, server reports {rec.prompt_tokens}"
            )
        got = rec.completion_tokens
        if rec.done and got is not None and got != self.cfg.gen_tokens:
            res["warnings"].append(f"{label}: asked for {self.cfg.gen_tokens} tokens, got {got}")
        return {
            "round": r,
            "stream": i,
            "prompt_salt": salt,
            "prompt_tokens": rec.prompt_tokens,
            "error": rec.error,
            "metrics": m,
            "meta_info": meta,
            "finish_reason": rec.finish_reason,
            "http": {
                "done": rec.done,
                "http_status": rec.http_status,
                "first_byte_s": rec.first_byte_s,
                "last_byte_s": rec.last_byte_s,
                "error": rec.error,
            },
            "token_timestamps": [[round(t, 6), count] for t, count in rec.events],
        }

    # -- output ---------------------------------------------------------------------------------

    def _check_outputs(self) -> None:
        """ValueError, before anything is measured, where a point file or the server log could
        not be written, or a point file holds another server configuration's point (another
        name, or an ok point of the same name launched with another command)."""
        for ctx in (ctx for chunk in self.cfg.chunks for ctx in chunk.contexts):
            path = point_path(self.cfg.out, ctx)
            if why := unwritable(path):
                raise ValueError(f"--out: cannot write {path}: {why}")
            recorded = _recorded(path)
            other = recorded.get("name")
            if other not in (None, self.cfg.name):
                raise ValueError(
                    f"{path} holds the point of server {other!r}: give --name {other} to "
                    "measure it again, or another --out"
                )
            # the same name launched another way (a server by URL cannot be compared); a point
            # that failed or was skipped measured nothing, so a rescue with another flag may
            # replace it
            template, ours = _recorded_template(recorded), self.cfg.server_cmd
            measured = recorded.get("status") == "ok"
            why = _command_difference(template, ours) if measured and template and ours else None
            if why:
                raise ValueError(
                    f"{path} holds a point of server {self.cfg.name!r} launched with another "
                    f"command ({why}): give this configuration another --name or --out, "
                    "or remove the file to measure it again"
                )
        if self.log_path and (why := unwritable(self.log_path)):
            raise ValueError(f"--server-log: cannot write {self.log_path}: {why}")

    def _write(self, res: dict) -> None:
        # A record that breaks the schema is a bug: PointError ends the sweep, the file unwritten.
        point.check(res)
        path = point_path(self.cfg.out, res["requested_ctx"])
        if res["status"] != "ok" and _recorded(path).get("status") == "ok":
            kept = path.with_name(path.name + ".prev")  # no reader globs it as a point
            path.replace(kept)
            self.console.print(
                f"{self.cfg.name} ctx {res['requested_ctx']}: the earlier ok point is kept "
                f"as {kept}"
            )
        write_json(path, res, allow_nan=False)  # strict JSON: a NaN is a bug here
        self.written.append(path)

    def _summary(self, res: dict) -> None:
        m = res["metrics"]

        def f(key: str, fmt: str) -> str:
            return "-" if m.get(key) is None else format(m[key], fmt)

        self.console.print(
            f"{self.cfg.name} ctx {res['requested_ctx']}: ok  {m.get('requests')} requests  "
            f"ttft {f('ttft_s', '.3f')} s  prefill {f('prefill_tok_s', '.0f')} tok/s  "
            f"verify steps/s {f('verify_steps_s_client', '.2f')} (server "
            f"{f('verify_steps_s_server', '.2f')})  decode {f('decode_tok_s', '.2f')} tok/s  "
            f"itl p50 {f('itl_ms_p50', '.1f')} ms"
        )


class _PointProgress:
    """A live line on stderr while a point streams (prefill of a long context takes minutes)."""

    def __init__(self, runner: Runner, ctx: int) -> None:
        self.runner, self.ctx = runner, ctx
        self.progress: Progress | None = None
        self.stopped = threading.Event()
        self.tokens = 0

    def __enter__(self) -> Callable[[float, int], None]:
        gen, hook = self.runner.cfg.gen_tokens, self.runner.on_event
        label, task = f"{self.runner.cfg.name} ctx {self.ctx}", None
        if self.runner.cfg.progress and self.runner.console.is_terminal:
            self.progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.runner.console,
                transient=True,
            )
            self.progress.start()
            task = self.progress.add_task(f"{label} prefill", total=gen)
        elif self.runner.cfg.heartbeat_s > 0:
            every = self.runner.cfg.heartbeat_s
            threading.Thread(target=self._heartbeat, args=(label, every), daemon=True).start()

        def on_event(t: float, tokens: int) -> None:
            self.tokens = tokens
            if self.progress is not None:
                self.progress.update(task, completed=tokens, description=f"{label} decode")
            if hook is not None:
                hook(self.ctx, t, tokens)

        return on_event

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()
        self.stopped.set()

    def _heartbeat(self, label: str, every: float) -> None:
        """Without a terminal (logs), say every ``every`` s that the point is still running."""
        start = time.monotonic()
        while not self.stopped.wait(every):
            gen = self.runner.cfg.gen_tokens
            phase = f"decode {self.tokens}/{gen} tokens" if self.tokens else "prefill"
            self.runner.console.print(f"{label}: {phase}, {time.monotonic() - start:.0f} s")
