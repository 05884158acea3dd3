"""The weight-streaming GEMM (engine/skinny_gemm.py): against float64 in the Triton interpreter on
a CPU (float16: the interpreter's bfloat16 loads are not faithful), split-K sums in split order
(bit-identical reruns, tickets re-armed), both weight layouts; the engine's chooser on a CPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decodecliff.engine.model import weight_gemm

skinny = pytest.importorskip("decodecliff.engine.skinny_gemm")
GLU, NORM, ADD = skinny.Fold(glu=True), skinny.Fold(norm=True), skinny.Fold(add=True)
GATED = skinny.Fold(norm=True, gate_up=True)


class CountingGemm(skinny.SkinnyGemm):
    """The kernel as it is, each launch's fold recorded (so a test knows the kernel ran)."""

    def __init__(self) -> None:
        super().__init__()
        self.folds: list = []

    def __call__(self, x, w, cfg, **options):
        self.folds.append(options.get("fold", skinny.PLAIN))
        return super().__call__(x, w, cfg, **options)


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
    *_, tickets = gemm.scratch(cfg, m, n, x.device)
    assert not tickets.any()  # every slice's last program re-armed its ticket
    assert torch.equal(gemm(x, w, cfg, out=torch.full_like(first, float("nan"))), first)


@pytest.mark.parametrize(("m", "k", "n", "cfg", "layout"), CASES[:3])
def test_the_glu_gemm_is_the_silu_mul_kernel_then_the_gemm(m, k, n, cfg, layout):
    """With glu the input [gate | up] becomes silu(gate) * up as the GEMM loads it: the same
    bits as the silu_mul kernel then the GEMM (same configuration), in every layout."""
    from decodecliff.engine import fused_triton

    torch.manual_seed(m + k)
    gate_up, w = torch.randn(m, 2 * k, dtype=torch.float16), weights(k, n, layout)
    gemm = skinny.SkinnyGemm()
    apart = gemm(fused_triton.silu_mul(gate_up, pdl=False), w, cfg)
    fused = gemm(gate_up, w, cfg, out=torch.full_like(apart, float("nan")), fold=GLU)
    assert torch.equal(fused, apart)
    act = torch.nn.functional.silu(gate_up[:, :k].double()) * gate_up[:, k:].double()
    ref = act @ w.double()
    assert ((fused.double() - ref).norm() / ref.norm()).item() < 1e-2
    with pytest.raises(ValueError, match=r"\(gate \| up\)"):
        gemm(gate_up[:, :-1], w, cfg, fold=GLU)


