"""A synthetic absorbed-MLA transformer with seeded random weights (DeepSeek-V3 / Kimi K2 layout).

Per layer: q = W_qb(norm(W_qa x)) split into nope (128) and rope (64) parts per head; the nope part
is absorbed through W_kc into the 512-wide latent space, so attention scores are taken directly
against the cached latent row [latent 512 | k_rope 64] = 576, and the attention output (a latent,
512 wide) is expanded by W_vc to the 128-wide V head before W_o. Every op is a fixed-shape tensor op
with no host sync, so a step can be captured in a CUDA graph.

The step is as lean as a production MLA engine's: the q_a and kv_a projections are one GEMM and
gate and up are one GEMM (weights concatenated once at load from the same seeded weights),
RMSNorm is fused with the residual add (or, with ``gemm: fused``, folded into the weight GEMMs
with the add and silu: engine/projections.py), the kv part's norm + rope + cache write is one
kernel, rope reads a cos/sin table built once, and attention metadata is planned once per step
(``backend.plan``) with one ``backend.run`` per layer (engine/fused.py has the kernels).

A prefill chunk may instead take the multi-head path (``StepInput.mha``), as SGLang serves MLA
models: the request's cached latent rows are decompressed with the same weights (k_nope = c W_kc^T,
v = c W_vc per head; k_rope shared) and attended with head dim 192 and V dim 128. Scores and outputs
are the absorbed path's exactly (q_nope . (W_kc c) = (q_nope W_kc) . c), at about a third of
the FLOPs for long chunks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from decodecliff.kernels.api import (
    D_QK,
    D_V,
    AttentionBackend,
    AttnMeta,
    cache_rows,
    token_slots,
)

from . import fused
from .config import CHAINED_GEMMS, GEMM_PREFETCH_MB, GEMMS, ModelConfig
from .projections import FoldedProjections, Projections

if TYPE_CHECKING:
    from .l2_overlap import L2Overlap


@dataclass
class StepInput:
    """One forward pass over T query tokens of B requests (token-major, requests contiguous)."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64 rope positions
    out_slots: torch.Tensor  # [T] int64 cache rows that receive the tokens' KV
    page_table: torch.Tensor  # [>= B, max_pages] int32
    kv_lens: torch.Tensor  # [B] int32, including the T tokens' own KV
    q_indptr: torch.Tensor  # [B + 1] int32
    tree_mask: torch.Tensor | None  # [B, q, q] bool or None (causal chain)
    max_q_len: int
    max_kv_len: int
    logit_rows: torch.Tensor | None = None  # rows whose logits are needed; None: all
    total_kv_len: int | None = None  # sum of kv_lens where known on the host (not in a graph)
    mha: bool = False  # prefill: decompressed multi-head attention instead of the backend

    def attn_meta(
        self,
        num_heads: int,
        page_size: int,
        sm_scale: float,
        chained: bool = False,
        kv_rows: int | None = None,
    ) -> AttnMeta:
        """The step's attention metadata, planned once and shared by every layer (``kv_rows``:
        the rows of the cache it reads)."""
        return AttnMeta(
            page_table=self.page_table,
            kv_lens=self.kv_lens,
            q_indptr=self.q_indptr,
            sm_scale=sm_scale,
            num_tokens=self.input_ids.shape[0],
            num_heads=num_heads,
            page_size=page_size,
            tree_mask=self.tree_mask,
            max_q_len=self.max_q_len,
            max_kv_len=self.max_kv_len,
            total_kv_len=self.total_kv_len,
            chained=chained,
            kv_rows=kv_rows,
        )


@dataclass
class MhaSpan:
    """One request's part of a multi-head prefill step: its query rows and its cache rows."""

    q_start: int
    q_end: int
    slots: torch.Tensor  # [kv_len] int64 cache rows of the request's prefix + chunk, in order


def mha_spans(step: StepInput, page_size: int) -> list[MhaSpan]:
    """Cache rows per request, gathered once per forward (host sync: prefill only)."""
    if step.tree_mask is not None:
        raise ValueError("multi-head prefill attention is causal; a tree mask needs the backend")
    indptr, kv_lens = step.q_indptr.tolist(), step.kv_lens.tolist()
    spans = []
    for b, kv_len in enumerate(kv_lens):
        t = torch.arange(kv_len, device=step.page_table.device)
        slots = token_slots(step.page_table[b], t, page_size)
        spans.append(MhaSpan(indptr[b], indptr[b + 1], slots))
    return spans


