"""Check the custom MLA kernel on a GPU: correctness over many random shapes, sanitizers, timing.

    python scripts/check_custom_kernel.py [--variants v1 v2 v3] [--quick] [--sanitize] [--out DIR]
                                          [--cases N] [--seed N] [--no-timing] [--grid]

Needs a CUDA GPU and the built library (`decodecliff build-kernel`). Every case draws fresh random
inputs, poisons the output with NaN, runs each kernel variant twice (the reruns must be
bit-identical) and compares with one float64 reference (||out - ref|| / ||ref||). A CUDA-graph
case per variant replays one captured launch at several context lengths. With --sanitize a few
small cases rerun under compute-sanitizer (memcheck, racecheck) per variant. The timing pass uses
triton.testing.do_bench (median, L2 flushed), times the variants side by side on the same batch,
and reports each point against the floors: bytes / measured copy bandwidth and FLOPs / the
mma.sync peak (648 TFLOP/s measured on H200). --quick keeps 10 random cases and the main timing
points (about a minute on an H200). Tables print last; JSON + logs go to --out.
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
from pathlib import Path

import torch

from decodecliff import envinfo
from decodecliff.kernels.api import D_QK, D_V, AttnBatch
from decodecliff.kernels.custom import VARIANTS, CustomAttention
from decodecliff.kernels.reference import TorchAttention, reference_attention
from decodecliff.kernels.synthetic import random_batch, random_tree_mask, relative_error

TOL = 1e-2
MMA_PEAK = 648e12  # mma.sync bf16 peak measured on H200 (shared/reference/h200-sglang-kernels.md)


def gpu_batch(kv_lens, q_len, heads, page_size=1, tree=False, seed=0, spare_pages=3) -> AttnBatch:
    """random_batch's layout (scattered pages, ragged requests), drawn on the GPU for speed."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    cpu_g = torch.Generator().manual_seed(seed)
    pages = [math.ceil(n / page_size) for n in kv_lens]
    num_pages = sum(pages) + spare_pages
    order = torch.randperm(num_pages, generator=g, device="cuda").to(torch.int32)
    table = torch.zeros(len(kv_lens), max(pages) + 1, dtype=torch.int32, device="cuda")
    start = 0
    for b, n in enumerate(pages):
        table[b, :n] = order[start : start + n]
        start += n
    kv = torch.randn(num_pages, page_size, D_QK, generator=g, device="cuda").to(torch.bfloat16)
    q = torch.randn(q_len * len(kv_lens), heads, D_QK, generator=g, device="cuda")
    mask = None
    if tree:
        mask = torch.stack([random_tree_mask(q_len, cpu_g) for _ in kv_lens]).cuda()
    return AttnBatch(
        q=q.to(torch.bfloat16),
        kv_cache=kv,
        page_table=table,
        kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device="cuda"),
        q_indptr=torch.arange(0, q_len * (len(kv_lens) + 1), q_len, dtype=torch.int32).cuda(),
        sm_scale=1.0 / math.sqrt(192),
        tree_mask=mask,
        max_q_len=q_len,
        max_kv_len=max(kv_lens),
    )


def gpu_reference(batch: AttnBatch) -> torch.Tensor:
    """float64 attention computed on the GPU (same code as reference_attention, other device)."""
    up = AttnBatch(**{**batch.__dict__, "q": batch.q.double(), "kv_cache": batch.kv_cache.double()})
    return TorchAttention(torch.float64)(up)


