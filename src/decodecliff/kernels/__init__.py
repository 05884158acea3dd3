"""Attention backends behind one interface (see api.py): `torch`, `triton`, `custom`."""

from .api import D_QK, D_V, AttentionBackend, AttnBatch
from .registry import BACKENDS, get_backend

__all__ = ["D_QK", "D_V", "AttnBatch", "AttentionBackend", "BACKENDS", "get_backend"]
