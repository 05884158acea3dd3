"""The interface every attention backend implements: absorbed-MLA attention over a paged KV cache.

Shapes (Kimi K2 absorbed MLA): a query row and a latent KV row are both D_QK = 576 wide
(512 latent + 64 rope); V is the first D_V = 512 dims of the same latent row.

A batch holds B requests. Request b has ``q_len[b] = q_indptr[b+1] - q_indptr[b]`` query
tokens (1 for plain decode, L for a verify step) and ``kv_lens[b]`` cached tokens, the *last*
``q_len[b]`` of which are the query tokens' own KV (written to the cache before attention, as
SGLang does). The prefix ``kv_lens[b] - q_len[b]`` is visible to every query token; among the draft
tokens, query i sees draft j when ``j <= i`` (chain) or when ``tree_mask[b, i, j]`` is set (tree:
ancestors and self).

Token t of request b lives in cache row
``page_table[b, t // page_size] * page_size + t % page_size`` of ``kv_cache.view(-1, 576)``.
With page_size = 1 the page table is a list of scattered slots.

All metadata tensors have fixed shapes chosen by the caller (max batch, max pages), so a step can be
captured in a CUDA graph and replayed at any context length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

D_QK = 576  # kv_lora_rank 512 + qk_rope_head_dim 64
D_V = 512  # V is the latent part of the same row


@dataclass
class AttnBatch:
    q: torch.Tensor  # [total_q, heads, 576] bf16 (or fp32/fp64 for the reference)
    kv_cache: torch.Tensor  # [num_pages, page_size, 576]
    page_table: torch.Tensor  # [max_batch >= B, max_pages] int32
    kv_lens: torch.Tensor  # [B] int32, includes the query tokens' own KV
    q_indptr: torch.Tensor  # [B + 1] int32
    sm_scale: float
    tree_mask: torch.Tensor | None = None  # [B, max_q, max_q] bool; None means a causal chain
    max_q_len: int | None = None  # host-side max(q_len); lets backends size grids without a sync
    max_kv_len: int | None = None  # host-side upper bound on kv_lens (for split planning)

    @property
    def batch_size(self) -> int:
        return self.kv_lens.shape[0]

    @property
    def num_heads(self) -> int:
        return self.q.shape[1]

    @property
    def page_size(self) -> int:
        return self.kv_cache.shape[1]

    def new_output(self) -> torch.Tensor:
        return torch.empty(
            self.q.shape[0], self.num_heads, D_V, dtype=self.q.dtype, device=self.q.device
        )


class AttentionBackend(Protocol):
    """``backend(batch, out)`` writes each query row's attention to ``out`` [tokens, heads, 512]."""

    name: str

    def __call__(self, batch: AttnBatch, out: torch.Tensor | None = None) -> torch.Tensor: ...
