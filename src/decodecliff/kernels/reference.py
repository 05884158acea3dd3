"""The `torch` backend: plain PyTorch absorbed-MLA attention, any device, any dtype.

It gathers each request's KV through the page table and runs a masked softmax per request. It is the
correctness reference (run it in float64 for the ground truth) and the engine's CPU path.
"""

from __future__ import annotations

import torch

from .api import D_QK, D_V, AttnBatch


def visible_mask(q_len: int, kv_len: int, tree_mask: torch.Tensor | None, device) -> torch.Tensor:
    """[q_len, kv_len] bool: the prefix is fully visible, the draft part chain- or tree-masked."""
    prefix = kv_len - q_len
    mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    if tree_mask is None:
        draft = torch.ones(q_len, q_len, dtype=torch.bool, device=device).tril()
    else:
        draft = tree_mask[:q_len, :q_len].to(device=device, dtype=torch.bool)
    mask[:, prefix:] = draft
    return mask


def gather_kv(batch: AttnBatch, b: int, kv_len: int) -> torch.Tensor:
    """[kv_len, 576]: request b's cached rows in token order."""
    page_size = batch.page_size
    tokens = torch.arange(kv_len, device=batch.kv_cache.device)
    pages = batch.page_table[b].to(torch.long)[tokens // page_size]
    return batch.kv_cache.reshape(-1, D_QK)[pages * page_size + tokens % page_size]


class TorchAttention:
    name = "torch"

    def __init__(self, compute_dtype: torch.dtype | None = None):
        self.compute_dtype = compute_dtype  # None: the inputs' dtype, upcast to fp32 for bf16/fp16

    def _dtype(self, dtype: torch.dtype) -> torch.dtype:
        if self.compute_dtype is not None:
            return self.compute_dtype
        return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype

    def __call__(self, batch: AttnBatch, out: torch.Tensor | None = None) -> torch.Tensor:
        out = batch.new_output() if out is None else out
        dtype = self._dtype(batch.q.dtype)
        q_indptr = batch.q_indptr.tolist()
        kv_lens = batch.kv_lens.tolist()
        for b, kv_len in enumerate(kv_lens):
            q0, q1 = q_indptr[b], q_indptr[b + 1]
            if q1 == q0:
                continue
            tree = None if batch.tree_mask is None else batch.tree_mask[b]
            kv = gather_kv(batch, b, kv_len).to(dtype)
            q = batch.q[q0:q1].to(dtype)  # [L, H, 576]
            scores = torch.einsum("lhd,td->lht", q, kv) * batch.sm_scale
            mask = visible_mask(q1 - q0, kv_len, tree, q.device)
            scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out[q0:q1] = torch.einsum("lht,td->lhd", probs, kv[:, :D_V]).to(out.dtype)
        return out


def reference_attention(batch: AttnBatch) -> torch.Tensor:
    """Ground truth in float64 on the CPU."""
    cpu = AttnBatch(
        q=batch.q.double().cpu(),
        kv_cache=batch.kv_cache.double().cpu(),
        page_table=batch.page_table.cpu(),
        kv_lens=batch.kv_lens.cpu(),
        q_indptr=batch.q_indptr.cpu(),
        sm_scale=batch.sm_scale,
        tree_mask=None if batch.tree_mask is None else batch.tree_mask.cpu(),
    )
    return TorchAttention(torch.float64)(cpu)
