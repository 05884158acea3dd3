"""CPU correctness: the torch reference against an independent float64 loop, the Triton baseline
under the Triton interpreter against the reference, and the backends' error handling."""

from __future__ import annotations

import math
import os

import pytest
import torch

from decodecliff.kernels import D_QK, D_V, get_backend
from decodecliff.kernels.reference import TorchAttention, reference_attention
from decodecliff.kernels.synthetic import random_batch, relative_error

BF16_TOL = 2e-2


def naive_attention(batch) -> torch.Tensor:
    """Row by row in float64, addressing the cache through the page-table formula of api.py."""
    ps, cache = batch.page_size, batch.kv_cache.double().reshape(-1, D_QK)
    out = torch.zeros(batch.q.shape[0], batch.num_heads, D_V, dtype=torch.float64)
    for b in range(batch.batch_size):
        q0, q1 = int(batch.q_indptr[b]), int(batch.q_indptr[b + 1])
        kv_len, q_len = int(batch.kv_lens[b]), q1 - q0
        rows = [int(batch.page_table[b, t // ps]) * ps + t % ps for t in range(kv_len)]
        kv = cache[rows]
        prefix = kv_len - q_len
        for i in range(q_len):
            if batch.tree_mask is None:
                draft = [j for j in range(q_len) if j <= i]
            else:
                draft = [j for j in range(q_len) if bool(batch.tree_mask[b, i, j])]
            seen = kv[list(range(prefix)) + [prefix + j for j in draft]]
            scores = batch.q[q0 + i].double() @ seen.T * batch.sm_scale  # [H, n]
            out[q0 + i] = torch.softmax(scores, -1) @ seen[:, :D_V]
    return out


CASES = [
    dict(kv_lens=[37], q_len=1),
    dict(kv_lens=[64], q_len=16, page_size=16),
    dict(kv_lens=[90, 17, 45], q_len=5, tree=True, page_size=4),
    dict(kv_lens=[33, 120], q_len=7, heads=3, page_size=1),
    dict(kv_lens=[70, 41], q_len=40, tree=True, heads=2, page_size=16),
    dict(kv_lens=[300, 5, 129], q_len=1, heads=20, page_size=64),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_torch_reference_matches_float64_loop(case: int) -> None:
    batch = random_batch(**CASES[case], dtype=torch.float32, seed=case, spare_pages=3)
    truth = naive_attention(batch)
    assert relative_error(reference_attention(batch), truth) < 1e-12
    assert relative_error(TorchAttention()(batch), truth) < 1e-5


def test_torch_reference_bf16_within_tolerance() -> None:
    batch = random_batch([200, 80], 16, heads=8, page_size=16, tree=True, seed=3)
    assert relative_error(TorchAttention()(batch), reference_attention(batch)) < BF16_TOL


def test_triton_runs_in_the_interpreter_without_cuda() -> None:
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    if not torch.cuda.is_available():
        assert os.environ.get("TRITON_INTERPRET") == "1" and tb.INTERPRETED


TRITON_CASES = [
    # (batch kwargs, backend options)
    (dict(kv_lens=[100], q_len=16), dict(arch_config="sm90")),
    (dict(kv_lens=[100], q_len=16), dict(arch_config="sm120")),
    (dict(kv_lens=[70, 33], q_len=5, tree=True, page_size=16), dict(arch_config="sm90")),
    (dict(kv_lens=[200, 90], q_len=40, heads=3, page_size=4), dict(arch_config="sm120")),
    (dict(kv_lens=[130, 90], q_len=40, tree=True, heads=2), dict(arch_config="sm100")),
    (dict(kv_lens=[300, 45, 17], q_len=1), dict(decode="grouped", num_kv_splits=8)),
    (dict(kv_lens=[300, 45, 17], q_len=1, heads=20), dict(decode="grouped", num_kv_splits=64)),
    (dict(kv_lens=[77, 3], q_len=1, page_size=16), dict(decode="grouped", num_kv_splits=1)),
    (dict(kv_lens=[150, 9], q_len=1, heads=4), dict(decode="extend", arch_config="sm90")),
]


@pytest.mark.parametrize("case", range(len(TRITON_CASES)))
def test_triton_matches_reference(case: int) -> None:
    pytest.importorskip("decodecliff.kernels.triton_baseline")
    kwargs, options = TRITON_CASES[case]
    batch = random_batch(**kwargs, seed=10 + case, spare_pages=2)
    out = batch.new_output().fill_(float("nan"))  # a row the kernel skips stays NaN and fails
    get_backend("triton", **options)(batch, out)
    err = relative_error(out, reference_attention(batch))
    assert err < BF16_TOL, f"rel err {err} for {kwargs} {options}"


def test_triton_reuses_its_workspace() -> None:
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    backend = tb.TritonAttention(decode="grouped", num_kv_splits=8)
    big = random_batch([90, 60], 1, heads=8, seed=1)
    backend(big)
    ptrs = (backend._indices.data_ptr(), backend._logits.data_ptr(), backend._lse.data_ptr())
    small = random_batch([40], 1, heads=8, seed=2)
    err = relative_error(backend(small), reference_attention(small))
    assert err < BF16_TOL
    backend(big)
    assert (
        backend._indices.data_ptr(),
        backend._logits.data_ptr(),
        backend._lse.data_ptr(),
    ) == ptrs


def test_triton_verify_never_uses_the_decode_kernel() -> None:
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    backend = tb.TritonAttention(decode="grouped")
    backend(random_batch([50], 4, seed=4))
    assert backend._logits is None  # the split-KV workspace only exists for L = 1


def test_arch_configs_follow_sglang_for_lq_576() -> None:
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    sm90, sm120 = tb.resolve_arch_config("sm90"), tb.resolve_arch_config("sm120")
    assert (sm90.block_m, sm90.block_n, sm90.num_warps, sm90.num_stages) == (32, 64, 8, 1)
    assert (sm120.block_m, sm120.block_n) == (32, 32)
    if not torch.cuda.is_available():
        assert tb.resolve_arch_config("auto").name == "sm90"


def test_backend_errors() -> None:
    with pytest.raises(ValueError, match="unknown attention backend"):
        get_backend("flashinfer")
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    with pytest.raises(ValueError, match="decode must be"):
        tb.TritonAttention(decode="split")
    with pytest.raises(ValueError, match="num_kv_splits"):
        tb.TritonAttention(num_kv_splits=0)
    with pytest.raises(ValueError, match="unknown arch_config"):
        tb.TritonAttention(arch_config="sm75")(random_batch([20], 2))
    batch = random_batch([20], 2)
    batch.q = batch.q[..., :512]
    with pytest.raises(ValueError, match="q must be"):
        tb.TritonAttention()(batch)
    batch = random_batch([20], 2)
    batch.kv_cache = batch.kv_cache.float()
    with pytest.raises(ValueError, match="kv_cache is"):
        tb.TritonAttention()(batch)


def test_relative_error_flags_nan() -> None:
    ref = torch.ones(2, 3)
    assert math.isinf(relative_error(torch.full((2, 3), float("nan")), ref))
