"""scripts/mlp_stream_bench.py's packing: the weights laid out as a DCMLP_PACKED build of
kernels/csrc/mlp_stream.cu reads them (checked here against the kernel's addressing; the kernel
itself is checked against float64 on a GPU by the same script)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts/mlp_stream_bench.py"


def bench():
    spec = importlib.util.spec_from_file_location("mlp_stream_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def weight_row(n: int, tile_n: int, gated: bool, block: int, r: int) -> int:
    """The kernel's weight_row: a gate|up block is tile_n / 2 gate rows, then the up rows of the
    same columns."""
    if not gated:
        return block * tile_n + r
    return (0 if r < tile_n // 2 else n // 2 - tile_n // 2) + block * (tile_n // 2) + r


@pytest.mark.parametrize("tile_n, tile_k", [(64, 128), (32, 256)])
@pytest.mark.parametrize("gated", [True, False])
def test_a_packed_chunk_is_what_the_kernel_reads_into_its_swizzled_tile(tile_n, tile_k, gated):
    n, k = 4 * tile_n, 3 * tile_k
    w = torch.arange(n * k, dtype=torch.float32).view(n, k)  # every element distinct
    packed = bench().pack(w, tile_n, tile_k, gated)
    assert packed.numel() == n * k
    pieces = tile_k // 8
    for c in range(n // tile_n * (k // tile_k)):  # streaming order: row block, then column block
        block, column_block = divmod(c, k // tile_k)
        tile = packed[c * tile_n * tile_k : (c + 1) * tile_n * tile_k].view(tile_n, pieces, 8)
        for r in range(tile_n):
            row = w[weight_row(n, tile_n, gated, block, r)].view(-1, pieces, 8)[column_block]
            # shared memory's piece q of row r holds the row's piece q ^ (r % 8) (the swizzle)
            order = torch.arange(pieces) ^ (r % 8)
            assert torch.equal(tile[r], row[order])
