"""Persistent device buffers for a backend's plan: grown to the largest step seen, never shrunk.

A captured CUDA graph holds raw pointers, so a buffer that grows keeps its old storage alive
(``retired``) and graphs are captured only after a step at the largest shape has been planned.
"""

from __future__ import annotations

import torch


class Workspaces:
    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}
        self.retired: list[torch.Tensor] = []

    def get(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A view ``shape`` of buffer ``name`` (grown to fit; contents are left as they were)."""
        buf = self._bufs.get(name)
        fits = buf is not None and buf.device == device and buf.dtype == dtype
        if not (fits and all(have >= need for have, need in zip(buf.shape, shape, strict=True))):
            grown = shape if buf is None or not fits else tuple(map(max, buf.shape, shape))
            if buf is not None:
                self.retired.append(buf)  # a captured CUDA graph may still point into it
            buf = self._bufs[name] = torch.empty(grown, dtype=dtype, device=device)
        return buf[tuple(slice(0, n) for n in shape)]