WEIGHT_LAYOUTS = ("kn", "nk")  # how a [K, N] projection is stored: row-major, or as W^T rows


class Layer:
    """Weights of one decoder layer; normal(0, 1/fan_in) keeps every projection unit-variance.

    The weights are drawn in the unfused order (q_a, q_b, kv_a, ..., gate, up, down), then q_a|kv_a
    and gate|up are concatenated along N: the same model as separate projections, fewer GEMMs.
    """

    def __init__(self, cfg: ModelConfig, make: _Maker) -> None:
        h, H = cfg.hidden, cfg.num_heads
        residual_scale = 1.0 / math.sqrt(2 * cfg.num_layers)  # keeps the residual stream bounded
        self.attn_norm = make.ones(h)
        w_qa = make.weight(h, cfg.q_lora_rank)
        self.q_norm = make.ones(cfg.q_lora_rank)
        self.w_qb = make.linear(make.weight(cfg.q_lora_rank, H * cfg.qk_head_dim))
        w_kva = make.weight(h, cfg.kv_row_dim)
        self.w_qkv_a = make.linear(torch.cat([w_qa, w_kva], dim=1))  # [h, q_lora + 576]
        del w_qa, w_kva
        self.kv_norm = make.ones(cfg.kv_lora_rank)
        self.w_kc = make.weight(H, cfg.qk_nope_dim, cfg.kv_lora_rank)  # absorbed K up-projection
        self.w_vc = make.weight(H, cfg.kv_lora_rank, cfg.v_head_dim)  # absorbed V up-projection
        self.w_o = make.linear(make.weight(H * cfg.v_head_dim, h, scale=residual_scale))
        self.mlp_norm = make.ones(h)
        w_gate = make.weight(h, cfg.mlp_dim)
        w_up = make.weight(h, cfg.mlp_dim)
        self.w_gate_up = make.linear(torch.cat([w_gate, w_up], dim=1))  # [h, 2 * mlp]
        del w_gate, w_up
        self.w_down = make.linear(make.weight(cfg.mlp_dim, h, scale=residual_scale))


