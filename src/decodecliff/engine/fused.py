"""The model's fused elementwise steps: one kernel each on CUDA (Triton), the same math in torch.

Each function is what a production MLA engine runs between its GEMMs, fused so that a layer
launches a handful of kernels instead of dozens:

* ``add_rms_norm``: the residual add (rounded to the stream's dtype, as an unfused add is) and
  RMSNorm of the sum, in float32, one pass.
* ``qkv_a_post``: after the fused q_a / kv_a GEMM, RMSNorm of the q part, RMSNorm of the latent
  and rope of k_rope, and the write of [latent | k_rope] to the tokens' cache rows.
* ``rope``: rotate-half rope of the queries' rope part, written where attention reads it.
* ``silu_mul``: silu(gate) * up after the fused gate / up GEMM.

Rope reads a per-step [T, 64] float32 table of [cos | sin] rows (``RopeTable.rows``), gathered
once per step from a cache built once. On CUDA the Triton kernels run (imported only there, so a
CPU process never loads Triton); elsewhere the torch code below, which is the reference. ``pdl``
launches a CUDA kernel as a programmatic dependent (engine/fused_triton.py); torch ignores it.
"""

from __future__ import annotations

import torch

EPS = 1e-6
Rope = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (r [T, H, d], cs [T, d], r_out)


class RopeTable:
    """cos/sin of every position up to a capacity, built once (grown only if a step needs more)."""

    def __init__(self, dim: int, theta: float, device: torch.device) -> None:
        self.dim, self.device = dim, device
        self.inv_freq = theta ** (
            -torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim
        )
        self.table = torch.empty(0, dim, device=device, dtype=torch.float32)

    def reserve(self, positions: int) -> None:
        """Cover positions 0 .. positions-1 (host-side size: no sync)."""
        if positions <= self.table.shape[0]:
            return
        angles = torch.arange(positions, device=self.device).float()[:, None] * self.inv_freq
        self.table = torch.cat([angles.cos(), angles.sin()], dim=-1)

    def rows(self, positions: torch.Tensor) -> torch.Tensor:
        """[T, dim] float32 [cos | sin] at the positions."""
        return self.table[positions]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * weight.float()).to(x.dtype)


def _rope_torch(x: torch.Tensor, cs: torch.Tensor) -> torch.Tensor:
    """Rotate-half rope of x [T, ..., d] with cs [T, d] = [cos | sin], in float32."""
    half = x.shape[-1] // 2
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos, sin = cs[:, :half].view(shape), cs[:, half:].view(shape)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, pdl: bool = False
) -> torch.Tensor:
    """x += delta (in place, x is the residual stream), then RMSNorm(x) * weight."""
    if x.is_cuda:
        from . import fused_triton

        return fused_triton.add_rms_norm(x, delta, weight, EPS, pdl)
    if delta is not None:
        x.add_(delta)
    return rms_norm(x, weight)


def qkv_a_post(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    kv_norm: torch.Tensor,
    cs: torch.Tensor,
    cache_rows: torch.Tensor,
    out_slots: torch.Tensor,
    pdl: bool = False,
) -> torch.Tensor:
    """qkv [T, R + C + P] -> normed q part [T, R]; [norm(latent) | rope(k_rope)] -> cache rows."""
    if qkv.is_cuda:
        from . import fused_triton

        return fused_triton.qkv_a_post(qkv, q_norm, kv_norm, cs, cache_rows, out_slots, EPS, pdl)
    r, c = q_norm.shape[0], kv_norm.shape[0]
    cq = rms_norm(qkv[:, :r], q_norm)
    latent = rms_norm(qkv[:, r : r + c], kv_norm)
    k_rope = _rope_torch(qkv[:, r + c :], cs)
    cache_rows[out_slots] = torch.cat([latent, k_rope], dim=-1)
    return cq


def rope(x: torch.Tensor, cs: torch.Tensor, out: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """out [T, H, d] (any strides, unit last) = rope(x [T, H, d]); returns out."""
    if x.is_cuda:
        from . import fused_triton

        return fused_triton.rope(x, cs, out, pdl)
    out.copy_(_rope_torch(x, cs))
    return out


def silu_mul(gate_up: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """[T, 2M] -> silu(gate) * up [T, M], silu rounded to the dtype first (as unfused)."""
    if gate_up.is_cuda:
        from . import fused_triton

        return fused_triton.silu_mul(gate_up, pdl)
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
