"""Peers: the attention kernels a user could pick instead of the custom one, as bench backends.

* ``sglang``: SGLang's own Triton kernels, from the installed ``sglang`` package (pinned in the
  ``peers`` extra): ``extend_attention_fwd`` (what SGLang's Triton backend runs for target-verify on
  NVIDIA), ``decode_attention_fwd`` (L = 1, with the split count SGLang's Triton backend picks or a
  fixed one) and ``verify_shared_kv_fwd`` (its split-KV verify kernel, ``verify_mla.py``; causal
  chains of one length only).
* ``flashinfer``: FlashInfer's ``BatchMLAPagedAttentionWrapper``, planned once per step and run per
  layer, on its fa2 (mma.sync) or fa3 (Hopper wgmma) path. Causal only: no tree mask.
* ``cublas``: gather the visible latent rows, then two cuBLAS matmuls with a masked softmax between
  (the simple path any engineer tries).

Importing ``sglang`` runs its package ``__init__``, which pulls in the whole server's
dependencies; the kernel modules themselves need only torch, triton and a few helpers. So
``load_sglang`` loads just those modules from the installed package's files: the packages above
them (``sglang``, ``sglang.kernels``, ...) are registered as empty namespace stubs whose
``__init__`` never runs, and two shims stand in for ``sglang.srt.environ`` (every ``envs`` flag at
its default, as on a server started without SGLANG_* variables) and ``sglang.srt.utils`` (is_cuda,
is_hip, the SM count). $DECODECLIFF_SGLANG_PATH may name a folder holding ``sglang/`` instead of the
installed package. Nothing of SGLang is copied into this repository.

The SGLang kernels take SGLang's metadata (``kv_indptr`` / ``kv_indices`` token slots, the draft
tokens' K/V as separate ``k_extend`` / ``v_extend`` tensors): ``plan()`` builds it once per step
from the page table, as SGLang's ``init_forward_metadata`` does, and ``run()`` gathers the draft
rows into a persistent ``k_extend`` (one index_select of q_len rows, timed with the kernel).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import itertools
import math
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from . import sm120_model
from .api import D_QK, D_V, AttentionBackend, AttnMeta, int32_slots_problem
from .reference import TorchAttention, token_rows
from .registry import CHOICES
from .workspace import Workspaces

SGLANG_PATH_ENV = "DECODECLIFF_SGLANG_PATH"
SGLANG_KERNELS = "sglang.kernels.ops.attention"
# SGLang's defaults for the MLA Triton decode: --triton-attention-num-kv-splits 8, and the
# per-request split scheduler's minimum tokens per split (triton_backend._MLA_DECODE_MIN_BLOCK_KV).
SGLANG_BASE_KV_SPLITS = 8
SGLANG_MLA_MIN_BLOCK_KV = 32
KIMI_K2_CONTEXT = 262_144  # the model's context length, which caps SGLang's decode split count
FLASHINFER_WORKSPACE_BYTES = 128 * 2**20
# kv_indices as SGLang 0.5.23's Triton backend builds them for target verify and decode, eager and
# under CUDA graphs (srt/layers/attention/triton_backend.py: torch.empty(seq_lens_sum,
# dtype=torch.int64) and the graph buffer cuda_graph_kv_indices, int64), although its req_to_token
# is int32. tests/test_peers_fidelity.py reads the installed package's source to keep this true.
SGLANG_KV_INDEX_DTYPE = "int64"
INDEX_DTYPES = {"int32": torch.int32, "int64": torch.int64}


class SlotIndexed:
    """A backend whose kernels read token slots of ``index_dtype`` (SGLang's kv_indices): int32
    slots reach api.INT32_SLOT_ROWS cache rows, and it refuses a larger cache."""

    index_dtype: str

    def reach_problem(self, kv_rows: int | None) -> str | None:
        return int32_slots_problem(kv_rows) if self.index_dtype == "int32" else None


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class _DefaultFlag:
    """An ``envs.SGLANG_*`` flag read as its default (False / 0)."""

    def get(self) -> bool:
        return False


class _DefaultEnvs:
    def __getattr__(self, name: str) -> _DefaultFlag:
        return _DefaultFlag()


def _core_count(device_index: int = 0) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _shim_modules(root: Path) -> dict[str, types.ModuleType]:
    """Namespace stubs for the packages above the kernels, and the two helper shims."""
    mods = {}
    for name, folder in [
        ("sglang", root),
        ("sglang.kernels", root / "kernels"),
        ("sglang.kernels.ops", root / "kernels" / "ops"),
        (SGLANG_KERNELS, root / "kernels" / "ops" / "attention"),
        ("sglang.srt", root / "srt"),
    ]:
        mod = types.ModuleType(name)
        mod.__path__ = [str(folder)]
        mod.__decodecliff_stub__ = True
        mods[name] = mod
    environ = types.ModuleType("sglang.srt.environ")
    environ.envs = _DefaultEnvs()
    utils = types.ModuleType("sglang.srt.utils")
    utils.is_hip = lambda: torch.version.hip is not None
    utils.is_cuda = lambda: torch.cuda.is_available() and torch.version.cuda is not None
    utils.is_gfx95_supported = lambda: False
    utils.is_gfx1250_supported = lambda: False
    utils.get_device_core_count = _core_count
    utils.next_power_of_2 = _next_power_of_2
    mods["sglang.srt.environ"], mods["sglang.srt.utils"] = environ, utils
    return mods


def sglang_root() -> Path:
    """The ``sglang`` package folder to load the kernels from (never importing the package)."""
    loaded = sys.modules.get("sglang")
    if os.environ.get(SGLANG_PATH_ENV):
        root = Path(os.environ[SGLANG_PATH_ENV]) / "sglang"
    elif loaded is not None and getattr(loaded, "__path__", None):  # the package, or our stub
        root = Path(next(iter(loaded.__path__)))
    else:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(
                "sglang is not installed: pip install -e '.[peers]' (or pip install --no-deps "
                "sglang==0.5.23; the kernels need only torch and triton)"
            )
        root = Path(next(iter(spec.submodule_search_locations)))
    if not (root / "kernels" / "ops" / "attention" / "extend_attention.py").is_file():
        raise ModuleNotFoundError(
            f"{root} holds no sglang/kernels/ops/attention/extend_attention.py"
        )
    return root


@dataclass(frozen=True)
class SGLangKernels:
    extend_attention_fwd: object
    decode_attention_fwd: object
    verify_shared_kv_fwd: object
    get_num_kv_splits_triton: object
    version: str
    root: str


_SGLANG: SGLangKernels | None = None


def load_sglang() -> SGLangKernels:
    """SGLang's Triton attention kernels, loaded once from the package files (see the docstring)."""
    global _SGLANG
    if _SGLANG is not None:
        return _SGLANG
    real = sys.modules.get("sglang")
    if real is not None and not getattr(real, "__decodecliff_stub__", False):
        root = Path(next(iter(real.__path__)))  # the real package is imported: use it as it is
    else:
        root = sglang_root()
        for name, mod in _shim_modules(root).items():
            sys.modules.setdefault(name, mod)
    mod = {m: importlib.import_module(f"{SGLANG_KERNELS}.{m}") for m in ("extend_attention",
           "decode_attention", "verify_mla", "metadata")}  # fmt: skip
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    _SGLANG = SGLangKernels(
        mod["extend_attention"].extend_attention_fwd,
        mod["decode_attention"].decode_attention_fwd,
        mod["verify_mla"].verify_shared_kv_fwd,
        mod["metadata"].get_num_kv_splits_triton,
        version,
        str(root),
    )
    return _SGLANG


def sglang_max_kv_splits(sm_count: int, max_context_len: int = KIMI_K2_CONTEXT) -> int:
    """SGLang's Triton backend for MLA: the split cap (triton_backend._mla_decode_kv_splits_cap).

    max(--triton-attention-num-kv-splits, min(next_power_of_2(SMs), next_power_of_2(ctx / 32))):
    256 on a 132-SM H200 or a 188-SM RTX PRO 6000.
    """
    if sm_count <= 0:
        return SGLANG_BASE_KV_SPLITS
    sm_cap = _next_power_of_2(sm_count)
    ctx_cap = _next_power_of_2(math.ceil(max_context_len / SGLANG_MLA_MIN_BLOCK_KV))
    return max(SGLANG_BASE_KV_SPLITS, min(sm_cap, ctx_cap))


def sglang_num_kv_splits(
    seq_lens: list[int], heads: int, sm_count: int, max_splits: int
) -> list[int]:
    """SGLang's per-request decode split counts for MLA (metadata.get_num_kv_splits_triton).

    The same arithmetic on the host, for one KV head and one query token per request: at batch 1
    and long contexts it gives ``max_splits`` (256 on an H200 from 2k tokens up).
    """
    if sm_count <= 0:
        return [max_splits] * len(seq_lens)
    longest, shortest = max(seq_lens), min(seq_lens)
    if longest * 8 < shortest * 10:
        shortest = longest
    splits1 = min(math.ceil(longest / shortest), max_splits)
    chunk1 = math.ceil(longest / splits1)
    ext_cores = int(sm_count * max(math.log2(longest / 64.0), 1.0))
    token_grid = len(seq_lens) * math.ceil(heads / min(16, heads))
    splits2 = min(math.ceil(ext_cores / token_grid), max_splits)
    chunk2 = math.ceil(longest / splits2)
    return [max(math.ceil(n / chunk1), math.ceil(n / chunk2)) for n in seq_lens]


def _indptr(lengths: list[int], device) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


class SGLangAttention(SlotIndexed, AttentionBackend):
    """SGLang's Triton kernels on this repository's paged layout (see the module docstring).

    ``kernel``: "extend" (extend_attention_fwd, any q_len, chain or tree), "verify"
    (verify_shared_kv_fwd: causal chains of one q_len) or "decode" (decode_attention_fwd, every
    q_len = 1). ``num_kv_splits`` (decode): a fixed count, or "sglang" for the per-request counts
    SGLang's Triton backend computes (its get_num_kv_splits_triton under the MLA cap).
    ``index_dtype``: ``kv_indices``' dtype, by default SGLang's own (SGLANG_KV_INDEX_DTYPE);
    int32 slots reach api.INT32_SLOT_ROWS cache rows, and a plan told of more refuses them.
    ``interpreted``: allow CPU tensors (the kernels then run in the Triton interpreter, which must
    have been chosen before triton was imported; for tests at tiny sizes, in fp32).

    As SGLang's Triton backend under CUDA graphs: ``plan`` fills buffers of fixed address from the
    lengths (read on the host) before every replay, ``run`` launches only. A tree mask's buffer is
    sized per step, so tree steps run eagerly.
    """

    name = "sglang"
    capturable = True
    plan_outside_graph = True

    def __init__(
        self,
        kernel: str = "extend",
        num_kv_splits: int | str = "sglang",
        max_context_len: int = KIMI_K2_CONTEXT,
        index_dtype: str = SGLANG_KV_INDEX_DTYPE,
        interpreted: bool = False,
    ):
        if kernel not in CHOICES["sglang"]["kernel"]:
            raise ValueError(f"kernel must be extend, verify or decode, got {kernel!r}")
        if num_kv_splits != "sglang" and not (isinstance(num_kv_splits, int) and num_kv_splits > 0):
            raise ValueError(f"num_kv_splits must be 'sglang' or >= 1, got {num_kv_splits!r}")
        if index_dtype not in CHOICES["sglang"]["index_dtype"]:
            raise ValueError(f"index_dtype must be in {list(INDEX_DTYPES)}, got {index_dtype!r}")
        self.kernel, self.num_kv_splits = kernel, num_kv_splits
        self.max_context_len, self.index_dtype = max_context_len, index_dtype
        self.interpreted = interpreted  # CPU under the Triton interpreter (tests at tiny sizes)
        self.ops = load_sglang()
        self._ws = Workspaces()
        self._step: dict | None = None
        self.resolved_splits: int | None = None  # the decode split count of the last plan

    def unsupported(self, meta: AttnMeta) -> str | None:
        if meta.device.type != "cuda" and not self.interpreted:
            return "SGLang's Triton kernels need a CUDA GPU"
        if why := self.reach_problem(meta.kv_rows):
            return why
        q_lens, kv_lens = meta.q_lens(), meta.kv_lens.tolist()
        if self.kernel == "decode" and any(q != 1 for q in q_lens):
            return "decode_attention_fwd serves q_len = 1 only"
        if self.kernel == "verify" and meta.tree_mask is not None:
            return "verify_shared_kv_fwd is causal only (SGLang uses it at topk = 1)"
        if self.kernel == "verify" and len(set(q_lens)) > 1:
            return "verify_shared_kv_fwd needs one q_len for every request"
        if self.kernel == "verify" and any(n == q for q, n in zip(q_lens, kv_lens, strict=True)):
            # measured: such a request's rows come out NaN (tests/test_kernels_cpu.py)
            return "verify_shared_kv_fwd needs a prefix in every request (kv_len > q_len)"
        return None

    def describe(self) -> dict:
        label = self.kernel
        if self.kernel == "decode":
            label = (
                f"decode-{'sglang' if self.num_kv_splits == 'sglang' else f's{self.num_kv_splits}'}"
            )
        if self.index_dtype != SGLANG_KV_INDEX_DTYPE:
            label += f"-{self.index_dtype}"  # as the kernel bench labels it
        return {"backend": self.name, "variant": label, "kernel": self.kernel,
                "num_kv_splits": self.resolved_splits, "index_dtype": self.index_dtype,
                "sglang": self.ops.version}  # fmt: skip

    def _fill(self, name: str, values: torch.Tensor, size: int) -> torch.Tensor:
        """``values`` copied into the head of a fixed buffer of at least ``size`` elements."""
        buf = self._ws.get(name, (max(size, 1),), values.dtype, values.device)
        buf[: values.numel()].copy_(values)
        return buf

    def plan(self, meta: AttnMeta) -> None:
        self.check(meta)
        q_lens, kv_lens = meta.q_lens(), meta.kv_lens.tolist()
        self.check_lengths(q_lens, kv_lens)
        if not any(q_lens):
            self._step = {"T": 0}  # an empty step: run() launches nothing
            return
        dev, cap = (
            meta.device,
            meta.page_table.numel() * meta.page_size,
        )  # every slot it maps
        rows = [token_rows(meta.page_table[b], n, meta.page_size) for b, n in enumerate(kv_lens)]
        idx = INDEX_DTYPES[self.index_dtype]
        rows_b = meta.page_table.shape[0]
        step = {"max_q": max(q_lens), "T": sum(q_lens), "sm_scale": meta.sm_scale}
        step["qo_indptr"] = self._fill("qo_indptr", _indptr(q_lens, dev), rows_b + 1)
        if self.kernel == "decode":
            step |= self._plan_decode(meta, rows, kv_lens, idx, cap)
        else:
            prefix = [n - q for n, q in zip(kv_lens, q_lens, strict=True)]
            step["kv_indptr"] = self._fill("kv_indptr", _indptr(prefix, dev), rows_b + 1)
            flat = torch.cat([r[:p] for r, p in zip(rows, prefix, strict=True)]).to(idx)
            step["kv_indices"] = self._fill("kv_indices", flat, cap)
            ext = torch.cat([r[p:] for r, p in zip(rows, prefix, strict=True)])
            step["ext_rows"] = self._fill("ext_rows", ext, ext.numel())
            step |= self._plan_mask(meta, q_lens, kv_lens)
        self._step = step

    def _plan_mask(self, meta: AttnMeta, q_lens: list[int], kv_lens: list[int]) -> dict:
        """SGLang's custom mask: per request [q_len, kv_len] flattened, prefix columns set."""
        if meta.tree_mask is None:
            return {"custom_mask": None, "mask_indptr": None, "causal": True}
        parts = []
        for b, (q, n) in enumerate(zip(q_lens, kv_lens, strict=True)):
            m = torch.ones(q, n, dtype=torch.bool, device=meta.device)
            m[:, n - q :] = meta.tree_mask[b, :q, :q]
            parts.append(m.flatten())
        sizes = [q * n for q, n in zip(q_lens, kv_lens, strict=True)]
        return {
            "custom_mask": torch.cat(parts),
            "mask_indptr": _indptr(sizes, meta.device),
            "causal": False,
        }

    def _plan_decode(
        self, meta: AttnMeta, rows: list[torch.Tensor], kv_lens: list[int], idx, cap: int
    ) -> dict:
        b, dev, h = meta.batch_size, meta.device, meta.num_heads
        seq_lens = meta.kv_lens.to(torch.int32)
        if self.num_kv_splits == "sglang":
            sms = _core_count(dev.index or 0) if dev.type == "cuda" else 0
            max_splits = sglang_max_kv_splits(sms, self.max_context_len)
            splits = torch.full((b,), max_splits, dtype=torch.int32, device=dev)
            if sms > 0:  # SGLang fills the cap when it cannot count the cores
                self.ops.get_num_kv_splits_triton[(1,)](
                    splits, seq_lens, b, 1, h, 1, max_splits, sms,
                    MAX_NUM_SEQ=256 if b < 256 else _next_power_of_2(b),
                )  # fmt: skip
        else:
            max_splits = self.num_kv_splits
            splits = torch.full((b,), max_splits, dtype=torch.int32, device=dev)
        self.resolved_splits = int(splits.max())
        f32 = torch.float32
        return {
            "kv_indptr": self._fill(
                "kv_indptr", _indptr(kv_lens, dev), meta.page_table.shape[0] + 1
            ),
            "kv_indices": self._fill("kv_indices", torch.cat(rows).to(idx), cap),
            "num_kv_splits": self._fill("num_kv_splits", splits, splits.numel()),
            "max_kv_splits": max_splits,
            "attn_logits": self._ws.get("attn_logits", (b, h, max_splits, D_V), f32, dev),
            "attn_lse": self._ws.get("attn_lse", (b, h, max_splits), f32, dev),
        }

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        s = self._step
        if s is None:
            raise RuntimeError("sglang attention: run() before plan()")
        if s["T"] == 0:
            return out
        kv = kv_cache.view(-1, 1, D_QK)
        if self.kernel == "decode":
            self.ops.decode_attention_fwd(
                q, kv, kv[..., :D_V], out, s["kv_indptr"], s["kv_indices"], s["attn_logits"],
                s["attn_lse"], s["num_kv_splits"], s["max_kv_splits"], s["sm_scale"], 1.0, 1.0,
                has_mla=True,
            )  # fmt: skip
            return out
        # SGLang hands the draft tokens' K/V over as their own tensors: one gather of T rows
        k_ext = self._ws.get("k_extend", (s["T"], 1, D_QK), kv.dtype, kv.device)
        torch.index_select(kv, 0, s["ext_rows"][: s["T"]], out=k_ext)
        args = (
            q, k_ext, k_ext[..., :D_V], out, kv, kv[..., :D_V], s["qo_indptr"], s["kv_indptr"],
            s["kv_indices"], s["custom_mask"], s["causal"], s["mask_indptr"], s["max_q"], 1.0, 1.0,
        )  # fmt: skip
        if self.kernel == "extend":
            self.ops.extend_attention_fwd(*args, sm_scale=s["sm_scale"])
        elif not self.ops.verify_shared_kv_fwd(*args, sm_scale=s["sm_scale"]):
            raise ValueError("sglang verify_shared_kv_fwd declined this problem (can_handle)")
        return out


class FlashInferAttention(AttentionBackend):
    """FlashInfer's MLA paged attention (BatchMLAPagedAttentionWrapper) as SGLang's FlashInfer MLA
    backend runs it: planned once per step on the host, layers captured in a CUDA graph.

    ``backend``: "fa2" (mma.sync, any sm_80+ GPU: the path sm_120 has) or "fa3" (Hopper wgmma,
    sm_90 only). The wrapper is built with ``use_cuda_graph=True`` over index buffers of fixed
    size (the page table's every page), so ``plan`` copies the step's indices into them and a
    captured ``run`` reads them at every replay. Its masks are causal and non-causal only, so a
    tree mask is unsupported.

    ``model``: "sm120" runs the configuration FlashInfer picks on an sm_120 GPU (its dispatch
    reads 100 KB of shared memory per SM through the preloaded shim of kernels/sm120_model.py).
    """

    name = "flashinfer"
    capturable = True
    plan_outside_graph = True

    def __init__(self, backend: str = "fa2", model: str | None = None):
        if backend not in CHOICES["flashinfer"]["backend"]:
            raise ValueError(f"backend must be fa2 or fa3, got {backend!r}")
        if model not in (None, *CHOICES["flashinfer"]["model"]):
            raise ValueError(f"model must be sm120 (or none), got {model!r}")
        if model == "sm120":
            if backend != "fa2":
                raise ValueError("sm_120 has no wgmma: its model runs FlashInfer's fa2 path only")
            if (reason := sm120_model.shim_missing()) is not None:
                raise RuntimeError(reason)
        self.model = model
        if not torch.cuda.is_available():
            raise RuntimeError("FlashInfer's MLA kernels need a CUDA GPU")
        major, minor = torch.cuda.get_device_capability()
        if backend == "fa3" and major != 9:
            raise RuntimeError(
                f"FlashInfer's fa3 MLA path needs sm_90 (Hopper), not {major}.{minor}"
            )
        import flashinfer.mla

        self._mla = flashinfer.mla
        self.backend = backend
        self.version = importlib.metadata.version("flashinfer-python")
        self.workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.int8, device="cuda")
        self.wrapper = None  # the wrapper planned last, which run() uses
        self.empty = False  # the step planned last has no query row: run() launches nothing
        self._wrappers: dict[int, object] = {}  # per batch size
        self._sizes: tuple[int, int] = (0, 0)  # (requests, pages) the index buffers hold
        self._bufs: tuple[torch.Tensor, ...] = ()
        self._retired: list[dict] = []

    def unsupported(self, meta: AttnMeta) -> str | None:
        if meta.device.type != "cuda":
            return "FlashInfer needs a CUDA GPU"
        if meta.tree_mask is not None:
            return "FlashInfer's MLA wrapper has causal and non-causal masks only, no tree mask"
        return None

    def describe(self) -> dict:
        model = {"model": self.model} if self.model else {}
        return {"backend": self.name, "variant": self.backend, "flashinfer": self.version, **model}

    def _sized(self) -> contextlib.AbstractContextManager:
        """The shared memory per SM FlashInfer's dispatch sees: the model's, or the GPU's own."""
        return sm120_model.smem_per_sm() if self.model else contextlib.nullcontext()

    def _wrapper(self, batch: int, rows: int, pages: int):
        """The CUDA-graph wrapper of a batch size, over views of index buffers shared by all batch
        sizes (as SGLang keeps one per captured batch size); buffers grow only between steps."""
        if rows > self._sizes[0] or pages > self._sizes[1]:
            rows, pages = max(rows, self._sizes[0]), max(pages, self._sizes[1])
            i32 = dict(dtype=torch.int32, device=self.workspace.device)
            self._bufs = (torch.zeros(rows + 1, **i32), torch.zeros(rows + 1, **i32),
                          torch.zeros(max(pages, 1), **i32), torch.zeros(rows, **i32))  # fmt: skip
            self._retired.append(self._wrappers)  # graphs captured on them keep their buffers
            self._wrappers, self._sizes = {}, (rows, pages)
        if batch not in self._wrappers:
            qo, kv, idx, lens = self._bufs
            self._wrappers[batch] = self._mla.BatchMLAPagedAttentionWrapper(
                self.workspace, use_cuda_graph=True, qo_indptr=qo[: batch + 1],
                kv_indptr=kv[: batch + 1], kv_indices=idx, kv_len_arr=lens[:batch],
                backend=self.backend,
            )  # fmt: skip
        return self._wrappers[batch]

    def plan(self, meta: AttnMeta) -> None:
        self.check(meta)
        q_lens, kv_lens = meta.q_lens(), meta.kv_lens.tolist()
        self.check_lengths(q_lens, kv_lens)
        self.empty = not any(q_lens)
        if self.empty:  # no request, or no query row: nothing for FlashInfer to plan or run
            return
        pages = [math.ceil(n / meta.page_size) for n in kv_lens]
        indices = torch.cat([meta.page_table[r, :p] for r, p in enumerate(pages)])
        rows, width = meta.page_table.shape
        self.wrapper = self._wrapper(meta.batch_size, rows, rows * width)
        self.wrapper.plan(  # the plan reads the SM count only; run() dispatches by shared memory
            _indptr(q_lens, meta.device), _indptr(pages, meta.device), indices.to(torch.int32),
            meta.kv_lens.to(torch.int32), meta.num_heads, D_V, D_QK - D_V, meta.page_size, True,
            meta.sm_scale, torch.bfloat16, torch.bfloat16,
        )  # fmt: skip

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if self.empty:
            return out
        if self.wrapper is None:
            raise RuntimeError("flashinfer attention: run() before plan()")
        q_nope, q_pe = q[..., :D_V], q[..., D_V:]
        ckv, kpe = kv_cache[..., :D_V], kv_cache[..., D_V:]
        with self._sized():
            self.wrapper.run(q_nope, q_pe, ckv, kpe, out=out)
        return out


class CublasAttention(TorchAttention):
    """Gather the visible latent rows, then Q K^T and P V as bf16 cuBLAS matmuls (fp32 softmax).

    The plan (row lists and masks) is the torch backend's; only the per-layer math differs.
    """

    name = "cublas"
    capturable = False

    def __init__(self) -> None:
        super().__init__(torch.bfloat16)

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        flat = kv_cache.reshape(-1, D_QK)
        for span in self._spans:
            kv = flat.index_select(0, span.rows)  # [n, 576] bf16
            rows = q[span.q0 : span.q1]
            length, heads = rows.shape[0], rows.shape[1]
            scores = torch.matmul(rows.reshape(length * heads, D_QK), kv.T)
            scores = scores.view(length, heads, -1).float().mul_(self._sm_scale)
            scores.masked_fill_(~span.mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(kv.dtype).view(length * heads, -1)
            out[span.q0 : span.q1] = torch.matmul(probs, kv[:, :D_V]).view(length, heads, D_V)
        return out
