"""Random attention problems for tests and benchmarks: scattered pages, ragged batches, trees."""

from __future__ import annotations

import itertools
import math

import torch

from .api import D_QK, AttnBatch


def random_tree_mask(num_nodes: int, generator: torch.Generator) -> torch.Tensor:
    """[n, n] bool ancestor-or-self mask of a random tree whose nodes are in topological order."""
    parent = [-1] + [
        int(torch.randint(0, i, (1,), generator=generator)) for i in range(1, num_nodes)
    ]
    mask = torch.zeros(num_nodes, num_nodes, dtype=torch.bool)
    for i in range(num_nodes):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parent[j]
    return mask


def random_batch(
    kv_lens: list[int],
    q_len: int | list[int],
    heads: int = 8,
    page_size: int = 1,
    tree: bool = False,
    scattered: bool = True,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    seed: int = 0,
    spare_pages: int = 0,
) -> AttnBatch:
    """A batch of len(kv_lens) requests, each verifying q_len tokens over kv_lens[b] cached tokens.

    ``q_len`` may be one per request (a ragged batch: q_indptr of mixed steps, the tree mask
    padded to the longest). The pool holds every request's pages (plus ``spare_pages``) in a
    random order when ``scattered``, so requests interleave in memory as they do after churn in
    a real pool.
    """
    g = torch.Generator().manual_seed(seed)
    q_lens = [q_len] * len(kv_lens) if isinstance(q_len, int) else list(q_len)
    if len(q_lens) != len(kv_lens) or min(q_lens, default=1) < 1:
        raise ValueError("q_len must be >= 1, one for the batch or one per kv_len")
    if any(n < q for n, q in zip(kv_lens, q_lens, strict=True)):
        raise ValueError("every kv_len must include the q_len draft tokens")
    max_q = max(q_lens)
    pages_per_req = [math.ceil(n / page_size) for n in kv_lens]
    num_pages = sum(pages_per_req) + spare_pages
    order = torch.randperm(num_pages, generator=g) if scattered else torch.arange(num_pages)
    max_pages = max(pages_per_req)
    page_table = torch.zeros(len(kv_lens), max_pages, dtype=torch.int32)
    start = 0
    for b, n in enumerate(pages_per_req):
        page_table[b, :n] = order[start : start + n].to(torch.int32)
        start += n
    kv_cache = torch.randn(num_pages, page_size, D_QK, generator=g).to(dtype)
    q = torch.randn(sum(q_lens), heads, D_QK, generator=g).to(dtype)
    tree_mask = None
    if tree:
        tree_mask = torch.zeros(len(kv_lens), max_q, max_q, dtype=torch.bool)
        for b, n in enumerate(q_lens):
            tree_mask[b, :n, :n] = random_tree_mask(n, g)
    batch = AttnBatch.build(
        q=q,
        kv_cache=kv_cache,
        page_table=page_table,
        kv_lens=torch.tensor(kv_lens, dtype=torch.int32),
        q_indptr=torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32),
        sm_scale=1.0 / math.sqrt(192),  # Kimi K2: softmax over qk_nope 128 + qk_rope 64
        tree_mask=tree_mask,
        max_q_len=max_q,
        max_kv_len=max(kv_lens),
        total_kv_len=sum(kv_lens),
    )
    return batch.to(device)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere gives inf."""
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    if not torch.isfinite(out64).all():
        return math.inf
    return float((out64 - ref64).norm() / ref64.norm())
