"""Model presets and engine settings.

`kimi-k2-tp8-rank` is the per-token work of one tensor-parallel rank (of 8) of Kimi K2: 8 of the 64
query heads, the full latent KV (MLA keeps one shared latent head, so every rank caches all of it),
1/8 of the vocabulary, and a dense MLP as wide as the rank's share of the active experts
((8 routed + 1 shared) x 2048 / 8 = 2304). `tiny` keeps the attention shapes and shrinks the rest so
that it runs on a laptop CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
SPEC_MODES = ("none", "chain", "tree")
# How prefill chunks attend: through the attention backend (absorbed, as decode does) or, as SGLang
# serves MLA models, with plain multi-head attention over K/V decompressed from the latent cache.
PREFILL_ATTENTION = ("backend", "mha")


@dataclass
class EngineConfig:
    preset: str = "tiny"
    backend: str = "torch"
    device: str = "cpu"  # resolved: "cpu" or "cuda"
    dtype: str | None = None  # None: bfloat16 on CUDA, float32 on CPU
    page_size: int = 1
    chunk_size: int = 512
    prefill_attention: str = "backend"  # one of PREFILL_ATTENTION; decode/verify always absorbed
    max_total_tokens: int | None = None  # None: from mem_fraction (CUDA) or CPU_DEFAULT_TOKENS
    mem_fraction: float = 0.85  # of the free device memory after the weights
    max_running_requests: int = 8
    spec: str = "none"
    draft_len: int = 16
    tree_nodes: int = 64
    cuda_graph: bool = False
    defrag: bool = False
    defrag_threshold: float = 0.25  # fraction of page breaks that triggers a compaction
    defrag_interval: int = 32  # engine steps between fragmentation checks
    scatter_seed: int | None = None  # shuffle the initial free list (page_size=1: scattered slots)
    seed: int = 0
    threads: int | None = None  # torch.set_num_threads; None: torch's default
    backend_options: dict = field(default_factory=dict)

    CPU_DEFAULT_TOKENS = 65536

    @property
    def model(self) -> ModelConfig:
        return PRESETS[self.preset]

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype is None:
            return torch.bfloat16 if self.device == "cuda" else torch.float32
        return DTYPES[self.dtype]

    @property
    def spec_tokens(self) -> int:
        """Query tokens per request in one decode step (1, the chain length, or the tree size)."""
        return {"none": 1, "chain": self.draft_len, "tree": self.tree_nodes}[self.spec]

    def validate(self) -> None:
        """Raise ValueError with a clear message for an impossible configuration."""
        checks = [
            (
                self.preset in PRESETS,
                f"unknown preset {self.preset!r}; choose from {sorted(PRESETS)}",
            ),
            (self.device in ("cpu", "cuda"), f"device must be cpu or cuda, not {self.device!r}"),
            (self.dtype is None or self.dtype in DTYPES, f"dtype must be one of {sorted(DTYPES)}"),
            (self.page_size >= 1, "page size must be >= 1"),
            (self.chunk_size >= 1, "chunk size must be >= 1"),
            (
                self.prefill_attention in PREFILL_ATTENTION,
                f"prefill attention must be one of {PREFILL_ATTENTION}",
            ),
            (self.max_total_tokens is None or self.max_total_tokens >= 1, "max total tokens >= 1"),
            (0.0 < self.mem_fraction <= 1.0, "mem fraction must be in (0, 1]"),
            (self.max_running_requests >= 1, "max running requests must be >= 1"),
            (self.spec in SPEC_MODES, f"spec must be one of {SPEC_MODES}"),
            (2 <= self.draft_len <= 64, "draft length must be in 2..64"),
            (16 <= self.tree_nodes <= 256, "tree nodes must be in 16..256"),
            (0.0 <= self.defrag_threshold <= 1.0, "defrag threshold must be in [0, 1]"),
            (self.defrag_interval >= 1, "defrag interval must be >= 1"),
            (self.threads is None or self.threads >= 1, "threads must be >= 1"),
            (not (self.cuda_graph and self.device != "cuda"), "--cuda-graph needs a CUDA device"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
