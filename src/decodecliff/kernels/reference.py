"""The `torch` backend: plain PyTorch absorbed-MLA attention, any device, any dtype.

It gathers each request's KV through the page table and runs a masked softmax per request. It is the
correctness reference (run it in float64 for the ground truth) and the engine's CPU path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .api import D_QK, D_V, AttentionBackend, AttnBatch, AttnMeta, token_slots


def visible_mask(
    q_len: int, kv_len: int, tree_mask: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """[q_len, kv_len] bool: the prefix is fully visible, the draft part chain- or tree-masked."""
    prefix = kv_len - q_len
    mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    if tree_mask is None:
        draft = torch.ones(q_len, q_len, dtype=torch.bool, device=device).tril()
    else:
        draft = tree_mask[:q_len, :q_len].to(device=device, dtype=torch.bool)
    mask[:, prefix:] = draft
    return mask


def token_rows(pages: torch.Tensor, kv_len: int, page_size: int) -> torch.Tensor:
    """[kv_len] int64 cache rows of a request's tokens, from its page-table row."""
    return token_slots(pages, torch.arange(kv_len, device=pages.device), page_size)


@dataclass
class _Span:
    """One request of a planned step: its query rows, cache rows and visibility mask."""

    q0: int
    q1: int
    rows: torch.Tensor  # [kv_len] int64
    mask: torch.Tensor  # [q_len, 1, kv_len] bool


class TorchAttention(AttentionBackend):
    """Gathers each request's KV through the page table and runs a masked softmax per request.

    ``plan`` reads the lengths to the host once per step (so it cannot be captured in a CUDA
    graph) and builds every request's row list and mask; ``run`` is the per-layer math.
    """

    name = "torch"
    capturable = False

    def __init__(self, compute_dtype: torch.dtype | None = None):
        self.compute_dtype = compute_dtype  # None: the inputs' dtype, upcast to fp32 for bf16/fp16
        self._spans: list[_Span] = []
        self._sm_scale = 1.0

    def _dtype(self, dtype: torch.dtype) -> torch.dtype:
        if self.compute_dtype is not None:
            return self.compute_dtype
        return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype

    def plan(self, meta: AttnMeta) -> None:
        q_indptr, kv_lens = meta.q_indptr.tolist(), meta.kv_lens.tolist()
        self.check_lengths([q_indptr[b + 1] - q_indptr[b] for b in range(len(kv_lens))], kv_lens)
        spans = []
        for b, kv_len in enumerate(kv_lens):
            q0, q1 = q_indptr[b], q_indptr[b + 1]
            if q1 == q0:
                continue
            tree = None if meta.tree_mask is None else meta.tree_mask[b]
            mask = visible_mask(q1 - q0, kv_len, tree, meta.device)[:, None, :]
            rows = token_rows(meta.page_table[b], kv_len, meta.page_size)
            spans.append(_Span(q0, q1, rows, mask))
        self._spans, self._sm_scale = spans, meta.sm_scale

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        dtype = self._dtype(q.dtype)
        flat = kv_cache.reshape(-1, D_QK)
        for span in self._spans:
            kv = flat[span.rows].to(dtype)
            qs = q[span.q0 : span.q1].to(dtype)  # [L, H, 576]
            scores = torch.einsum("lhd,td->lht", qs, kv) * self._sm_scale
            scores = scores.masked_fill(~span.mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out[span.q0 : span.q1] = torch.einsum("lht,td->lhd", probs, kv[:, :D_V]).to(out.dtype)
        return out


def reference_attention(batch: AttnBatch) -> torch.Tensor:
    """Ground truth in float64 on the CPU."""
    return TorchAttention(torch.float64)(batch.to("cpu", torch.float64))
