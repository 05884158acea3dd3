"""Model presets and engine settings.

`kimi-k2-tp8-rank` is the per-token work of one tensor-parallel rank (of 8) of Kimi K2: 8 of the 64
query heads, the full latent KV (MLA keeps one shared latent head, so every rank caches all of it),
1/8 of the vocabulary, and a dense MLP as wide as the rank's share of the active experts
((8 routed + 1 shared) x 2048 / 8 = 2304). `tiny` keeps the attention shapes and shrinks the rest so
that it runs on a laptop CPU.
"""

from __future__ import annotations

import argparse
import math
import typing
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from decodecliff.kernels.registry import BACKENDS

if TYPE_CHECKING:  # torch loads only when an engine is built, so `serve --help` answers at once
    import torch


@dataclass(frozen=True)
class ModelConfig:
    name: str
    num_layers: int
    hidden: int
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int
    vocab_size: int
    mlp_dim: int
    rope_theta: float = 10000.0
    eos_token_id: int = 0

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_dim + self.qk_rope_dim

    @property
    def kv_row_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_dim


PRESETS: dict[str, ModelConfig] = {
    "kimi-k2-tp8-rank": ModelConfig(
        name="kimi-k2-tp8-rank",
        num_layers=61,
        hidden=7168,
        num_heads=8,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_dim=128,
        qk_rope_dim=64,
        v_head_dim=128,
        vocab_size=163840 // 8,
        mlp_dim=2304,
    ),
    "tiny": ModelConfig(
        name="tiny",
        num_layers=2,
        hidden=256,
        num_heads=8,
        q_lora_rank=128,
        kv_lora_rank=512,
        qk_nope_dim=128,
        qk_rope_dim=64,
        v_head_dim=128,
        vocab_size=512,
        mlp_dim=512,
    ),
}

DTYPES = ("bfloat16", "float32", "float64")  # torch dtype names
SPEC_MODES = ("none", "chain", "tree")
# How prefill chunks attend: through the attention backend (absorbed, as decode does) or, as SGLang
# serves MLA models, with plain multi-head attention over K/V decompressed from the latent cache.
PREFILL_ATTENTION = ("backend", "mha")
DEVICES = ("cpu", "cuda")
# engine/skinny_gemm.py: WeightGemm (engine/projections.py: fused folds), or x @ w
GEMMS = ("auto", "cublas", "fused", "pdl", "cublas-pdl")
DEFAULT_GEMM = "cublas"


def gemm_label(label: str, gemm: str) -> str:
    """How results name an engine configuration: its backend's label ("custom (sm120)"), and its
    weight GEMMs' path where that is not the default ("custom (sm120) + fused GEMMs")."""
    return label if gemm == DEFAULT_GEMM else f"{label} + {gemm} GEMMs"


# What a chained weight GEMM asks of the L2 before its wait, over all its programs: a third of an
# H200's 50 MB L2, so the prefetched head of each slice is still there when the program streams it.
GEMM_PREFETCH_MB = 16
CHAINED_GEMMS = ("pdl", "cublas-pdl")  # chained by dependent launch (cublas-pdl: but the GEMMs)


MAX_SEED = 2**62  # torch seeds are 64-bit; a request's seed adds its number to this one


def option(default: Any, help: str, **checks: Any) -> Any:
    """An EngineConfig field that is also a `decodecliff serve` option: ``help`` is its help text;
    ``choices``, ``min`` and ``max`` are checked by validate() (and offered by the parser);
    ``exclusive`` names a group of options of which at most one may be given."""
    return field(default=default, metadata={"help": help, **checks})


