"""`decodecliff sweep`: a chunked context sweep against a launched server or a URL.

Every point gets its file, failed and skipped points included. Exit code 0 when some point
succeeded (or with --failed-points-ok), 3 when none did, 2 for usage errors, 1 when a result file
could not be written (or a point record did not match its schema, a bug).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from dataclasses import fields
from pathlib import Path

from decodecliff.helpformat import DefaultsHelpFormatter
from decodecliff.sweep import client, launcher, prompts
from decodecliff.sweep.point import PointError
from decodecliff.sweep.runner import URL_RECHECK_S, Chunk, Runner, SweepConfig
from decodecliff.values import is_server_url

NO_SUCCESS = 3  # exit code when no point succeeded


def _default(name: str) -> object:
    """SweepConfig's default of a setting: the options repeat it, never restate it."""
    return next(f.default for f in fields(SweepConfig) if f.name == name)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="decodecliff sweep",
        description="Stream requests at each context point and write <out>/ctx<N>.json each.",
        epilog=__doc__.split("\n\n")[1],  # the exit codes
        formatter_class=DefaultsHelpFormatter,
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--server-cmd",
        metavar="TEMPLATE",
        help="command that starts the server; {port} (a free port) and {host} are filled in",
    )
    where.add_argument("--url", help="an already running server (not launched or stopped)")
    p.add_argument("--name", required=True, help="name of the server configuration")
    p.add_argument(
        "--contexts",
        type=int,
        nargs="+",
        metavar="N",
        help="prompt lengths of the points (default: every point of --chunks-json)",
    )
    p.add_argument(
        "--chunks-json",
        type=Path,
        metavar="FILE",
        help='chunks: [{"contexts": [...], "timeout_s": S, "point_timeout_s": S}, ...] '
        "(timeouts default to the options); with --contexts only those points run (default: "
        "one chunk of --contexts)",
    )
    p.add_argument(
        "--gen-tokens",
        type=int,
        default=_default("gen_tokens"),
        metavar="N",
        help="tokens generated per request, at least 2 (the first is the prefill's)",
    )
    p.add_argument(
        "--warmup-tokens",
        type=int,
        default=_default("warmup_tokens"),
        metavar="N",
        help="prompt tokens of the unrecorded warm-up request sent after every server launch "
        "(0: no warm-up)",
    )
    p.add_argument(
        "--warmup-gen-tokens",
        type=int,
        default=_default("warmup_gen_tokens"),
        metavar="N",
        help="tokens the warm-up generates",
    )
    p.add_argument(
        "--requests-per-point",
        type=int,
        default=_default("requests_per_point"),
        metavar="N",
        help="recorded rounds per point after the warm-up (the summary is their median)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=_default("concurrency"),
        metavar="K",
        help="streams sent at once per round",
    )
    p.add_argument(
        "--point-timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="seconds per request (round)",
    )
    p.add_argument(
        "--chunk-timeout", type=float, default=7200.0, metavar="S", help="seconds per chunk"
    )
    p.add_argument(
        "--start-timeout",
        type=float,
        default=_default("start_timeout_s"),
        metavar="S",
        help="seconds a server may take to get healthy (a --url server that stayed unreachable "
        f"this long is then looked for {URL_RECHECK_S:g} s a point)",
    )
    p.add_argument(
        "--stop-grace",
        type=float,
        default=_default("stop_grace_s"),
        metavar="S",
        help="seconds from SIGTERM to SIGKILL when a launched server is stopped",
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder of the point files, ctx<N>.json; a failed point that replaces an ok one "
        "keeps it beside as ctx<N>.json.prev",
    )
    p.add_argument(
        "--api",
        choices=client.APIS,
        default=_default("api"),
        help="SGLang's native /generate or OpenAI's /v1/completions",
    )
    p.add_argument("--model", default=_default("model"), help="model name sent with --api openai")
    p.add_argument(
        "--seed", type=int, default=_default("seed"), help="seed of the prompt token ids"
    )
    low, high = prompts.DEFAULT_ID_RANGE
    p.add_argument(
        "--vocab-size",
        type=int,
        help="token id range when the server info has no usable vocab_size (default: ids from "
        f"{low} to {high - 1})",
    )
    p.add_argument("--host", default=_default("host"), help="host the launched server binds")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar on stderr")
    p.add_argument(
        "--heartbeat",
        type=float,
        default=_default("heartbeat_s"),
        metavar="S",
        help="without a terminal, a still-running line every S seconds (0: none)",
    )
    p.add_argument(
        "--server-log",
        type=Path,
        metavar="FILE",
        help="server stdout/stderr (default: <out>/server-<name>.log)",
    )
    p.add_argument(
        "--server-log-cap",
        type=float,
        default=_default("server_log_cap_mb"),
        metavar="MIB",
        help="MiB the server log may hold: past that a launch's output loses its middle (its "
        "start and latest output stay), and a log over half of it at a launch is moved to "
        "FILE.1 (0: no cap)",
    )
    p.add_argument(
        "--skip-reason",
        metavar="TEXT",
        help="write every point as skipped with this reason, starting nothing: a server whose "
        "backend cannot run on this machine (default: run the points)",
    )
    p.add_argument(
        "--failed-points-ok",
        action="store_true",
        help="exit 0 even when no point succeeded: failed points are results (the study's "
        "one-point jobs keep theirs)",
    )
    p.add_argument(
        "--stop-with-parent",
        nargs="?",
        const=0,
        type=int,
        metavar="PID",
        help="stop as on SIGTERM when the process that started this one exits: a scheduler "
        "killed outright (SIGKILL) then leaves no sweep and server measuring beside its rerun. "
        "PID: the parent it should have (a shell that execs the sweep passes $PPID), so a "
        "parent gone before the watch began counts too (default: the parent at the start)",
    )
    return p


