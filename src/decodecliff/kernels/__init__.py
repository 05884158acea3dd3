"""Attention backends behind one interface (see api.py): `torch`, `triton`, `custom`.

The backend names (registry.BACKENDS) load without torch, so command-line parsers can list them
and answer --help at once; the interface's names below load api.py (and torch) on first use.
"""

from .registry import BACKENDS, get_backend

_API = ("D_QK", "D_V", "AttnBatch", "AttentionBackend")
__all__ = [*_API, "BACKENDS", "get_backend"]


def __getattr__(name: str) -> object:
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
