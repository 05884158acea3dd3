"""The `triton` backend: SGLang's Triton MLA attention, the baseline this study measures.

What SGLang's Triton backend runs on NVIDIA GPUs, re-implemented from its algorithm:

* Verify (q_len > 1, and decode when ``decode="extend"``): the *extend* kernel
  (``extend_attention_fwd``). Grid (batch, heads, cdiv(max_q_len, BLOCK_M)); each program loads
  BLOCK_M query rows of one head, walks the request's whole prefix serially in BLOCK_N steps through
  page_size=1 token slots (stage 1), then the draft part under the causal or tree mask (stage 2),
  with an online softmax. Lq = 576 is split into a 512 block and a 64 rope block; V is the first
  512 dims of the same latent row. Block sizes follow SGLang's per-architecture table
  (ARCH_CONFIGS).
* Decode (every q_len == 1, ``decode="grouped"``, the default): the grouped split-KV decode
  (``decode_attention_fwd_grouped``): stage 1 gives each (request, 16-head group, KV split) a
  program that reduces its slice of the KV into a partial output + log-sum-exp; stage 2 combines
  the splits.

Differences from SGLang, none of which changes the work done per token:

* Token slots. SGLang's ``init_forward_metadata`` flattens ``req_to_token`` into ``kv_indices`` with
  a ``kv_indptr``; here ``plan()`` builds the same token-slot list (in SGLang's dtype) from the page
  table into a padded [batch, max_kv_len] buffer (row b starts at ``b * stride``).
* Draft KV. SGLang passes the draft tokens' K/V as separate contiguous ``k_extend``/``v_extend``
  tensors; here they are the last q_len cache rows of each request (api.py), so stage 2 reads them
  through the same slot list at positions ``prefix + j``. No gather kernel is launched.
* Tree mask. SGLang's custom mask is [q_len, kv_len] per request with the prefix part skipped
  (``skip_prefix_custom_mask``); here it is the draft-only [max_q, max_q] block of ``tree_mask``,
  read by stage 2 exactly where SGLang reads its draft columns.
* KV splits. SGLang picks per-request split counts up to ``max_kv_splits``; at batch 1 and long
  contexts that is the maximum, which is what ``num_kv_splits`` fixes here. ``num_kv_splits=
  "sglang"`` computes SGLang's own count from the ``max_kv_len`` hint (peers.sglang_num_kv_splits
  under the MLA cap of peers.sglang_max_kv_splits: 256 on an H200), one count for the batch.

Without an NVIDIA GPU the kernels run under the Triton interpreter (TRITON_INTERPRET=1, set by
triton_interpret.py before Triton is imported). Triton 3.9's interpreter computes bf16 ``tl.dot``
wrongly, so under the interpreter the dot operands are upcast to fp32 after the same bf16 rounding;
compiled kernels keep bf16 tensor-core dots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from ..triton_interpret import triton_interpreted
from .api import D_QK, D_V, AttentionBackend, AttnBatch, AttnMeta, token_slots
from .peers import INDEX_DTYPES, SGLANG_KV_INDEX_DTYPE, SlotIndexed
from .registry import CHOICES
from .workspace import Workspaces

INTERPRETED = triton_interpreted()  # decided when the package was imported, before triton
if INTERPRETED and type(tl.zeros).__name__ != "InterpretedFunction":
    raise RuntimeError(
        "triton was imported before TRITON_INTERPRET=1 was set, so its builtins cannot run in the "
        "interpreter; set TRITON_INTERPRET=1 in the environment or import decodecliff first"
    )
D_NOPE, D_ROPE = 512, 64  # BLOCK_DMODEL, BLOCK_DPE for Lq = 576
DECODE_BLOCK_N = 32  # SGLang's grouped decode: BLOCK = 32, BLOCK_H = 16, MIN_BLOCK_KV = 32
DECODE_BLOCK_H = 16
MIN_BLOCK_KV = 32


@dataclass(frozen=True)
class ArchConfig:
    """Launch parameters of the extend kernel for Lq = 576 on one GPU architecture."""

    name: str
    block_m: int
    block_n: int
    num_warps: int = 8  # SGLang: 4 if Lq <= 64 else 8
    num_stages: int = 1  # SGLang launches the extend kernel with num_stages = 1 on NVIDIA


# SGLang's _get_block_sizes_for_extend_attention for Lq = 576 (> 256).
ARCH_CONFIGS = {
    "sm80": ArchConfig("sm80", 32, 64),
    "sm86": ArchConfig("sm86", 32, 32),  # sm86/sm89: ~100 KB shared memory
    "sm90": ArchConfig("sm90", 32, 64),
    "sm100": ArchConfig("sm100", 16, 64),
    "sm120": ArchConfig("sm120", 32, 32),  # ~100 KB shared memory
}


def resolve_arch_config(arch_config: str, device: torch.device | str | None = None) -> ArchConfig:
    """``auto`` picks the table entry of the device's architecture (sm90 without a GPU)."""
    if arch_config != "auto":
        if arch_config not in ARCH_CONFIGS:
            choices = ["auto", *ARCH_CONFIGS]
            raise ValueError(f"unknown arch_config {arch_config!r}; choose one of {choices}")
        return ARCH_CONFIGS[arch_config]
    dev = torch.device(device) if device is not None else None
    if not torch.cuda.is_available() or (dev is not None and dev.type != "cuda"):
        return ARCH_CONFIGS["sm90"]
    major, minor = torch.cuda.get_device_capability(dev)
    if major == 12:
        return ARCH_CONFIGS["sm120"]
    if major == 10:
        return ARCH_CONFIGS["sm100"]
    if major >= 9:
        return ARCH_CONFIGS["sm90"]
    if major == 8 and minor in (6, 9):
        return ARCH_CONFIGS["sm86"]
    return ARCH_CONFIGS["sm80"]


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr):
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b)


