"""A step's weight GEMMs with the kernels around them, as the model's forward calls them.

Between two projections of a layer sit small kernels: the residual add and RMSNorm before the
attention's and the MLP's input projections, silu(gate) * up between the MLP's two. Each is a
launch of a few microseconds at verify sizes, and a layer has five of them (notes/engine.md):

* ``Projections`` runs them as kernels of their own (engine/fused.py) around ``mm`` (cuBLAS, or
  ``WeightGemm`` choosing per shape). A projection's output (``delta``) is added to the residual
  stream by the next norm's kernel, as production engines fuse add and norm.
* ``FoldedProjections`` folds them into the weight GEMMs (engine/skinny_gemm.py's ``Fold``): the
  norm into the projection that reads the normed rows (its weight applied on load, 1/rms to the
  sums), the residual add into the projection that writes it (the o and down projections add
  into the stream as they store), silu(gate) * up into the gate|up projection's store. A layer
  then launches five kernels fewer; each GEMM's choice is still per shape, against cuBLAS with
  the separate kernels, so a shape whose fold is slower keeps them.

Both update the residual stream ``x`` in place and give the same math up to rounding points.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from . import fused

if TYPE_CHECKING:
    from .skinny_gemm import WeightGemm

Matmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Projections:
    """The norms, the residual adds and silu * up as kernels of their own around ``mm``."""

    def __init__(self, mm: Matmul, pdl: bool = False) -> None:
        self.mm, self.pdl = mm, pdl

    def normed(
        self, x: torch.Tensor, delta: torch.Tensor | None, g: torch.Tensor, w: torch.Tensor
    ) -> torch.Tensor:
        """``x += delta`` (in place), then ``RMSNorm(x) * g @ w``."""
        return self.mm(fused.add_rms_norm(x, delta, g, self.pdl), w)

    def residual(self, x: torch.Tensor, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
        """``a @ w``, to be added to x: the delta the next ``normed`` adds (None: added)."""
        return self.mm(a, w)

    def mlp(
        self,
        x: torch.Tensor,
        delta: torch.Tensor | None,
        g: torch.Tensor,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
    ) -> torch.Tensor | None:
        """``x += delta``, then the MLP of RMSNorm(x) * g: its output as ``residual`` gives it."""
        return self._down(x, self._gate_up(x, delta, g, w_gate_up), w_down)

    def _gate_up(
        self, x: torch.Tensor, delta: torch.Tensor | None, g: torch.Tensor, w: torch.Tensor
    ) -> torch.Tensor:
        """The gate|up projection's output: [gate | up]."""
        return self.normed(x, delta, g, w)

    def _down(self, x: torch.Tensor, gate_up: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
        glu = getattr(self.mm, "glu", None)  # tuned: silu(gate) * up made as the GEMM loads it
        if glu is not None:
            return glu(gate_up, w)
        return self.residual(x, fused.silu_mul(gate_up, self.pdl), w)


class FoldedProjections(Projections):
    """The same, each small kernel folded into a weight GEMM where its shape's choice says so."""

    def __init__(self, gemm: WeightGemm) -> None:
        super().__init__(gemm, gemm.pdl)
        self.gemm = gemm

    def normed(
        self, x: torch.Tensor, delta: torch.Tensor | None, g: torch.Tensor, w: torch.Tensor
    ) -> torch.Tensor:
        _add(x, delta)
        return self.gemm.normed(x, g, w)

    def residual(self, x: torch.Tensor, a: torch.Tensor, w: torch.Tensor) -> None:
        self.gemm.add_into(x, a, w)

    def _gate_up(
        self, x: torch.Tensor, delta: torch.Tensor | None, g: torch.Tensor, w: torch.Tensor
    ) -> torch.Tensor:
        """silu(gate) * up, made by the gate|up projection itself."""
        _add(x, delta)
        return self.gemm.gated(x, g, w)

    def _down(self, x: torch.Tensor, act: torch.Tensor, w: torch.Tensor) -> None:
        self.residual(x, act, w)


def _add(x: torch.Tensor, delta: torch.Tensor | None) -> None:
    """A delta from an unfolded projection into the stream (the folded forward passes None)."""
    if delta is not None:
        x.add_(delta)
