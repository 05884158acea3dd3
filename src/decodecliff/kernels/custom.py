"""The `custom` backend: the CUDA MLA verify/decode kernel (csrc/mla_verify.cu) through ctypes.

The library is the one named by the caller or $DECODECLIFF_KERNEL_LIB, else the first build found
under the working directory, its parents or this package's checkout (``library_candidates``): the
pipeline's results/build/, then build/kernels/ of `decodecliff build-kernel`. A call launches the
split-KV attention kernel and its combine kernel on the current stream: no host sync and no
allocation once the workspace is large enough, so a step can be captured in a CUDA graph (fix
``num_splits`` at construction, reserve the workspace).

Five kernel variants share the source (``variant``): "v1" streams 32-token tiles through a 2-stage
ring; "v2" streams 16-token tiles through a 4-stage ring with the page-table entries loaded one
iteration ahead; "v3" is v1's tiling with v2's prefetch, held to 128 registers on sm_90 so two
CTAs share an SM; "v4" is v3 rescaling O only when a row's running max moves past a slack; "v5"
runs 64 query rows per CTA (each KV tile read once for them). "auto" (the default) takes what
was measured fastest (notes/kernel.md; ``takes_v5``, then ``AUTO_VARIANTS``).
"""

from __future__ import annotations

import ctypes
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

from . import abi
from .api import D_QK, D_V, AttentionBackend, AttnBatch, AttnMeta
from .build import DEFAULT_OUT, LIB_NAME
from .registry import CHOICES

LIB_ENV = "DECODECLIFF_KERNEL_LIB"
# Where a build leaves the library, under a project root: the pipeline's build_kernel rule
# (KERNEL_LIB in workflow/rules/common.smk), then `decodecliff build-kernel`'s default --out.
BUILD_DIRS = (Path("results/build"), DEFAULT_OUT)
CHECKOUT = Path(__file__).resolve().parents[3]  # the repository root of a source checkout
MIN_TOKENS_PER_SPLIT = 256  # at long contexts shorter splits cost more in partials + combine
# Short contexts (notes/kernel.md, "Short contexts: the split floor, measured"): where a wave of
# resident CTAs would split the KV below SHORT_SPLIT_BELOW tokens, the time is the CTAs' fixed
# cost, not the KV: one CTA an SM, each split down to MIN_TOKENS_PER_SHORT_SPLIT, was fastest at
# 1k-16k (decode at 1k: 32 splits of 32 tokens took half the time of 4 of 256).
SHORT_SPLIT_BELOW = 128
MIN_TOKENS_PER_SHORT_SPLIT = 32
# A batch is ragged where its tokens are under RAGGED_BELOW of batch x the max_kv_len hint: there
# the plan of equal lengths would idle more than an eighth of its CTAs. A ragged batch shares its
# tokens among one wave's split slots, one slot a request less (its partial last split), where the
# wave holds 8 slots a request (at most an eighth idle). Where it holds fewer, each request is
# split evenly in up to 8, in at most RAGGED_EVEN_WAVES waves, and the longest's splits kept long:
# 64 heads of chain16, 8 v5 CTAs a wave, over four requests had left half the wave idle, and 4
# even splits a request (two waves) were the fastest of 2-16 at 4k-16k in both builds, ahead of 8
# (four waves) by 15% and 6%, and within 3% of 8, in either order, at 64k-185k (notes/kernel.md,
# "Two waves of even splits"). Where the wave holds under 16 slots a request and the shared
# splits would be long (RAGGED_LONG_SPLIT tokens), each request is split evenly in up to 16 in two
# waves too: chain16 at 16 heads over four requests and at 8 heads over eight (8.25 slots a
# request) took 6-9% less at 64k-185k (5,085+ tokens a shared split) and 1-2% more at 16k (1,272
# and 1,413), and 16 even splits at 1k took up to 71% more, so shorter splits stay shared
# (notes/kernel.md, "Sixteen slots a request where the splits are long").
RAGGED_BELOW = 7 / 8
RAGGED_SLOTS_PER_REQUEST = 8
RAGGED_LONG_SLOTS_PER_REQUEST = 16
RAGGED_LONG_SPLIT = 4096  # between the 1,413 tokens where even splits lost and the 5,085 they won
RAGGED_EVEN_WAVES = 2
# name -> the kernel's template parameter. v5 runs 64-row CTAs (V5_ROWS): it is planned in those.
VARIANTS = {"v1": 1, "v2": 2, "v3": 3, "v4": 4, "v5": 5}
# "auto" (notes/kernel.md, "v5 merged", "v5 with the refill among the MMAs" and "auto's v5
# threshold"): v5 for requests of 64+ query rows whose splits are long (>= MIN_TOKENS_PER_V5_SPLIT;
# in the H200 study's bench at 7fe4732 v5 was behind by 20-47% at 256 tokens per split at 1k-16k,
# ahead once, 64-head decode at 32k, and ahead by up to 15% from 496), on either GPU: since its
# ring refill moved between the MMAs it beats two v4 CTAs per SM too (H100, 185k: chain16 8 and
# 64 heads, tree64, decode at 64 heads). Below that, where two v4 CTAs fit an SM (sm_90's
# 228 KB): v4 where its plan puts more than one CTA on an SM (it wins by overlapping two CTAs),
# else v1 (sm_90's v4 is cut to 128 registers for two CTAs; a lone one was slower than v1 at
# every such shape of that bench but decode at 8 heads on page 1, where it was 8-13% faster);
# where one CTA fits (sm_120's 100 KB, and its model on the H200) v4, which beat v1 at every
# point of the sm_120 model.
AUTO_VARIANTS = ("v4", "v1")
MIN_TOKENS_PER_V5_SPLIT = 384  # between the 256 where v5 lost and the 496 where it won
V5_ROWS = 64  # query rows of one v5 CTA
DEFAULT_VARIANT = "auto"

