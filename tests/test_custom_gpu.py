"""The custom kernel on a GPU against the float64 reference (skipped without CUDA)."""

from __future__ import annotations

import os

import pytest
import torch

from decodecliff.kernels import build
from decodecliff.kernels.api import D_V
from decodecliff.kernels.reference import reference_attention
from decodecliff.kernels.synthetic import random_batch, relative_error

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> str:
    lib = os.environ.get("DECODECLIFF_KERNEL_LIB")
    if not lib:
        major, minor = torch.cuda.get_device_capability()
        out = tmp_path_factory.mktemp("kernels")
        archs = sorted({major * 10 + minor, 120, 90})
        assert build.cli(["--arch", *map(str, archs), "--out", str(out)]) == 0
        lib = str(out / build.LIB_NAME)
    return lib


@pytest.fixture(params=["v1", "v2", "v3", "v4", "v5", "auto"])
def backend(library, request):
    from decodecliff.kernels.custom import CustomAttention

    return lambda **kw: CustomAttention(lib_path=library, variant=request.param, **kw)


CASES = [
    dict(kv_lens=[1], q_len=1, heads=8, page_size=1),
    dict(kv_lens=[5000], q_len=1, heads=8, page_size=1),
    dict(kv_lens=[3000], q_len=16, heads=8, page_size=64),
    dict(kv_lens=[2500, 40, 777], q_len=4, heads=8, page_size=16),
    dict(kv_lens=[1500], q_len=64, heads=8, page_size=1, tree=True),
    dict(kv_lens=[700], q_len=16, heads=64, page_size=16),
    dict(kv_lens=[300, 900], q_len=5, heads=3, page_size=1),
    dict(kv_lens=[17, 3, 40], q_len=3, heads=5, page_size=1),  # tiles shorter than one ring
    dict(kv_lens=[2000, 9000], q_len=16, heads=8, page_size=64),  # two 64-row tiles per request
    dict(kv_lens=[900, 5000], q_len=64, heads=8, page_size=1, tree=True),  # eight 64-row tiles
    dict(kv_lens=[4000], q_len=1, heads=64, page_size=1),  # decode: one 64-row tile
    dict(kv_lens=[3000, 50], q_len=7, heads=16, page_size=16),  # 112 rows: a partial 64-row tile
    dict(kv_lens=[4000, 900, 60], q_len=[16, 1, 5], heads=8, page_size=64),  # ragged: mixed steps
    dict(kv_lens=[2000, 700], q_len=[64, 9], heads=8, page_size=1, tree=True),  # ragged trees
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_matches_float64_reference(backend, case):
    batch = random_batch(**case, device="cuda", seed=len(str(case)))
    out = torch.full((batch.q.shape[0], batch.meta.num_heads, D_V), float("nan"), device="cuda",
                     dtype=torch.bfloat16)  # fmt: skip
    backend()(batch, out)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    assert relative_error(out, reference_attention(batch)) < 1e-2


def test_variants_agree(library):
    from decodecliff.kernels.custom import CustomAttention

    batch = random_batch([6000, 333], q_len=16, heads=8, page_size=16, device="cuda", seed=11)
    v1 = CustomAttention(lib_path=library, variant="v1")(batch)
    for name in ("v2", "v3", "v4", "v5"):
        other = CustomAttention(lib_path=library, variant=name)(batch)
        assert relative_error(other, v1.double().cpu()) < 1e-2


@pytest.mark.parametrize("splits", [1, 7, 300, 1024])  # 1024: the combine's cap
def test_any_split_count_gives_the_same_answer(backend, splits):
    batch = random_batch([4000], q_len=16, heads=8, device="cuda", seed=splits)
    out = backend(num_splits=splits)(batch)
    assert relative_error(out, reference_attention(batch)) < 1e-2


def test_a_long_context_whose_wave_holds_more_splits_than_the_cap_plans_the_cap(backend):
    """300k tokens of one decode request: where a wave of small CTAs holds more splits than the
    combine's cap (1,024), the planner gives it the cap (it asked for more and raised)."""
    batch = random_batch([300_000], q_len=1, heads=8, device="cuda", seed=9)
    attn = backend()
    cap = attn.max_splits
    planned = attn.launch_plan(batch.meta).num_splits
    attn.max_splits = 1 << 30  # what the wave alone would ask for
    wanted = attn.launch_plan(batch.meta).num_splits
    attn.max_splits = cap
    assert planned == min(wanted, cap), (planned, wanted, cap)
    out = attn(batch)
    assert relative_error(out, reference_attention(batch)) < 1e-2


def test_a_ragged_batch_is_split_by_tokens(backend):
    batch = random_batch([60_000, 20_000, 3_000], q_len=16, heads=8, device="cuda", seed=4)
    attn = backend()
    out = attn(batch)
    assert attn.describe().get("split_tokens", 0) > 0  # the balanced plan ran
    assert relative_error(out, reference_attention(batch)) < 1e-2


def test_graph_replay_follows_kv_lens(backend):
    batch = random_batch([3000, 1200], q_len=16, heads=8, device="cuda", seed=5)
    attn = backend(num_splits=8)
    out = attn(batch)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attn(batch, out)
    batch.meta.kv_lens.copy_(torch.tensor([2000, 16], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert relative_error(out, reference_attention(batch)) < 1e-2


def test_workspace_cannot_grow_during_capture(backend):
    batch = random_batch([500], q_len=16, heads=8, device="cuda", seed=1)
    attn = backend(num_splits=4)
    out = batch.new_output()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="grow during CUDA graph capture"):  # noqa: SIM117
        with torch.cuda.graph(graph):
            attn(batch, out)


def test_bad_inputs_are_clear_errors(backend):
    batch = random_batch([100], q_len=1, heads=8, device="cuda")
    attn = backend()
    with pytest.raises(ValueError, match="bf16"):
        attn(batch, torch.empty(1, 8, D_V, device="cuda"))
    batch.meta.kv_lens = batch.meta.kv_lens.long()
    with pytest.raises(ValueError, match="kv_lens"):
        attn(batch)
