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
``page_table[b, t // page_size] * page_size + t % page_size`` of ``kv_cache.view(-1, 576)``
(``token_slots``; ``token_slot`` for one token of a host-side page list). With page_size = 1 the
page table is a list of scattered slots.

All metadata tensors have fixed shapes chosen by the caller (max batch, max pages), so a step can be
captured in a CUDA graph and replayed at any context length. A step plans once (``plan(meta)``)
and runs every layer (``run(q, kv_cache, out)``): see ``AttentionBackend``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

D_QK = 576  # kv_lora_rank 512 + qk_rope_head_dim 64
D_V = 512  # V is the latent part of the same row


def token_slots(
    pages: torch.Tensor,
    tokens: torch.Tensor,
    page_size: int,
    out: torch.Tensor | None = None,
    clamp: bool = False,
) -> torch.Tensor:
    """int64 cache rows of ``tokens``: ``pages[..., t // page_size] * page_size + t % page_size``.

    ``pages`` is one request's page-table row [max_pages] (result shaped as ``tokens``) or a table
    [B, max_pages] (result [B, len(tokens)]). A token past the table's last page is an IndexError,
    unless ``clamp`` maps it into that page: a fixed-width slot list padded past every kv_len then
    needs no bounds check, and no kernel reads those slots.
    """
    cols = tokens // page_size
    if clamp:
        cols = cols.clamp_(max=pages.shape[-1] - 1)
    return torch.add(pages[..., cols].long() * page_size, tokens % page_size, out=out)


def token_slot(pages: Sequence[int] | torch.Tensor, token: int, page_size: int) -> int:
    """The cache row of one token (``token_slots`` for a host-side page list, without tensors)."""
    return int(pages[token // page_size]) * page_size + token % page_size


@dataclass
class AttnMeta:
    """What every layer of one step shares: the batch-level input of ``plan()``.

    Host-side hints (``num_tokens``, ``max_q_len``, ``max_kv_len``) let a backend size grids and
    workspaces without reading device tensors; ``plan()`` must not sync on the device tensors
    either if the backend is ``capturable``.
    """

    page_table: torch.Tensor  # [max_batch >= B, max_pages] int32
    kv_lens: torch.Tensor  # [B] int32, includes the query tokens' own KV
    q_indptr: torch.Tensor  # [B + 1] int32
    sm_scale: float
    num_tokens: int  # total query rows T (host-side)
    num_heads: int
    page_size: int
    tree_mask: torch.Tensor | None = None  # [B, max_q, max_q] bool; None means a causal chain
    max_q_len: int | None = None  # host-side max(q_len)
    max_kv_len: int | None = None  # host-side upper bound on kv_lens

    @property
    def batch_size(self) -> int:
        return self.kv_lens.shape[0]

    @property
    def device(self) -> torch.device:
        return self.kv_lens.device

    def batch(self, q: torch.Tensor, kv_cache: torch.Tensor) -> AttnBatch:
        """This step's metadata with one layer's queries and cache."""
        return AttnBatch(
            q=q,
            kv_cache=kv_cache,
            page_table=self.page_table,
            kv_lens=self.kv_lens,
            q_indptr=self.q_indptr,
            sm_scale=self.sm_scale,
            tree_mask=self.tree_mask,
            max_q_len=self.max_q_len,
            max_kv_len=self.max_kv_len,
        )


@dataclass
class AttnBatch:
    """One attention call: an ``AttnMeta`` plus one layer's queries and cache."""

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
    def num_tokens(self) -> int:
        return self.q.shape[0]

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def page_size(self) -> int:
        return self.kv_cache.shape[1]

    @property
    def meta(self) -> AttnMeta:
        return AttnMeta(
            page_table=self.page_table,
            kv_lens=self.kv_lens,
            q_indptr=self.q_indptr,
            sm_scale=self.sm_scale,
            num_tokens=self.num_tokens,
            num_heads=self.num_heads,
            page_size=self.page_size,
            tree_mask=self.tree_mask,
            max_q_len=self.max_q_len,
            max_kv_len=self.max_kv_len,
        )

    def new_output(self) -> torch.Tensor:
        return new_output(self.q)


def new_output(q: torch.Tensor) -> torch.Tensor:
    """The attention output for queries q [T, H, 576]: [T, H, 512] in q's dtype."""
    return torch.empty(q.shape[0], q.shape[1], D_V, dtype=q.dtype, device=q.device)


class AttentionBackend(Protocol):
    """The plan/run contract (as FlashInfer's wrappers and SGLang's init_forward_metadata).

    ``plan(meta)`` runs once per step, before the first layer: it validates the metadata and builds
    whatever the step's layers share (launch plans, token-slot lists, workspaces). ``run(q,
    kv_cache, out)`` runs once per layer with that layer's queries [T, H, 576] and cache [pages,
    page_size, 576] and writes ``out`` [T, H, 512]; it does only launch work. ``__call__(batch)``
    is plan + run for a single call. A ``capturable`` backend neither syncs nor allocates in
    ``run`` (nor in ``plan`` once its workspaces have reached the step's size), so a step can be
    captured in a CUDA graph.
    """

    name: str
    capturable: bool

    def plan(self, meta: AttnMeta) -> object: ...

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor: ...

    def __call__(self, batch: AttnBatch, out: torch.Tensor | None = None) -> torch.Tensor: ...


class PlannedBackend:
    """``__call__`` for a backend that implements ``plan`` and ``run``."""

    name = "planned"
    capturable = False

    def plan(self, meta: AttnMeta) -> object:
        raise NotImplementedError

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, batch: AttnBatch, out: torch.Tensor | None = None) -> torch.Tensor:
        out = batch.new_output() if out is None else out
        self.plan(batch.meta)
        return self.run(batch.q, batch.kv_cache, out)


class NoAttention(PlannedBackend):
    """Does no attention work (the output is left as it is): a step then costs only the rest.

    Benchmarks time a step with it beside the real backend; the difference is attention's share.
    """

    name = "none"
    capturable = True

    def plan(self, meta: AttnMeta) -> None:
        return None

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out
