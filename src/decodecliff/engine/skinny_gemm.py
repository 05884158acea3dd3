"""Weight GEMMs of a decode/verify step (M = 1..64 token rows): a weight-streaming Triton kernel.

At M = 16 a projection is a stream of its weights (the GEMM's FLOPs are 16 x fewer than the bytes
would allow), so the kernel is built for the copy rate, not the tensor cores: each program owns a
BLOCK_N-wide slice of the output and a 1/SPLIT_K share of K, reading its weight tile once through
a deep software pipeline. The SPLIT_K partial sums go to a float32 workspace; the last program of
a slice to arrive (an acq_rel ticket per slice) adds them in split order, so the result does not
depend on which program finished last, writes the output and re-arms the ticket for the next
launch (a CUDA graph replays the same buffers).

``WeightGemm`` picks, per (M, K, N, weight strides), the fastest of cuBLAS (``x @ w``) and the
configurations in ``CANDIDATES``, timed once on first use outside graph capture, each as a CUDA
graph replays it (timed eagerly, a choice of several small kernels paid their host launches: a
fallback of three kernels looked twice as slow as in the step); a step captured before a shape
was timed takes cuBLAS for it.

A launch can also do the small kernels around a projection (``Fold``, engine/projections.py):
make its input as silu(gate) * up or as RMSNorm(x) * g while loading it, store silu(gate) * up of
a [gate | up] weight's two halves, or add its product to the residual stream as it stores; a
folded shape is chosen against cuBLAS with those kernels.

With ``pdl`` (programmatic dependent launch, sm_90 and newer) a projection starts while the kernel
before it still runs: each program first asks the L2 for the head of its weight slice (the weights
do not depend on that kernel), then waits for it (``griddepcontrol.wait``) and lets the next kernel
launch. It is meant to hide the per-GEMM ramp (launch, first bytes in flight) that keeps the
step's projections at 59% of the copy rate behind the kernel before (notes/engine.md says what
the H200 measured). The elementwise kernels of engine/fused_triton.py take part the same way, the
absorbed heads' per-head GEMMs run in ``head_gemm`` instead of cuBLAS's bmm (the queries' rope
folded into the first one's launch), and the custom attention backend launches its kernels as
dependents too (``AttnMeta.chained``): a layer is one chain.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import triton
import triton.language as tl

from . import fused
from .config import GEMM_PREFETCH_MB
from .fused import Rope
from .fused_triton import _rope_pair, chain_start, chained, silu_mul_tile, silu_mul_values


@dataclass(frozen=True)
class Config:
    block_n: int
    block_k: int
    split_k: int
    warps: int = 4
    stages: int = 4
    pdl: bool = False  # launched as a programmatic dependent, weights prefetched before the wait

    @property
    def name(self) -> str:
        name = f"n{self.block_n}k{self.block_k}s{self.split_k}w{self.warps}p{self.stages}"
        return name + ("-pdl" if self.pdl else "")


# Slices of 16..64 columns and 1..8 K-splits: enough programs to cover 132 SMs at every
# projection of the served shapes (N = 1,536 .. 7,168, K = 1,024 .. 7,168). CONFIGS is what the
# GEMM bench times; CANDIDATES what ``WeightGemm`` tunes over at an engine's start.
CONFIGS = tuple(Config(n, k, s) for n in (16, 32, 64) for k in (128, 256) for s in (1, 2, 4, 8))
CANDIDATES = tuple(Config(n, 256, s) for n in (16, 32, 64) for s in (1, 2, 4, 8))
# A normed or gate|up GEMM holds more per K tile (the scaled input; both halves' weights): at
# BLOCK_K 256 its wider slices spill (sm_90, 4 warps), so narrower K tiles are tried too.
NARROW_K = tuple(Config(n, 128, s) for n in (16, 32) for s in (1, 2, 4, 8))
MAX_M = 64
TUNE_REPEATS = 5
PREFETCH_BYTES = GEMM_PREFETCH_MB << 20  # engine/config.py says why
L2_LINE_BYTES = 128


@triton.jit
def _prefetch_l2(ptrs, mask):
    """Ask the L2 for the 128-byte lines at ``ptrs`` where ``mask`` (no registers, no wait)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; }",
        "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _prefetch_slice(
    w_ptr, swk, swn, k_begin, k_end, n0, N,
    TK: tl.constexpr, STEP_K: tl.constexpr, TN: tl.constexpr, STEP_N: tl.constexpr,
):  # fmt: skip
    """One prefetch per L2 line of the weight rows [k_begin, k_end) x columns [n0, n0 + TN *
    STEP_N): lines run along N for [K, N] storage (STEP_N = a line's elements, STEP_K = 1) and
    along K for N-major storage (STEP_K = a line's elements, STEP_N = 1)."""
    rn = n0 + tl.arange(0, TN) * STEP_N
    for k in range(k_begin, k_end, TK * STEP_K):
        rk = k + tl.arange(0, TK) * STEP_K
        inside = (rk[:, None] < k_end) & (rn[None, :] < N)
        _prefetch_l2(w_ptr + tl.where(inside, rk[:, None] * swk + rn[None, :] * swn, 0), inside)