_LIBS: dict[str, ctypes.CDLL] = {}


def library_candidates(path: str | os.PathLike | None = None) -> list[Path]:
    """Where to look, in order: the argument, else $DECODECLIFF_KERNEL_LIB, else each BUILD_DIRS
    entry under the working directory, each of its parents, then this package's checkout."""
    explicit = path or os.environ.get(LIB_ENV)
    if explicit:
        return [Path(explicit)]
    cwd = Path.cwd()
    roots = dict.fromkeys([cwd, *cwd.parents, CHECKOUT])
    return [root / folder / LIB_NAME for root in roots for folder in BUILD_DIRS]


def library_path(path: str | os.PathLike | None = None) -> Path:
    """The library to load: the first of ``library_candidates`` that exists."""
    candidates = library_candidates(path)
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise FileNotFoundError(
        f"custom kernel library not found at {', '.join(map(str, candidates))}: build it with "
        f"`decodecliff build-kernel` (writes {DEFAULT_OUT / LIB_NAME}) or set ${LIB_ENV}"
    )


def load_library(path: str | os.PathLike | None = None) -> ctypes.CDLL:
    resolved = str(library_path(path))
    if resolved not in _LIBS:
        _LIBS[resolved] = abi.bind(ctypes.CDLL(resolved))
    return _LIBS[resolved]


@dataclass(frozen=True)
class LaunchPlan:
    mtiles: int  # m16 tiles per row tile: 1 (<= 16 rows per request) or 2
    row_tiles: int  # row tiles (CTAs) per request and split
    num_splits: int  # KV splits per request
    max_q_len: int
    variant: int = 1  # the kernel's template parameter (see VARIANTS)
    split_tokens: int = 0  # > 0: tokens per split over a ragged batch (0: kv_len / num_splits)
    busy_splits: int | None = None  # splits with work over the batch (ragged: fewer than B x S)
    longest_split: float = 0.0  # tokens of the longest split, by the hints

    def ctas(self, batch_size: int) -> int:
        """CTAs with work (a ragged plan's empty splits exit at once)."""
        return self.row_tiles * (self.busy_splits or batch_size * self.num_splits)


def m_tiles(rows: int) -> int:
    """m16 tiles per row tile: 1 where a request's rows fit one (<= 16 rows), else 2."""
    return 1 if rows <= 16 else 2


