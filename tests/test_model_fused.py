"""The lean forward (fused GEMMs, fused norms and rope, plan once per step) is the old math.

``reference_forward`` is the unfused forward the model had before: separate q_a / kv_a and
gate / up projections (views of the concatenated weights), RMSNorm and rope recomputed per layer,
attention re-planned per layer. Both run on the CPU on the same weights and caches.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from decodecliff.engine.config import PRESETS
from decodecliff.engine.model import StepInput, SyntheticMLA
from decodecliff.kernels.api import AttnBatch, NoAttention
from decodecliff.kernels.reference import TorchAttention
from decodecliff.kernels.synthetic import random_tree_mask


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * weight.float()).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * inv_freq[None, :]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (d // 2,)
    cos, sin = angles.cos().view(shape), angles.sin().view(shape)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def reference_forward(model: SyntheticMLA, step: StepInput, kv_cache: torch.Tensor) -> torch.Tensor:
    """The unfused forward (absorbed path, torch attention called per layer)."""
    cfg, backend = model.cfg, TorchAttention()
    r, m = cfg.q_lora_rank, cfg.mlp_dim
    x = model.embed[step.input_ids]
    for i, layer in enumerate(model.layers):
        h = rms_norm(x, layer.attn_norm)
        T = h.shape[0]
        q = (rms_norm(h @ layer.w_qkv_a[:, :r], layer.q_norm) @ layer.w_qb).view(
            T, cfg.num_heads, -1
        )
        q_nope, q_rope = q.split([cfg.qk_nope_dim, cfg.qk_rope_dim], dim=-1)
        q_rope = apply_rope(q_rope, step.positions, cfg.rope_theta)
        kv = h @ layer.w_qkv_a[:, r:]
        latent = rms_norm(kv[:, : cfg.kv_lora_rank], layer.kv_norm)
        k_rope = apply_rope(kv[:, cfg.kv_lora_rank :], step.positions, cfg.rope_theta)
        cache = kv_cache[i]
        cache.view(-1, cfg.kv_row_dim)[step.out_slots] = torch.cat([latent, k_rope], dim=-1)
        q_latent = torch.bmm(q_nope.transpose(0, 1), layer.w_kc).transpose(0, 1)
        batch = AttnBatch.build(
            q=torch.cat([q_latent, q_rope], dim=-1),
            kv_cache=cache,
            page_table=step.page_table,
            kv_lens=step.kv_lens,
            q_indptr=step.q_indptr,
            sm_scale=model.sm_scale,
            tree_mask=step.tree_mask,
            max_q_len=step.max_q_len,
            max_kv_len=step.max_kv_len,
        )
        out = backend(batch)
        v = torch.bmm(out.transpose(0, 1), layer.w_vc).transpose(0, 1)
        x = x + v.reshape(T, -1) @ layer.w_o
        h = rms_norm(x, layer.mlp_norm)
        gate, up = layer.w_gate_up[:, :m], layer.w_gate_up[:, m:]
        x = x + (F.silu(h @ gate) * (h @ up)) @ layer.w_down
    if step.logit_rows is not None:
        x = x[step.logit_rows]
    return (rms_norm(x, model.final_norm) @ model.lm_head).float()


def verify_step(
    prefixes: list[int], q: int, page_size: int, tree: bool, seed: int
) -> tuple[StepInput, int]:
    """A batch verifying q tokens per request after `prefixes` cached ones (scattered pages), and
    the number of pages its cache needs."""
    g = torch.Generator().manual_seed(seed)
    lens = [p + q for p in prefixes]
    pages = [math.ceil(n / page_size) for n in lens]
    order = torch.randperm(sum(pages) + 3, generator=g).to(torch.int32)
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    start = 0
    for b, n in enumerate(pages):
        table[b, :n] = order[start : start + n]
        start += n
    slots, positions = [], []
    for b, p in enumerate(prefixes):
        t = torch.arange(p, p + q)
        slots.append(table[b, t // page_size].long() * page_size + t % page_size)
        positions.append(t)
    mask = torch.stack([random_tree_mask(q, g) for _ in lens]) if tree else None
    return StepInput(
        input_ids=torch.randint(1, 512, (q * len(lens),), generator=g),
        positions=torch.cat(positions),
        out_slots=torch.cat(slots),
        page_table=table,
        kv_lens=torch.tensor(lens, dtype=torch.int32),
        q_indptr=torch.arange(0, q * (len(lens) + 1), q, dtype=torch.int32),
        tree_mask=mask,
        max_q_len=q,
        max_kv_len=max(lens),
    ), int(order.max()) + 1


# float64: the fused code is the same arithmetic up to summation order; float32: rounding of the
# residual add and of the norms happens at the same points, the GEMMs sum in another order.
TOLERANCES = [(torch.float64, 1e-12), (torch.float32, 2e-5), (torch.bfloat16, 3e-2)]


@pytest.mark.parametrize("dtype,tol", TOLERANCES, ids=["fp64", "fp32", "bf16"])
@pytest.mark.parametrize(
    "prefixes,q,page_size,tree",
    [([40], 16, 1, False), ([30, 57], 6, 4, True), ([9, 0, 25], 1, 3, False)],
    ids=["chain16-p1", "tree6-p4-batch2", "decode-p3-batch3"],
)
def test_lean_forward_equals_the_unfused_forward(dtype, tol, prefixes, q, page_size, tree):
    cfg = dataclasses.replace(PRESETS["tiny"], num_layers=3)
    model = SyntheticMLA(cfg, "cpu", dtype, seed=5)
    step, pages = verify_step(prefixes, q, page_size, tree, seed=len(prefixes) + q)
    g = torch.Generator().manual_seed(1)
    cache = torch.randn(cfg.num_layers, pages, page_size, cfg.kv_row_dim, generator=g).to(dtype)
    ref_cache = cache.clone()
    logits = model.forward(step, cache, TorchAttention())
    ref = reference_forward(model, step, ref_cache)
    scale = ref.abs().max()
    assert (logits - ref).abs().max() <= tol * scale
    assert (cache.double() - ref_cache.double()).abs().max() <= tol * ref_cache.abs().max()
    if dtype == torch.float64:
        assert torch.equal(logits.argmax(-1), ref.argmax(-1))


def test_logit_rows_and_the_nk_weight_layout_keep_the_logits():
    cfg = dataclasses.replace(PRESETS["tiny"], num_layers=2)
    kn = SyntheticMLA(cfg, "cpu", torch.float64, seed=2)
    nk = SyntheticMLA(cfg, "cpu", torch.float64, seed=2, weight_layout="nk")
    assert not nk.layers[0].w_qkv_a.is_contiguous() and torch.equal(
        nk.layers[0].w_qkv_a, kn.layers[0].w_qkv_a
    )
    step, pages = verify_step([20], 8, 2, False, seed=3)
    cache = torch.randn(2, pages, 2, cfg.kv_row_dim, dtype=torch.float64)
    full = kn.forward(step, cache.clone(), TorchAttention())
    picked = kn.forward(
        dataclasses.replace(step, logit_rows=torch.tensor([7, 2])), cache.clone(), TorchAttention()
    )
    assert torch.allclose(picked, full[[7, 2]], rtol=0, atol=1e-12)
    assert torch.allclose(nk.forward(step, cache.clone(), TorchAttention()), full, atol=1e-12)


class CountingAttention(TorchAttention):
    def __init__(self) -> None:
        super().__init__()
        self.plans = self.runs = 0

    def plan(self, meta):
        self.plans += 1
        return super().plan(meta)

    def run(self, q, kv_cache, out):
        self.runs += 1
        return super().run(q, kv_cache, out)


def test_a_step_plans_once_and_runs_every_layer():
    cfg = dataclasses.replace(PRESETS["tiny"], num_layers=4)
    model = SyntheticMLA(cfg, "cpu", torch.float32, seed=0)
    step, pages = verify_step([12, 3], 4, 1, True, seed=0)
    backend = CountingAttention()
    model.forward(step, torch.zeros(4, pages, 1, cfg.kv_row_dim), backend)
    assert (backend.plans, backend.runs) == (1, 4)
    # the no-op backend leaves the (zeroed) attention output alone: logits still come out
    out = model.forward(step, torch.zeros(4, pages, 1, cfg.kv_row_dim), NoAttention())
    assert out.shape == (8, cfg.vocab_size) and torch.isfinite(out).all()


def test_the_rope_table_is_built_once_and_grows_only_when_asked():
    model = SyntheticMLA(PRESETS["tiny"], "cpu", torch.float32, seed=0)
    model.rope.reserve(100)
    table = model.rope.table
    model.rope.reserve(50)
    assert model.rope.table is table and table.shape == (100, 64)
    pos = torch.tensor([0, 7, 99])
    angles = pos.float()[:, None] * model.rope.inv_freq
    assert torch.equal(model.rope.rows(pos), torch.cat([angles.cos(), angles.sin()], -1))


@pytest.mark.slow  # the Triton interpreter runs every projection of the tiny model
@pytest.mark.parametrize(
    "dtype,tol", [(torch.float32, 2e-5), (torch.float16, 3e-2)], ids=["fp32", "fp16"]
)
@pytest.mark.parametrize(
    "prefixes,q,tree,rows",
    [([40], 16, False, None), ([30, 57], 6, True, [11, 0, 4]), ([5] * 9, 8, False, None)],
    ids=["chain16", "tree6-batch2-logit-rows", "prefill-72-rows"],
)
def test_the_folded_forward_equals_the_unfused_forward(dtype, tol, prefixes, q, tree, rows):
    """gemm fused: the residual adds, the norms and silu * up folded into the weight GEMMs (the
    Triton kernel, interpreted on the CPU at a fixed configuration; above 64 rows the separate
    kernels' math): the unfused forward's logits and cache rows, to rounding."""
    skinny = pytest.importorskip("decodecliff.engine.skinny_gemm")
    from test_skinny_gemm import CountingGemm

    from decodecliff.engine.projections import FoldedProjections

    cfg = dataclasses.replace(PRESETS["tiny"], num_layers=2)
    model = SyntheticMLA(cfg, "cpu", dtype, seed=7)
    step, pages = verify_step(prefixes, q, 1, tree, seed=q)
    if rows is not None:
        step = dataclasses.replace(step, logit_rows=torch.tensor(rows))
    g = torch.Generator().manual_seed(2)
    cache = torch.randn(cfg.num_layers, pages, 1, cfg.kv_row_dim, generator=g).to(dtype)
    ref_cache = cache.clone()
    ref = reference_forward(model, step, ref_cache)
    gemm = skinny.WeightGemm(fixed=skinny.Config(32, 128, 2))
    gemm.skinny = CountingGemm()
    model.mm, model.proj = gemm, FoldedProjections(gemm)  # as gemm fused builds them on CUDA
    logits = model.forward(step, cache, TorchAttention())
    assert logits.shape == ref.shape
    # per layer q_a|kv_a (normed), q_b, o (adding), gate|up, down (adding); then the LM head
    plain, norm, gated, add = skinny.PLAIN, skinny.Fold(norm=True), skinny.Fold(
        norm=True, gate_up=True), skinny.Fold(add=True)  # fmt: skip
    kernels = [norm, plain, add, gated, add] * cfg.num_layers + [norm]
    assert gemm.skinny.folds == (kernels if step.input_ids.shape[0] <= skinny.MAX_M else [])
    assert (logits - ref).abs().max() <= tol * ref.abs().max()
    assert (cache.double() - ref_cache.double()).abs().max() <= tol * ref_cache.abs().max()


def test_the_fused_triton_kernels_equal_their_torch_code_in_the_interpreter():
    # engine/fused_triton.py on a CPU (Triton's interpreter; float32, ragged widths so the masks
    # count); on a GPU test_engine_gpu.py runs them compiled, in bfloat16 and chained too (the
    # interpreter has no programmatic dependent launch)
    kernels = pytest.importorskip("decodecliff.engine.fused_triton")
    from decodecliff.engine import fused

    g = torch.Generator().manual_seed(3)
    rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    close = lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-5)  # noqa: E731
    T, R, C, H = 5, 200, 72, 3
    table = fused.RopeTable(64, 10000.0, torch.device("cpu"))
    table.reserve(128)
    cs = table.rows(torch.randint(0, 128, (T,), generator=g))

    x, d, w = rnd(T, 300), rnd(T, 300), rnd(300)
    x_ref = x + d
    assert close(kernels.add_rms_norm(x, d, w, 1e-6, False), fused.rms_norm(x_ref, w, 1e-6))
    assert torch.equal(x, x_ref)  # the residual stream updated in place
    assert close(kernels.add_rms_norm(x, None, w, 1e-6, False), fused.rms_norm(x_ref, w, 1e-6))

    qkv, qn, kvn = rnd(T, R + C + 64), rnd(R), rnd(C)
    slots = torch.randperm(16, generator=g)[:T]
    cache = torch.full((16, C + 64), float("nan"))
    cq = kernels.qkv_a_post(qkv, qn, kvn, cs, cache, slots, 1e-6, False)
    kv_row = torch.cat(
        [fused.rms_norm(qkv[:, R : R + C], kvn, 1e-6), fused._rope_torch(qkv[:, R + C :], cs)], -1
    )
    assert close(cq, fused.rms_norm(qkv[:, :R], qn, 1e-6)) and close(cache[slots], kv_row)
    others = torch.ones(16, dtype=torch.bool)
    others[slots] = False
    assert cache[others].isnan().all()  # no other cache row written

    q, out = rnd(T, H, 64), torch.full((T, H, 80), float("nan"))
    kernels.rope(q, cs, out[..., 16:], False)
    assert close(out[..., 16:], fused._rope_torch(q, cs)) and out[..., :16].isnan().all()

    gu = rnd(T, 2 * 1100)  # past one 1,024-column block
    ref = torch.nn.functional.silu(gu[:, :1100]) * gu[:, 1100:]
    assert close(kernels.silu_mul(gu, False), ref)
