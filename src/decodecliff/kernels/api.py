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

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

D_QK = 576  # kv_lora_rank 512 + qk_rope_head_dim 64
D_V = 512  # V is the latent part of the same row
# The cache rows int32 slots reach in the Triton baseline's kernels and SGLang's: both address a
# row's columns as slot x D_QK + column in int32, which overflows from this row on.
INT32_SLOT_ROWS = 2**31 // D_QK  # 3,728,270


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
    """What every layer of one step shares: the input of ``plan()``, the one metadata type.

    Host-side hints (``num_tokens``, ``max_q_len``, ``max_kv_len``, ``kv_rows``) let a backend
    size grids and workspaces, and check what its indices reach, without reading device tensors;
    a backend whose ``plan`` runs inside a CUDA graph must not sync on the device tensors either.
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
    total_kv_len: int | None = None  # host-side sum of kv_lens (balances a ragged batch's splits)
    # the step's kernels run as programmatic dependents (sm_90+): a backend that can launches
    # its kernels so too, each waiting for the one before it; the others launch plainly
    chained: bool = False
    # host-side rows of the KV cache (pages x page_size), every slot below it; None: not told
    kv_rows: int | None = None

    @property
    def batch_size(self) -> int:
        return self.kv_lens.shape[0]

    @property
    def device(self) -> torch.device:
        return self.kv_lens.device

    def batch(self, q: torch.Tensor, kv_cache: torch.Tensor) -> AttnBatch:
        """This step's metadata with one layer's queries and cache."""
        return AttnBatch(q, kv_cache, self)

    def q_lens(self) -> list[int]:
        """Per-request query lengths, read on the host (a sync: host-planned backends only)."""
        ptr = self.q_indptr.tolist()
        return [ptr[b + 1] - ptr[b] for b in range(self.batch_size)]


@dataclass
class AttnBatch:
    """One attention call: one layer's queries and cache with the step's ``AttnMeta``."""

    q: torch.Tensor  # [total_q, heads, 576] bf16 (or fp32/fp64 for the reference)
    kv_cache: torch.Tensor  # [num_pages, page_size, 576]
    meta: AttnMeta

    @classmethod
    def build(
        cls,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        page_table: torch.Tensor,
        kv_lens: torch.Tensor,
        q_indptr: torch.Tensor,
        sm_scale: float,
        tree_mask: torch.Tensor | None = None,
        max_q_len: int | None = None,
        max_kv_len: int | None = None,
        total_kv_len: int | None = None,
    ) -> AttnBatch:
        """A batch whose metadata takes its sizes (tokens, heads, page size) from q and cache."""
        meta = AttnMeta(
            page_table=page_table,
            kv_lens=kv_lens,
            q_indptr=q_indptr,
            sm_scale=sm_scale,
            num_tokens=q.shape[0],
            num_heads=q.shape[1],
            page_size=kv_cache.shape[1],
            tree_mask=tree_mask,
            max_q_len=max_q_len,
            max_kv_len=max_kv_len,
            total_kv_len=total_kv_len,
            kv_rows=cache_rows(kv_cache),
        )
        return cls(q, kv_cache, meta)

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> AttnBatch:
        """The same problem on ``device`` (q and cache in ``dtype`` if given)."""
        m = self.meta
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return AttnBatch.build(
            self.q.to(device, dtype), self.kv_cache.to(device, dtype), move(m.page_table),
            move(m.kv_lens), move(m.q_indptr), m.sm_scale, move(m.tree_mask), m.max_q_len,
            m.max_kv_len, m.total_kv_len,
        )  # fmt: skip

    @property
    def device(self) -> torch.device:
        return self.q.device

    def new_output(self) -> torch.Tensor:
        return new_output(self.q)


def cache_rows(kv_cache: torch.Tensor) -> int:
    """The rows of one layer's cache, pages x page_size: the two dims before the 576 columns,
    whatever leads them (a model's cache has its layers first)."""
    return kv_cache.shape[-3] * kv_cache.shape[-2]


def int32_slots_problem(kv_rows: int | None) -> str | None:
    """Why int32 slots cannot address every row of a cache of ``kv_rows`` rows, or None (None
    too where the rows are not told)."""
    if kv_rows is None or kv_rows <= INT32_SLOT_ROWS:
        return None
    return (
        f"a cache of {kv_rows:,} rows is past the {INT32_SLOT_ROWS:,} rows int32 slots reach "
        f"(slot x {D_QK} + column overflows int32): index_dtype=int64 reaches them"
    )


def new_output(q: torch.Tensor) -> torch.Tensor:
    """The attention output for queries q [T, H, 576]: [T, H, 512] in q's dtype."""
    return torch.empty(q.shape[0], q.shape[1], D_V, dtype=q.dtype, device=q.device)


class AttentionBackend(abc.ABC):
    """The one contract of every attention backend (as FlashInfer's plan/run wrappers and SGLang's
    ``init_forward_metadata`` + per-layer ``forward``).

    * ``plan(meta)`` runs once per step, before the first layer: it builds what the step's layers
      share (launch plans, index lists, workspaces). A plan that reads every request's lengths
      on the host (the peers', the torch reference's, Triton's on the CPU) refuses a request whose
      kv_len is under its q_len (``check_lengths``); one captured in a CUDA graph reads none.
    * ``run(q, kv_cache, out)`` runs once per layer with that layer's queries [T, H, 576] and cache
      [pages, page_size, 576], writes ``out`` [T, H, 512] and does launch work only.
    * ``capturable``: ``run`` neither syncs nor allocates, so a step's layers can be captured in a
      CUDA graph and replayed.
    * ``plan_outside_graph``: ``plan`` reads lengths on the host (FlashInfer's plan, SGLang's
      metadata), so a graph captures the layers only and ``plan`` runs before every replay, writing
      into buffers of fixed address. Otherwise ``plan`` itself is captured with the step (it reads
      only host hints and does device work on fixed-size tensors).
    * ``unsupported(meta)``: why this backend cannot serve ``meta`` (None when it can).
    * ``reach_problem(kv_rows)``: why it cannot address a cache of that many rows per layer, so
      an engine refuses its pool before allocating it (None when it can).
    * ``describe()``: what a result must record to name the backend exactly (its variant, splits).
    """

    name: ClassVar[str]
    capturable: ClassVar[bool] = False
    plan_outside_graph: ClassVar[bool] = False

    def unsupported(self, meta: AttnMeta) -> str | None:
        return None

    def reach_problem(self, kv_rows: int | None) -> str | None:
        return None

    @abc.abstractmethod
    def plan(self, meta: AttnMeta) -> None: ...

    @abc.abstractmethod
    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor: ...

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name}

    def check(self, meta: AttnMeta) -> None:
        """Raise ValueError naming the backend when it cannot serve ``meta``."""
        reason = self.unsupported(meta)
        if reason:
            raise ValueError(f"{self.name} attention: {reason}")

    def check_lengths(self, q_lens: Sequence[int], kv_lens: Sequence[int]) -> None:
        """Raise ValueError naming the first request whose kv_len is under its q_len (its query
        tokens are the last q_len of its KV). For lengths on the host: a ``plan`` captured in a
        CUDA graph reads none."""
        for b, (q, n) in enumerate(zip(q_lens, kv_lens, strict=True)):
            if n < q:
                raise ValueError(
                    f"{self.name} attention: request {b} has kv_len {n} < q_len {q} (its KV "
                    "includes its query tokens)"
                )

    def validate(self, batch: AttnBatch, out: torch.Tensor) -> None:  # noqa: B027 (optional)
        """Raise ValueError when one call's tensors break what ``run`` relies on (layouts)."""

    def prepare(self, batch: AttnBatch, out: torch.Tensor) -> Callable[[], None]:
        """Check and plan ``batch`` here (outside any timed region); return the launch-only call."""
        self.validate(batch, out)
        self.check(batch.meta)
        self.plan(batch.meta)
        q, kv = batch.q, batch.kv_cache
        return lambda: self.run(q, kv, out)

    def __call__(self, batch: AttnBatch, out: torch.Tensor | None = None) -> torch.Tensor:
        out = batch.new_output() if out is None else out
        self.prepare(batch, out)()
        return out


class NoAttention(AttentionBackend):
    """Does no attention work (the output is left as it is): a step then costs only the rest.

    Benchmarks time a step with it beside the real backend; the difference is attention's share.
    """

    name = "none"
    capturable = True

    def plan(self, meta: AttnMeta) -> None:
        return None

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out