@triton.jit
def _finish(acc, up, ss, y_at, mask, K, eps, NORM: tl.constexpr, GATE_UP: tl.constexpr,
            ADD: tl.constexpr):  # fmt: skip
    """Store a slice's sums: rows scaled by 1/rms (NORM), silu(gate) * up (GATE_UP), added to
    what y holds (ADD), rounded where the separate kernels round (the GEMM's output, silu)."""
    dtype = y_at.dtype.element_ty
    if NORM:
        rms = 1.0 / tl.sqrt(ss / K + eps)
        acc = acc * rms[:, None]
        up = up * rms[:, None]
    if GATE_UP:  # both halves rounded as the GEMM's stored output is, then the silu_mul kernel
        acc = silu_mul_values(acc.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32), dtype)
        acc = acc.to(tl.float32)
    if ADD:
        acc = acc.to(dtype).to(tl.float32) + tl.load(y_at, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_at, acc.to(dtype), mask=mask)


@triton.jit
def _skinny_gemm_kernel(
    x_ptr, w_ptr, y_ptr, ws_ptr, ticket_ptr, M, N, K,
    sxm, sxk, swk, swn, sym, syn, prefetch_k, g_ptr, ss_ptr, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr = False, PF_TK: tl.constexpr = 1, PF_STEP_K: tl.constexpr = 1,
    PF_TN: tl.constexpr = 1, PF_STEP_N: tl.constexpr = 1, PF_SHARE: tl.constexpr = 1,
    GLU: tl.constexpr = False, NORM: tl.constexpr = False, GATE_UP: tl.constexpr = False,
    ADD: tl.constexpr = False,
):  # fmt: skip
    """y [M, N] = x @ w, with the folds of ``Fold`` (each a constant: a plain GEMM has none)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_share = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_begin = pid_k * k_share
    k_end = tl.minimum(k_begin + k_share, K)
    # The weights are the previous kernel's input, never its output: fetch them now, once per
    # line (of PF_SHARE slices whose rows share a line, the first fetches the line).
    if PDL and pid_n % PF_SHARE == 0:
        pf_end = tl.minimum(k_begin + prefetch_k, k_end)
        _prefetch_slice(
            w_ptr, swk, swn, k_begin, pf_end, pid_n * BLOCK_N, N, PF_TK, PF_STEP_K, PF_TN, PF_STEP_N
        )
    chain_start(PDL)  # x (and y, the workspace) belong to the kernels before
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # GATE_UP: the up half's sums
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)  # NORM: the rows' sums of squares
    for k in range(k_begin, k_end, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        x_at = x_ptr + rm[:, None] * sxm + rk[None, :] * sxk
        x_mask = (rm[:, None] < M) & (rk[None, :] < k_end)
        if GLU:  # x is [gate | up], K columns each: the down projection's input made here
            x = silu_mul_tile(x_at, x_at + K * sxk, x_mask, x_ptr.dtype.element_ty)
        else:
            x = tl.load(x_at, mask=x_mask, other=0.0)
        if NORM:  # RMSNorm(x) * g = (x * g) / rms(x): g applied here, 1/rms once at the end
            xf = x.to(tl.float32)
            ss += tl.sum(xf * xf, axis=1)
            g = tl.load(g_ptr + rk, mask=rk < k_end, other=0.0).to(tl.float32)
            x = (xf * g[None, :]).to(x_ptr.dtype.element_ty)
        w_at = w_ptr + rk[:, None] * swk + rn[None, :] * swn
        w_mask = (rk[:, None] < k_end) & (rn[None, :] < N)
        acc = tl.dot(x, tl.load(w_at, mask=w_mask, other=0.0), acc)
        if GATE_UP:  # w is [gate | up]: the up columns N to the right of the gate ones
            up = tl.dot(x, tl.load(w_at + N * swn, mask=w_mask, other=0.0), up)
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    y_at = y_ptr + rm[:, None] * sym + rn[None, :] * syn
    if SPLIT_K == 1:
        _finish(acc, up, ss, y_at, out_mask, K, eps, NORM, GATE_UP, ADD)
    else:
        ws_n = N * 2 if GATE_UP else N  # the workspace holds both halves' partials
        part = ws_ptr + (pid_k * BLOCK_M + rm[:, None]) * ws_n + rn[None, :]
        tl.store(part, acc, mask=out_mask)
        if GATE_UP:
            tl.store(part + N, up, mask=out_mask)
        slices = tl.num_programs(0)
        if NORM:  # each slice's shares hold the sums of squares of their K rows
            tl.store(ss_ptr + (pid_k * slices + pid_n) * BLOCK_M + rm, ss)
        tl.debug_barrier()  # every thread's partial is written before the ticket releases it
        ticket = tl.atomic_add(ticket_ptr + pid_n, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:  # the last share of this slice: sum all, in split order
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            total_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            total_ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                at = ws_ptr + (s * BLOCK_M + rm[:, None]) * ws_n + rn[None, :]
                total += tl.load(at, mask=out_mask, other=0.0, cache_modifier=".cg")
                if GATE_UP:
                    total_up += tl.load(at + N, mask=out_mask, other=0.0, cache_modifier=".cg")
                if NORM:
                    ss_at = ss_ptr + (s * slices + pid_n) * BLOCK_M + rm
                    total_ss += tl.load(ss_at, cache_modifier=".cg")
            _finish(total, total_up, total_ss, y_at, out_mask, K, eps, NORM, GATE_UP, ADD)
            tl.atomic_xchg(ticket_ptr + pid_n, 0)  # re-armed for the next launch


@triton.jit
def _head_tile(
    x_ptr, w_ptr, y_ptr, M, K, N, sxm, sxh, sxk, swh, swk, swn, sym, syh, syn, pid_n, h,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """y[:, h] = x[:, h] @ w[h] for BLOCK_N columns (the pid_n-th) of head h."""
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        x_at = x_ptr + h * sxh + rm[:, None] * sxm + rk[None, :] * sxk
        x = tl.load(x_at, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w_at = w_ptr + h * swh + rk[:, None] * swk + rn[None, :] * swn
        w = tl.load(w_at, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(x, w, acc)
    y_at = y_ptr + h * syh + rm[:, None] * sym + rn[None, :] * syn
    tl.store(y_at, acc.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _rope_rows(
    r_ptr, cs_ptr, ro_ptr, M, srm, srh, som, soh, h,
    HALF: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """ro[t, h] = rope(r[t, h]) for the M rows t of head h (cs: [cos | sin] per row), as one
    [BLOCK_M, HALF] tile: rows past M read row M - 1 and are not stored."""
    rows = tl.arange(0, BLOCK_M)[:, None]
    safe = tl.minimum(rows, M - 1)
    o1, o2 = _rope_pair(r_ptr + h * srh + safe * srm, cs_ptr + safe * 2 * HALF, HALF)
    i = tl.arange(0, HALF)[None, :]
    dst = ro_ptr + h * soh + rows * som
    tl.store(dst + i, o1.to(ro_ptr.dtype.element_ty), mask=rows < M)
    tl.store(dst + HALF + i, o2.to(ro_ptr.dtype.element_ty), mask=rows < M)


@triton.jit
def _head_gemm_kernel(
    x_ptr, w_ptr, y_ptr, M, K, N,
    sxm, sxh, sxk, swh, swk, swn, sym, syh, syn,
    r_ptr, cs_ptr, ro_ptr, srm, srh, som, soh,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    ROPE_HALF: tl.constexpr = 0,
):  # fmt: skip
    """One head (program axis 1) and BLOCK_N of its columns (axis 0); with ROPE_HALF, the last
    program of axis 0 ropes the head's r rows into ro instead (the queries' rope part, which
    would otherwise take a kernel of its own after this one)."""
    pid_n, h = tl.program_id(0), tl.program_id(1)
    chain_start(PDL)
    if ROPE_HALF > 0:
        if pid_n == tl.num_programs(0) - 1:
            _rope_rows(r_ptr, cs_ptr, ro_ptr, M, srm, srh, som, soh, h, ROPE_HALF, BLOCK_M)
        else:
            _head_tile(
                x_ptr, w_ptr, y_ptr, M, K, N, sxm, sxh, sxk, swh, swk, swn, sym, syh, syn,
                pid_n, h, BLOCK_M, BLOCK_N, BLOCK_K,
            )  # fmt: skip
    else:
        _head_tile(
            x_ptr, w_ptr, y_ptr, M, K, N, sxm, sxh, sxk, swh, swk, swn, sym, syh, syn,
            pid_n, h, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip


def _rope_fits(r: torch.Tensor, cs: torch.Tensor, r_out: torch.Tensor, t: int, heads: int) -> bool:
    if cs.dim() != 2 or cs.dtype != torch.float32 or not cs.is_contiguous() or cs.shape[0] != t:
        return False
    d = cs.shape[1]
    unit = r.stride(-1) == r_out.stride(-1) == 1
    return unit and r.shape == r_out.shape == (t, heads, d) and d >= 2 and (d & (d - 1)) == 0


def head_gemm(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, pdl: bool, rope: Rope | None = None
) -> torch.Tensor:
    """out [T, H, N] = x [T, H, K] @ w [H, K, N] per head (the absorbed MLA heads' up- and
    down-projections, any strides): torch.bmm's result, in a kernel that can join the chain.
    ``rope`` = (r [T, H, d], cs [T, d], r_out [T, H, d]): the same launch also writes
    rope(r) to r_out (engine/fused.py's ``rope``), one program per head."""
    t, heads, k = x.shape
    n = w.shape[2]
    if t > MAX_M or w.shape[:2] != (heads, k) or out.shape != (t, heads, n):
        shapes = f"{tuple(x.shape)} x {tuple(w.shape)} -> {tuple(out.shape)}"
        raise ValueError(
            f"head GEMM takes [<= {MAX_M}, H, K] x [H, K, N] -> [T, H, N], got {shapes}"
        )
    r, cs, r_out = rope if rope is not None else (x, x, out)  # unread without rope
    if rope is not None and not _rope_fits(r, cs, r_out, t, heads):
        raise ValueError(
            f"rope takes [T, H, d] rows of unit last stride and [T, d] cos|sin (float32, d a "
            f"power of two), T, H = {t}, {heads}: got {tuple(r.shape)}, {tuple(cs.shape)}"
        )
    block_n = 64
    _head_gemm_kernel[(triton.cdiv(n, block_n) + (rope is not None), heads)](
        x, w, out, t, k, n, *x.stride(), *w.stride(), *out.stride(),
        r, cs, r_out, r.stride(0), r.stride(1), r_out.stride(0), r_out.stride(1),
        BLOCK_M=block_m(t), BLOCK_N=block_n, BLOCK_K=128, num_warps=4,
        ROPE_HALF=cs.shape[1] // 2 if rope is not None else 0, **chained(pdl),
    )  # fmt: skip
    return out


def block_m(m: int) -> int:
    return max(16, triton.next_power_of_2(m))


def prefetch_plan(cfg: Config, w: torch.Tensor, budget: int = PREFETCH_BYTES) -> dict:
    """The kernel's prefetch arguments for w: K rows per fetching program (``budget`` bytes of
    L2 lines over the grid) and the tile of one prefetch per L2 line, along w's contiguous
    dimension. In [K, N] rows a slice narrower than a line shares each line with its
    neighbours: the first of each PF_SHARE slices fetches it."""
    k, n = w.shape
    line = L2_LINE_BYTES // w.element_size()
    if w.stride(1) == 1:  # [K, N] rows: per K row, the line(s) holding the slice's columns
        share = max(line // cfg.block_n, 1)
        per_row = max(cfg.block_n // line, 1)
        # a K row per thread: a [TK, 1] tile smaller than the CTA would be issued twice over
        tile = {"PF_TK": 32 * cfg.warps, "PF_STEP_K": 1, "PF_TN": per_row, "PF_STEP_N": line}
        row_bytes = per_row * L2_LINE_BYTES
    else:  # N-major: each column's K run is contiguous, fetched in whole lines
        share = 1
        tile = {"PF_TK": 16, "PF_STEP_K": line, "PF_TN": cfg.block_n, "PF_STEP_N": 1}
        row_bytes = cfg.block_n * w.element_size()
    fetching = triton.cdiv(triton.cdiv(n, cfg.block_n), share) * cfg.split_k
    rows = (budget // fetching // row_bytes if cfg.pdl else 0) // tile["PF_STEP_K"]
    rows *= tile["PF_STEP_K"]  # N-major: whole lines of each column
    return {"prefetch_k": min(rows, k), "PDL": cfg.pdl, "PF_SHARE": share, **tile}


@dataclass(frozen=True)
class Fold:
    """What a weight GEMM does besides ``x @ w``, each in place of a kernel of its own."""

    glu: bool = False  # x is [gate | up] (2K columns): the input is silu(gate) * up, made on load
    norm: bool = False  # the input is RMSNorm(x) * g: g applied on load, 1/rms to the sums
    gate_up: bool = False  # w is [gate | up] (2N columns): y = silu(x @ gate) * (x @ up)
    add: bool = False  # y += x @ w: y is the residual stream, read and written by the kernel

    def constants(self) -> dict:
        return {"GLU": self.glu, "NORM": self.norm, "GATE_UP": self.gate_up, "ADD": self.add}


PLAIN = Fold()


class SkinnyGemm:
    """y = x @ w for x [M <= 64, K], w a [K, N] view (row-major or the transpose of [N, K]),
    with a ``Fold``'s work besides."""

    def __init__(self, prefetch_bytes: int = PREFETCH_BYTES) -> None:
        self.prefetch_bytes = prefetch_bytes  # per chained launch, over all its programs
        self._scratch: dict[tuple, tuple[torch.Tensor, ...]] = {}

    def scratch(
        self, cfg: Config, m: int, n: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Workspace, sums of squares and tickets per (config, BLOCK_M, workspace width N):
        allocated once, reused by replays."""
        key = (cfg.split_k, cfg.block_n, block_m(m), n, device)
        if key not in self._scratch:
            slices = triton.cdiv(n, cfg.block_n)
            f32 = {"dtype": torch.float32, "device": device}
            self._scratch[key] = (
                torch.empty(cfg.split_k * block_m(m) * n, **f32),
                torch.empty(cfg.split_k * slices * block_m(m), **f32),
                torch.zeros(slices, dtype=torch.int32, device=device),
            )
        return self._scratch[key]

    def __call__(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        cfg: Config,
        out: torch.Tensor | None = None,
        prefetch_bytes: int | None = None,
        fold: Fold = PLAIN,
        norm_weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``prefetch_bytes``: this launch's prefetch budget, if not the instance's. ``fold``:
        what the launch does besides the product (``Fold``); ``norm_weight`` is its RMSNorm's
        weight (K), and with ``fold.add`` ``out`` is the residual stream it adds to."""
        m, k = x.shape[0], x.shape[1] // (2 if fold.glu else 1)
        n = w.shape[1] // (2 if fold.gate_up else 1)
        self._check(x, w, cfg, out, fold, norm_weight)
        y = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
        ws, ss, tickets = self.scratch(cfg, m, w.shape[1], x.device)
        grid = (triton.cdiv(n, cfg.block_n), cfg.split_k)
        _skinny_gemm_kernel[grid](
            x, w, y, ws, tickets, m, n, k,
            x.stride(0), x.stride(1), w.stride(0), w.stride(1), y.stride(0), y.stride(1),
            g_ptr=x if norm_weight is None else norm_weight, ss_ptr=ss, eps=fused.EPS,
            BLOCK_M=block_m(m), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
            num_warps=cfg.warps, num_stages=cfg.stages, **fold.constants(),
            **self.launch_options(cfg, w, prefetch_bytes),
        )  # fmt: skip
        return y

    @staticmethod
    def _check(
        x: torch.Tensor,
        w: torch.Tensor,
        cfg: Config,
        out: torch.Tensor | None,
        fold: Fold,
        norm_weight: torch.Tensor | None,
    ) -> None:
        m, k = x.shape[0], x.shape[1] // (2 if fold.glu else 1)
        if m > MAX_M or w.shape[0] != k or (fold.glu and x.shape[1] != 2 * k):
            shapes = f"{tuple(x.shape)} x {tuple(w.shape)}"
            takes = "[<= {0}, 2K] (gate | up)" if fold.glu else "[<= {0}, K]"
            raise ValueError(f"skinny GEMM takes {takes.format(MAX_M)} x [K, N], got {shapes}")
        if fold.gate_up and w.shape[1] % 2:
            raise ValueError(f"a [gate | up] weight has an even width, got {tuple(w.shape)}")
        if fold.norm and not (
            norm_weight is not None
            and norm_weight.shape == (k,)
            and norm_weight.stride() == (1,)
            and norm_weight.device == x.device
            and not fold.glu
        ):
            got = None if norm_weight is None else tuple(norm_weight.shape)
            raise ValueError(
                f"a normed GEMM takes one contiguous weight per input column ({k}), got {got}"
            )
        if fold.add and out is None:
            raise ValueError("a GEMM that adds to the residual stream needs it as out")
        n = w.shape[1] // (2 if fold.gate_up else 1)
        if out is not None and (out.shape != (m, n) or out.dtype != x.dtype):
            got = f"{tuple(out.shape)} {out.dtype}"
            raise ValueError(f"the GEMM writes [{m}, {n}] {x.dtype}, its out is {got}")
        if fold.gate_up and cfg.pdl:  # the prefetch plan knows one weight slice per program
            raise ValueError("a gate|up GEMM is not launched as a programmatic dependent")

    def launch_options(self, cfg: Config, w: torch.Tensor, budget: int | None = None) -> dict:
        """A chained launch's prefetch plan (this GEMM's budget unless ``budget``) and flag;
        none for a plain one."""
        if not cfg.pdl:
            return {"prefetch_k": 0}
        budget = self.prefetch_bytes if budget is None else budget
        return {**prefetch_plan(cfg, w, budget), **chained(True)}


class PerShape:
    """A choice per shape, timed on the shape's first call; a call during CUDA-graph capture
    before that gets None (the caller's fallback), recorded in ``untuned_in_capture``."""

    def __init__(self) -> None:
        self.choices: dict[tuple, Any] = {}  # None: the fallback
        self.untuned_in_capture: set[tuple] = set()
        self.timed: dict[tuple, dict[str, float]] = {}  # the tuning's ms, alone, replayed

    def choice(self, key: tuple, tune: Callable[[], tuple[Any, dict[str, float]]]) -> Any:
        if key not in self.choices:
            if torch.cuda.is_current_stream_capturing():
                self.untuned_in_capture.add(key)  # the fallback in the graph: recorded
                return None
            self.choices[key], self.timed[key] = tune()
        return self.choices[key]


def agrees(y: torch.Tensor, ref: torch.Tensor) -> bool:
    """A tuned kernel's result is the reference's to bf16 rounding (never pick one that is not)."""
    atol = 2e-2 * ref.abs().max().item()
    return torch.allclose(y.float(), ref.float(), rtol=2e-2, atol=atol)


Fallback = Callable[[torch.Tensor | None], torch.Tensor]  # the unfolded math, given out


class WeightGemm(PerShape):
    """``x @ w`` for a step's projections: per shape the fastest of cuBLAS and ``CANDIDATES``.

    A shape is (M rounded up to the kernel's row tile, K, N, the weight's strides, dtype, the
    ``Fold``). A folded shape's fallback is cuBLAS with the kernels the fold replaces (silu_mul,
    RMSNorm, the residual add), whose time the tuning records as ``cublas_ms``. Its choice is
    timed on its first call, each candidate captured in a CUDA graph and replayed as the step
    runs it, with the L2 flushed before each repeat (a step streams weights the L2 cannot hold);
    a call during CUDA-graph capture before that takes the fallback. On a CPU,
    and above MAX_M rows (prefill chunks), it is the fallback (torch's ``x @ w``), unless
    ``fixed`` names the configuration to run without tuning or checking (then the Triton kernel
    runs on any device, interpreted on a CPU: the tests' way to run the folds there).

    ``pdl``: every shape takes the fastest candidate launched as a programmatic dependent, not
    cuBLAS (a cuBLAS kernel in the chain waits for the whole kernel before it and makes the next
    one wait for all of it). The choice is timed one kernel alone, where no overlap shows, and
    so without its prefetch: alone, a chained launch's prefetch is a prologue issued before its
    loads with nothing to hide under (up to the whole slice for the small projections), and
    would rank the configurations by it rather than by their main loop (notes/engine.md).
    """

    def __init__(
        self,
        candidates: tuple[Config, ...] = CANDIDATES,
        pdl: bool = False,
        prefetch_bytes: int = PREFETCH_BYTES,
        fixed: Config | None = None,
    ) -> None:
        super().__init__()  # choices: a Config, or None for cuBLAS
        self.pdl, self.fixed = pdl, fixed
        self.candidates = tuple(replace(c, pdl=True) for c in candidates) if pdl else candidates
        self.fold_candidates = self.candidates + tuple(replace(c, pdl=pdl) for c in NARROW_K)
        self.skinny = SkinnyGemm(prefetch_bytes)

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self._run(x, w, PLAIN, lambda out: x @ w)

    def glu(self, gate_up: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up @ w`` for gate_up = [gate | up]: per shape the faster of the
        silu_mul kernel then cuBLAS, and the Triton kernel making its input as it loads (one
        launch for two)."""
        fallback = lambda out: fused.silu_mul(gate_up, self.pdl) @ w  # noqa: E731
        return self._run(gate_up, w, Fold(glu=True), fallback)

    def normed(self, x: torch.Tensor, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``RMSNorm(x) * g @ w``: the norm kernel then cuBLAS, or the Triton kernel scaling as
        it loads and sums (x, the residual stream, is read once either way)."""
        fallback = lambda out: fused.add_rms_norm(x, None, g, self.pdl) @ w  # noqa: E731
        return self._run(x, w, Fold(norm=True), fallback, norm_weight=g)

    def gated(self, x: torch.Tensor, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``silu(h @ gate) * (h @ up)`` for h = RMSNorm(x) * g and w = [gate | up]: the MLP's
        input in one launch where the fallback takes three (norm, cuBLAS, silu_mul)."""

        def fallback(out: torch.Tensor | None) -> torch.Tensor:
            return fused.silu_mul(fused.add_rms_norm(x, None, g, self.pdl) @ w, self.pdl)

        return self._run(x, w, Fold(norm=True, gate_up=True), fallback, norm_weight=g)

    def add_into(self, y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``y += x @ w`` (y the residual stream; the product rounded to y's dtype first, as a
        separate add rounds it): cuBLAS then the add, or the Triton kernel adding as it stores."""
        return self._run(x, w, Fold(add=True), lambda out: out.add_(x @ w), out=y)

    def _run(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        fold: Fold,
        fallback: Fallback,
        out: torch.Tensor | None = None,
        norm_weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if x.shape[0] > MAX_M or (not x.is_cuda and self.fixed is None):
            return fallback(out)
        if self.fixed is not None:
            cfg = self.fixed
        else:
            key = (block_m(x.shape[0]), w.shape[0], w.shape[1], w.stride(), x.dtype, fold)
            wide = self.fold_candidates if fold.norm or fold.gate_up else self.candidates
            tune = functools.partial(self._tune, x, w, fold, fallback, out, norm_weight, wide)
            cfg = self.choice(key, tune)
        if cfg is None:
            return fallback(out)
        return self.skinny(x, w, cfg, out=out, fold=fold, norm_weight=norm_weight)

    def _tune(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        fold: Fold,
        fallback: Fallback,
        out: torch.Tensor | None,
        norm_weight: torch.Tensor | None,
        candidates: tuple[Config, ...],
    ) -> tuple[Config | None, dict[str, float]]:
        """The fastest choice for this shape, and the ms of the fallback and of that choice
        (alone, graph-replayed). Each candidate is checked first (``_probe``); an adding shape
        is timed on a copy of the stream; a configuration that does not fit the GPU (shared
        memory) is passed over."""
        from decodecliff.bench.timing import graph_median_ms

        launch = functools.partial(self.skinny, w=w, fold=fold, norm_weight=norm_weight)
        stream = None if out is None else out.clone()
        best, best_ms = None, graph_median_ms(lambda: fallback(stream), TUNE_REPEATS)
        cublas_ms = best_ms
        if self.pdl:
            best_ms = float("inf")  # cuBLAS only where no candidate agrees with it
        probe, ref = self._probe(x, w, fold, fallback)
        for cfg in candidates:
            # an unwritten element keeps the NaN of a fresh output, or the zero of a zero stream
            start = torch.zeros_like(ref) if fold.add else torch.full_like(ref, float("nan"))
            try:
                if not agrees(launch(probe, cfg=cfg, out=start), ref):
                    continue
            except triton.runtime.errors.OutOfResources:
                continue
            run = functools.partial(launch, x, cfg=cfg, out=stream, prefetch_bytes=0)
            ms = graph_median_ms(run, TUNE_REPEATS)
            if ms < best_ms:
                best, best_ms = cfg, ms
        return best, {"cublas_ms": cublas_ms, "ms": best_ms if best else cublas_ms}

    @staticmethod
    def _probe(
        x: torch.Tensor, w: torch.Tensor, fold: Fold, fallback: Fallback
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The input a candidate is checked on and the fallback's answer to it: the step's own
        input, but for an adding fold a random one added to a zero stream (the answer is then
        the product alone, never zero where an element is left unwritten, whatever the step
        reads: the first step's o projection reads zeros)."""
        if not fold.add:
            return x, fallback(None)
        probe = torch.randn_like(x)
        return probe, probe @ w

    def describe(self) -> list[dict]:
        """What each tuned shape runs, and its tuning's times alone (for the bench's records)."""
        return [
            {"m_tile": key[0], "k": key[1], "n": key[2],
             **{name: on for name, on in vars(key[5]).items()},
             "impl": "cublas" if c is None else "triton", "config": None if c is None else c.name,
             **self.timed.get(key, {})}
            for key, c in self.choices.items()
        ]  # fmt: skip


class TunedHeadGemm(PerShape):
    """The absorbed heads' per-head GEMMs for ``gemm: auto``: per shape the faster of
    ``fallback`` (torch's bmm, then the rope kernel) and ``head_gemm`` with the rope folded into
    its launch (one kernel where the fallback takes two), each timed alone as a CUDA graph
    replays it, with the L2 flushed;
    a shape whose results disagree, or whose rope ``head_gemm`` does not take, keeps the
    fallback, as does a CPU and a shape above MAX_M rows."""

    def __init__(self, fallback: Callable[..., None]) -> None:
        super().__init__()  # choices: True for head_gemm, None for the fallback
        self.fallback = fallback

    def __call__(
        self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, rope: Rope | None = None
    ) -> None:
        if not x.is_cuda or x.shape[0] > MAX_M:
            return self.fallback(x, w, out, rope)
        # the rope's state: None (none), True (the kernel takes its layout), False (it does not)
        fits = None if rope is None else _rope_fits(*rope, x.shape[0], w.shape[0])
        key = (block_m(x.shape[0]), *w.shape, fits, x.dtype)
        if self.choice(key, lambda: self._tune(x, w, out, rope)):
            head_gemm(x, w, out, False, rope)
        else:
            self.fallback(x, w, out, rope)

    def _tune(
        self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, rope: Rope | None
    ) -> tuple[bool | None, dict[str, float]]:
        from decodecliff.bench.timing import graph_median_ms

        written = [out] if rope is None else [out, rope[2]]
        self.fallback(x, w, out, rope)
        refs = [t.clone() for t in written]
        bmm_ms = graph_median_ms(lambda: self.fallback(x, w, out, rope), TUNE_REPEATS)
        timed = {"bmm_ms": bmm_ms, "ms": bmm_ms}
        for t in written:
            t.fill_(float("nan"))  # an element the kernel leaves unwritten cannot agree
        try:
            head_gemm(x, w, out, False, rope)
        except ValueError:  # shapes or a rope layout the kernel does not take
            return None, timed
        if not all(agrees(t, ref) for t, ref in zip(written, refs, strict=True)):
            return None, timed
        ms = graph_median_ms(lambda: head_gemm(x, w, out, False, rope), TUNE_REPEATS)
        return (True, {**timed, "ms": ms}) if ms < bmm_ms else (None, timed)

    def describe(self) -> list[dict]:
        """What each tuned shape runs, and its tuning's times alone (for the bench's records)."""
        return [
            {"m_tile": key[0], "heads": key[1], "k": key[2], "n": key[3], "rope": key[4],
             "impl": "triton-heads" if c else "bmm", **self.timed.get(key, {})}
            for key, c in self.choices.items()
        ]  # fmt: skip
