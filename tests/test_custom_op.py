"""The custom kernel as a torch.library op: traced without a GPU from its fake implementation,
and on a GPU the same numbers as the `custom` backend, inside torch.compile too."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import decodecliff.kernels.ops  # noqa: F401  (registers torch.ops.decodecliff.*)
from decodecliff.kernels.reference import reference_attention
from decodecliff.kernels.synthetic import random_batch, relative_error


def op_args(batch) -> tuple:
    m = batch.meta
    return (batch.q, batch.kv_cache, m.page_table, m.kv_lens, m.q_indptr, m.tree_mask,
            m.sm_scale, m.max_q_len, m.max_kv_len)  # fmt: skip


def test_the_fake_gives_the_output_shape_without_a_gpu() -> None:
    batch = random_batch([70, 33], 4, heads=8, page_size=16)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in op_args(batch)]
        out = torch.ops.decodecliff.mla_attention(*fake)
    assert out.shape == (8, 8, 512) and out.dtype == torch.bfloat16


def test_both_ops_are_registered_with_their_schemas() -> None:
    assert "!) out) -> ()" in str(torch.ops.decodecliff.mla_attention_out.default._schema)
    assert "-> Tensor" in str(torch.ops.decodecliff.mla_attention.default._schema)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel needs a CUDA GPU")
def test_the_op_computes_the_attention_inside_torch_compile_too() -> None:
    try:
        from decodecliff.kernels.custom import load_library

        load_library()
    except (OSError, FileNotFoundError) as exc:
        pytest.skip(f"the kernel library is not built: {exc}")
    batch = random_batch([300, 120], 16, heads=8, page_size=1, device="cuda")
    ref = reference_attention(batch)
    out = torch.ops.decodecliff.mla_attention(*op_args(batch))
    assert relative_error(out, ref) < 2e-2
    compiled = torch.compile(lambda *a: torch.ops.decodecliff.mla_attention(*a), fullgraph=True)
    assert relative_error(compiled(*op_args(batch)), ref) < 2e-2
    torch.library.opcheck(torch.ops.decodecliff.mla_attention.default, op_args(batch))
