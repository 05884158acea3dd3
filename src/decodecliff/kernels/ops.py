"""The custom kernel as PyTorch custom ops (``torch.library``): ``torch.compile``, CUDA graphs and
other engines see one op per call and need none of this package's ctypes layer.

* ``torch.ops.decodecliff.mla_attention(q, kv_cache, page_table, kv_lens, q_indptr, tree_mask,
  sm_scale, max_q_len, max_kv_len) -> out``: plans (variant and splits, as the `custom` backend
  does) and returns a new [T, H, 512] output.
* ``torch.ops.decodecliff.mla_attention_out(..., out)``: the same into a preallocated ``out``,
  the form a captured step uses.

Shapes and dtypes as kernels/api.py: q [T, H, 576] bf16, kv_cache [pages, page_size, 576] bf16,
page_table [>= B, max_pages] int32, kv_lens [B] int32, q_indptr [B + 1] int32, tree_mask
[B, n, n] bool or None (a causal chain). The fake implementations give the output's shape, so
tracing needs no GPU.
"""

from __future__ import annotations

import torch

from .api import D_V, AttnMeta, cache_rows

_BACKEND = None  # one CustomAttention per process: its workspace and occupancy cache are shared


def _backend():
    global _BACKEND
    if _BACKEND is None:
        from .custom import CustomAttention

        _BACKEND = CustomAttention()
    return _BACKEND


def _meta(q, kv_cache, page_table, kv_lens, q_indptr, tree_mask, sm_scale, max_q_len, max_kv_len):
    return AttnMeta(
        page_table=page_table, kv_lens=kv_lens, q_indptr=q_indptr, sm_scale=sm_scale,
        num_tokens=q.shape[0], num_heads=q.shape[1], page_size=kv_cache.shape[1],
        tree_mask=tree_mask, max_q_len=max_q_len, max_kv_len=max_kv_len,
        kv_rows=cache_rows(kv_cache),
    )  # fmt: skip


@torch.library.custom_op("decodecliff::mla_attention_out", mutates_args=("out",))
def mla_attention_out(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    q_indptr: torch.Tensor,
    tree_mask: torch.Tensor | None,
    sm_scale: float,
    max_q_len: int,
    max_kv_len: int,
    out: torch.Tensor,
) -> None:
    backend = _backend()
    meta = _meta(q, kv_cache, page_table, kv_lens, q_indptr, tree_mask, sm_scale, max_q_len,
                 max_kv_len)  # fmt: skip
    backend.prepare(meta.batch(q, kv_cache), out)()


@mla_attention_out.register_fake
def _(q, kv_cache, page_table, kv_lens, q_indptr, tree_mask, sm_scale, max_q_len, max_kv_len, out):
    return None


@torch.library.custom_op("decodecliff::mla_attention", mutates_args=())
def mla_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    q_indptr: torch.Tensor,
    tree_mask: torch.Tensor | None,
    sm_scale: float,
    max_q_len: int,
    max_kv_len: int,
) -> torch.Tensor:
    out = q.new_empty(q.shape[0], q.shape[1], D_V)
    mla_attention_out(q, kv_cache, page_table, kv_lens, q_indptr, tree_mask, sm_scale, max_q_len,
                      max_kv_len, out)  # fmt: skip
    return out


@mla_attention.register_fake
def _(q, kv_cache, page_table, kv_lens, q_indptr, tree_mask, sm_scale, max_q_len, max_kv_len):
    torch._check(q.dim() == 3 and kv_cache.dim() == 3 and q.shape[2] == kv_cache.shape[2])
    return q.new_empty(q.shape[0], q.shape[1], D_V)
