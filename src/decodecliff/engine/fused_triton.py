"""Triton kernels of engine/fused.py (CUDA only; fused.py holds the torch reference of each).

One program per token row (per (token, head) for rope): at decode/verify sizes (T = 1..256 rows)
these kernels are launch-bound, so the point is one launch where the unfused code made ten.
Every kernel reads its inputs in the stored dtype, computes in float32 and rounds once on store,
as the torch code does. With ``pdl`` each is launched as a programmatic dependent: it waits for
the kernel before it and at once lets the next one launch, so a weight GEMM after it
(engine/skinny_gemm.py) fetches its weights while it runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def chain_start(PDL: tl.constexpr):
    """A programmatic dependent's start: wait for the kernel before, let the next one launch
    (the weight GEMMs of engine/skinny_gemm.py call it too)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _load_row(ptr, cols, n):
    return tl.load(ptr + cols, mask=cols < n, other=0.0).to(tl.float32)


@triton.jit
def _norm_row(x, w, cols, n, eps):
    """RMSNorm of one float32 row x (masked to n columns) times the weight w, in float32. The
    callers load w with their row: loaded here, after the sum's barrier, it was a second trip
    to memory in series with the first."""
    var = tl.sum(tl.where(cols < n, x * x, 0.0), axis=0) / n
    return x * (1.0 / tl.sqrt(var + eps)) * w


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, d_ptr, w_ptr, out_ptr, n, x_stride, d_stride, out_stride, eps,
    HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    chain_start(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = _load_row(x_ptr + row * x_stride, cols, n)
    w = _load_row(w_ptr, cols, n)
    if HAS_DELTA:
        d = _load_row(d_ptr + row * d_stride, cols, n)
        s = (x + d).to(x_ptr.dtype.element_ty)  # the residual stream keeps its dtype
        tl.store(x_ptr + row * x_stride + cols, s, mask=mask)
        x = s.to(tl.float32)
    y = _norm_row(x, w, cols, n, eps)
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_pair(x_ptr, cs_ptr, HALF: tl.constexpr):
    """(out1, out2) float32 halves of rotate-half rope at x_ptr with [cos | sin] at cs_ptr."""
    i = tl.arange(0, HALF)
    x1 = tl.load(x_ptr + i).to(tl.float32)
    x2 = tl.load(x_ptr + HALF + i).to(tl.float32)
    cos = tl.load(cs_ptr + i)
    sin = tl.load(cs_ptr + HALF + i)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _qkv_a_post_kernel(
    qkv_ptr, qn_ptr, kvn_ptr, cs_ptr, cq_ptr, cache_ptr, slots_ptr,
    qkv_stride, cq_stride, cache_stride, eps,
    R: tl.constexpr, C: tl.constexpr, HALF: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    chain_start(PDL)
    row = tl.program_id(0)
    base = qkv_ptr + row * qkv_stride
    if tl.program_id(1) == 0:  # the q part: RMSNorm -> cq
        q_cols = tl.arange(0, BLOCK_R)
        q_x = _load_row(base, q_cols, R)
        q_y = _norm_row(q_x, _load_row(qn_ptr, q_cols, R), q_cols, R, eps)
        q_dst = cq_ptr + row * cq_stride + q_cols
        tl.store(q_dst, q_y.to(cq_ptr.dtype.element_ty), mask=q_cols < R)
    else:  # the kv part: RMSNorm(latent) | rope(k_rope) -> the token's cache row
        dst = cache_ptr + tl.load(slots_ptr + row) * cache_stride
        c_cols = tl.arange(0, BLOCK_C)
        c_x = _load_row(base + R, c_cols, C)
        c_y = _norm_row(c_x, _load_row(kvn_ptr, c_cols, C), c_cols, C, eps)
        tl.store(dst + c_cols, c_y.to(cache_ptr.dtype.element_ty), mask=c_cols < C)
        o1, o2 = _rope_pair(base + R + C, cs_ptr + row * 2 * HALF, HALF)
        i = tl.arange(0, HALF)
        tl.store(dst + C + i, o1.to(cache_ptr.dtype.element_ty))
        tl.store(dst + C + HALF + i, o2.to(cache_ptr.dtype.element_ty))


@triton.jit
def _rope_kernel(
    x_ptr, cs_ptr, out_ptr, heads, x_st, x_sh, o_st, o_sh, HALF: tl.constexpr, PDL: tl.constexpr
):  # fmt: skip
    chain_start(PDL)
    pid = tl.program_id(0)
    t, h = pid // heads, pid % heads
    o1, o2 = _rope_pair(x_ptr + t * x_st + h * x_sh, cs_ptr + t * 2 * HALF, HALF)
    i = tl.arange(0, HALF)
    dst = out_ptr + t * o_st + h * o_sh
    tl.store(dst + i, o1.to(out_ptr.dtype.element_ty))
    tl.store(dst + HALF + i, o2.to(out_ptr.dtype.element_ty))


@triton.jit
def silu_mul_values(g, u, dtype: tl.constexpr):
    """silu(gate) * up of float32 values, in ``dtype``, silu rounded to it first (as unfused);
    the weight GEMMs of engine/skinny_gemm.py that make or store it call it too."""
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    return (act * u).to(dtype)


@triton.jit
def silu_mul_tile(g_at, u_at, mask, dtype: tl.constexpr):
    """``silu_mul_values`` of the gate and up elements at g_at and u_at."""
    g = tl.load(g_at, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_at, mask=mask, other=0.0).to(tl.float32)
    return silu_mul_values(g, u, dtype)


@triton.jit
def _silu_mul_kernel(
    gu_ptr, out_ptr, m, gu_stride, out_stride, BLOCK: tl.constexpr, PDL: tl.constexpr
):  # fmt: skip
    chain_start(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < m
    at = gu_ptr + row * gu_stride + cols
    y = silu_mul_tile(at, at + m, mask, out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * out_stride + cols, y, mask=mask)


def _warps(block: int) -> int:
    return 4 if block <= 2048 else 8


def chained(pdl: bool) -> dict:
    """The launch options of a kernel that calls chain_start: its constant and the launch flag."""
    return {"PDL": pdl, "launch_pdl": pdl}


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, pdl: bool
) -> torch.Tensor:
    rows, n = x.shape
    out = torch.empty_like(x)
    block = triton.next_power_of_2(n)
    d = x if delta is None else delta
    _add_rms_norm_kernel[(rows,)](
        x, d, weight, out, n, x.stride(0), d.stride(0), out.stride(0), eps,
        HAS_DELTA=delta is not None, BLOCK=block, num_warps=_warps(block), **chained(pdl),
    )  # fmt: skip
    return out


def qkv_a_post(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    kv_norm: torch.Tensor,
    cs: torch.Tensor,
    cache_rows: torch.Tensor,
    out_slots: torch.Tensor,
    eps: float,
    pdl: bool,
) -> torch.Tensor:
    rows = qkv.shape[0]
    r, c = q_norm.shape[0], kv_norm.shape[0]
    half = (qkv.shape[1] - r - c) // 2
    cq = torch.empty(rows, r, dtype=qkv.dtype, device=qkv.device)
    block_r = triton.next_power_of_2(r)
    _qkv_a_post_kernel[(rows, 2)](
        qkv, q_norm, kv_norm, cs, cq, cache_rows, out_slots,
        qkv.stride(0), cq.stride(0), cache_rows.stride(0), eps,
        R=r, C=c, HALF=half, BLOCK_R=block_r, BLOCK_C=triton.next_power_of_2(c),
        num_warps=_warps(block_r), **chained(pdl),
    )  # fmt: skip
    return cq


def rope(x: torch.Tensor, cs: torch.Tensor, out: torch.Tensor, pdl: bool) -> torch.Tensor:
    t, h, d = x.shape
    _rope_kernel[(t * h,)](
        x, cs, out, h, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
        HALF=d // 2, num_warps=1, **chained(pdl),
    )  # fmt: skip
    return out


def silu_mul(gate_up: torch.Tensor, pdl: bool) -> torch.Tensor:
    rows, m = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, m, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(m, block))](
        gate_up, out, m, gate_up.stride(0), out.stride(0), BLOCK=block, num_warps=4,
        **chained(pdl),
    )  # fmt: skip
    return out