@dataclass
class EngineConfig:
    """The engine's settings: the one place their defaults, limits and help are defined.

    Every field made with option() is the `decodecliff serve` option of the same name (dashes for
    underscores) with the same default (add_options builds the parser, from_args reads it back);
    the study's config schema (workflow/schemas/config.schema.yaml) repeats the settings it
    exposes, and tests/test_config_sources.py holds the two together.
    """

    CPU_DEFAULT_TOKENS = 65536  # KV pool without max_total_tokens on a CPU

    preset: str = option("tiny", "model preset", choices=tuple(sorted(PRESETS)))
    backend: str = option("torch", "attention backend", choices=tuple(sorted(BACKENDS)))
    # resolved before the engine is built (serve's --device also takes "auto")
    device: str = field(default="cpu", metadata={"choices": DEVICES})
    dtype: str | None = option(
        None,
        "dtype of the weights and the KV cache (default: bfloat16 on CUDA, float32 on a CPU)",
        choices=DTYPES,
    )
    page_size: int = option(1, "KV cache page size in tokens", min=1)
    # The study's config schema gives the same default for a server without chunk_size; the
    # study's configs set it for every server, so the pipeline always passes it explicitly.
    chunk_size: int = option(512, "chunked prefill size in tokens", min=1)
    prefill_attention: str = option(
        "backend",
        "how prefill chunks attend: through the attention backend (absorbed) or, as SGLang does, "
        "multi-head attention over K/V decompressed from the latent; decode and verify steps "
        "always use the backend",
        choices=PREFILL_ATTENTION,
    )
    max_total_tokens: int | None = option(
        None,
        f"KV pool size in tokens (default: from --mem-fraction on CUDA, {CPU_DEFAULT_TOKENS} "
        "on a CPU)",
        min=1,
        exclusive="pool size",
    )
    mem_fraction: float = option(
        0.85,
        "share of the free GPU memory after the weights that the KV pool takes, in (0, 1]",
        exclusive="pool size",
    )
    max_running_requests: int = option(8, "requests in the running batch at most", min=1)
    # SGLang starts its ratio at 0.7 and lowers it while nothing is retracted; here it stays put.
    new_token_ratio: float = option(
        0.7,
        "share of a request's remaining max_new_tokens that admission books for it, as "
        "SGLang's new token ratio: a request is admitted on its prompt, its next step and this "
        "share of the rest; when the running requests outgrow the pool the youngest is retracted "
        "and recomputed later (1: book the worst case, never retract)",
        min=0.0,
        max=1.0,
    )
    spec: str = option(
        "none",
        "speculative decoding: none, a draft chain or a draft tree verified per step",
        choices=SPEC_MODES,
    )
    draft_len: int = option(
        16, "chain verify length in tokens (the last token included)", min=2, max=64
    )
    tree_nodes: int = option(64, "tree verify size in nodes (the root included)", min=16, max=256)
    cuda_graph: bool = option(False, "capture decode and verify steps in CUDA graphs (CUDA only)")
    gemm: str = option(
        DEFAULT_GEMM,
        "weight GEMMs of decode and verify steps: cuBLAS, or per shape the fastest of cuBLAS and "
        "a weight-streaming Triton kernel timed by graph replay at the first step (auto, CUDA; "
        "1-3%% faster than cuBLAS in a graph-captured H100 step: notes/engine.md), the same "
        "with the residual adds, the RMSNorms and silu * up folded into the kernel where it "
        "wins (fused, CUDA; "
        "engine/projections.py), or that kernel alone, chained with the "
        "elementwise kernels by programmatic dependent launch, weights prefetched to L2 before "
        "each waits (pdl, sm_90+), or cuBLAS with the other kernels chained (cublas-pdl, sm_90+)",
        choices=GEMMS,
    )
    gemm_prefetch_mb: int = option(
        GEMM_PREFETCH_MB,
        "with gemm pdl: MB of each projection's weights asked of the L2 before it waits for the "
        "kernel before (0: none)",
        min=0,
        max=64,
    )
    l2_overlap_mb: int = option(
        0,
        "MB of each layer's later weights (q_b, W_kc, W_vc, o, gate|up) asked of the L2 on a "
        "side stream while its attention runs, where the step's KV leaves them room (CUDA; "
        "0: none; measured no faster on an H200: notes/engine.md; engine/l2_overlap.py)",
        min=0,
        max=64,
    )
    defrag: bool = option(False, "compact the running requests' scattered KV pages")
    defrag_threshold: float = option(
        0.25, "fraction of page breaks that triggers a compaction", min=0.0, max=1.0
    )
    defrag_interval: int = option(32, "engine steps between fragmentation checks", min=1)
    scatter_seed: int | None = option(
        None,
        "shuffle the initial free list with this seed (page size 1: scattered slots; "
        "default: in order)",
        min=0,
        max=MAX_SEED,
    )
    seed: int = option(
        0,
        "seed of the synthetic weights, and of sampling for requests that give none (plus "
        "the request's number)",
        min=0,
        max=MAX_SEED,
    )
    threads: int | None = option(
        None, "CPU threads for torch (default: torch's own choice, all cores)", min=1
    )
    backend_options: dict = field(default_factory=dict)

    @property
    def model(self) -> ModelConfig:
        return PRESETS[self.preset]

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        if self.dtype is None:
            return torch.bfloat16 if self.device == "cuda" else torch.float32
        return getattr(torch, self.dtype)

    @property
    def spec_tokens(self) -> int:
        """Query tokens per request in one decode step (1, the chain length, or the tree size)."""
        return {"none": 1, "chain": self.draft_len, "tree": self.tree_nodes}[self.spec]

    def validate(self) -> None:
        """Raise ValueError with a clear message for an impossible configuration."""
        for f in fields(self):
            value, meta = getattr(self, f.name), f.metadata
            if value is None or not meta:
                continue
            name = f.name.replace("_", " ")
            if "choices" in meta and value not in meta["choices"]:
                raise ValueError(f"{name} must be one of {list(meta['choices'])}, not {value!r}")
            low, high = meta.get("min"), meta.get("max")
            if isinstance(value, float) and math.isnan(value):
                raise ValueError(f"{name} must be a number, not nan")
            if (low is not None and value < low) or (high is not None and value > high):
                bounds = f">= {low}" if high is None else f"in {low}..{high}"
                raise ValueError(f"{name} must be {bounds}, not {value!r}")
        if not 0.0 < self.mem_fraction <= 1.0:
            raise ValueError("mem fraction must be in (0, 1]")
        if self.cuda_graph and self.device != "cuda":
            raise ValueError("--cuda-graph needs a CUDA device")
        if self.l2_overlap_mb and self.device != "cuda":
            raise ValueError("--l2-overlap-mb needs a CUDA device")
        if self.gemm != DEFAULT_GEMM and self.device != "cuda":  # a CPU runs torch's matmul
            raise ValueError(f"--gemm {self.gemm} needs a CUDA device")

    @classmethod
    def from_args(cls, args: argparse.Namespace, **given: Any) -> EngineConfig:
        """The config of options parsed by a parser add_options built; ``given`` sets the fields
        that are not options (the resolved device, backend options)."""
        return cls(**{f.name: getattr(args, f.name) for f in options()}, **given)


def options() -> list[Field]:
    """The EngineConfig fields that are command-line options."""
    return [f for f in fields(EngineConfig) if "help" in f.metadata]


def _scalar(hint: Any) -> type:
    """The type of an option's values: ``int`` of ``int | None``."""
    return next(t for t in typing.get_args(hint) or (hint,) if t is not type(None))


def add_options(parser: argparse.ArgumentParser) -> None:
    """Add the `decodecliff serve` option of every EngineConfig option field."""
    hints = typing.get_type_hints(EngineConfig)
    groups: dict[str, Any] = {}
    for f in options():
        meta, flag = f.metadata, "--" + f.name.replace("_", "-")
        where = parser
        if "exclusive" in meta:
            if meta["exclusive"] not in groups:
                groups[meta["exclusive"]] = parser.add_mutually_exclusive_group()
            where = groups[meta["exclusive"]]
        kind = _scalar(hints[f.name])
        assert f.default is not MISSING, f"option {f.name} needs a default"
        if kind is bool:
            assert f.default is False, f"switch {f.name} must default to off"
            where.add_argument(flag, action="store_true", help=meta["help"])
        else:
            where.add_argument(
                flag, type=kind, default=f.default, choices=meta.get("choices"), help=meta["help"]
            )
