"""The Triton baseline compiled on a GPU against the float64 reference (skipped without CUDA)."""

from __future__ import annotations

import random

import pytest
import torch

from decodecliff.kernels.reference import reference_attention
from decodecliff.kernels.synthetic import random_batch, relative_error

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def random_case(rng: random.Random) -> dict:
    q_len = rng.choice([1, 1, 2, 16, 33, 64])
    batch = rng.choice([1, 1, 2, 3])
    kv_lens = [rng.randint(q_len, rng.choice([300, 5_000, 70_000])) for _ in range(batch)]
    return dict(
        kv_lens=kv_lens, q_len=q_len, heads=rng.choice([8, 16, 64]),
        page_size=rng.choice([1, 16, 64]), tree=q_len > 1 and rng.random() < 0.5,
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(
    "options",
    [dict(arch_config="sm90"), dict(arch_config="sm120", num_kv_splits=64), dict(decode="extend")],
)
def test_triton_gpu_matches_float64(seed: int, options: dict) -> None:
    from decodecliff.kernels.triton_baseline import TritonAttention

    case = random_case(random.Random(seed))
    batch = random_batch(**case, device="cuda", seed=seed, spare_pages=5)
    out = batch.new_output().fill_(float("nan"))
    TritonAttention(**options)(batch, out)
    torch.cuda.synchronize()
    err = relative_error(out, reference_attention(batch))
    assert err < 2e-2, f"rel err {err} for {case} {options}"


def test_triton_gpu_long_context_verify_and_decode() -> None:
    from decodecliff.kernels.triton_baseline import TritonAttention

    for q_len, tree in [(16, False), (64, True), (1, False)]:
        batch = random_batch([185_000], q_len, 8, 1, tree, device="cuda", seed=q_len)
        out = TritonAttention(num_kv_splits=64)(batch)
        assert relative_error(out, reference_attention(batch)) < 2e-2