class _Maker:
    """Creates seeded random tensors directly on the target device (no CPU round trip)."""

    def __init__(
        self, device: torch.device, dtype: torch.dtype, seed: int, layout: str = "kn"
    ) -> None:
        if layout not in WEIGHT_LAYOUTS:
            raise ValueError(f"weight layout must be one of {WEIGHT_LAYOUTS}, got {layout!r}")
        self.device, self.dtype, self.layout = device, dtype, layout
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def weight(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        fan_in = shape[-2]
        w = torch.randn(*shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return (w * (scale / math.sqrt(fan_in))).to(self.dtype)

    def linear(self, w: torch.Tensor) -> torch.Tensor:
        """A [K, N] projection for ``x @ w``: as is, or stored N-major and viewed transposed."""
        return w if self.layout == "kn" else w.t().contiguous().t()

    def ones(self, n: int) -> torch.Tensor:
        return torch.ones(n, device=self.device, dtype=self.dtype)


def weight_gemm(
    gemm: str, device: torch.device, prefetch_mb: int = GEMM_PREFETCH_MB
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The step's ``x @ w``: tuned per shape on CUDA ("auto" and "fused", and "pdl" chained by
    programmatic dependent launch: engine/skinny_gemm.py), else torch ("cublas-pdl" chains the
    rest only)."""
    if gemm not in GEMMS:
        raise ValueError(f"gemm must be one of {GEMMS}, got {gemm!r}")
    if device.type != "cuda":
        return torch.matmul
    if gemm in CHAINED_GEMMS and torch.cuda.get_device_capability(device) < (9, 0):
        raise ValueError(
            f"gemm {gemm} needs programmatic dependent launch: compute capability >= 9.0"
        )
    if gemm in ("cublas", "cublas-pdl"):
        return torch.matmul
    from .skinny_gemm import WeightGemm  # Triton: CUDA processes only

    return WeightGemm(pdl=gemm == "pdl", prefetch_bytes=prefetch_mb << 20)


def projections(gemm: str, mm: Callable, pdl: bool) -> Projections:
    """The step's projections with their norms, adds and silu: folded into the weight GEMMs
    (``fused`` on CUDA), else kernels of their own around ``mm`` (a CPU runs torch's math)."""
    if gemm == "fused" and mm is not torch.matmul:
        return FoldedProjections(mm)
    return Projections(mm, pdl)


def head_gemm(gemm: str, device: torch.device) -> Callable[..., None]:
    """``out [T, H, N] = x [T, H, K] @ w [H, K, N]`` per head, and with ``rope`` = (r, cs, r_out)
    also ``r_out = rope(r)``: torch's bmm and the rope kernel; with ``auto`` on CUDA per shape
    the faster of that and the Triton kernel of engine/skinny_gemm.py doing both in one launch;
    in a chain of programmatic dependent launches that kernel chained (up to its MAX_M rows: a
    prefill chunk or a large batch takes the bmm, as the weight GEMMs take cuBLAS)."""
    pdl = gemm in CHAINED_GEMMS and device.type == "cuda"

    def bmm(
        x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, rope: fused.Rope | None = None
    ) -> None:
        torch.bmm(x.transpose(0, 1), w, out=out.transpose(0, 1))
        if rope is not None:
            fused.rope(*rope, pdl)

    if device.type != "cuda" or gemm == "cublas":
        return bmm
    from .skinny_gemm import MAX_M, TunedHeadGemm  # Triton: CUDA processes only
    from .skinny_gemm import head_gemm as triton_heads

    if not pdl:
        return TunedHeadGemm(bmm)

    def chained_or_bmm(
        x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, rope: fused.Rope | None = None
    ) -> None:
        if x.shape[0] > MAX_M:
            return bmm(x, w, out, rope)
        triton_heads(x, w, out, pdl=True, rope=rope)

    return chained_or_bmm


def l2_overlap(mb: int, device: torch.device, kv_row_bytes: int) -> L2Overlap | None:
    """The side stream that prefetches a layer's later weights into the L2 (None: no prefetch)."""
    if not mb:
        return None
    if device.type != "cuda":
        raise ValueError("the L2 prefetch needs a CUDA device")
    from .l2_overlap import L2Overlap  # Triton: CUDA processes only

    return L2Overlap(mb << 20, device, kv_row_bytes)


class SyntheticMLA:
    def __init__(
        self,
        cfg: ModelConfig,
        device: torch.device | str,
        dtype: torch.dtype,
        seed: int = 0,
        weight_layout: str = "kn",
        gemm: str = "cublas",
        gemm_prefetch_mb: int = GEMM_PREFETCH_MB,
        l2_overlap_mb: int = 0,
    ) -> None:
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        self.mm = weight_gemm(gemm, self.device, gemm_prefetch_mb)
        self.overlap = l2_overlap(l2_overlap_mb, self.device, cfg.kv_row_dim * dtype.itemsize)
        # the elementwise kernels join the GEMMs' chain of programmatic dependent launches
        self.pdl = gemm in CHAINED_GEMMS and self.device.type == "cuda"
        self.heads_mm = head_gemm(gemm, self.device)
        self.proj = projections(gemm, self.mm, self.pdl)
        make = _Maker(self.device, dtype, seed, weight_layout)
        self.embed = make.weight(cfg.vocab_size, cfg.hidden) * math.sqrt(cfg.vocab_size)
        self.layers = [Layer(cfg, make) for _ in range(cfg.num_layers)]
        self.final_norm = make.ones(cfg.hidden)
        self.lm_head = make.linear(make.weight(cfg.hidden, cfg.vocab_size))
        self.sm_scale = 1.0 / math.sqrt(cfg.qk_head_dim)
        self.rope = fused.RopeTable(cfg.qk_rope_dim, cfg.rope_theta, self.device)

    def weight_bytes(self) -> int:
        tensors = [self.embed, self.final_norm, self.lm_head]
        tensors += [t for layer in self.layers for t in vars(layer).values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def step_weight_bytes(self) -> int:
        """Weights a decode/verify step must read: all but the embedding (only T rows of it)."""
        return self.weight_bytes() - self.embed.numel() * self.embed.element_size()

    def step_gemm_flops(self, rows: int, logit_rows: int | None = None) -> int:
        """Multiply-adds x 2 of a step's projections over ``rows`` tokens (logits for some)."""
        per_layer = sum(
            t.numel() for layer in self.layers[:1] for t in vars(layer).values() if t.dim() > 1
        )
        logits = self.lm_head.numel() * (rows if logit_rows is None else logit_rows)
        return 2 * (rows * per_layer * len(self.layers) + logits)

    def plan(self, step: StepInput, kv_cache: torch.Tensor, backend: AttentionBackend) -> None:
        """The step's attention plan, shared by every layer (``forward`` does it unless told)."""
        rows = cache_rows(kv_cache)  # a layer's: [layers, pages, page_size, 576]
        meta = step.attn_meta(self.cfg.num_heads, kv_cache.shape[2], self.sm_scale, self.pdl, rows)
        backend.plan(meta)

    def forward(
        self,
        step: StepInput,
        kv_cache: torch.Tensor,
        backend: AttentionBackend,
        planned: bool = False,
    ) -> torch.Tensor:
        """Logits [rows, vocab] in float32; kv_cache is [layers, pages, page_size, 576].

        ``planned``: the caller ran ``plan`` for this step (a CUDA graph of a backend that plans
        on the host captures the layers only)."""
        T = step.input_ids.shape[0]
        self.rope.reserve(step.max_kv_len)  # positions < kv_len <= max_kv_len (host-side)
        cs = self.rope.rows(step.positions)  # [T, 64] cos | sin, shared by every layer
        x = self.embed[step.input_ids]
        spans = mha_spans(step, kv_cache.shape[2]) if step.mha else None
        bufs = None
        if spans is None:
            if not planned:
                self.plan(step, kv_cache, backend)
            bufs = self._buffers(T)
        delta = None  # a projection's output not yet in the stream x (self.proj says when)
        for i, layer in enumerate(self.layers):
            qkv_a = self.proj.normed(x, delta, layer.attn_norm, layer.w_qkv_a)
            v = self._attention(layer, qkv_a, cs, step, kv_cache[i], backend, spans, bufs)
            delta = self.proj.residual(x, v, layer.w_o)
            delta = self.proj.mlp(x, delta, layer.mlp_norm, layer.w_gate_up, layer.w_down)
        if step.logit_rows is not None:
            x = x[step.logit_rows]
            delta = None if delta is None else delta[step.logit_rows]
        return self.proj.normed(x, delta, self.final_norm, self.lm_head).float()

    def _buffers(self, T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-step scratch shared by the layers: queries [T,H,576], latent out, V out."""
        H, dev, dt = self.cfg.num_heads, self.device, self.dtype
        return (
            torch.empty(T, H, D_QK, device=dev, dtype=dt),
            torch.zeros(T, H, D_V, device=dev, dtype=dt),  # what a no-op backend leaves
            torch.empty(T, H, self.cfg.v_head_dim, device=dev, dtype=dt),
        )

    def _attention(
        self,
        layer: Layer,
        qkv_a: torch.Tensor,
        cs: torch.Tensor,
        step: StepInput,
        cache: torch.Tensor,
        backend: AttentionBackend,
        spans: list[MhaSpan] | None = None,
        bufs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The heads' values [T, H x 128] (the o projection's input) from the q_a|kv_a
        projection's output; multi-head over decompressed K/V when spans are given.

        Absorbed path: ``backend.plan`` must have run for this step; ``bufs`` from ``_buffers``.
        """
        cfg, T = self.cfg, qkv_a.shape[0]
        # The tokens' own KV goes into the cache before attention reads it (as SGLang does).
        overlap = self.overlap if spans is None else None
        if overlap is not None:  # the later weights stream in while the layer's middle runs
            later = [layer.w_qb, layer.w_kc, layer.w_vc, layer.w_o, layer.w_gate_up]
            overlap.fork(later, step.kv_lens)
        cq = fused.qkv_a_post(
            qkv_a,
            layer.q_norm,
            layer.kv_norm,
            cs,
            cache.view(-1, cfg.kv_row_dim),
            step.out_slots,
            self.pdl,
        )
        q = self.mm(cq, layer.w_qb).view(T, cfg.num_heads, -1)
        q_nope, q_rope = q.split([cfg.qk_nope_dim, cfg.qk_rope_dim], dim=-1)
        if spans is not None:
            q_rope = fused.rope(q_rope, cs, torch.empty_like(q_rope), self.pdl)
            v = torch.cat([self._mha(layer, q_nope, q_rope, cache, s) for s in spans])
            return v.reshape(T, -1)
        q_buf, out, v_buf = bufs if bufs is not None else self._buffers(T)
        # q_nope W_kc and rope(q_rope) land in place in the [T, H, 576] query rows (one launch
        # where the per-head GEMM is the chained Triton kernel).
        latent, rope_part = q_buf.split([cfg.kv_lora_rank, cfg.qk_rope_dim], dim=-1)
        self.heads_mm(q_nope, layer.w_kc, latent, rope=(q_rope, cs, rope_part))
        backend.run(q_buf, cache, out)  # [T, H, 512]
        self.heads_mm(out, layer.w_vc, v_buf)  # [T, H, 128]
        if overlap is not None:  # joined before the o projection
            overlap.join()
        return v_buf.view(T, -1)

    def _mha(
        self,
        layer: Layer,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        cache: torch.Tensor,
        span: MhaSpan,
    ) -> torch.Tensor:
        """One request's chunk [T, H, 128] attending to its whole cached prefix + chunk."""
        cfg, H = self.cfg, self.cfg.num_heads
        rows = cache.view(-1, cfg.kv_row_dim)[span.slots]  # [L, 576]
        c, k_rope = rows.split([cfg.kv_lora_rank, cfg.qk_rope_dim], dim=-1)
        L, T = rows.shape[0], span.q_end - span.q_start
        # w_kc is [H, 128, 512] (q_latent = q_nope @ w_kc): k_nope[h] = c @ w_kc[h]^T.
        k_nope = (c @ layer.w_kc.reshape(H * cfg.qk_nope_dim, -1).T).view(L, H, -1)
        # w_vc is [H, 512, 128] (v = out_latent @ w_vc): v[h] = c @ w_vc[h].
        v = (c @ layer.w_vc.transpose(0, 1).reshape(cfg.kv_lora_rank, -1)).view(L, H, -1)
        k = torch.cat([k_nope, k_rope[:, None, :].expand(L, H, cfg.qk_rope_dim)], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)[span.q_start : span.q_end]
        dv = v.shape[-1]
        if q.is_cuda and dv != k.shape[-1]:
            # Flash attention needs one head dim for q, k and v; zero columns leave out[:dv] exact.
            v = F.pad(v, (0, k.shape[-1] - dv))
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],  # [1, H, T, 192]
            k.transpose(0, 1)[None],  # [1, H, L, 192]
            v.transpose(0, 1)[None],  # [1, H, L, dv]
            attn_mask=causal_lower_right(T, L),  # prefix visible, causal within the chunk
            scale=self.sm_scale,
        )
        return out[0, ..., :dv].transpose(0, 1)  # [T, H, 128]


def layer_attention(
    model: SyntheticMLA,
    layer: Layer,
    h: torch.Tensor,
    step: StepInput,
    cache: torch.Tensor,
    spans: list[MhaSpan] | None = None,
    backend: AttentionBackend | None = None,
) -> torch.Tensor:
    """One layer's attention output alone (planned for this step): for checks layer by layer."""
    from decodecliff.kernels.reference import TorchAttention

    backend = backend or TorchAttention()
    model.rope.reserve(step.max_kv_len)
    if spans is None:
        meta = step.attn_meta(
            model.cfg.num_heads, cache.shape[1], model.sm_scale, kv_rows=cache_rows(cache)
        )
        backend.plan(meta)
    cs = model.rope.rows(step.positions)
    v = model._attention(layer, model.mm(h, layer.w_qkv_a), cs, step, cache, backend, spans)
    return model.mm(v, layer.w_o)
