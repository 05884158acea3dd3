"""Planted attention problems: inputs on which every mask decision shows in the output.

Relative L2 error on random data cannot see a mask error at long context: one wrongly visible
token among 185k moves the output by ~1e-4. Here each (draft row, head) gets a pair of planted
tokens instead: a *visible* one (its own position, the last prefix token, an ancestor / the previous
chain token, the first token) and a *hidden* one (the next chain token, a sibling or other
non-ancestor in the tree, the token just past kv_len). Their keys are orthogonal directions of norm
KEY_NORM, every other key is small noise, and the row's query points at both, so the hidden token's
logit beats the visible one's by HIDDEN_LOGIT - VISIBLE_LOGIT = 10 and the visible one beats all the
noise of a 185k prefix by ~18 (e^-18 = 1.5e-8 of the weight). A correct kernel returns the visible
token's value (the first 512 dims of its key, unique to it); a mask that hides the visible token or
shows the hidden one returns something else, an error of order 1 in that row.

The token just past kv_len lies in a real, allocated slot (the request's last page, or one extra
page-table entry): a kernel that reads one token too far reads it.

Checks are per row: the maximum over the 512 output dims of |out - ref| over the maximum |ref|, for
every (token, head), against a float64 reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .api import D_QK, D_V, AttnBatch, token_slot, token_slots
from .synthetic import random_tree_mask

PLANTED_TOL = 3e-2  # per-row max error over the row's max |value|: bf16 inputs, output and partials
VISIBLE_LOGIT = 30.0  # logit of the token the row must return (noise logits are ~0)
HIDDEN_LOGIT = 40.0  # logit of the token a correct mask hides
KEY_NORM = 16.0
NOISE = 0.02  # std of every other key (and so value) element
SM_SCALE = 1.0 / math.sqrt(192)


@dataclass
class Planted:
    """A planted batch and, per (query token, head), the tokens its mask must show and hide."""

    batch: AttnBatch
    visible: torch.Tensor  # [T, H] int64: token index (within its request) the row must return
    hidden: torch.Tensor  # [T, H] int64: token index a correct mask hides
    visible_kind: list[list[str]]  # [T][H] what the visible token is ("self", "last-prefix", ...)
    hidden_kind: list[list[str]]  # [T][H] ("next", "non-ancestor", "past-end")


def _ancestors(tree: torch.Tensor | None, i: int) -> list[int]:
    if tree is None:
        return list(range(i + 1))
    return [j for j in range(i + 1) if bool(tree[i, j])]


def _candidates(i: int, q_len: int, prefix: int, tree: torch.Tensor | None):
    """(visible, hidden) candidate lists of (kind, draft-relative or absolute token) for row i."""
    kv_len = prefix + q_len
    visible = [("self", prefix + i)]
    if prefix > 0:
        visible.append(("last-prefix", prefix - 1))
    if prefix > 1:
        visible.append(("first", 0))
    anc = [j for j in _ancestors(tree, i) if j != i]
    if anc:
        visible.append(("ancestor" if tree is not None else "previous", prefix + anc[-1]))
    hidden = [("past-end", kv_len)]
    if tree is None and i + 1 < q_len:
        hidden.insert(0, ("next", prefix + i + 1))
    elif tree is not None:
        seen = set(_ancestors(tree, i))
        others = [j for j in range(q_len) if j not in seen]
        if others:  # prefer an earlier non-ancestor (a sibling branch) over a later node
            earlier = [j for j in others if j < i]
            hidden.insert(0, ("non-ancestor", prefix + (earlier or others)[-1]))
    return visible, hidden


class _Keys:
    """One request's planted keys: an unused orthonormal direction per planted token."""

    def __init__(self, basis, perm, cache, pages: torch.Tensor, page_size: int) -> None:
        self.basis, self.perm, self.cache, self.pages, self.ps = (
            basis,
            perm,
            cache,
            pages,
            page_size,
        )
        self.directions: dict[int, torch.Tensor] = {}

    def plant(self, token: int) -> torch.Tensor:
        """The token's key direction; its cache row is set to KEY_NORM times it."""
        if token not in self.directions:
            d = self.basis[:, self.perm[len(self.directions)]]
            self.directions[token] = d
            row = token_slot(self.pages, token, self.ps)
            self.cache[row] = KEY_NORM * d
        return self.directions[token]


def _layout(kv_lens: list[int], page_size: int, spare: int, g: torch.Generator):
    """A scattered page table with room for one token past each request's kv_len."""
    pages = [math.ceil((n + 1) / page_size) for n in kv_lens]
    order = torch.randperm(sum(pages) + spare, generator=g)
    table = torch.zeros(len(kv_lens), max(pages), dtype=torch.int32)
    start = 0
    for b, n in enumerate(pages):
        table[b, :n] = order[start : start + n].to(torch.int32)
        start += n
    return table, sum(pages) + spare


