"""Backends by name. Imports are lazy so the CPU path never needs Triton or the CUDA library."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # api.py loads torch; the names below must not
    from .api import AttentionBackend

BACKENDS = {
    "torch": ("decodecliff.kernels.reference", "TorchAttention"),
    "triton": ("decodecliff.kernels.triton_baseline", "TritonAttention"),
    "custom": ("decodecliff.kernels.custom", "CustomAttention"),
    # peers a user could pick instead (kernels/peers.py; the `peers` extra installs them)
    "sglang": ("decodecliff.kernels.peers", "SGLangAttention"),
    "flashinfer": ("decodecliff.kernels.peers", "FlashInferAttention"),
    "cublas": ("decodecliff.kernels.peers", "CublasAttention"),
}
GPU_ONLY = {"custom", "sglang", "flashinfer"}  # recorded as skipped (with the reason) on a CPU


def get_backend(name: str, **options) -> AttentionBackend:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(BACKENDS)}")
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)(**options)