def _load_chunks(path: Path, point_timeout: float, chunk_timeout: float) -> list[Chunk]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read chunks file {path}: {exc}") from exc
    raw = raw.get("chunks") if isinstance(raw, dict) else raw
    if not isinstance(raw, list) or not all(isinstance(c, dict) for c in raw):
        raise ValueError(f"{path}: expected a list of chunk objects (or {{'chunks': [...]}})")
    chunks = []
    for i, c in enumerate(raw):
        unknown = set(c) - {"contexts", "timeout_s", "point_timeout_s"}
        if unknown or not isinstance(c.get("contexts"), list):
            raise ValueError(f"{path}: chunk {i} needs 'contexts' (a list); unknown: {unknown}")
        try:
            chunk = Chunk(
                contexts=c["contexts"],
                timeout_s=c.get("timeout_s", chunk_timeout),
                point_timeout_s=c.get("point_timeout_s", point_timeout),
            )
        except ValueError as exc:
            raise ValueError(f"{path}: chunk {i}: {exc}") from None
        chunks.append(chunk)
    return chunks


def _select(chunks: list[Chunk], contexts: list[int]) -> list[Chunk]:
    """Only the given points, each keeping its chunk's timeouts (to rerun single points)."""
    known = {c for ch in chunks for c in ch.contexts}
    missing = sorted(set(contexts) - known)
    if missing:
        raise ValueError(f"contexts {missing} are in no chunk of the chunks file")
    picked = [
        Chunk([c for c in ch.contexts if c in contexts], ch.timeout_s, ch.point_timeout_s)
        for ch in chunks
        if any(c in contexts for c in ch.contexts)
    ]
    return picked


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    """The sweep described by the parsed options; ValueError for bad combinations."""
    if args.chunks_json is None and not args.contexts:
        raise ValueError("give --contexts or --chunks-json")
    if args.chunks_json is not None:
        chunks = _load_chunks(args.chunks_json, args.point_timeout, args.chunk_timeout)
        if args.contexts:
            chunks = _select(chunks, args.contexts)
    else:
        chunks = [Chunk(list(args.contexts), args.chunk_timeout, args.point_timeout)]
    if args.url is not None:
        _check_url(args.url)
    if args.server_cmd is not None:
        try:
            launcher.free_port(args.host)  # the host a launched server listens on resolves
        except OSError as exc:
            raise ValueError(f"--host {args.host}: {exc}") from None
    if args.vocab_size is not None and args.vocab_size < 2:
        raise ValueError(f"--vocab-size must be at least 2, got {args.vocab_size}")
    return SweepConfig(
        name=args.name,
        chunks=chunks,
        out=args.out,
        server_cmd=args.server_cmd,
        url=args.url,
        gen_tokens=args.gen_tokens,
        start_timeout_s=args.start_timeout,
        api=args.api,
        seed=args.seed,
        vocab_size=args.vocab_size,
        host=args.host,
        stop_grace_s=args.stop_grace,
        model=args.model,
        progress=not args.no_progress,
        heartbeat_s=args.heartbeat,
        server_log=args.server_log,
        server_log_cap_mb=args.server_log_cap,
        warmup_tokens=args.warmup_tokens,
        warmup_gen_tokens=args.warmup_gen_tokens,
        requests_per_point=args.requests_per_point,
        concurrency=args.concurrency,
    )


