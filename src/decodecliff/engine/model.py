"""A synthetic absorbed-MLA transformer with seeded random weights (DeepSeek-V3 / Kimi K2 layout).

Per layer: q = W_qb(norm(W_qa x)) split into nope (128) and rope (64) parts per head; the nope part
is absorbed through W_kc into the 512-wide latent space, so attention scores are taken directly
against the cached latent row [latent 512 | k_rope 64] = 576, and the attention output (a latent,
512 wide) is expanded by W_vc to the 128-wide V head before W_o. Every op is a fixed-shape tensor op
with no host sync, so a step can be captured in a CUDA graph.

A prefill chunk may instead take the multi-head path (``StepInput.mha``), as SGLang serves MLA
models: the request's cached latent rows are decompressed with the same weights (k_nope = c W_kc^T,
v = c W_vc per head; k_rope shared) and attended with head dim 192 and V dim 128. Scores and outputs
are the absorbed path's exactly (q_nope . (W_kc c) = (q_nope W_kc) . c), at about a third of
the FLOPs for long chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from decodecliff.kernels.api import AttentionBackend, AttnBatch

from .config import ModelConfig


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
    mha: bool = False  # prefill: decompressed multi-head attention instead of the backend


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
        slots = step.page_table[b, t // page_size].long() * page_size + t % page_size
        spans.append(MhaSpan(indptr[b], indptr[b + 1], slots))
    return spans


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * weight.float()).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half rope on the last dim of x ([T, ..., d]) at the given positions."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * inv_freq[None, :]  # [T, d/2]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (d // 2,)
    cos, sin = angles.cos().view(shape), angles.sin().view(shape)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Layer:
    """Weights of one decoder layer; normal(0, 1/fan_in) keeps every projection unit-variance."""

    def __init__(self, cfg: ModelConfig, make) -> None:
        h, H = cfg.hidden, cfg.num_heads
        residual_scale = 1.0 / math.sqrt(2 * cfg.num_layers)  # keeps the residual stream bounded
        self.attn_norm = make.ones(h)
        self.w_qa = make.weight(h, cfg.q_lora_rank)
        self.q_norm = make.ones(cfg.q_lora_rank)
        self.w_qb = make.weight(cfg.q_lora_rank, H * cfg.qk_head_dim)
        self.w_kva = make.weight(h, cfg.kv_row_dim)
        self.kv_norm = make.ones(cfg.kv_lora_rank)
        self.w_kc = make.weight(H, cfg.qk_nope_dim, cfg.kv_lora_rank)  # absorbed K up-projection
        self.w_vc = make.weight(H, cfg.kv_lora_rank, cfg.v_head_dim)  # absorbed V up-projection
        self.w_o = make.weight(H * cfg.v_head_dim, h, scale=residual_scale)
        self.mlp_norm = make.ones(h)
        self.w_gate = make.weight(h, cfg.mlp_dim)
        self.w_up = make.weight(h, cfg.mlp_dim)
        self.w_down = make.weight(cfg.mlp_dim, h, scale=residual_scale)


class _Maker:
    """Creates seeded random tensors directly on the target device (no CPU round trip)."""

    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int) -> None:
        self.device, self.dtype = device, dtype
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def weight(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        fan_in = shape[-2]
        w = torch.randn(*shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return (w * (scale / math.sqrt(fan_in))).to(self.dtype)

    def ones(self, n: int) -> torch.Tensor:
        return torch.ones(n, device=self.device, dtype=self.dtype)


class SyntheticMLA:
    def __init__(
        self, cfg: ModelConfig, device: torch.device | str, dtype: torch.dtype, seed: int = 0
    ) -> None:
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        make = _Maker(self.device, dtype, seed)
        self.embed = make.weight(cfg.vocab_size, cfg.hidden) * math.sqrt(cfg.vocab_size)
        self.layers = [Layer(cfg, make) for _ in range(cfg.num_layers)]
        self.final_norm = make.ones(cfg.hidden)
        self.lm_head = make.weight(cfg.hidden, cfg.vocab_size)
        self.sm_scale = 1.0 / math.sqrt(cfg.qk_head_dim)

    def weight_bytes(self) -> int:
        tensors = [self.embed, self.final_norm, self.lm_head]
        tensors += [t for layer in self.layers for t in vars(layer).values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def forward(
        self, step: StepInput, kv_cache: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        """Logits [rows, vocab] in float32; kv_cache is [layers, pages, page_size, 576]."""
        x = self.embed[step.input_ids]
        spans = mha_spans(step, kv_cache.shape[2]) if step.mha else None
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm)
            x = x + self._attention(layer, h, step, kv_cache[i], backend, spans)
            x = x + self._mlp(layer, rms_norm(x, layer.mlp_norm))
        if step.logit_rows is not None:
            x = x[step.logit_rows]
        return (rms_norm(x, self.final_norm) @ self.lm_head).float()

    def _attention(
        self,
        layer: Layer,
        h: torch.Tensor,
        step: StepInput,
        cache: torch.Tensor,
        backend: AttentionBackend,
        spans: list[MhaSpan] | None = None,
    ) -> torch.Tensor:
        """Attention output [T, hidden]; multi-head over decompressed K/V when spans are given."""
        cfg, T = self.cfg, h.shape[0]
        q = (rms_norm(h @ layer.w_qa, layer.q_norm) @ layer.w_qb).view(T, cfg.num_heads, -1)
        q_nope, q_rope = q.split([cfg.qk_nope_dim, cfg.qk_rope_dim], dim=-1)
        q_rope = apply_rope(q_rope, step.positions, cfg.rope_theta)
        kv = h @ layer.w_kva
        latent = rms_norm(kv[:, : cfg.kv_lora_rank], layer.kv_norm)
        k_rope = apply_rope(kv[:, cfg.kv_lora_rank :], step.positions, cfg.rope_theta)
        # The tokens' own KV goes into the cache before attention reads it (as SGLang does).
        cache.view(-1, cfg.kv_row_dim)[step.out_slots] = torch.cat([latent, k_rope], dim=-1)
        if spans is not None:
            v = torch.cat([self._mha(layer, q_nope, q_rope, cache, s) for s in spans])
            return v.reshape(T, -1) @ layer.w_o
        q_latent = torch.bmm(q_nope.transpose(0, 1), layer.w_kc).transpose(0, 1)  # [T, H, 512]
        batch = AttnBatch(
            q=torch.cat([q_latent, q_rope], dim=-1),
            kv_cache=cache,
            page_table=step.page_table,
            kv_lens=step.kv_lens,
            q_indptr=step.q_indptr,
            sm_scale=self.sm_scale,
            tree_mask=step.tree_mask,
            max_q_len=step.max_q_len,
            max_kv_len=step.max_kv_len,
        )
        out = backend(batch)  # [T, H, 512]
        v = torch.bmm(out.transpose(0, 1), layer.w_vc).transpose(0, 1)  # [T, H, 128]
        return v.reshape(T, -1) @ layer.w_o

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

    def _mlp(self, layer: Layer, h: torch.Tensor) -> torch.Tensor:
        return (F.silu(h @ layer.w_gate) * (h @ layer.w_up)) @ layer.w_down
