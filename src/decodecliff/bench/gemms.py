"""The verify step's weight GEMMs one by one (``bench-engine --parts gemms``), beside their floor.

For every projection of the preset (q_a|kv_a, q_b, o, gate|up, down, the LM head) at the step's
token rows (chain: draft length x batch, tree: nodes x batch): cuBLAS (``x @ w`` as torch runs it)
and the same through cuBLASLt (torch's preferred BLAS library switched for that row), with the
weights stored [K, N] and N-major, and each configuration of the weight-streaming Triton kernel
(engine/skinny_gemm.py), checked against cuBLAS first; with ``--gemm pdl`` each configuration
is launched as a programmatic dependent with its L2 prefetch of ``--gemm-prefetch-mb`` (timed
alone, where nothing overlaps: what the chain costs a kernel). The floor is the weights' bytes
at the measured copy rate: at these M a projection is a stream of its weights. The summary sums
one layer's projections x layers + the LM head: the step's GEMM time if each took its fastest of
what the engine can run (cuBLASLt's sums beside it, not among them).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import replace

import torch

from decodecliff.engine.config import PRESETS, ModelConfig

from . import timing

REL_TOL = 1e-2  # bf16 output of a float32 sum in another order


def projections(cfg: ModelConfig) -> list[tuple[str, int, int, int]]:
    """(name, K, N, count per step) of every weight GEMM of a step of ``cfg``."""
    h, heads = cfg.hidden, cfg.num_heads
    per_layer = [
        ("qkv_a", h, cfg.q_lora_rank + cfg.kv_row_dim),
        ("q_b", cfg.q_lora_rank, heads * cfg.qk_head_dim),
        ("o", heads * cfg.v_head_dim, h),
        ("gate_up", h, 2 * cfg.mlp_dim),
        ("down", cfg.mlp_dim, h),
    ]
    return [(n, k, m, cfg.num_layers) for n, k, m in per_layer] + [
        ("lm_head", h, cfg.vocab_size, 1)
    ]


def weights(k: int, n: int, layout: str, device: torch.device) -> torch.Tensor:
    """Random [K, N] weights, stored row-major (kn) or as the transpose of [N, K] (nk)."""
    if layout == "kn":
        return torch.randn(k, n, device=device, dtype=torch.bfloat16)
    return torch.randn(n, k, device=device, dtype=torch.bfloat16).t()


@contextlib.contextmanager
def blas(library: str | None) -> Iterator[None]:
    """torch's matmuls through ``library`` ("cublas", "cublaslt") while inside; None: as is."""
    if library is None:
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def time_impls(m: int, k: int, n: int, args: argparse.Namespace, ceil: dict) -> list[dict]:
    """Every implementation of one [m, k] x [k, n] GEMM: ms, GB/s, share of the copy rate."""
    from decodecliff.engine.skinny_gemm import CONFIGS, MAX_M, SkinnyGemm

    device = torch.device("cuda")
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    floor = 2 * k * n / (ceil["copy_gbs"] * 1e6)
    chained = args.gemm == ["pdl"]  # bench-engine takes one --gemm path with this part
    configs = [replace(c, pdl=True) for c in CONFIGS] if chained else CONFIGS
    rows, skinny = [], SkinnyGemm(args.gemm_prefetch_mb << 20)
    for layout in ("kn", "nk"):
        w = weights(k, n, layout, device)
        ref = x @ w
        impls = [("cublas", None, lambda w=w: x @ w), ("cublaslt", None, lambda w=w: x @ w)]
        if m <= MAX_M:
            impls += [("triton", c, lambda w=w, c=c: skinny(x, w, c)) for c in configs]
        for impl, cfg, fn in impls:
            row = {"m": m, "k": k, "n": n, "layout": layout, "impl": impl, "floor_ms": floor}
            row["config"] = cfg.name if cfg else None
            if cfg and cfg.pdl:
                row["prefetch_mb"] = args.gemm_prefetch_mb
            library = "cublaslt" if impl == "cublaslt" else None  # cublas: as the engine runs it
            try:
                with blas(library):
                    err = ((fn().float() - ref.float()).norm() / ref.float().norm()).item()
                    row["rel_err"] = err
                    if not err <= REL_TOL:  # NaN too
                        raise ValueError(f"relative error {err:.3g} > {REL_TOL}")
                    row["ms"] = timing.median_ms(fn, device, args.repeats * 4, warmup=3)
                row["copy_frac"] = floor / row["ms"]
                row["status"] = "ok"
            except Exception as exc:  # a configuration that does not compile or is wrong
                row["status"], row["reason"] = "failed", repr(exc)[:300]
            rows.append(row)
        del w
    return rows


def bench_gemms(args: argparse.Namespace, ceil: dict) -> dict:
    """Rows per (projection, M, layout, implementation) and the per-step sums of the fastest."""
    cfg = PRESETS[args.preset]
    ms = sorted({args.draft_len * args.batch, args.tree_nodes * args.batch})
    rows, summary = [], []
    for m in ms:
        best = dict.fromkeys(("cublas-kn", "cublas-nk", "cublaslt-kn", "cublaslt-nk"), 0.0)
        best |= {"fastest": 0.0, "floor": 0.0}  # fastest: of what the engine can run
        for name, k, n, count in projections(cfg):
            found = time_impls(m, k, n, args, ceil)
            for row in found:
                row["projection"] = name
            rows += found
            ok = [r for r in found if r["status"] == "ok"]
            by_lib = {
                lib: {r["layout"]: r["ms"] for r in ok if r["impl"] == lib}
                for lib in ("cublas", "cublaslt")
            }
            for lib, by_layout in by_lib.items():
                for layout in ("kn", "nk"):
                    best[f"{lib}-{layout}"] += count * by_layout.get(layout, float("nan"))
            best["floor"] += count * found[0]["floor_ms"]
            runnable = [r for r in ok if r["impl"] != "cublaslt"]
            if not runnable:  # nothing the engine could run here: the sum has no fastest
                best["fastest"] = float("nan")
                print(f"gemm m={m} {name:8s} k={k} n={n}: every candidate failed", flush=True)
                continue
            top = min(runnable, key=lambda r: r["ms"])
            best["fastest"] += count * top["ms"]
            cublas = min(by_lib["cublas"].values(), default=float("nan"))
            print(
                f"gemm m={m} {name:8s} k={k} n={n}: cuBLAS {cublas * 1e3:.1f} us, "
                f"fastest {top['impl']} {top['config'] or ''} {top['layout']} "
                f"{top['ms'] * 1e3:.1f} us ({top['copy_frac']:.0%} of copy)",
                flush=True,
            )
        summary.append({"m": m, **{f"{key}_ms": v for key, v in best.items()}})
        print(f"gemm step m={m}: " + ", ".join(f"{key} {v:.3f} ms" for key, v in best.items()))
    return {"rows": rows, "summary": summary}