def rms_normed(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * g.double()


def norm_input(m: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A residual stream far from unit rms (rows of different scales) and a norm weight."""
    x = torch.randn(m, k, dtype=torch.float16) * torch.linspace(0.2, 5.0, m)[:, None].half()
    return x, (torch.rand(k) + 0.5).half()


@pytest.mark.parametrize(("m", "k", "n", "cfg", "layout"), CASES)
def test_a_normed_gemm_is_rmsnorm_then_the_gemm(m, k, n, cfg, layout):
    """RMSNorm folded into the projection reading its rows (the weight applied on load, 1/rms
    to the sums, over every K-split's share): float64's answer, and the norm kernel then the
    GEMM's to rounding; split-K sums in split order (bit-identical reruns)."""
    from decodecliff.engine import fused_triton

    torch.manual_seed(m + k + n)
    (x, g), w = norm_input(m, k), weights(k, n, layout)
    gemm = skinny.SkinnyGemm()
    poisoned = torch.full((m, n), float("nan"), dtype=torch.float16)
    folded = gemm(x, w, cfg, out=poisoned, fold=NORM, norm_weight=g)
    ref = rms_normed(x, g) @ w.double()
    assert ((folded.double() - ref).norm() / ref.norm()).item() < 2e-3
    apart = gemm(fused_triton.add_rms_norm(x, None, g, 1e-6, False), w, cfg)
    assert ((folded.double() - apart.double()).norm() / ref.norm()).item() < 2e-3
    assert torch.equal(gemm(x, w, cfg, fold=NORM, norm_weight=g), folded)
    assert not gemm.scratch(cfg, m, n, x.device)[-1].any()  # tickets re-armed


@pytest.mark.parametrize(("m", "k", "n", "cfg", "layout"), CASES)
def test_a_gate_up_gemm_is_the_gemm_then_silu_mul(m, k, n, cfg, layout):
    """w = [gate | up]: silu(x @ gate) * (x @ up) as the GEMM stores (both halves' partials
    in the split-K workspace), the same bits as the GEMM then the silu_mul kernel; with the
    norm folded too, float64's answer of the MLP's input."""
    from decodecliff.engine import fused_triton

    torch.manual_seed(m * n + k)
    (x, g), w = norm_input(m, k), weights(k, 2 * n, layout)
    gemm = skinny.SkinnyGemm()
    apart = fused_triton.silu_mul(gemm(x, w, cfg), pdl=False)
    poisoned = torch.full_like(apart, float("nan"))
    assert torch.equal(gemm(x, w, cfg, out=poisoned, fold=skinny.Fold(gate_up=True)), apart)
    folded = gemm(x, w, cfg, fold=GATED, norm_weight=g)
    h = rms_normed(x, g)
    ref = torch.nn.functional.silu(h @ w[:, :n].double()) * (h @ w[:, n:].double())
    assert ((folded.double() - ref).norm() / ref.norm()).item() < 5e-3
    with pytest.raises(ValueError, match="even width"):
        gemm(x, w[:, 1:], cfg, fold=GATED, norm_weight=g)


@pytest.mark.parametrize(("m", "k", "n", "cfg", "layout"), CASES)
def test_an_adding_gemm_adds_its_product_to_the_stream(m, k, n, cfg, layout):
    """y += x @ w as the GEMM stores (the product rounded first, as a separate add has it):
    the same bits as the GEMM then torch's add, the stream's other columns untouched."""
    torch.manual_seed(k - m)
    x, w = torch.randn(m, k, dtype=torch.float16), weights(k, n, layout)
    stream = torch.randn(m, n + 3, dtype=torch.float16)
    gemm = skinny.SkinnyGemm()
    apart = stream[:, :n] + gemm(x, w, cfg)
    y = stream.clone()
    assert gemm(x, w, cfg, out=y[:, :n], fold=ADD).data_ptr() == y.data_ptr()
    assert torch.equal(y[:, :n], apart) and torch.equal(y[:, n:], stream[:, n:])
    with pytest.raises(ValueError, match="needs it as out"):
        gemm(x, w, cfg, fold=ADD)
    with pytest.raises(ValueError, match="one contiguous weight per input column"):
        gemm(x, w, cfg, fold=NORM, norm_weight=torch.ones(k + 1, dtype=torch.float16))
    with pytest.raises(ValueError, match="its out is"):  # a stream of the wrong width
        gemm(x, w, cfg, out=stream, fold=ADD)


def test_a_fixed_weight_gemm_runs_the_kernel_where_a_tuned_one_falls_back():
    """On a CPU the tuned chooser runs the fallback (the separate kernels' torch math) and tunes
    nothing; a fixed configuration runs the folded kernel (interpreted): the same math."""
    torch.manual_seed(3)
    (x, g), w = norm_input(16, 384), weights(384, 160, "kn")
    w2, stream = weights(384, 320, "nk"), torch.randn(16, 384, dtype=torch.float16)
    w_down = weights(160, 384, "kn")
    fixed, fallback = skinny.WeightGemm(fixed=skinny.Config(32, 128, 2)), skinny.WeightGemm()
    for gemm_ in (fixed, fallback):
        gemm_.skinny = CountingGemm()
        y = stream.clone()
        gemm_.add_into(y, gemm_.gated(x, g, w2), w_down)
        gemm_.result = (gemm_.normed(x, g, w), y)
    for a, b in zip(fixed.result, fallback.result, strict=True):
        assert ((a.double() - b.double()).norm() / b.double().norm()).item() < 5e-3
    assert fixed.skinny.folds == [GATED, ADD, NORM] and not fallback.skinny.folds
    assert not fallback.choices and not fixed.choices


def test_more_rows_than_a_tile_is_a_clear_error():
    with pytest.raises(ValueError, match="skinny GEMM takes"):
        skinny.SkinnyGemm()(torch.zeros(65, 32), torch.zeros(32, 16), skinny.Config(16, 128, 1))


def test_the_engine_uses_torch_on_a_cpu_and_rejects_unknown_choices():
    assert weight_gemm("auto", torch.device("cpu")) is torch.matmul
    assert weight_gemm("cublas", torch.device("cpu")) is torch.matmul
    with pytest.raises(ValueError, match="gemm must be one of"):
        weight_gemm("cutlass", torch.device("cpu"))


def test_pdl_kernels_wait_prefetch_and_release_in_the_ptx_of_sm90_and_sm120():
    """Compiled for real (no GPU needed): with pdl the weight GEMM prefetches its weights to L2,
    then waits for the kernel before and lets the next one launch, in both weight layouts, and
    the per-head GEMM and the elementwise kernel wait and release; without pdl none of it is
    there."""
    script = Path(__file__).with_name("pdl_compile.py")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    for arch in (90, 120):
        done = subprocess.run(
            [sys.executable, str(script), str(arch)],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        found = json.loads(done.stdout.splitlines()[-1])
        for name, has in found.items():
            pdl = name.endswith("pdl=True")
            assert has["wait"] == pdl and has["launch_dependents"] == pdl, (arch, name)
            assert has["prefetch_l2"] == (pdl and name.startswith("gemm")), (arch, name)
            if pdl:  # nothing the kernel before may write is read before the wait
                assert has["loads_after_wait"], (arch, name)
                assert has["prefetch_before_wait"] == name.startswith("gemm"), (arch, name)


def prefetched_lines(cfg: skinny.Config, w: torch.Tensor, plan: dict) -> list[int]:
    """The L2 lines (byte offset // 128) the chained GEMM's prefetch asks for over its whole
    grid: the kernel's address arithmetic (``_prefetch_slice``, masked lanes ask nothing)."""
    k, n = w.shape
    k_share = math.ceil(math.ceil(k / cfg.split_k) / cfg.block_k) * cfg.block_k
    step = plan["PF_TK"] * plan["PF_STEP_K"]
    lines = []
    for pid_n in range(0, math.ceil(n / cfg.block_n), plan["PF_SHARE"]):
        cols = [pid_n * cfg.block_n + j * plan["PF_STEP_N"] for j in range(plan["PF_TN"])]
        for pid_k in range(cfg.split_k):
            begin = pid_k * k_share
            end = min(begin + plan["prefetch_k"], begin + k_share, k)
            for k0 in range(begin, end, step):
                rows = [k0 + i * plan["PF_STEP_K"] for i in range(plan["PF_TK"])]
                lines += [
                    (r * w.stride(0) + c * w.stride(1)) * w.element_size() // 128
                    for r in rows if r < end for c in cols if c < n
                ]  # fmt: skip
    return lines


@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize(("block_n", "split_k"), [(16, 4), (32, 2), (64, 1), (128, 1)])
def test_the_prefetch_asks_for_each_line_once_within_its_l2_budget(layout, block_n, split_k):
    """Slices narrower than a line share it: one of them fetches it, and the budget counts
    whole lines; each column slice's first rows are covered, in every layout."""
    k, n = 4096, 2112
    w = weights(k, n, layout).to(torch.bfloat16)
    cfg = skinny.Config(block_n, 128, split_k, pdl=True)
    budget = 4 << 20  # under the matrix's 16.5 MiB, so the rows prefetched are cut by it
    plan = skinny.prefetch_plan(cfg, w, budget)
    lines = prefetched_lines(cfg, w, plan)
    assert len(lines) == len(set(lines)) > 0  # every line once
    assert len(lines) * 128 <= budget
    assert len(lines) * 128 > budget // 2  # and most of the budget used
    # each program's first prefetched row holds its whole slice: row k_begin of every column,
    # in every K-split
    k_share = math.ceil(math.ceil(k / split_k) / cfg.block_k) * cfg.block_k
    firsts = range(0, k, k_share)
    every = {(r * w.stride(0) + c * w.stride(1)) * 2 // 128 for r in firsts for c in range(n)}
    assert every <= set(lines)
    assert skinny.prefetch_plan(skinny.Config(32, 256, 2), w)["prefetch_k"] == 0
    assert skinny.prefetch_plan(cfg, w, budget=0)["prefetch_k"] == 0  # --gemm-prefetch-mb 0


def test_the_pdl_gemm_tunes_over_chained_launches_only():
    gemm = skinny.WeightGemm(pdl=True)
    assert gemm.candidates and all(c.pdl for c in gemm.candidates)
    assert all(c.name.endswith("-pdl") for c in gemm.candidates)
    assert not any(c.pdl for c in skinny.WeightGemm().candidates)
    assert weight_gemm("pdl", torch.device("cpu")) is torch.matmul
    assert weight_gemm("cublas-pdl", torch.device("cpu")) is torch.matmul
    w = weights(7168, 4608, "kn").to(torch.bfloat16)
    chained = skinny.Config(32, 256, 2, pdl=True)
    options = skinny.WeightGemm(pdl=True).skinny.launch_options(chained, w)
    assert options["launch_pdl"] and options["prefetch_k"] > 0
    unfetched = skinny.WeightGemm(pdl=True, prefetch_bytes=0).skinny.launch_options(chained, w)
    assert unfetched["launch_pdl"] and unfetched["prefetch_k"] == 0  # --gemm-prefetch-mb 0
    # the tuning times a chained launch alone without its prefetch (a budget of 0 this launch)
    alone = skinny.WeightGemm(pdl=True).skinny.launch_options(chained, w, budget=0)
    assert alone["launch_pdl"] and alone["prefetch_k"] == 0
    assert skinny.SkinnyGemm().launch_options(skinny.Config(32, 256, 2), w) == {"prefetch_k": 0}


@pytest.mark.parametrize(("t", "heads", "k", "n"), [(16, 8, 128, 512), (5, 3, 512, 128)])
def test_the_head_gemm_is_a_bmm_into_strided_rows(t, heads, k, n):
    """The absorbed heads' projections: x [T, H, K] @ w [H, K, N] per head, written into a slice
    of wider rows (as the queries' latent part of [T, H, 576]), nothing beside it touched."""
    torch.manual_seed(t)
    x = torch.randn(t, heads, k + 64, dtype=torch.float16)[..., :k]  # a strided view, as q_nope
    w = torch.randn(heads, k, n, dtype=torch.float16) / k**0.5
    rows = torch.full((t, heads, n + 64), float("nan"), dtype=torch.float16)
    skinny.head_gemm(x, w, rows[..., :n], pdl=False)
    ref = torch.bmm(x.double().transpose(0, 1), w.double()).transpose(0, 1)
    assert ((rows[..., :n].double() - ref).norm() / ref.norm()).item() < 1e-3
    assert rows[..., n:].isnan().all()


@pytest.mark.parametrize("t", [16, 5])
def test_the_head_gemm_ropes_the_queries_rope_part_in_the_same_launch(t):
    """With ``rope``, the launch also writes rope(q_rope) beside the latent part of the [T, H,
    576] query rows: what the separate rope (fused.py's torch code) writes, to float32
    rounding, and the GEMM part unchanged."""
    from decodecliff.engine import fused

    heads, k, n, d = 8, 128, 512, 64
    torch.manual_seed(t)
    q = torch.randn(t, heads, k + d, dtype=torch.float32)  # q_b's output: nope | rope
    q_nope, q_rope = q.split([k, d], dim=-1)
    w = torch.randn(heads, k, n, dtype=torch.float32) / k**0.5
    cs = fused.RopeTable(d, 10000.0, torch.device("cpu"))
    cs.reserve(64)
    rows = cs.rows(torch.arange(40, 40 + t))
    plain = torch.full((t, heads, n + d), float("nan"))
    skinny.head_gemm(q_nope, w, plain[..., :n], pdl=False)
    fused.rope(q_rope, rows, plain[..., n:])
    folded = torch.full((t, heads, n + d), float("nan"))
    skinny.head_gemm(q_nope, w, folded[..., :n], pdl=False, rope=(q_rope, rows, folded[..., n:]))
    assert torch.equal(folded[..., :n], plain[..., :n])
    assert torch.allclose(folded[..., n:], plain[..., n:], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(folded[..., n:], q_rope, atol=1e-2)  # the rotation did something
    with pytest.raises(ValueError, match="rope takes"):
        skinny.head_gemm(q_nope, w, folded[..., :n], False, rope=(q_rope[:, :4], rows, q_rope))
    strided = q[..., ::3][..., :d]  # every third element of the rows
    with pytest.raises(ValueError, match="unit last stride"):
        skinny.head_gemm(q_nope, w, folded[..., :n], False, rope=(strided, rows, q_rope))


def test_a_head_gemm_of_mismatched_shapes_is_a_clear_error():
    with pytest.raises(ValueError, match="head GEMM takes"):
        skinny.head_gemm(torch.zeros(4, 2, 8), torch.zeros(3, 8, 16), torch.zeros(4, 2, 16), False)