@triton.jit
def _extend_kernel(
    Q,
    KV,
    Out,
    kv_indices,
    kv_lens,
    q_indptr,
    tree_mask,
    sm_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kv,
    stride_idx_b,
    stride_mask_b,
    stride_mask_q,
    D_NOPE: tl.constexpr,
    D_ROPE: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_TREE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    block_m = tl.program_id(2)

    q_start = tl.load(q_indptr + b)
    q_len = tl.load(q_indptr + b + 1) - q_start
    kv_len = tl.load(kv_lens + b)
    prefix = kv_len - q_len
    slots = kv_indices + b.to(tl.int64) * stride_idx_b

    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < q_len
    offs_d = tl.arange(0, D_NOPE)
    offs_pe = D_NOPE + tl.arange(0, D_ROPE)
    offs_dv = tl.arange(0, D_V)
    offs_n = tl.arange(0, BLOCK_N)

    q_rows = (q_start + offs_m).to(tl.int64)[:, None] * stride_qt + head * stride_qh
    q = tl.load(Q + q_rows + offs_d[None, :], mask=mask_m[:, None], other=0.0)
    qpe = tl.load(Q + q_rows + offs_pe[None, :], mask=mask_m[:, None], other=0.0)

    acc = tl.zeros([BLOCK_M, D_V], dtype=tl.float32)
    deno = tl.zeros([BLOCK_M], dtype=tl.float32)
    e_max = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")

    # Stage 1: the prefix, fully visible, walked serially by this one program.
    for start_n in range(0, prefix, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < prefix
        loc = tl.load(slots + cols, mask=mask_n, other=0)
        k = tl.load(
            KV + loc[None, :] * stride_kv + offs_d[:, None], mask=mask_n[None, :], other=0.0
        )
        kpe = tl.load(
            KV + loc[None, :] * stride_kv + offs_pe[:, None], mask=mask_n[None, :], other=0.0
        )
        qk = _dot(q.to(k.dtype), k, UPCAST) + _dot(qpe.to(kpe.dtype), kpe, UPCAST)
        qk = tl.where(mask_m[:, None] & mask_n[None, :], qk * sm_scale, float("-inf"))
        row_max = tl.max(qk, 1)
        n_e_max = tl.maximum(tl.where(row_max == float("-inf"), -1e20, row_max), e_max)
        re_scale = tl.exp(e_max - n_e_max)
        p = tl.exp(qk - n_e_max[:, None])
        deno = deno * re_scale + tl.sum(p, 1)
        v = tl.load(
            KV + loc[:, None] * stride_kv + offs_dv[None, :], mask=mask_n[:, None], other=0.0
        )
        acc = acc * re_scale[:, None] + _dot(p.to(v.dtype), v, UPCAST)
        e_max = n_e_max

    # Stage 2: the draft tokens' own KV (the last q_len slots), causal or tree-masked.
    draft_end = q_len if USE_TREE else tl.minimum(q_len, (block_m + 1) * BLOCK_M)
    for start_n in range(0, draft_end, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < draft_end
        valid = mask_m[:, None] & mask_n[None, :]
        if USE_TREE:
            vis = tl.load(
                tree_mask
                + b.to(tl.int64) * stride_mask_b
                + offs_m[:, None] * stride_mask_q
                + cols[None, :],
                mask=valid,
                other=0,
            )
            valid = valid & (vis != 0)
        else:
            valid = valid & (offs_m[:, None] >= cols[None, :])
        loc = tl.load(slots + prefix + cols, mask=mask_n, other=0)
        k = tl.load(
            KV + loc[None, :] * stride_kv + offs_d[:, None], mask=mask_n[None, :], other=0.0
        )
        kpe = tl.load(
            KV + loc[None, :] * stride_kv + offs_pe[:, None], mask=mask_n[None, :], other=0.0
        )
        qk = _dot(q.to(k.dtype), k, UPCAST) + _dot(qpe.to(kpe.dtype), kpe, UPCAST)
        qk = tl.where(valid, qk * sm_scale, float("-inf"))
        row_max = tl.max(qk, 1)
        n_e_max = tl.maximum(tl.where(row_max == float("-inf"), -1e20, row_max), e_max)
        re_scale = tl.exp(e_max - n_e_max)
        p = tl.exp(qk - n_e_max[:, None])
        deno = deno * re_scale + tl.sum(p, 1)
        v = tl.load(
            KV + loc[:, None] * stride_kv + offs_dv[None, :], mask=mask_n[:, None], other=0.0
        )
        acc = acc * re_scale[:, None] + _dot(p.to(v.dtype), v, UPCAST)
        e_max = n_e_max

    o_rows = (q_start + offs_m).to(tl.int64)[:, None] * stride_ot + head * stride_oh
    tl.store(Out + o_rows + offs_dv[None, :], acc / deno[:, None], mask=mask_m[:, None])


@triton.jit
def _decode_stage1(
    Q,
    KV,
    kv_indices,
    kv_lens,
    Att_Out,
    Att_Lse,
    sm_scale,
    num_kv_splits,
    num_heads,
    stride_qt,
    stride_qh,
    stride_kv,
    stride_idx_b,
    stride_mid_b,
    stride_mid_h,
    stride_mid_s,
    stride_lse_b,
    stride_lse_h,
    D_NOPE: tl.constexpr,
    D_ROPE: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    MIN_BLOCK_KV: tl.constexpr,
    UPCAST: tl.constexpr,
):
    b = tl.program_id(0)
    head_block = tl.program_id(1)
    split = tl.program_id(2)

    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = heads < num_heads
    offs_d = tl.arange(0, D_NOPE)
    offs_pe = D_NOPE + tl.arange(0, D_ROPE)
    offs_dv = tl.arange(0, D_V)
    slots = kv_indices + b.to(tl.int64) * stride_idx_b

    kv_len = tl.load(kv_lens + b)
    per_split = tl.cdiv(tl.cdiv(kv_len, num_kv_splits), MIN_BLOCK_KV) * MIN_BLOCK_KV
    split_start = per_split * split
    split_end = tl.minimum(split_start + per_split, kv_len)

    e_max = tl.zeros([BLOCK_H], dtype=tl.float32) - float("inf")
    e_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D_V], dtype=tl.float32)

    if split_end > split_start:
        q_rows = b.to(tl.int64) * stride_qt + heads[:, None] * stride_qh
        q = tl.load(Q + q_rows + offs_d[None, :], mask=mask_h[:, None], other=0.0)
        qpe = tl.load(Q + q_rows + offs_pe[None, :], mask=mask_h[:, None], other=0.0)
        for start_n in range(split_start, split_end, BLOCK_N):
            cols = start_n + tl.arange(0, BLOCK_N)
            mask_n = cols < split_end
            loc = tl.load(slots + cols, mask=mask_n, other=0)
            k = tl.load(
                KV + loc[None, :] * stride_kv + offs_d[:, None], mask=mask_n[None, :], other=0.0
            )
            kpe = tl.load(
                KV + loc[None, :] * stride_kv + offs_pe[:, None], mask=mask_n[None, :], other=0.0
            )
            qk = _dot(q, k.to(q.dtype), UPCAST) + _dot(qpe, kpe.to(qpe.dtype), UPCAST)
            qk = tl.where(mask_h[:, None] & mask_n[None, :], qk * sm_scale, float("-inf"))
            tl.static_assert(D_V == D_NOPE)
            v = tl.trans(k)  # MLA: V is K's first D_V columns, reused as SGLang's HAS_MLA does
            n_e_max = tl.maximum(tl.max(qk, 1), e_max)
            re_scale = tl.exp(e_max - n_e_max)
            p = tl.exp(qk - n_e_max[:, None])
            acc = acc * re_scale[:, None] + _dot(p.to(v.dtype), v, UPCAST)
            e_sum = e_sum * re_scale + tl.sum(p, 1)
            e_max = n_e_max

        mid = b.to(tl.int64) * stride_mid_b + heads[:, None] * stride_mid_h + split * stride_mid_s
        tl.store(Att_Out + mid + offs_dv[None, :], acc / e_sum[:, None], mask=mask_h[:, None])
        lse = b.to(tl.int64) * stride_lse_b + heads * stride_lse_h + split
        tl.store(Att_Lse + lse, e_max + tl.log(e_sum), mask=mask_h)


@triton.jit
def _decode_stage2(
    Att_Out,
    Att_Lse,
    Out,
    kv_lens,
    num_kv_splits,
    stride_mid_b,
    stride_mid_h,
    stride_mid_s,
    stride_lse_b,
    stride_lse_h,
    stride_ot,
    stride_oh,
    MAX_KV_SPLITS: tl.constexpr,
    MIN_BLOCK_KV: tl.constexpr,
    D_V: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    kv_len = tl.load(kv_lens + b)
    offs_dv = tl.arange(0, D_V)
    per_split = tl.cdiv(tl.cdiv(kv_len, num_kv_splits), MIN_BLOCK_KV) * MIN_BLOCK_KV
    mid = b.to(tl.int64) * stride_mid_b + head * stride_mid_h
    lse = b.to(tl.int64) * stride_lse_b + head * stride_lse_h

    e_sum = 0.0
    e_max = -float("inf")
    acc = tl.zeros([D_V], dtype=tl.float32)
    for split in range(0, MAX_KV_SPLITS):
        split_start = per_split * split
        split_end = tl.minimum(split_start + per_split, kv_len)
        if split_end > split_start:
            part = tl.load(Att_Out + mid + split * stride_mid_s + offs_dv)
            part_lse = tl.load(Att_Lse + lse + split)
            n_e_max = tl.maximum(part_lse, e_max)
            old_scale = tl.exp(e_max - n_e_max)
            weight = tl.exp(part_lse - n_e_max)
            acc = acc * old_scale + weight * part
            e_sum = e_sum * old_scale + weight
            e_max = n_e_max
    tl.store(Out + b.to(tl.int64) * stride_ot + head * stride_oh + offs_dv, acc / e_sum)


def _check(batch: AttnBatch, out: torch.Tensor) -> None:
    """What the kernels rely on in one call's tensors; raises ValueError otherwise."""
    # The grids take the heads from the plan and the output is written through its first two
    # strides with a unit last one: other shapes or layouts would be misaddressed, not refused.
    t, h = batch.meta.num_tokens, batch.meta.num_heads
    if tuple(batch.q.shape) != (t, h, D_QK):
        raise ValueError(f"q must be [T={t}, H={h}, {D_QK}], got {list(batch.q.shape)}")
    if tuple(out.shape) != (t, h, D_V) or out.stride(2) != 1:
        raise ValueError(
            f"out must be [T={t}, H={h}, {D_V}] with unit last stride, got {list(out.shape)} "
            f"strides {list(out.stride())}"
        )
    if out.device != batch.q.device:
        raise ValueError("q and out must be on the same device")
    if batch.kv_cache.dim() != 3 or batch.kv_cache.shape[2] != D_QK:
        raise ValueError(f"kv_cache must be [pages, page_size, {D_QK}]")
    if not batch.kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous (rows are addressed as slot * 576)")
    if batch.q.stride(2) != 1:
        raise ValueError("q must be contiguous in its last dimension")
    if batch.q.dtype != batch.kv_cache.dtype:
        raise ValueError(f"q is {batch.q.dtype} but kv_cache is {batch.kv_cache.dtype}")
    if batch.q.device != batch.kv_cache.device:
        raise ValueError("q and kv_cache must be on the same device")
    if batch.q.is_cuda == INTERPRETED:
        where = "a CUDA device" if INTERPRETED else "the CPU"
        raise ValueError(
            f"the triton backend was loaded for {where}; tensors are on {batch.q.device}"
        )


def _meta_problem(meta: AttnMeta) -> str | None:
    pt = meta.page_table
    if pt.dtype != torch.int32 or pt.dim() != 2 or pt.shape[0] < meta.batch_size:
        return "page_table must be int32 [>= B, max_pages]"
    if meta.page_table.device != meta.device:
        return "page_table and kv_lens must be on the same device"
    if not (meta.kv_lens.is_contiguous() and meta.q_indptr.is_contiguous()):
        return "kv_lens and q_indptr must be contiguous (the kernels read them as flat arrays)"
    if meta.q_indptr.dim() != 1 or meta.q_indptr.shape[0] < meta.batch_size + 1:
        # the extend kernel reads q_indptr[b + 1] for every request b of kv_lens
        got = list(meta.q_indptr.shape)
        return f"q_indptr must be [B + 1] = [{meta.batch_size + 1}], got {got}"
    tm, max_q = meta.tree_mask, meta.max_q_len
    if tm is not None and (
        tm.dim() != 3
        or tm.stride(2) != 1
        or tm.shape[0] < meta.batch_size
        or (max_q is not None and min(tm.shape[1], tm.shape[2]) < max_q)
    ):
        return "tree_mask must be [>= B, >= max_q_len, >= max_q_len] with unit last stride"
    if meta.device.type == "cuda" and INTERPRETED:
        return "the triton backend was loaded for the CPU; tensors are on a CUDA device"
    if meta.device.type != "cuda" and not INTERPRETED:
        return "compiled Triton kernels need a CUDA GPU (TRITON_INTERPRET=1 runs them on the CPU)"
    return None


class TritonAttention(SlotIndexed, AttentionBackend):
    """SGLang's Triton MLA attention: extend kernel for verify, grouped split-KV decode for L = 1.

    ``arch_config`` picks the extend kernel's block sizes ("auto" = this GPU's entry of SGLang's
    table); ``decode`` is "grouped" (SGLang's decode path) or "extend" (decode through the extend
    kernel, as a verify of one token); ``num_kv_splits`` is the grouped decode's split count, or
    "sglang" for the count SGLang's Triton backend picks (``describe()`` names the count planned).
    ``index_dtype``: the token slots' dtype, by default what the pinned SGLang's Triton backend
    passes as ``kv_indices`` (peers.SGLANG_KV_INDEX_DTYPE); the kernel bench times both dtypes, as
    the extend kernel's speed depends on it; int32 slots reach api.INT32_SLOT_ROWS cache rows, and
    a plan told of more refuses them. Workspaces grow to the largest batch seen and are reused,
    never reallocated per call.
    """

    name = "triton"
    capturable = True

    def __init__(
        self,
        arch_config: str = "auto",
        decode: str = "grouped",
        num_kv_splits: int | str = 8,
        index_dtype: str = SGLANG_KV_INDEX_DTYPE,
    ):
        if decode not in CHOICES["triton"]["decode"]:
            raise ValueError(f"decode must be 'grouped' or 'extend', got {decode!r}")
        if num_kv_splits != "sglang" and not (
            isinstance(num_kv_splits, int) and num_kv_splits >= 1
        ):
            raise ValueError(f"num_kv_splits must be >= 1 or 'sglang', got {num_kv_splits!r}")
        if index_dtype not in CHOICES["triton"]["index_dtype"]:
            raise ValueError(f"index_dtype must be in {list(INDEX_DTYPES)}, got {index_dtype!r}")
        self.index_dtype = index_dtype
        self.resolved_splits: int | None = None
        self.arch_config = arch_config
        self.decode = decode
        self.num_kv_splits = num_kv_splits
        self._config: ArchConfig | None = None
        self._ws = Workspaces()
        self._launch: Callable[..., None] | None = None

    def config(self, device: torch.device | str | None = None) -> ArchConfig:
        if self._config is None:
            self._config = resolve_arch_config(self.arch_config, device)
        return self._config

    def token_slots(self, meta: AttnMeta) -> torch.Tensor:
        """[B, max_kv_len] token slots (page * page_size + offset): SGLang's kv_indices."""
        b, ps, dev = meta.batch_size, meta.page_size, meta.device
        max_kv = meta.max_kv_len or int(meta.kv_lens.max())
        slots = self._ws.get("indices", (b, max(max_kv, 1)), INDEX_DTYPES[self.index_dtype], dev)
        tok = torch.arange(slots.shape[1], device=dev)
        return token_slots(meta.page_table[:b], tok, ps, out=slots, clamp=True)

    def unsupported(self, meta: AttnMeta) -> str | None:
        if why := self.reach_problem(meta.kv_rows):
            return why
        return _meta_problem(meta)

    def validate(self, batch: AttnBatch, out: torch.Tensor) -> None:
        _check(batch, out)

    def describe(self) -> dict:
        return {"backend": self.name, "arch_config": self._config.name if self._config else None,
                "decode": self.decode, "num_kv_splits": self.resolved_splits,
                "index_dtype": self.index_dtype}  # fmt: skip

    def plan(self, meta: AttnMeta) -> None:
        """Once per step: the token-slot list (SGLang's init_forward_metadata) and the launcher."""
        self.check(meta)
        if not (meta.kv_lens.is_cuda or meta.q_indptr.is_cuda):  # on the host: read at no sync
            self.check_lengths(meta.q_lens(), meta.kv_lens.tolist())
        if meta.batch_size == 0 or meta.num_tokens * meta.num_heads == 0:
            self._launch = lambda q, kv, out: None  # an empty step: nothing to read or write
            return
        max_q = meta.max_q_len or int((meta.q_indptr[1:] - meta.q_indptr[:-1]).max())
        if meta.max_q_len is None:  # the tree mask must hold the longest draft read here too
            self.check(replace(meta, max_q_len=max_q))
        slots = self.token_slots(meta)
        if max_q == 1 and meta.num_tokens == meta.batch_size and self.decode == "grouped":
            launch = self._plan_decode(meta, slots)
        else:
            launch = self._plan_extend(meta, slots, max_q)
        self._launch = launch

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """One layer: launch the planned kernels on this layer's queries and cache."""
        if self._launch is None:
            raise RuntimeError("triton attention: run() before plan()")
        if INTERPRETED:
            import numpy as np

            # Rows masked out (padding heads or queries) hold NaN that is never stored.
            with np.errstate(invalid="ignore", divide="ignore"):
                self._launch(q, kv_cache.view(-1, D_QK), out)
        else:
            self._launch(q, kv_cache.view(-1, D_QK), out)
        return out

    def _plan_extend(self, meta: AttnMeta, slots: torch.Tensor, max_q: int) -> Callable[..., None]:
        cfg = self.config(meta.device)
        tree = meta.tree_mask
        if tree is not None:
            tree = tree.view(torch.uint8) if tree.dtype == torch.bool else tree
        mask_arg = tree if tree is not None else slots  # an unused pointer when there is no tree
        mask_strides = (tree.stride(0), tree.stride(1)) if tree is not None else (0, 0)
        grid = (meta.batch_size, meta.num_heads, triton.cdiv(max_q, cfg.block_m))
        kv_lens, q_indptr, sm_scale = meta.kv_lens, meta.q_indptr, meta.sm_scale

        def launch(q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor) -> None:
            _extend_kernel[grid](
                q, kv, out, slots, kv_lens, q_indptr, mask_arg, sm_scale,
                q.stride(0), q.stride(1), out.stride(0), out.stride(1), kv.stride(0),
                slots.stride(0), *mask_strides,
                D_NOPE=D_NOPE, D_ROPE=D_ROPE, D_V=D_V, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                USE_TREE=tree is not None, UPCAST=INTERPRETED,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )  # fmt: skip

        return launch

    def decode_splits(self, meta: AttnMeta) -> int:
        """The grouped decode's split count for this step (host-side: hints only)."""
        if self.num_kv_splits != "sglang":
            return self.num_kv_splits
        from .peers import sglang_max_kv_splits, sglang_num_kv_splits

        sms = 0
        if meta.device.type == "cuda":
            sms = torch.cuda.get_device_properties(meta.device).multi_processor_count
        longest = meta.max_kv_len or int(meta.kv_lens.max())
        lens = [max(longest, 1)] * meta.batch_size
        return sglang_num_kv_splits(lens, meta.num_heads, sms, sglang_max_kv_splits(sms))[0]

    def _plan_decode(self, meta: AttnMeta, slots: torch.Tensor) -> Callable[..., None]:
        b, h, s = meta.batch_size, meta.num_heads, self.decode_splits(meta)
        self.resolved_splits = s
        logits = self._ws.get("logits", (b, h, s, D_V), torch.float32, meta.device)
        lse = self._ws.get("lse", (b, h, s), torch.float32, meta.device)
        grid1 = (b, triton.cdiv(h, DECODE_BLOCK_H), s)
        mid_strides = (logits.stride(0), logits.stride(1), logits.stride(2))
        lse_strides = (lse.stride(0), lse.stride(1))
        kv_lens, sm_scale = meta.kv_lens, meta.sm_scale

        def launch(q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor) -> None:
            _decode_stage1[grid1](
                q, kv, slots, kv_lens, logits, lse, sm_scale, s, h,
                q.stride(0), q.stride(1), kv.stride(0), slots.stride(0), *mid_strides, *lse_strides,
                D_NOPE=D_NOPE, D_ROPE=D_ROPE, D_V=D_V, BLOCK_N=DECODE_BLOCK_N,
                BLOCK_H=DECODE_BLOCK_H, MIN_BLOCK_KV=MIN_BLOCK_KV, UPCAST=INTERPRETED,
                num_warps=4, num_stages=2,
            )  # fmt: skip
            _decode_stage2[(b, h)](
                logits, lse, out, kv_lens, s, *mid_strides, *lse_strides,
                out.stride(0), out.stride(1),
                MAX_KV_SPLITS=s, MIN_BLOCK_KV=MIN_BLOCK_KV, D_V=D_V, num_warps=4, num_stages=2,
            )  # fmt: skip

        return launch
