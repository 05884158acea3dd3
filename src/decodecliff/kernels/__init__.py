"""Attention backends behind one contract (api.AttentionBackend), one module each, named in
registry.BACKENDS: `torch` (reference), `triton` (the baseline), `custom` (csrc/ through ctypes;
ops.py registers it as torch.ops.decodecliff.mla_attention for other engines), and the peers
`sglang`, `flashinfer`, `cublas` (peers.py).

The backend names load without torch, so command-line parsers can list them and answer --help at
once; the interface's names below load api.py (and torch) on first use.
"""

from .registry import BACKENDS, get_backend

_API = ("D_QK", "D_V", "AttnBatch", "AttnMeta", "AttentionBackend")
__all__ = [*_API, "BACKENDS", "get_backend"]


def __getattr__(name: str) -> object:
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