def _check_url(url: str) -> None:
    """http(s)://HOST[:PORT][/PREFIX]: the sweep adds /health, /generate, ... to it (a prefix:
    a server behind a proxy)."""
    if not is_server_url(url):
        raise ValueError(f"--url must be http(s)://HOST[:PORT][/PREFIX], got {url!r}")


def skip_all(runner: Runner, reason: str) -> list[dict]:
    """Every point of the sweep written as skipped with ``reason``; no server is started."""
    results = []
    for index, chunk in enumerate(runner.cfg.chunks):
        for ctx in chunk.contexts:
            res = runner._new_result(ctx, index, chunk)
            res["status"], res["reason"] = "skipped", reason
            res["server_log"], res["finished_at"] = None, res["started_at"]  # nothing launched
            runner._write(res)
            results.append(res)
    print(f"decodecliff sweep {runner.cfg.name}: skipped: {reason}", file=sys.stderr)
    return results


STOPPING = threading.Event()  # a stop signal arrived: the sweep is unwinding


def _exit_on_signal(signum: int, _frame: object) -> None:
    STOPPING.set()
    raise SystemExit(128 + signum)


def stop_with_parent(parent: int | None = None, poll_s: float = 1.0) -> threading.Thread:
    """Watch the parent process (``parent``: the pid it should be, as its launcher saw it; None:
    whatever it is now): once it is gone (this process re-parented), SIGTERM ourselves, so the
    sweep unwinds as on a scheduler's stop (its point written as interrupted, its server
    stopped); at once where it was gone before the watch began. Polling, not PR_SET_PDEATHSIG:
    that fires when the forking *thread* ends. A sweep already unwinding is left to finish."""
    parent = os.getppid() if parent is None else parent

    def watch() -> None:
        while os.getppid() == parent and not STOPPING.is_set():
            time.sleep(poll_s)
        if not STOPPING.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    watcher = threading.Thread(target=watch, name="stop-with-parent", daemon=True)
    watcher.start()
    return watcher


def cli(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
        runner = Runner(cfg)
    except ValueError as exc:
        parser.error(str(exc))  # exits 2
    # SIGTERM (a scheduler's cancel, Snakemake's stop) and SIGHUP (a closed terminal or SSH
    # session) unwind like Ctrl-C, so the runner's cleanup stops the server it launched instead
    # of leaving it orphaned.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    if args.stop_with_parent is not None:
        stop_with_parent(args.stop_with_parent or None)
    try:
        results = skip_all(runner, args.skip_reason) if args.skip_reason else runner.run()
    except OSError as exc:
        print(f"decodecliff sweep: cannot write results: {exc}", file=sys.stderr)
        return 1
    except PointError as exc:
        print(f"decodecliff sweep: {exc}", file=sys.stderr)
        return 1
    counts = {s: sum(r["status"] == s for r in results) for s in ("ok", "failed", "skipped")}
    print(
        f"decodecliff sweep {cfg.name}: {len(results)} points in {cfg.out} "
        f"({counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped)",
        file=sys.stderr,
    )
    if counts["ok"] == 0 and not args.failed_points_ok:
        print(f"decodecliff sweep {cfg.name}: no point succeeded", file=sys.stderr)
        return NO_SUCCESS
    return 0
