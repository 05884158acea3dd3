"""`decodecliff check-kernel`: the custom MLA kernel on a GPU: correctness over many random shapes,
planted mask problems, a CUDA-graph replay, sanitizers and timing against the floors.

Every case draws fresh random inputs (kernels/synthetic.py), poisons the output with NaN, runs each
kernel variant twice (the reruns must be bit-identical) and compares with one float64 reference
(kernels/reference.py): ||out - ref|| / ||ref||. Random data cannot show a mask error at long
context, so each variant also runs planted problems (kernels/planted.py), which fail on any wrong
mask decision. A CUDA-graph case per variant replays one captured launch at several context
lengths. With --sanitize a few small cases rerun under compute-sanitizer (memcheck, racecheck).
The timing pass (bench/timing.py: CUDA events, L2 flushed, the median) times the variants side by
side on the same batch and puts each point against its floor (bench/roofline.py): the latent KV
at the copy bandwidth, or the FLOPs at the dense bf16 matmul rate, whichever is larger, both
measured in the same run. On sm_90 that matmul rate is cuBLAS's (wgmma), above the mma.sync peak
the kernel is limited to (648 TFLOP/s on an H200, ../shared/reference/h200-sglang-kernels.md), so a
compute-bound point's floor is the lower of the two and its fraction of the floor conservative.
The problems, the checks and their tolerance, and the timing are the ones `bench-kernels` uses
(core.py). Tables print last; the JSON (check.json) and the log (check.log) go to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .. import envinfo
from ..helpformat import DefaultsHelpFormatter
from ..jsonio import not_a_folder, write_json
from ..kernels.api import AttentionBackend, AttnBatch
from ..kernels.custom import VARIANTS
from ..kernels.registry import get_backend
from ..kernels.synthetic import relative_error
from . import core, roofline
from .kernels import kv_lengths
from .timing import sync

DEFAULT_VARIANTS = ["v1", "v2", "v3", "v4"]
DEFAULT_OUT = Path("results/kernel-check")
# (repeats, warmup) of the timing pass, per variant and point; the Triton baseline's
TIMING_CALLS = {"quick": (50, 5), "full": (100, 10)}
TRITON_CALLS = (30, 3)
SANITIZER_TIMEOUT_S = 240  # per sanitizer run
# The kernel study's shapes for --grid: every (ctx, mode, heads, page size) combination
GRID = {
    "ctx": (1024, 16384, 65536, 185000),
    "modes": ((1, False), (16, False), (64, True)),  # decode, chain16, tree64
    "heads": (8, 64),
    "pages": (1, 64),
}
# Planted problems (kv_lens, q_len, heads, page_size, tree): decode, chain and tree, ragged, long
PLANTED_SHAPES = [
    ([4097], 1, 64, 16, False),
    ([5000, 17, 900, 64], 4, 8, 16, False),
    ([70000], 16, 8, 64, False),
    ([185000], 16, 8, 1, False),
    ([185000], 64, 8, 1, True),
]
SANITIZER_CASES = [
    {"kv_lens": [300], "q_len": 16, "heads": 8, "page_size": 1},
    {"kv_lens": [130, 70], "q_len": 1, "heads": 8, "page_size": 16},
    {"kv_lens": [90], "q_len": 16, "heads": 4, "page_size": 64, "tree": True},
]

Log = Callable[[str], None]
MakeBackend = Callable[..., AttentionBackend]  # (num_splits=, variant=) -> an attention backend


def custom(**options: object) -> AttentionBackend:
    """The custom kernel, built through the registry as the benches build every backend."""
    return get_backend("custom", **options)


# ---------------------------------------------------------------------------------------------
# the cases and points (pure: no GPU)


def correctness_cases(n_random: int, seed: int) -> list[dict]:
    """The fixed edge cases, then ``n_random`` random ones drawn from ``seed``."""
    base = {"page_size": 1, "tree": False, "seed": 0}
    fixed = [
        {"kv_lens": [1], "q_len": 1, "heads": 8},
        {"kv_lens": [33], "q_len": 1, "heads": 8},
        {"kv_lens": [16], "q_len": 16, "heads": 8},
        {"kv_lens": [100], "q_len": 16, "heads": 8},
        {"kv_lens": [1000], "q_len": 16, "heads": 8, "tree": True},
        {"kv_lens": [4097], "q_len": 1, "heads": 64, "page_size": 16},
        {"kv_lens": [70000], "q_len": 16, "heads": 8, "page_size": 64},
        {"kv_lens": [185000], "q_len": 16, "heads": 8},
        {"kv_lens": [185000], "q_len": 1, "heads": 8},
        {"kv_lens": [185000], "q_len": 64, "heads": 8, "tree": True},
        {"kv_lens": [200000], "q_len": 16, "heads": 64, "page_size": 64},
        {"kv_lens": [5000, 17, 900, 64], "q_len": 4, "heads": 8, "page_size": 16},
        {"kv_lens": [3000, 256], "q_len": 256, "heads": 8, "tree": True},
        {"kv_lens": [9000], "q_len": 5, "heads": 3, "num_splits": 7},
        {"kv_lens": [50000], "q_len": 16, "heads": 8, "num_splits": 1},
        {"kv_lens": [2000], "q_len": 2, "heads": 8, "num_splits": 1024},
        {"kv_lens": [12345, 678], "q_len": 16, "heads": 8, "drop_hints": True},
        {"kv_lens": [40, 3, 17], "q_len": 3, "heads": 5},  # fewer tiles than the ring holds
        {"kv_lens": [131072], "q_len": 1, "heads": 8, "page_size": 16},
    ]
    rng = random.Random(seed)
    return [{**base, **c} for c in fixed] + [random_case(rng, 1000 + i) for i in range(n_random)]


def random_case(rng: random.Random, seed: int) -> dict:
    """A decode, chain or tree problem of up to 5 requests and 200k tokens (at most ~3e8 rows x
    tokens, so its reference fits in memory)."""
    kind = rng.choice(["decode", "chain", "tree"])
    heads = rng.choice([8, 8, 8, 64, 16, 5])
    q_len = {
        "decode": 1,
        "chain": rng.choice([2, 7, 16, 33, 64]),
        "tree": rng.choice([16, 64, 128, 256]),
    }[kind]
    b = rng.choice([1, 1, 2, 3, 5])
    cap = max(q_len, int(3e8 / (q_len * heads * b)))
    kv_lens = [
        max(q_len, min(cap, int(math.exp(rng.uniform(0, math.log(200_000)))))) for _ in range(b)
    ]
    case = {
        "kv_lens": kv_lens,
        "q_len": q_len,
        "heads": heads,
        "tree": kind == "tree",
        "page_size": rng.choice([1, 16, 64]),
        "seed": seed,
    }
    if rng.random() < 0.2:
        case["num_splits"] = rng.randint(1, 300)
    if rng.random() < 0.1:
        case["drop_hints"] = True
    return case


def timing_points(quick: bool, grid: bool = False) -> list[tuple]:
    """(ctx, q_len, heads, tree, page_size, fixed splits or None) per timed point."""
    if grid:
        return [
            (ctx, q_len, heads, tree, ps, None)
            for heads in GRID["heads"]
            for ps in GRID["pages"]
            for q_len, tree in GRID["modes"]
            for ctx in GRID["ctx"]
        ]
    ctxs = (16384, 65536, 131072, 185000) if quick else (1024, 16384, 65536, 131072, 185000)
    points = []
    for ctx in ctxs:
        points += [(ctx, 1, 8, False, 1, None), (ctx, 16, 8, False, 1, None)]
        points.append((ctx, 64, 8, True, 1, None))
    points += [(185000, 16, 8, False, 64, None), (185000, 16, 64, False, 1, None)]
    if not quick:
        points += [(16384, 16, 64, False, 1, None), (185000, 1, 64, False, 1, None)]
        points += [(185000, 16, 8, False, 1, s) for s in (16, 66, 132)]
        points += [(185000, 1, 8, False, 1, s) for s in (132, 528)]
    return points


SHAPE_FORMAT = "CTX:Q_LEN:HEADS[:PAGE_SIZE][:tree][:batch=B][:splits=S]"


def parse_shape(text: str) -> dict:
    """CTX:Q_LEN:HEADS[:PAGE_SIZE][:tree][:batch=B][:splits=S] (e.g. 185000:16:8,
    185000:64:8:64:tree or 185000:1:8:batch=4:splits=132) as the arguments of random_batch, and
    ``num_splits`` (None: the kernel's plan). batch=B is a ragged batch of B requests, ctx down to
    ctx / B (as bench-kernels --ragged lays it out)."""
    parts = text.split(":")
    options = dict(p.split("=", 1) for p in parts if "=" in p)
    parts = [p for p in parts if "=" not in p]
    tree = bool(parts) and parts[-1] == "tree"
    numbers = parts[:-1] if tree else parts
    try:
        values = [int(p) for p in numbers]
        batch, splits = int(options.pop("batch", 1)), options.pop("splits", None)
        splits = None if splits is None else int(splits)
    except ValueError:
        values, batch, splits = [], 1, None
    if (
        len(values) not in (3, 4) or min(values) < 1 or values[0] < values[1] or options
        or batch < 1 or (splits is not None and splits < 1)
    ):  # fmt: skip
        raise argparse.ArgumentTypeError(
            f"{text!r} is not {SHAPE_FORMAT} with positive numbers and CTX >= Q_LEN"
        )
    ctx, q_len, heads = values[:3]
    page_size = values[3] if len(values) == 4 else 1
    kv_lens = kv_lengths(ctx, q_len, batch, ragged=True)
    return {
        "kv_lens": kv_lens, "q_len": q_len, "heads": heads, "page_size": page_size, "tree": tree,
        "num_splits": splits,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------
# correctness


def case_batch(case: dict, device: torch.device | str) -> AttnBatch:
    """The case's random problem (core.problem) on ``device``."""
    kw = {k: case[k] for k in ("kv_lens", "q_len", "heads", "page_size", "tree")}
    batch = core.problem(**kw, device=device, seed=case["seed"])
    if case.get("drop_hints"):  # the kernel must plan from the tensors alone
        batch.meta.max_q_len = None
        batch.meta.max_kv_len = None
    return batch


def check_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def run_case(
    case: dict, variants: list[str], log: Log, make_backend: MakeBackend = custom
) -> list[dict]:
    """One random problem, one float64 reference, every variant run twice on NaN-poisoned output."""
    batch = case_batch(case, check_device())
    ref = core.reference(batch)
    results = []
    for variant in variants:
        backend = make_backend(num_splits=case.get("num_splits"), variant=variant)
        first = core.run_once(backend, batch)
        out = core.run_once(backend, batch)
        err, why = core.output_error(out, ref)
        res = {
            "variant": variant,
            **{k: v for k, v in case.items() if k != "kv_lens"},
            "kv_lens": case["kv_lens"][:4],
            "batch": len(case["kv_lens"]),
            "splits": backend.describe().get("num_splits"),
            "rel_err": err,
            "finite": bool(torch.isfinite(out).all()),
            "deterministic": bool(torch.equal(first, out)),
        }
        res["ok"] = res["deterministic"] and why is None
        if not res["ok"]:
            log(f"FAIL {res}")
            diagnose(out, ref, log)
        results.append(res)
    return results


def diagnose(out: torch.Tensor, ref: torch.Tensor, log: Log) -> None:
    """Where the error sits: per head, per token, per 64-column block, per 8-column group."""
    d = (out.double().cpu() - ref).abs().nan_to_num(1e9)
    log(f"  nan count {int(torch.isnan(out.float()).sum())} / {out.numel()}")
    log(f"  err by head   {d.amax(dim=(0, 2))[:16].tolist()}")
    log(f"  err by token  {d.amax(dim=(1, 2))[:32].tolist()}")
    log(f"  err by 64-col {d.amax(dim=(0, 1)).view(8, 64).amax(1).tolist()}")
    log(f"  err by 8-col  {d.amax(dim=(0, 1)).view(64, 8).amax(1)[:16].tolist()}")
    log(f"  ref sample {ref[0, 0, :4].tolist()} out {out[0, 0, :4].float().tolist()}")


def planted_checks(
    shape: tuple,
    variants: list[str],
    seed: int,
    log: Log,
    make_backend: MakeBackend = custom,
) -> list[dict]:
    """One planted problem, every variant: each row must return its visible token, not its hidden
    one (the per-row error against the float64 reference within planted.PLANTED_TOL)."""
    kv_lens, q_len, heads, page_size, tree = shape
    plant, ref = core.planted_problem(*shape, device=check_device(), seed=seed)
    results = []
    for variant in variants:
        worst = core.planted_error(make_backend(variant=variant), plant, ref)
        res = {
            "variant": variant,
            "kv_lens": kv_lens[:4],
            "batch": len(kv_lens),
            "q_len": q_len,
            "heads": heads,
            "page_size": page_size,
            "tree": tree,
            "seed": seed,
            "row_err": worst["max_err"],
            "worst_row": f"token {worst['token']} head {worst['head']}: shows {worst['visible']}, "
            f"hides {worst['hidden']}",
            "ok": worst["ok"],
        }
        log(f"{'ok  ' if res['ok'] else 'FAIL'} planted {json.dumps(res)}")
        results.append(res)
    return results


def graph_case(variant: str, log: Log) -> dict:
    """One captured launch (fixed splits), replayed after kv_lens change on the device."""
    batch = core.problem([150_000, 40_000], 16, 8, device="cuda", seed=7)
    backend = custom(num_splits=16, variant=variant)
    out = batch.new_output()
    backend(batch, out)  # sizes the workspace before capture
    sync(batch.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend(batch, out)
    errs = []
    for lens in ([150_000, 40_000], [1_000, 39_000], [149_999, 16], [77_777, 20_000]):
        batch.meta.kv_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        sync(batch.device)
        errs.append(relative_error(out, core.reference(batch)))
    res = {
        "variant": variant,
        "case": "cuda_graph_replay",
        "rel_errs": errs,
        "rel_err": max(errs),
        "ok": all(e < core.REL_TOL for e in errs),
    }
    log(f"graph: {res}")
    return res


# ---------------------------------------------------------------------------------------------
# compute-sanitizer


def sanitizer_child(variants: list[str]) -> int:
    """Small cases to run under compute-sanitizer (inputs on the GPU before the kernels)."""
    for case in SANITIZER_CASES:
        batch = case_batch({"tree": False, **case, "seed": 3}, "cuda")
        ref = core.reference(batch)
        for variant in variants:
            err, why = core.output_error(
                core.run_once(custom(num_splits=3, variant=variant), batch), ref
            )
            print(f"sanitizer case {variant} {case}: rel_err {err:.2e}")
            if why:
                return 3
    return 0


def sanitizer_command(tool: str, check: str, variants: list[str]) -> list[str]:
    """compute-sanitizer running this command's sanitizer child on the custom kernels only."""
    return [
        tool, "--tool", check, "--kernel-name", "kns=mla_", "--error-exitcode", "9",
        sys.executable, "-m", "decodecliff.cli", "check-kernel", "--sanitizer-child",
        "--variants", *variants,
    ]  # fmt: skip


def _text(output: str | bytes | None) -> str:
    """What a timed-out child had written (bytes or None, whatever ``text=True`` asked)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def run_sanitizers(out_dir: Path, variants: list[str], log: Log) -> list[dict]:
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not Path(tool).exists():
        log("compute-sanitizer not found: skipped")
        return []
    results = []
    for check in ("memcheck", "racecheck"):  # initcheck: >240 s under torch, skipped
        cmd = sanitizer_command(tool, check, variants)
        start = time.time()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SANITIZER_TIMEOUT_S)
            if proc.returncode not in (0, 3, 9):  # the kernel-name filter not understood: all
                cmd = [c for c in cmd if c not in ("--kernel-name", "kns=mla_")]
                proc = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=SANITIZER_TIMEOUT_S
                )
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:  # a failed check: the others and the report stay
            rc, text = None, _text(exc.stdout) + _text(exc.stderr)
            text += f"\ntimed out after {SANITIZER_TIMEOUT_S} s\n"
        (out_dir / f"sanitizer_{check}.log").write_text(text)
        summary = [ln for ln in text.splitlines() if "ERROR SUMMARY" in ln or "RACECHECK" in ln]
        if rc is None:
            summary.append(f"timed out after {SANITIZER_TIMEOUT_S} s")
        res = {
            "tool": check,
            "rc": rc,
            "summary": summary[-2:],
            "seconds": round(time.time() - start, 1),
            "ok": rc == 0,
        }
        log(f"sanitizer {res}")
        if not res["ok"]:
            log(text[-1500:])
        results.append(res)
    return results


# ---------------------------------------------------------------------------------------------
# timing


def point_floor_ms(ctx: int, q_len: int, heads: int, ceilings: dict) -> float:
    """The roofline floor of one point (one request) from the measured ceilings (core.floor_ms)."""
    return core.floor_ms(ctx, q_len, heads, 1, ceilings)


def point_batch(point: tuple, device: torch.device | str) -> AttnBatch:
    """The random problem of one timing point (one request)."""
    ctx, q_len, heads, tree, ps, _ = point
    return core.problem([ctx], q_len, heads, ps, tree, device=device, seed=ctx + q_len)


def time_point(
    point: tuple,
    batch: AttnBatch,
    variants: list[str],
    ceilings: dict,
    calls: tuple[int, int],
    make_backend: MakeBackend = custom,
) -> dict:
    """One timing point, every variant on the same batch, against the point's floor."""
    ctx, q_len, heads, tree, ps, splits = point
    row = {
        "ctx": ctx, "L": q_len, "heads": heads, "tree": tree, "page": ps,
        "fixed_splits": splits, "floor_ms": point_floor_ms(ctx, q_len, heads, ceilings),
        "variants": {},
    }  # fmt: skip
    for variant in variants:
        backend = make_backend(num_splits=splits, variant=variant)
        ms = core.time_step(backend, batch, *calls)
        r = core.rates(ms, ctx, q_len, heads, 1, ceilings)
        row["variants"][variant] = {
            "splits": backend.describe().get("num_splits"),
            "ms": ms,
            "GBps": r["gbs"],
            "TFLOPs": r["tflops"],
            "of_floor": r["roofline_frac"],
        }
    return row


def triton_baseline(quick: bool, log: Log) -> AttentionBackend | None:
    """The Triton baseline from the registry, timed beside the kernel on a few points (not with
    --quick); None when it cannot run here."""
    if quick:
        return None
    try:
        return get_backend("triton")
    except Exception as exc:  # the baseline is optional here: not importable on this host
        log(f"triton baseline unavailable: {exc!r}")
        return None


def timing(
    log: Log, ceilings: dict, variants: list[str], quick: bool, grid: bool = False
) -> list[dict]:
    """Each point once per variant on the same batch; the Triton baseline on a few (not quick)."""
    triton = triton_baseline(quick, log)
    triton_points = {(16384, 16, 8), (185000, 16, 8), (185000, 1, 8), (1024, 16, 8)}
    calls = TIMING_CALLS["quick" if quick else "full"]
    rows = []
    for point in timing_points(quick, grid):
        batch = point_batch(point, "cuda")
        row = time_point(point, batch, variants, ceilings, calls)
        ctx, q_len, heads, tree, ps, splits = point
        baseline = (ctx, q_len, heads) in triton_points and not tree and ps == 1 and not splits
        if triton is not None and baseline:
            row["triton_ms"] = core.time_step(triton, batch, *TRITON_CALLS)
        log(json.dumps(row))
        rows.append(row)
        del batch
    return rows


def timing_table(rows: list[dict], variants: list[str], ceilings: dict) -> list[str]:
    """The timing pass as text lines: per variant splits, ms, GB/s and % of the floor."""
    lines = [
        f"copy bandwidth {ceilings['copy_gbs']:.0f} GB/s, matmul {ceilings['matmul_tflops']:.0f} "
        "TFLOP/s (measured); per variant: splits, ms, GB/s, % of floor"
    ]
    head = f"{'ctx':>7} {'L':>3} {'H':>3} {'tree':>5} {'pg':>3} {'floor':>7}"
    for v in variants:
        head += f" | {v + ' S':>6} {'ms':>8} {'GB/s':>6} {'%fl':>5}"
    if len(variants) > 1:
        head += f" | {variants[-1] + '/' + variants[0]:>7}"
    lines.append(head + f" | {'triton':>8} {'x':>6}")
    for r in rows:
        line = (
            f"{r['ctx']:>7} {r['L']:>3} {r['heads']:>3} {r['tree']!s:>5} {r['page']:>3} "
            f"{r['floor_ms']:7.4f}"
        )
        for v in variants:
            t = r["variants"][v]
            line += (
                f" | {t['splits']:>6} {t['ms']:8.4f} {t['GBps']:6.0f} {100 * t['of_floor']:4.0f}%"
            )
        if len(variants) > 1:
            speedup = r["variants"][variants[0]]["ms"] / r["variants"][variants[-1]]["ms"]
            line += f" | {speedup:6.2f}x"
        tr = r.get("triton_ms")
        if tr is not None:
            line += f" | {tr:8.3f} {tr / r['variants'][variants[0]]['ms']:6.1f}"
        lines.append(line)
    return lines


def summary_lines(report: dict) -> list[str]:
    """Per variant: cases ok and the worst error; the planted checks; the sanitizers."""
    lines = []
    for variant in report["variants"]:
        mine = [r for r in report["correctness"] if r["variant"] == variant]
        if mine:
            worst = max(r["rel_err"] for r in mine)
            n_ok = sum(r["ok"] for r in mine)
            lines.append(f"correctness {variant}: {n_ok}/{len(mine)} ok, max rel err {worst:.2e}")
        planted = [r for r in report["planted"] if r["variant"] == variant]
        if planted:
            worst = max(r["row_err"] for r in planted)
            n_ok = sum(r["ok"] for r in planted)
            lines.append(f"planted {variant}: {n_ok}/{len(planted)} ok, max row err {worst:.2e}")
    for s in report["sanitizers"]:
        lines.append(f"sanitizer {s['tool']}: rc {s['rc']} {s['summary']}")
    return lines


def passed(report: dict) -> bool:
    checks = report["correctness"] + report["planted"] + report["sanitizers"]
    return all(r["ok"] for r in checks)


# ---------------------------------------------------------------------------------------------
# the command


DESCRIPTION = (
    "Check the custom MLA kernel on a CUDA GPU: each variant against a float64 reference on many "
    "random shapes (NaN-poisoned output, two bit-identical runs), on planted mask problems and in "
    "a CUDA-graph replay, optionally under compute-sanitizer, then timed against the roofline "
    "floor. Needs the built library (decodecliff build-kernel)."
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="decodecliff check-kernel",
        description=DESCRIPTION,
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument(
        "--variants",
        nargs="+",
        choices=sorted(VARIANTS),
        default=DEFAULT_VARIANTS,
        help="kernel variants to check and time side by side "
        f"(default: {' '.join(DEFAULT_VARIANTS)})",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="10 random cases and the main timing points (about a minute on an H200)",
    )
    p.add_argument(
        "--cases",
        type=int,
        default=None,
        help="random cases beyond the fixed ones (default: 40, or 10 with --quick)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the random cases (default: a fresh one every run, printed and recorded)",
    )
    p.add_argument(
        "--sanitize",
        action="store_true",
        help="also rerun small cases under compute-sanitizer (memcheck, racecheck)",
    )
    p.add_argument("--no-timing", action="store_true", help="check only, time nothing")
    p.add_argument(
        "--grid",
        action="store_true",
        help="time ctx 1k/16k/64k/185k x decode/chain16/tree64 x 8/64 heads x page 1/64 instead "
        "of the main points",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="folder of check.json, check.log and the sanitizer logs",
    )
    p.add_argument(
        "--launch",
        type=parse_shape,
        metavar=SHAPE_FORMAT,
        default=None,
        help="only launch the first variant on this shape --launches times, for a profiler such "
        "as Nsight Compute (default: off, run the checks)",
    )
    p.add_argument("--launches", type=int, default=3, help="launches of --launch")
    p.add_argument("--sanitizer-child", action="store_true", help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.cases is not None and args.cases < 0:
        p.error("--cases must be >= 0")
    if args.launches < 1:
        p.error("--launches must be >= 1")
    if why := not_a_folder(args.out):
        p.error(f"--out {args.out}: {why}")
    args.variants = list(dict.fromkeys(args.variants))
    return args


def launch(shape: dict, variant: str, launches: int) -> int:
    """Launch one variant on one shape a few times, nothing else (what a profiler records)."""
    shape = dict(shape)
    splits = shape.pop("num_splits")
    batch = core.problem(**shape, device="cuda", seed=1)
    step = custom(variant=variant, num_splits=splits).prepare(batch, batch.new_output())
    for _ in range(launches):
        step()
    sync(batch.device)
    return 0


def run(args: argparse.Namespace, log: Log) -> dict:
    """Every check (and the timing pass) of the parsed options; the JSON document."""
    start = time.time()
    variants = args.variants
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    n_cases = args.cases if args.cases is not None else (10 if args.quick else 40)
    report = {"env": envinfo.collect(), "seed": seed, "variants": variants, "quick": args.quick}
    log(f"seed {seed}  device {torch.cuda.get_device_name()}  variants {variants}")
    results = []
    for case in correctness_cases(n_cases, seed):
        t0 = time.time()
        for res in run_case(case, variants, log):
            shown = {k: res[k] for k in res if k not in ("ok", "variant")}
            log(
                f"{'ok  ' if res['ok'] else 'FAIL'} {res['variant']} err {res['rel_err']:.2e} "
                f"{time.time() - t0:5.1f}s {json.dumps(shown)}"
            )
            results.append(res)
    results += [graph_case(variant, log) for variant in variants]
    report["correctness"] = results
    report["planted"] = [r for s in PLANTED_SHAPES for r in planted_checks(s, variants, seed, log)]
    log(f"correctness done in {time.time() - start:.0f} s")
    report["sanitizers"] = run_sanitizers(args.out, variants, log) if args.sanitize else []
    if not args.no_timing:
        ceilings = roofline.measure_ceilings(torch.device("cuda"))
        report["ceilings"], report["copy_GBps"] = ceilings, ceilings["copy_gbs"]
        report["timing"] = timing(log, ceilings, variants, args.quick, args.grid)
    report["seconds"] = time.time() - start
    return report


def cli(argv: list[str]) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "decodecliff check-kernel: needs a CUDA GPU, and torch sees none "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'})",
            file=sys.stderr,
        )
        return 2
    if args.sanitizer_child:
        return sanitizer_child(args.variants)
    if args.launch:
        return launch(args.launch, args.variants[0], args.launches)
    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.out / "check.log"
    (args.out / "check.json").unlink(missing_ok=True)  # an earlier run's, not this log's
    log_path.write_text("")

    def log(msg: str) -> None:
        print(msg, flush=True)
        with log_path.open("a") as f:
            f.write(msg + "\n")

    report = run(args, log)
    write_json(args.out / "check.json", report, default=str)
    print()
    print("\n".join(summary_lines(report)))
    if "timing" in report:
        print("\n".join(timing_table(report["timing"], args.variants, report["ceilings"])))
    print(f"total {report['seconds']:.0f} s")
    return 0 if passed(report) else 1
