"""The weight-streaming GEMM (engine/skinny_gemm.py): against float64 in the Triton interpreter on
a CPU (float16: the interpreter's bfloat16 loads are not faithful), split-K sums in split order
(bit-identical reruns, tickets re-armed), both weight layouts; the engine's chooser on a CPU."""

from __future__ import annotations

import pytest
import torch

from decodecliff.engine.model import weight_gemm

skinny = pytest.importorskip("decodecliff.engine.skinny_gemm")

CASES = [  # (M, K, N, config, weight layout)
    (16, 512, 96, skinny.Config(32, 128, 4), "kn"),
    (5, 300, 50, skinny.Config(16, 128, 2), "nk"),  # ragged K and N, partial row tile
    (16, 256, 64, skinny.Config(64, 128, 1), "nk"),
    (64, 256, 48, skinny.Config(16, 128, 8), "kn"),  # more splits than K tiles
    (1, 1000, 40, skinny.Config(16, 256, 3), "nk"),  # decode: one row
]


def weights(k: int, n: int, layout: str) -> torch.Tensor:
    if layout == "kn":
        return torch.randn(k, n, dtype=torch.float16)
    return torch.randn(n, k, dtype=torch.float16).t()  # N-major storage, viewed [K, N]


@pytest.mark.parametrize(("m", "k", "n", "cfg", "layout"), CASES)
def test_matches_float64_and_reruns_bit_identically(m, k, n, cfg, layout):
    torch.manual_seed(m * 1000 + n)
    x, w = torch.randn(m, k, dtype=torch.float16), weights(k, n, layout)
    gemm = skinny.SkinnyGemm()
    first = gemm(x, w, cfg)
    ref = x.double() @ w.double()
    assert ((first.double() - ref).norm() / ref.norm()).item() < 1e-3
    _, tickets = gemm.scratch(cfg, m, n, x.device)
    assert not tickets.any()  # every slice's last program re-armed its ticket
    assert torch.equal(gemm(x, w, cfg, out=torch.full_like(first, float("nan"))), first)


def test_more_rows_than_a_tile_is_a_clear_error():
    with pytest.raises(ValueError, match="skinny GEMM takes"):
        skinny.SkinnyGemm()(torch.zeros(65, 32), torch.zeros(32, 16), skinny.Config(16, 128, 1))


def test_the_engine_uses_torch_on_a_cpu_and_rejects_unknown_choices():
    assert weight_gemm("auto", torch.device("cpu")) is torch.matmul
    assert weight_gemm("cublas", torch.device("cpu")) is torch.matmul
    with pytest.raises(ValueError, match="gemm must be one of"):
        weight_gemm("cutlass", torch.device("cpu"))