def planted_batch(
    kv_lens: list[int],
    q_len: int,
    heads: int = 8,
    page_size: int = 1,
    tree: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    seed: int = 0,
    spare_pages: int = 2,
) -> Planted:
    """Requests verifying q_len draft tokens over kv_lens[b] cached tokens, with planted keys."""
    if any(n < q_len for n in kv_lens) or q_len < 1:
        raise ValueError("every kv_len must include the q_len >= 1 draft tokens")
    if q_len + 4 > D_QK:
        raise ValueError(f"at most {D_QK - 4} draft tokens (one key direction per planted token)")
    g = torch.Generator().manual_seed(seed)
    table, num_pages = _layout(kv_lens, page_size, spare_pages, g)
    cache = torch.randn(num_pages * page_size, D_QK, generator=g, dtype=torch.float64) * NOISE
    basis, _ = torch.linalg.qr(torch.randn(D_QK, D_QK, generator=g, dtype=torch.float64))
    trees = [random_tree_mask(q_len, g) if tree else None for _ in kv_lens]
    q = torch.zeros(q_len * len(kv_lens), heads, D_QK, dtype=torch.float64)
    visible = torch.zeros(q.shape[0], heads, dtype=torch.long)
    hidden = torch.zeros_like(visible)
    vkind: list[list[str]] = []
    hkind: list[list[str]] = []
    a = VISIBLE_LOGIT / (KEY_NORM * SM_SCALE)
    c = HIDDEN_LOGIT / (KEY_NORM * SM_SCALE)
    for b, kv_len in enumerate(kv_lens):
        prefix = kv_len - q_len
        keys = _Keys(basis, torch.randperm(D_QK, generator=g), cache, table[b], page_size)
        for i in range(q_len):
            vis, hid = _candidates(i, q_len, prefix, trees[b])
            t = b * q_len + i
            vkind.append([])
            hkind.append([])
            for h in range(heads):
                (vk, v), (hk, w) = vis[(i + h) % len(vis)], hid[(i * 3 + h) % len(hid)]
                q[t, h] = a * keys.plant(v) + c * keys.plant(w)
                visible[t, h], hidden[t, h] = v, w
                vkind[-1].append(vk)
                hkind[-1].append(hk)
    tree_mask = torch.stack(trees) if tree else None
    batch = AttnBatch.build(
        q=q.to(dtype),
        kv_cache=cache.view(num_pages, page_size, D_QK).to(dtype),
        page_table=table,
        kv_lens=torch.tensor(kv_lens, dtype=torch.int32),
        q_indptr=torch.arange(0, q_len * (len(kv_lens) + 1), q_len, dtype=torch.int32),
        sm_scale=SM_SCALE,
        tree_mask=tree_mask,
        max_q_len=q_len,
        max_kv_len=max(kv_lens),
        total_kv_len=sum(kv_lens),
    )
    return Planted(batch.to(device), visible, hidden, vkind, hkind)


def expected_output(planted: Planted) -> torch.Tensor:
    """[T, H, 512] float64: each row's visible token's value (what a correct mask returns)."""
    batch = planted.batch
    flat = batch.kv_cache.reshape(-1, D_QK).double().cpu()
    ps, table = batch.meta.page_size, batch.meta.page_table.cpu()
    out = torch.zeros(batch.q.shape[0], batch.meta.num_heads, D_V, dtype=torch.float64)
    q_indptr = batch.meta.q_indptr.tolist()
    for b in range(batch.meta.batch_size):
        for t in range(q_indptr[b], q_indptr[b + 1]):
            tok = planted.visible[t]
            rows = token_slots(table[b], tok, ps)
            out[t] = flat[rows, :D_V]
    return out


def row_errors(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """[T, H] float64: max |out - ref| over a row's 512 dims / max |ref|; inf where not finite."""
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    err = (out64 - ref64).abs().amax(-1) / ref64.abs().amax(-1).clamp_min(1e-30)
    return torch.where(torch.isfinite(out64).all(-1), err, torch.full_like(err, math.inf))


def worst_row(planted: Planted, out: torch.Tensor, ref: torch.Tensor) -> dict:
    """The largest per-row error and which mask decision that row tests."""
    err = row_errors(out, ref)
    flat = int(err.argmax())
    t, h = divmod(flat, err.shape[1])
    return {
        "max_err": float(err.max()),
        "token": t,
        "head": h,
        "visible": planted.visible_kind[t][h],
        "hidden": planted.hidden_kind[t][h],
    }