def plan_launch(
    heads: int,
    max_q_len: int,
    max_kv_len: int,
    batch_size: int,
    ctas_per_wave: int,
    max_splits: int,
    num_splits: int | None = None,
    total_kv_len: int | None = None,
    cta_rows: int = 0,
    sms: int = 0,
) -> LaunchPlan:
    """Pick the row-tile variant and the number of KV splits (host-side, from hints only).

    Splits fill one wave of CTAs: (row tiles x batch x splits) ~ SMs x resident CTAs per SM, but no
    split gets fewer than MIN_TOKENS_PER_SPLIT tokens of the ``max_kv_len`` hint. Where that wave
    would give splits under SHORT_SPLIT_BELOW tokens (a short context), the splits fill ``sms``
    CTAs instead, one an SM, down to MIN_TOKENS_PER_SHORT_SPLIT tokens each. A row tile is
    16 x mtiles rows, or ``cta_rows`` where a CTA holds more (v5: 64); ``ctas_per_wave`` counts
    CTAs of that size. A ragged batch (``total_kv_len`` under RAGGED_BELOW of batch x
    ``max_kv_len``) is split by tokens instead (``_ragged_splits``). An empty batch plans one split.
    A planned split count is never over ``max_splits``; a fixed ``num_splits`` over it is refused.
    """
    rows = max_q_len * heads
    mtiles = m_tiles(rows)
    row_tiles = max(1, math.ceil(rows / max(16 * mtiles, cta_rows)))
    # the longest request: a loose hint is bounded by the batch's tokens less a token for each
    # other request (each holds its step's queries), never under one
    bound = total_kv_len - batch_size + 1 if total_kv_len else max_kv_len
    longest = max(1, min(max_kv_len, bound))
    ragged = bool(total_kv_len) and total_kv_len < RAGGED_BELOW * batch_size * max_kv_len
    split_tokens, busy = 0, None
    if num_splits is None and (rows == 0 or batch_size == 0):
        num_splits = 1  # nothing to launch: run() returns at once
    elif num_splits is None and ragged:
        floor = MIN_TOKENS_PER_V5_SPLIT if cta_rows else MIN_TOKENS_PER_SPLIT
        num_splits, split_tokens, busy = _ragged_splits(
            longest, total_kv_len, batch_size, max(1, ctas_per_wave // row_tiles),
            sms // row_tiles, max_splits, floor,
        )  # fmt: skip
    elif num_splits is None:
        num_splits = _even_splits(max_kv_len, ctas_per_wave // (row_tiles * batch_size),
                                  sms // (row_tiles * batch_size), max_splits)  # fmt: skip
    if not 1 <= num_splits <= max_splits:
        raise ValueError(f"num_splits must be in 1..{max_splits}, got {num_splits}")
    longest_split = max(split_tokens, longest / num_splits)
    return LaunchPlan(mtiles, row_tiles, num_splits, max_q_len, split_tokens=split_tokens,
                      busy_splits=busy, longest_split=longest_split)  # fmt: skip


def _ragged_splits(
    longest: int, total_kv_len: int, batch_size: int, ctas: int, sm_ctas: int, max_splits: int,
    even_floor: int,
) -> tuple[int, int, int | None]:  # fmt: skip
    """Splits a request, tokens a split (0: even splits) and splits with work of a ragged batch.

    One wave's ``ctas`` (of its row tiles) share the batch's tokens equally, so its longest request
    takes the most splits and no CTA waits on a longer one (the kernel still covers any request
    longer than the hints). Each request's last split is partial, so the tokens are shared by batch
    fewer CTAs than the wave holds: the splits of any lengths that sum to ``total_kv_len`` then fit
    one wave (their count is at most total / split + batch). That idles at most an eighth of the
    wave while it holds RAGGED_SLOTS_PER_REQUEST slots a request; where it holds fewer (many row
    tiles or requests), or fewer than RAGGED_LONG_SLOTS_PER_REQUEST over shared splits of
    RAGGED_LONG_SPLIT tokens or more, each request is split evenly instead (``_even_ragged``).
    """
    even = partial(_even_ragged, longest, batch_size, ctas, max_splits, even_floor)
    if ctas < RAGGED_SLOTS_PER_REQUEST * batch_size:  # too few slots: each request split evenly
        return even(RAGGED_SLOTS_PER_REQUEST)
    split_tokens = _ragged_split_tokens(total_kv_len, batch_size, ctas, sm_ctas)
    if ctas < RAGGED_LONG_SLOTS_PER_REQUEST * batch_size and split_tokens >= RAGGED_LONG_SPLIT:
        return even(RAGGED_LONG_SLOTS_PER_REQUEST)
    # at most one wave per request: a max_kv_len hint far above the lengths (an upper bound) must
    # not multiply the grid; the kernel lengthens the splits to cover the rest
    num_splits = min(max_splits, ctas, math.ceil(longest / split_tokens))
    busy = min(batch_size * num_splits, math.ceil(total_kv_len / split_tokens) + batch_size)
    return num_splits, split_tokens, busy


def _even_ragged(
    longest: int, batch_size: int, ctas: int, max_splits: int, even_floor: int, most: int
) -> tuple[int, int, None]:
    """Each request of a ragged batch split evenly in up to ``most``, fewer where that would take
    over RAGGED_EVEN_WAVES waves (one a request where the batch alone takes more) or cut the
    longest request's splits below ``even_floor`` tokens; the CTAs of unequal lengths balance
    across the SMs as they finish."""
    waves_cap = RAGGED_EVEN_WAVES * ctas // batch_size
    return max(1, min(most, waves_cap, max_splits, longest // even_floor)), 0, None


def _even_splits(max_kv_len: int, wave_splits: int, sm_splits: int, max_splits: int) -> int:
    """Splits per request of a batch of equal lengths: ``wave_splits`` fill a wave, ``sm_splits``
    one CTA an SM (0: unknown); the short-context rule of ``plan_launch``. Never over
    ``max_splits`` (the combine kernel merges at most that many partials a row): where a wave holds
    more CTAs a request, as over 1,024 CTAs of one row tile and request, the splits are longer."""
    if sm_splits and max_kv_len < SHORT_SPLIT_BELOW * max(wave_splits, 1):
        splits = min(sm_splits, math.ceil(max_kv_len / MIN_TOKENS_PER_SHORT_SPLIT))
    else:
        splits = min(wave_splits, math.ceil(max_kv_len / MIN_TOKENS_PER_SPLIT))
    return max(1, min(max_splits, splits))


def _ragged_split_tokens(total_kv_len: int, batch_size: int, ctas: int, sm_ctas: int) -> int:
    """Tokens per split of a ragged batch: its tokens shared by ``ctas`` less one partial split a
    request (see ``plan_launch``), or by one CTA an SM (``sm_ctas``) where those splits would be
    short (the short-context rule of ``_even_splits``) and the SMs hold 8 slots a request too."""
    tokens = math.ceil(total_kv_len / (ctas - batch_size))
    if sm_ctas >= RAGGED_SLOTS_PER_REQUEST * batch_size and tokens < SHORT_SPLIT_BELOW:
        return max(MIN_TOKENS_PER_SHORT_SPLIT, math.ceil(total_kv_len / (sm_ctas - batch_size)))
    return max(MIN_TOKENS_PER_SPLIT, tokens)


def auto_variant(plan: LaunchPlan, batch_size: int, sms: int) -> str:
    """The "auto" choice given the two-CTA plan: v4 only where its CTAs with work (a ragged plan's
    empty splits exit at once) put two on some SM."""
    return AUTO_VARIANTS[0] if plan.ctas(batch_size) > sms else AUTO_VARIANTS[1]


def auto_plan(
    plan_for: Callable[[str], LaunchPlan], rows: int, batch_size: int, sms: int, two_a_sm: bool
) -> LaunchPlan:
    """The "auto" plan from each variant's own (``plan_for``): v5 where ``takes_v5``; else v4,
    or v1 where ``auto_variant`` says so (only where two v4 CTAs fit an SM) and v1's own plan,
    on its wave of one CTA an SM, keeps its CTAs with work within the SMs too."""
    v5 = plan_for("v5")
    if takes_v5(rows, v5):
        return v5
    plan = plan_for(AUTO_VARIANTS[0])
    if not two_a_sm or auto_variant(plan, batch_size, sms) == AUTO_VARIANTS[0]:
        return plan
    alone = plan_for(AUTO_VARIANTS[1])
    return alone if alone.ctas(batch_size) <= sms else plan


def sm_count(device: torch.device | int) -> int:
    """The device's streaming multiprocessors."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def takes_v5(rows: int, v5_plan: LaunchPlan) -> bool:
    """The "auto" choice on either GPU: v5 for 64+ rows over long splits."""
    return rows >= V5_ROWS and v5_plan.longest_split >= MIN_TOKENS_PER_V5_SPLIT


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"custom attention: {message}")


def validate(batch: AttnBatch, out: torch.Tensor) -> None:
    """Shapes, dtypes, layouts and devices the kernel relies on; raises ValueError otherwise."""
    q, kv = batch.q, batch.kv_cache
    _check(q.is_cuda, "tensors must be on a CUDA device")
    meta = batch.meta
    validate_meta(meta)
    check_tensors(meta, q, kv, out)
    tensors = [kv, meta.page_table, meta.kv_lens, meta.q_indptr, out]
    if meta.tree_mask is not None:
        tensors.append(meta.tree_mask)
    _check(all(t.device == q.device for t in tensors), "all tensors must be on q's device")


def check_tensors(meta: AttnMeta, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor) -> None:
    """One call's q, cache and output: contiguous bf16 of the plan's shapes. The kernel takes
    their strides from the plan, so a q of other heads or a cache of another page size would be
    misread, not refused."""
    _check(
        q.dtype == kv.dtype == out.dtype == torch.bfloat16,
        "q, kv_cache and out must be bf16",
    )
    _check(
        q.is_contiguous() and kv.is_contiguous() and out.is_contiguous(),
        "q, kv_cache and out must be contiguous",
    )
    t, h = meta.num_tokens, meta.num_heads
    _check(tuple(q.shape) == (t, h, D_QK), f"q must be [T={t}, H={h}, {D_QK}], got {list(q.shape)}")
    _check(
        kv.dim() == 3 and tuple(kv.shape[1:]) == (meta.page_size, D_QK),
        f"kv_cache must be [pages, page_size={meta.page_size}, {D_QK}], got {list(kv.shape)}",
    )
    _check(
        tuple(out.shape) == (t, h, D_V), f"out must be [T={t}, H={h}, {D_V}], got {list(out.shape)}"
    )


def call_key(q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor) -> tuple:
    """What ``check_tensors`` and the launch arguments read of one call's tensors: ``run`` reuses
    the last call's arguments, unchecked, for a call of its key."""
    return (q.data_ptr(), kv.data_ptr(), out.data_ptr(), q.shape, kv.shape, out.shape,
            q.stride(), kv.stride(), out.stride(), q.dtype, kv.dtype, out.dtype)  # fmt: skip


def validate_meta(meta: AttnMeta) -> None:
    """The metadata checks, of a planned step and of each call (``validate``: the tensors' own)."""
    pt, b = meta.page_table, meta.batch_size
    _check(meta.device.type == "cuda", "tensors must be on a CUDA device")
    _check(
        pt.dtype == torch.int32 and pt.dim() == 2 and pt.stride(1) == 1 and pt.shape[0] >= b,
        "page_table must be int32 [>= B, max_pages] with unit column stride",
    )
    _check(meta.kv_lens.dtype == torch.int32 and meta.kv_lens.dim() == 1, "kv_lens: int32 [B]")
    _check(
        meta.q_indptr.dtype == torch.int32 and meta.q_indptr.shape == (b + 1,),
        "q_indptr: int32 [B + 1]",
    )
    # the kernel reads both through their data pointers, as flat arrays
    _check(
        meta.kv_lens.is_contiguous() and meta.q_indptr.is_contiguous(),
        "kv_lens and q_indptr must be contiguous",
    )
    tm = meta.tree_mask
    _check(
        tm is None
        or (
            tm.dtype in (torch.bool, torch.uint8)
            and tm.dim() == 3
            and tm.is_contiguous()
            and tm.shape[0] >= b
            and tm.shape[1] == tm.shape[2]
            and (meta.max_q_len is None or tm.shape[1] >= meta.max_q_len)
        ),
        "tree_mask must be contiguous bool [B, n, n] with n >= max_q_len",
    )


class CustomAttention(AttentionBackend):
    """Split-KV absorbed-MLA attention on tensor cores (mma.sync), any page size, chain or tree.

    ``num_splits``: fix the KV split count (for CUDA graphs); None plans it per call from the
    batch's ``max_kv_len`` hint. ``lib_path``: the library to load (see ``library_path``).
    ``variant``: the kernel variant, "v1" .. "v5" or "auto" (see ``takes_v5``, then
    ``AUTO_VARIANTS``).
    ``model``: "sm120" loads the library built to run with sm_120's per-SM resources
    (kernels/sm120_model.py) from beside ``lib_path`` or the default library.
    """

    name = "custom"
    capturable = True

    def __init__(
        self,
        num_splits: int | None = None,
        lib_path: str | os.PathLike | None = None,
        variant: str = DEFAULT_VARIANT,
        model: str | None = None,
    ):
        if variant not in CHOICES["custom"]["variant"]:
            choices = list(CHOICES["custom"]["variant"])
            raise ValueError(f"variant must be one of {choices}, got {variant!r}")
        if model not in (None, *CHOICES["custom"]["model"]):
            raise ValueError(f"model must be sm120 (or none), got {model!r}")
        self.variant, self.model = variant, model
        if model == "sm120":
            from . import sm120_model

            lib_path = sm120_model.library_path(library_path(lib_path).parent)
        self.lib = load_library(lib_path)
        if model == "sm120" and self.lib.dcmla_model_smem_per_sm() <= 0:
            raise RuntimeError(f"{lib_path} is not an sm_120-model build")
        self.max_splits = int(self.lib.dcmla_max_splits())
        if num_splits is not None and not 1 <= num_splits <= self.max_splits:
            raise ValueError(f"num_splits must be in 1..{self.max_splits}, got {num_splits}")
        self.num_splits = num_splits
        self.workspace: torch.Tensor | None = None
        # Outgrown workspaces stay allocated: a captured CUDA graph may still point into them.
        self._retired: list[torch.Tensor] = []
        self._wave: dict[tuple[int, int], int] = {}
        self._step: tuple[AttnMeta, LaunchPlan] | None = None  # what plan() left for run()
        self._args: tuple[tuple, tuple] | None = None  # the last run's launch arguments, by key

    def _raise(self, code: int, what: str) -> None:
        if code != 0:
            msg = self.lib.dcmla_error_string(code).decode()
            raise RuntimeError(f"custom attention: {what} failed: {msg} (cudaError {code})")

    def ctas_per_wave(self, device: torch.device, mtiles: int, variant: str) -> int:
        """Resident CTAs of ``variant`` on the whole device (SMs x CTAs per SM)."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (index, mtiles, variant)
        if key not in self._wave:
            per_sm = ctypes.c_int(0)
            with torch.cuda.device(index):
                code = self.lib.dcmla_ctas_per_sm(VARIANTS[variant], mtiles, ctypes.byref(per_sm))
                self._raise(code, "occupancy")
            self._wave[key] = sm_count(index) * max(1, per_sm.value)
        return self._wave[key]

    def _plan_for(self, variant: str, device: torch.device, args: tuple) -> LaunchPlan:
        heads, max_q, max_kv, batch_size, total_kv = args
        wave = self.ctas_per_wave(device, m_tiles(max_q * heads), variant)
        cta_rows = V5_ROWS if variant == "v5" else 0
        plan = plan_launch(
            heads, max_q, max_kv, batch_size, wave, self.max_splits, self.num_splits, total_kv,
            cta_rows, sm_count(device),
        )  # fmt: skip
        return replace(plan, variant=VARIANTS[variant])

    def launch_plan(self, meta: AttnMeta) -> LaunchPlan:
        """The variant and split count for ``meta`` (host-side, from its hints only)."""
        heads = meta.num_heads
        max_q = meta.max_q_len or meta.num_tokens
        if meta.max_q_len is None and meta.tree_mask is not None:
            max_q = min(max_q, meta.tree_mask.shape[1])  # a tree mask bounds every q_len
        max_kv = meta.max_kv_len or meta.page_table.shape[1] * meta.page_size
        args = (heads, max_q, max_kv, meta.batch_size, meta.total_kv_len)
        if self.variant != "auto":
            return self._plan_for(self.variant, meta.device, args)
        sms = sm_count(meta.device)
        two_a_sm = self.ctas_per_wave(meta.device, m_tiles(heads * max_q), AUTO_VARIANTS[0]) > sms
        return auto_plan(lambda v: self._plan_for(v, meta.device, args), heads * max_q,
                         meta.batch_size, sms, two_a_sm)  # fmt: skip

    def unsupported(self, meta: AttnMeta) -> str | None:
        try:
            validate_meta(meta)
        except ValueError as exc:
            return str(exc).removeprefix("custom attention: ")
        return None

    def validate(self, batch: AttnBatch, out: torch.Tensor) -> None:
        validate(batch, out)

    def plan(self, meta: AttnMeta) -> None:
        """The step's launch plan and workspace (no device work: captured with the step)."""
        self.check(meta)
        plan = self.launch_plan(meta)
        self.reserve(meta.num_tokens * meta.num_heads, plan.num_splits, meta.device)
        self._step, self._args = (meta, plan), None

    def describe(self) -> dict:
        model = {"model": self.model} if self.model else {}
        if self._step is None:
            return {"backend": self.name, "variant": self.variant, **model}
        plan = self._step[1]
        variant = next(k for k, v in VARIANTS.items() if v == plan.variant)
        balance = {"split_tokens": plan.split_tokens} if plan.split_tokens else {}
        return {
            "backend": self.name, "variant": variant, "num_splits": plan.num_splits, **balance,
            **model,
        }  # fmt: skip

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """One layer of the planned step: launch only (no sync, no allocation)."""
        if self._step is None:
            raise RuntimeError("custom attention: run() before plan()")
        meta, plan = self._step
        key = call_key(q, kv_cache, out)
        if self._args is not None and self._args[0] == key:  # the same layer again: launch only
            return self._launch(self._args[1], q.device, out)
        check_tensors(meta, q, kv_cache, out)
        rows = meta.num_tokens * meta.num_heads
        if rows == 0 or meta.batch_size == 0:
            return out
        self._args = (key, self._launch_args(meta, plan, q, kv_cache, out))
        return self._launch(self._args[1], q.device, out)

    def _launch(self, args: tuple, device: torch.device, out: torch.Tensor) -> torch.Tensor:
        code = self.lib.dcmla_mla_attention(*args, torch.cuda.current_stream(device).cuda_stream)
        self._raise(code, "launch")
        return out

    def reserve(self, rows: int, num_splits: int, device: torch.device) -> torch.Tensor:
        """Workspace for ``rows`` query rows (tokens x heads) x ``num_splits``: fp32 O + LSE."""
        need = rows * num_splits * (D_V + 1)
        ws = self.workspace
        if ws is None or ws.numel() < need or ws.device != device:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "custom attention: the workspace would have to grow during CUDA graph capture "
                    f"({need * 4} B needed); run one call at the largest shape before capturing "
                    "or call reserve() with it"
                )
            if ws is not None:
                self._retired.append(ws)
            self.workspace = ws = torch.empty(need, dtype=torch.float32, device=device)
        return ws

    def _launch_args(
        self, meta: AttnMeta, plan: LaunchPlan, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor
    ) -> tuple:
        """The library call's arguments but the stream, by name (abi.MLA_ATTENTION orders them)."""
        rows = meta.num_tokens * meta.num_heads
        ws_o = self.reserve(rows, plan.num_splits, q.device).data_ptr()
        tm = meta.tree_mask
        return abi.mla_attention_args(dict(
            q=q.data_ptr(), kv=kv.data_ptr(), page_table=meta.page_table.data_ptr(),
            kv_lens=meta.kv_lens.data_ptr(), q_indptr=meta.q_indptr.data_ptr(),
            tree_mask=None if tm is None else tm.data_ptr(), out=out.data_ptr(),
            ws_o=ws_o, ws_lse=ws_o + rows * plan.num_splits * D_V * 4,
            batch=meta.batch_size, heads=meta.num_heads, total_q=meta.num_tokens,
            max_q_len=plan.max_q_len, page_size=meta.page_size,
            pt_stride=meta.page_table.stride(0), tree_stride=0 if tm is None else tm.shape[1],
            num_splits=plan.num_splits, split_tokens=plan.split_tokens, mtiles=plan.mtiles,
            variant=plan.variant, dependent=int(meta.chained),
            sm_scale=float(meta.sm_scale),
        ))  # fmt: skip