def run_case(case: dict, variants: list[str], log) -> list[dict]:
    """One random problem, one float64 reference, every variant run twice on NaN-poisoned output."""
    kw = {k: case[k] for k in ("kv_lens", "q_len", "heads", "page_size", "tree")}
    if case.get("cpu_builder"):
        batch = random_batch(**kw, seed=case["seed"], device="cuda", spare_pages=2)
    else:
        batch = gpu_batch(**kw, seed=case["seed"])
    if case.get("drop_hints"):
        batch.max_q_len = None
        batch.max_kv_len = None
    small = sum(case["kv_lens"]) * case["q_len"] * case["heads"] < 2e6
    ref = reference_attention(batch) if small else gpu_reference(batch).cpu()
    results = []
    for variant in variants:
        backend = CustomAttention(num_splits=case.get("num_splits"), variant=variant)
        out = torch.full(
            (batch.q.shape[0], batch.num_heads, D_V),
            float("nan"),
            dtype=torch.bfloat16,
            device="cuda",
        )
        backend(batch, out)
        torch.cuda.synchronize()
        first = out.clone()
        out.fill_(float("nan"))
        backend(batch, out)
        torch.cuda.synchronize()
        err = relative_error(out, ref)
        res = {
            "variant": variant,
            **{k: v for k, v in case.items() if k != "kv_lens"},
            "kv_lens": case["kv_lens"][:4],
            "batch": len(case["kv_lens"]),
            "splits": backend.plan(batch).num_splits,
            "rel_err": err,
            "finite": bool(torch.isfinite(out).all()),
            "deterministic": bool(torch.equal(first, out)),
        }
        res["ok"] = res["finite"] and res["deterministic"] and err < TOL
        if not res["ok"]:
            log(f"FAIL {res}")
            diagnose(out, ref, batch, log)
        results.append(res)
    return results


def diagnose(out: torch.Tensor, ref: torch.Tensor, batch: AttnBatch, log) -> None:
    """Where the error sits: per head, per token, per 64-column block, per 8-column group."""
    d = (out.double().cpu() - ref).abs().nan_to_num(1e9)
    log(f"  nan count {int(torch.isnan(out.float()).sum())} / {out.numel()}")
    log(f"  err by head   {d.amax(dim=(0, 2))[:16].tolist()}")
    log(f"  err by token  {d.amax(dim=(1, 2))[:32].tolist()}")
    log(f"  err by 64-col {d.amax(dim=(0, 1)).view(8, 64).amax(1).tolist()}")
    log(f"  err by 8-col  {d.amax(dim=(0, 1)).view(64, 8).amax(1)[:16].tolist()}")
    log(f"  ref sample {ref[0, 0, :4].tolist()} out {out[0, 0, :4].float().tolist()}")


def correctness_cases(n_random: int, seed: int) -> list[dict]:
    base = {"page_size": 1, "tree": False, "seed": 0}
    fixed = [
        {"kv_lens": [1], "q_len": 1, "heads": 8},
        {"kv_lens": [33], "q_len": 1, "heads": 8},
        {"kv_lens": [16], "q_len": 16, "heads": 8},
        {"kv_lens": [100], "q_len": 16, "heads": 8, "cpu_builder": True},
        {"kv_lens": [1000], "q_len": 16, "heads": 8, "tree": True, "cpu_builder": True},
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
    cases = [{**base, **c} for c in fixed]
    rng = random.Random(seed)
    for i in range(n_random):
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
            "seed": 1000 + i,
        }
        if rng.random() < 0.2:
            case["num_splits"] = rng.randint(1, 300)
        if rng.random() < 0.1:
            case["drop_hints"] = True
        cases.append(case)
    return cases


def graph_case(variant: str, log) -> dict:
    """One captured launch (fixed splits), replayed after kv_lens change on the device."""
    batch = gpu_batch([150_000, 40_000], q_len=16, heads=8, seed=7)
    backend = CustomAttention(num_splits=16, variant=variant)
    out = batch.new_output()
    backend(batch, out)  # sizes the workspace before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend(batch, out)
    errs = []
    for lens in ([150_000, 40_000], [1_000, 39_000], [149_999, 16], [77_777, 20_000]):
        batch.kv_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        errs.append(relative_error(out, gpu_reference(batch).cpu()))
    res = {
        "variant": variant,
        "case": "cuda_graph_replay",
        "rel_errs": errs,
        "rel_err": max(errs),
        "ok": all(e < TOL for e in errs),
    }
    log(f"graph: {res}")
    return res


def sanitizer_child(variants: list[str]) -> int:
    """Small cases to run under compute-sanitizer (inputs on the GPU before the kernels)."""
    for kw in (
        {"kv_lens": [300], "q_len": 16, "heads": 8, "page_size": 1},
        {"kv_lens": [130, 70], "q_len": 1, "heads": 8, "page_size": 16},
        {"kv_lens": [90], "q_len": 16, "heads": 4, "page_size": 64, "tree": True},
    ):
        batch = gpu_batch(**kw, seed=3)
        ref = reference_attention(batch)
        for variant in variants:
            out = CustomAttention(num_splits=3, variant=variant)(batch)
            torch.cuda.synchronize()
            err = relative_error(out, ref)
            print(f"sanitizer case {variant} {kw}: rel_err {err:.2e}")
            if not err < TOL:
                return 3
    return 0


def run_sanitizers(out_dir: Path, variants: list[str], log) -> list[dict]:
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not Path(tool).exists():
        log("compute-sanitizer not found: skipped")
        return []
    results = []
    for name in ("memcheck", "racecheck"):  # initcheck: >240 s under torch, skipped
        cmd = [
            tool,
            "--tool",
            name,
            "--kernel-name",
            "kns=mla_",
            "--error-exitcode",
            "9",
            sys.executable,
            __file__,
            "--sanitizer-child",
            "--variants",
            *variants,
        ]
        start = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        if proc.returncode not in (0, 3, 9):  # the kernel-name filter not understood: check all
            cmd = [c for c in cmd if c not in ("--kernel-name", "kns=mla_")]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        text = proc.stdout + proc.stderr
        (out_dir / f"sanitizer_{name}.log").write_text(text)
        summary = [ln for ln in text.splitlines() if "ERROR SUMMARY" in ln or "RACECHECK" in ln]
        res = {
            "tool": name,
            "rc": proc.returncode,
            "summary": summary[-2:],
            "seconds": round(time.time() - start, 1),
        }
        res["ok"] = proc.returncode == 0
        log(f"sanitizer {res}")
        if not res["ok"]:
            log(text[-1500:])
        results.append(res)
    return results


def copy_bandwidth() -> float:
    import triton.testing

    src = torch.empty(2**30 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() * 2 / (ms * 1e-3)


ISSUE_GRID = {  # the kernel study's shapes: every (ctx, mode, heads, page size) combination
    "ctx": (1024, 16384, 65536, 185000),
    "modes": ((1, False), (16, False), (64, True)),  # decode, chain16, tree64
    "heads": (8, 64),
    "pages": (1, 64),
}


def grid_points() -> list[tuple]:
    g = ISSUE_GRID
    return [
        (ctx, q_len, heads, tree, ps, None)
        for heads in g["heads"]
        for ps in g["pages"]
        for q_len, tree in g["modes"]
        for ctx in g["ctx"]
    ]


def timing_points(quick: bool, grid: bool = False) -> list[tuple]:
    """(ctx, L, heads, tree, page_size, fixed splits or None) per timed point."""
    if grid:
        return grid_points()
    ctxs = (16384, 65536, 131072, 185000) if quick else (1024, 16384, 65536, 131072, 185000)
    points = []
    for ctx in ctxs:
        points += [
            (ctx, 1, 8, False, 1, None),
            (ctx, 16, 8, False, 1, None),
            (ctx, 64, 8, True, 1, None),
        ]
    points += [(185000, 16, 8, False, 64, None), (185000, 16, 64, False, 1, None)]
    if not quick:
        points += [
            (16384, 16, 64, False, 1, None),
            (185000, 1, 64, False, 1, None),
            (185000, 16, 8, False, 1, 16),
            (185000, 16, 8, False, 1, 66),
            (185000, 16, 8, False, 1, 132),
            (185000, 1, 8, False, 1, 132),
            (185000, 1, 8, False, 1, 528),
        ]
    return points


def timing(log, bw: float, variants: list[str], quick: bool, grid: bool = False) -> list[dict]:
    """Each point once per variant on the same batch; triton baseline on a few (not with quick)."""
    import triton.testing

    triton_points: set = set()
    if not quick:
        try:
            from decodecliff.kernels.triton_baseline import TritonAttention

            triton_points = {(16384, 16, 8), (185000, 16, 8), (185000, 1, 8), (1024, 16, 8)}
        except Exception as exc:  # the baseline is optional here
            log(f"triton baseline unavailable: {exc!r}")
    warmup, rep = (10, 40) if quick else (25, 100)
    rows = []
    for ctx, q_len, heads, tree, ps, splits in timing_points(quick, grid):
        batch = gpu_batch([ctx], q_len, heads, page_size=ps, tree=tree, seed=ctx + q_len)
        out = batch.new_output()
        nbytes = ctx * D_QK * 2
        flops = q_len * heads * ctx * (D_QK + D_V) * 2
        floor = max(nbytes / bw, flops / MMA_PEAK) * 1e3
        row = {
            "ctx": ctx,
            "L": q_len,
            "heads": heads,
            "tree": tree,
            "page": ps,
            "fixed_splits": splits,
            "floor_ms": floor,
            "variants": {},
        }
        for variant in variants:
            backend = CustomAttention(num_splits=splits, variant=variant)
            step = backend.prepare(batch, out)
            ms = triton.testing.do_bench(step, warmup=warmup, rep=rep, return_mode="median")
            row["variants"][variant] = {
                "splits": backend.plan(batch).num_splits,
                "ms": ms,
                "GBps": nbytes / ms / 1e6,
                "TFLOPs": flops / ms / 1e9,
                "of_floor": floor / ms,
            }
        if (ctx, q_len, heads) in triton_points and not tree and ps == 1 and splits is None:
            tstep = TritonAttention().prepare(batch, batch.new_output())
            row["triton_ms"] = triton.testing.do_bench(
                tstep, warmup=5, rep=60, return_mode="median"
            )
        log(json.dumps(row))
        rows.append(row)
        del batch, out
    return rows


def print_timing(rows: list[dict], variants: list[str], copy_gbps: float) -> None:
    print(f"copy bandwidth {copy_gbps:.0f} GB/s; per variant: splits, ms, GB/s, % of floor")
    head = f"{'ctx':>7} {'L':>3} {'H':>3} {'tree':>5} {'pg':>3} {'floor':>7}"
    for v in variants:
        head += f" | {v + ' S':>6} {'ms':>8} {'GB/s':>6} {'%fl':>5}"
    if len(variants) > 1:
        head += f" | {variants[-1] + '/' + variants[0]:>7}"
    print(head + f" | {'triton':>8} {'x':>6}")
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
        print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/kernel-check"))
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=sorted(VARIANTS),
        default=["v1", "v2", "v3"],
        help="kernel variants to check and time side by side (default: v1 v2 v3)",
    )
    parser.add_argument("--quick", action="store_true", help="10 random cases, main timing points")
    parser.add_argument(
        "--cases", type=int, default=None, help="random cases beyond the fixed ones"
    )
    parser.add_argument("--seed", type=int, default=None, help="default: fresh every run")
    parser.add_argument("--sanitize", action="store_true", help="also run compute-sanitizer")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument(
        "--grid",
        action="store_true",
        help="time ctx 1k/16k/64k/185k x decode/chain16/tree64 x "
        "8/64 heads x page 1/64 instead of the default points",
    )
    parser.add_argument("--sanitizer-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("check_custom_kernel: no CUDA device", file=sys.stderr)
        return 2
    variants = list(dict.fromkeys(args.variants))
    if args.sanitizer_child:
        return sanitizer_child(variants)
    n_cases = args.cases if args.cases is not None else (10 if args.quick else 40)
    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.out / "check.log"
    log_path.write_text("")

    def log(msg: str) -> None:
        print(msg, flush=True)
        with log_path.open("a") as f:
            f.write(msg + "\n")

    start = time.time()
    seed = args.seed if args.seed is not None else random.randrange(2**31)
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
    for variant in variants:
        results.append(graph_case(variant, log))
    log(f"correctness done in {time.time() - start:.0f} s")
    report["correctness"] = results
    report["sanitizers"] = run_sanitizers(args.out, variants, log) if args.sanitize else []
    if not args.no_timing:
        report["copy_GBps"] = copy_bandwidth() / 1e9
        report["timing"] = timing(log, report["copy_GBps"] * 1e9, variants, args.quick, args.grid)
    report["seconds"] = time.time() - start
    (args.out / "check.json").write_text(json.dumps(report, indent=1, default=str))

    print()
    for variant in variants:
        mine = [r for r in results if r["variant"] == variant]
        n_ok = sum(r["ok"] for r in mine)
        worst = max(r["rel_err"] for r in mine)
        print(f"correctness {variant}: {n_ok}/{len(mine)} ok, max rel err {worst:.2e}")
    for s in report["sanitizers"]:
        print(f"sanitizer {s['tool']}: rc {s['rc']} {s['summary']}")
    if "timing" in report:
        print_timing(report["timing"], variants, report["copy_GBps"])
    print(f"total {report['seconds']:.0f} s")
    good = all(r["ok"] for r in results) and all(s["ok"] for s in report["sanitizers"])
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
