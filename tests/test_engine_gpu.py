"""The engine on a CUDA device: the full-size preset, CUDA graphs and defragmentation."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json

import pytest
import torch

from decodecliff.engine.config import PRESETS, EngineConfig
from decodecliff.engine.engine import Engine
from decodecliff.engine.model import StepInput, SyntheticMLA, layer_attention, mha_spans
from decodecliff.engine.request import SamplingParams

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

GREEDY = SamplingParams(max_new_tokens=16, ignore_eos=True)


def capturable_backends() -> list[str]:
    names = []
    for name, module in (("triton", "triton_baseline"), ("custom", "custom")):
        try:
            importlib.import_module(f"decodecliff.kernels.{module}")
            names.append(name)
        except ImportError:  # not installed here; any other error fails the module's collection
            pass
    return names


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 512, (n,), generator=g).tolist()
    return ids + ids[: n // 2]


def engine(**cfg) -> Engine:
    base = {"device": "cuda", "max_total_tokens": 8192, "chunk_size": 128, "tree_nodes": 16}
    return Engine(EngineConfig(**{**base, **cfg}))


def outputs(eng: Engine) -> list[list[int]]:
    return [r.output for r in eng.generate([prompt(300, 1), prompt(500, 2)], GREEDY)]


def run(**cfg) -> list[list[int]]:
    return outputs(engine(**cfg))


def test_kimi_rank_preset_is_finite_on_the_gpu():
    eng = Engine(
        EngineConfig(
            preset="kimi-k2-tp8-rank", device="cuda", max_total_tokens=4096, chunk_size=256
        )
    )
    req = eng.generate([prompt(600, 3)], SamplingParams(max_new_tokens=4, ignore_eos=True))[0]
    assert len(req.output) == 4
    assert torch.isfinite(eng.pool.cache[:, : eng.pool.pages_for(600)]).all()


@pytest.mark.parametrize("backend", capturable_backends())
@pytest.mark.parametrize("spec", ["none", "chain", "tree"])
def test_cuda_graphs_match_eager(backend, spec):
    eager = run(backend=backend, spec=spec)
    eng = engine(backend=backend, spec=spec, cuda_graph=True)
    assert outputs(eng) == eager
    assert eng.graphs.captured_shapes()  # replayed, not fallen back to eager
    assert not eng.graphs.uncapturable


@pytest.mark.parametrize("backend", capturable_backends())
@pytest.mark.parametrize("mb", [1, 64])
def test_the_l2_prefetch_branch_leaves_the_tokens_as_they_were(backend, mb):
    """The side stream's prefetch (a parallel branch of each layer in the graphs) writes nothing
    and is joined before the o GEMM: the same tokens, eager and replayed, as without it."""
    plain = run(backend=backend, spec="chain")
    eng = engine(backend=backend, spec="chain", cuda_graph=True, l2_overlap_mb=mb)
    assert eng.model.overlap is not None and eng.model.overlap.max_kv_tokens > 0
    assert outputs(eng) == plain
    assert eng.graphs.captured_shapes() and not eng.graphs.uncapturable
    assert run(backend=backend, spec="chain", l2_overlap_mb=mb) == plain


@pytest.mark.parametrize("backend", ["torch", *capturable_backends()])
def test_defrag_matches_on_the_gpu(backend):
    plain = run(backend=backend, scatter_seed=1)
    defrag = run(
        backend=backend, scatter_seed=1, defrag=True, defrag_threshold=0.0, defrag_interval=1
    )
    assert defrag == plain


def test_mha_prefill_gives_the_absorbed_path_s_tokens_on_the_gpu():
    assert run(dtype="float32", prefill_attention="mha") == run(dtype="float32")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_mha_prefill_layer_matches_at_kimi_shapes(dtype, tol):
    # One kimi-rank layer, a 512-token chunk after 3000 cached tokens (flash / mem-efficient SDPA).
    cfg = dataclasses.replace(PRESETS["kimi-k2-tp8-rank"], num_layers=1)
    model = SyntheticMLA(cfg, "cuda", dtype, seed=0)
    prefix, chunk, total = 3000, 512, 3512
    g = torch.Generator(device="cuda").manual_seed(1)
    cache = torch.randn(total, 1, cfg.kv_row_dim, device="cuda", generator=g).to(dtype)
    t = torch.arange(prefix, total, device="cuda")
    step = StepInput(
        input_ids=t,
        positions=t,
        out_slots=t,
        page_table=torch.arange(total, dtype=torch.int32, device="cuda")[None],
        kv_lens=torch.tensor([total], dtype=torch.int32, device="cuda"),
        q_indptr=torch.tensor([0, chunk], dtype=torch.int32, device="cuda"),
        tree_mask=None,
        max_q_len=chunk,
        max_kv_len=total,
    )
    h = torch.randn(chunk, cfg.hidden, device="cuda", generator=g).to(dtype)
    layer = model.layers[0]
    absorbed = layer_attention(model, layer, h, step, cache.clone())
    mha = layer_attention(model, layer, h, step, cache, mha_spans(step, 1))
    err = (mha.float() - absorbed.float()).norm() / absorbed.float().norm()
    assert err < tol


@pytest.mark.parametrize("backend", capturable_backends())
def test_mha_prefill_keeps_prefill_chunks_away_from_the_backend(backend):
    eng = engine(backend=backend, chunk_size=4096, prefill_attention="mha")
    real, q_lens = eng.backend.plan, []

    def recording(meta):
        q_lens.append(meta.max_q_len)
        return real(meta)

    eng.backend.plan = recording
    assert [len(o) for o in outputs(eng)] == [16, 16]
    assert set(q_lens) == {1}


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_fused_triton_kernels_match_their_torch_code(dtype, tol):
    from decodecliff.engine import fused

    g = torch.Generator(device="cuda").manual_seed(0)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=g).to(dtype)  # noqa: E731
    T, R, C, H = 16, 1536, 512, 8
    table = fused.RopeTable(64, 10000.0, torch.device("cuda"))
    table.reserve(4096)
    cs = table.rows(torch.randint(0, 4096, (T,), device="cuda", generator=g))
    close = lambda a, b: (a.float() - b.float()).abs().max() <= tol * b.float().abs().max()  # noqa: E731

    x, d, w = rnd(T, 7168), rnd(T, 7168), rnd(7168)
    x_ref = x.clone()
    ref = fused.rms_norm(x_ref.add_(d), w)
    assert close(fused.add_rms_norm(x, d, w), ref) and close(x, x_ref)  # residual updated

    qkv, qn, kvn = rnd(T, R + C + 64), rnd(R), rnd(C)
    slots = torch.randperm(64, device="cuda", generator=g)[:T]
    cache, cache_ref = torch.zeros(64, 576, device="cuda", dtype=dtype), None
    cq = fused.qkv_a_post(qkv, qn, kvn, cs, cache, slots)
    cache_ref = torch.zeros_like(cache)
    cache_ref[slots] = torch.cat(
        [fused.rms_norm(qkv[:, R : R + C], kvn), fused._rope_torch(qkv[:, R + C :], cs)], -1
    )
    assert close(cq, fused.rms_norm(qkv[:, :R], qn)) and close(cache, cache_ref)

    q = rnd(T, H, 192)
    out = torch.zeros(T, H, 576, device="cuda", dtype=dtype)
    fused.rope(q[..., 128:], cs, out[..., 512:])
    assert close(out[..., 512:], fused._rope_torch(q[..., 128:], cs))
    assert not out[..., :512].any()  # nothing written outside the rope columns

    gu = rnd(T, 2 * 2304)
    ref = torch.nn.functional.silu(gu[:, :2304]) * gu[:, 2304:]
    assert close(fused.silu_mul(gu), ref)


needs_pdl = pytest.mark.skipif(
    torch.cuda.get_device_capability() < (9, 0), reason="programmatic dependent launch: sm_90+"
)


def _mlp_chain(x, w1, norm, w2, w3, pdl: bool) -> torch.Tensor:
    """GEMM -> RMSNorm -> GEMM -> silu*mul -> split-K GEMM, each reading the one before."""
    from decodecliff.engine import fused_triton
    from decodecliff.engine.skinny_gemm import Config, SkinnyGemm

    gemm = SkinnyGemm()
    h = fused_triton.add_rms_norm(gemm(x, w1, Config(32, 256, 1, pdl=pdl)), None, norm, 1e-6, pdl)
    gate_up = gemm(h, w2, Config(64, 256, 2, pdl=pdl))
    return gemm(fused_triton.silu_mul(gate_up, pdl), w3, Config(16, 256, 4, pdl=pdl))


@needs_pdl
def test_a_pdl_chain_computes_what_plain_launches_do():
    """The chain launched as programmatic dependents, eagerly and replayed from a CUDA graph, is
    bit-identical to the same kernels launched one after another: a kernel that read its input
    before the one writing it had finished would differ."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device="cuda").div(shape[0] ** 0.5).bfloat16()

    x, w1, norm = rand(16, 2048), rand(2048, 4096), rand(4096).abs()
    w2, w3 = rand(8192, 4096).t(), rand(4096, 2048)  # gate|up stored N-major
    plain = _mlp_chain(x, w1, norm, w2, w3, pdl=False)
    assert torch.isfinite(plain).all() and plain.abs().max() > 0
    # the allocator's reused blocks now hold another input's values, not the answer's
    _mlp_chain(-x, w1, norm, w2, w3, pdl=True)
    assert torch.equal(_mlp_chain(x, w1, norm, w2, w3, pdl=True), plain)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _mlp_chain(x, w1, norm, w2, w3, pdl=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _mlp_chain(x, w1, norm, w2, w3, pdl=True)
    out.fill_(float("nan"))
    graph.replay()
    assert torch.equal(out, plain)


@needs_pdl
@pytest.mark.parametrize("gemm", ["pdl", "cublas-pdl"])
@pytest.mark.parametrize("backend", capturable_backends())
def test_the_pdl_engine_s_graphs_give_its_eager_tokens(backend, gemm):
    eager_engine = engine(backend=backend, spec="chain", gemm=gemm)
    eager = outputs(eager_engine)
    eng = engine(backend=backend, spec="chain", gemm=gemm, cuda_graph=True)
    if gemm == "pdl":
        eng.model.mm.choices.update(eager_engine.model.mm.choices)  # the same kernel per shape
    assert outputs(eng) == eager
    assert eng.graphs.captured_shapes() and not eng.graphs.uncapturable
    assert eng.model.pdl
    if gemm == "pdl":
        assert {c["impl"] for c in eng.model.mm.describe()} == {"triton"}
        assert not eng.model.mm.untuned_in_capture  # no cuBLAS GEMM in the graphs
    else:
        assert eng.model.mm is torch.matmul


@needs_pdl
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_a_chained_gemm_of_ragged_shapes_matches_its_plain_launch(layout):
    """Ragged K and N (the prefetch's masks) and split-K back to back on one workspace: the same
    bits as the plain launch, every ticket re-armed."""
    from decodecliff.engine.skinny_gemm import Config, SkinnyGemm

    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(5, 3000, generator=g, device="cuda").bfloat16()
    w = torch.randn(3000, 1000, generator=g, device="cuda").bfloat16()
    w = w if layout == "kn" else w.t().contiguous().t()
    gemm = SkinnyGemm()
    for cfg in (Config(32, 256, 4), Config(16, 128, 3)):
        plain = gemm(x, w, cfg)
        chained = dataclasses.replace(cfg, pdl=True)
        first, second = gemm(x, w, chained), gemm(-x, w, chained)
        assert torch.equal(first, plain) and torch.equal(second, -plain)
        assert not gemm.scratch(chained, 5, 1000, x.device)[-1].any()  # tickets


@needs_pdl
@pytest.mark.parametrize("backend", capturable_backends())
def test_a_chained_forward_is_bit_identical_to_its_kernels_launched_plainly(backend):
    """Every kernel of the step chained (the GEMMs, the per-head GEMMs, the elementwise kernels
    and, for the custom backend, attention and its combine launched as dependents) against the
    same kernels with the same configurations launched one after another: the same bits."""
    from test_model_fused import verify_step

    from decodecliff.engine.skinny_gemm import head_gemm
    from decodecliff.kernels.registry import get_backend

    cfg = dataclasses.replace(PRESETS["tiny"], num_layers=3)
    model = SyntheticMLA(cfg, "cuda", torch.bfloat16, seed=5, gemm="pdl")
    step, pages = verify_step([300, 41], 16, 1, False, seed=3)
    step = dataclasses.replace(
        step, **{f.name: getattr(step, f.name).cuda() for f in dataclasses.fields(step)
                 if isinstance(getattr(step, f.name), torch.Tensor)},
    )  # fmt: skip
    g = torch.Generator(device="cuda").manual_seed(2)
    cache = torch.randn(3, pages, 1, cfg.kv_row_dim, generator=g, device="cuda").bfloat16()
    attention = get_backend(backend)
    chained = model.forward(step, cache.clone(), attention)
    model.pdl = False
    model.heads_mm = lambda x, w, out, rope=None: head_gemm(x, w, out, pdl=False, rope=rope)
    model.mm.choices = {
        key: c and dataclasses.replace(c, pdl=False) for key, c in model.mm.choices.items()
    }
    plain = model.forward(step, cache.clone(), attention)
    assert torch.isfinite(plain).all()
    assert torch.equal(chained, plain)


def test_bench_engine_folds_each_step_s_kernels_by_layer(tmp_path):
    from decodecliff.bench import engine as bench

    out = tmp_path / "engine.json"
    argv = ["--device", "cuda", "--preset", "tiny", "--backends", "triton", "--contexts", "256"]
    argv += ["--paths", "graphs", "eager", "--repeats", "2", "--out", str(out)]
    assert bench.cli(argv) == 0
    doc = json.loads(out.read_text())
    layers = PRESETS["tiny"].num_layers
    for row in doc["rows"]:  # graph replay and eager: each step's layers found and named
        folded = row["timeline"]
        kernels = [k["kernel"] for k in folded["layer"]]
        assert "_add_rms_norm_kernel" in kernels and "_qkv_a_post_kernel" in kernels
        assert folded["kernels"] > layers * len(kernels)
        assert 0 < folded["busy_us"] <= folded["span_us"]
    graphs, eager = doc["rows"]
    assert graphs["path"] == "graphs" and eager["path"] == "eager"
    noop = [k["kernel"] for k in eager["profile"]["timeline"]["layer"]]  # no attention kernels
    assert set(noop) < {k["kernel"] for k in eager["timeline"]["layer"]}


@needs_pdl
@pytest.mark.parametrize("t", [16, 5, 64])
def test_the_folded_rope_writes_what_the_rope_kernel_writes(t):
    """The per-head GEMM with the queries' rope folded in, compiled, plain and chained: the
    latent part bit for bit the head GEMM's alone, the rope part the separate rope kernel's (to
    bf16 rounding: the two kernels may contract the products differently)."""
    from decodecliff.engine import fused, fused_triton
    from decodecliff.engine.skinny_gemm import head_gemm

    g = torch.Generator(device="cuda").manual_seed(t)
    q = torch.randn(t, 8, 192, generator=g, device="cuda").bfloat16()
    q_nope, q_rope = q.split([128, 64], dim=-1)
    w = (torch.randn(8, 128, 512, generator=g, device="cuda") / 128**0.5).bfloat16()
    table = fused.RopeTable(64, 10000.0, torch.device("cuda"))
    table.reserve(4096)
    cs = table.rows(torch.arange(1000, 1000 + t, device="cuda"))
    apart = torch.full((t, 8, 576), float("nan"), device="cuda", dtype=torch.bfloat16)
    head_gemm(q_nope, w, apart[..., :512], pdl=False)
    fused_triton.rope(q_rope, cs, apart[..., 512:], False)
    for pdl in (False, True):
        folded = torch.full_like(apart, float("nan"))
        head_gemm(q_nope, w, folded[..., :512], pdl=pdl, rope=(q_rope, cs, folded[..., 512:]))
        assert torch.equal(folded[..., :512], apart[..., :512])
        assert not folded.isnan().any()
        torch.testing.assert_close(folded[..., 512:], apart[..., 512:], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("backend", capturable_backends())
def test_auto_tunes_the_per_head_gemms_and_its_graphs_give_its_eager_tokens(backend):
    """gemm auto: each per-head shape (with and without the queries' rope) takes the faster of
    torch's bmm + the rope kernel and the Triton kernel with the rope folded in, the down
    projection the faster of silu_mul + cuBLAS and the Triton GEMM making silu * up as it loads,
    tuned eagerly; with the same choices the graphs replay the eager step's kernels: the same
    tokens."""
    eager_engine = engine(backend=backend, spec="chain", gemm="auto")
    eager = outputs(eager_engine)
    choices = eager_engine.model.heads_mm.describe()
    assert {c["rope"] for c in choices} == {True, None}  # rope fits the kernel; no rope
    assert {c["impl"] for c in choices} <= {"triton-heads", "bmm"}
    tuned = eager_engine.model.mm.describe()
    tiles = {c["m_tile"] for c in tuned}  # one request's rows, or both requests'
    assert sorted(c["m_tile"] for c in tuned if c["glu"]) == sorted(tiles)  # the down GEMM's
    eng = engine(backend=backend, spec="chain", gemm="auto", cuda_graph=True)
    eng.model.mm.choices.update(eager_engine.model.mm.choices)
    eng.model.heads_mm.choices.update(eager_engine.model.heads_mm.choices)
    assert outputs(eng) == eager
    assert not eng.model.heads_mm.untuned_in_capture


def _heads_case(t: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, 8, 192, generator=g, device="cuda").bfloat16()
    w = (torch.randn(8, 128, 512, generator=g, device="cuda") / 128**0.5).bfloat16()
    cs = torch.rand(t, 64, generator=g, device="cuda")
    return x[..., :128], w, x[..., 128:], cs


@pytest.mark.parametrize("t", [16, 5])
def test_the_tuned_per_head_gemm_runs_what_it_chose(t):
    """After tuning, a call runs the chosen kernel (the Triton kernel with the rope folded in, or
    bmm + the rope kernel): its bits, every element written."""
    from decodecliff.engine import skinny_gemm
    from decodecliff.engine.model import head_gemm

    tuned = head_gemm("auto", torch.device("cuda"))
    q_nope, w, q_rope, cs = _heads_case(t, seed=t)
    first = torch.full((t, 8, 576), float("nan"), device="cuda", dtype=torch.bfloat16)
    tuned(q_nope, w, first[..., :512], rope=(q_rope, cs, first[..., 512:]))
    (choice,) = tuned.describe()
    again, direct = (torch.full_like(first, float("nan")) for _ in range(2))
    tuned(q_nope, w, again[..., :512], rope=(q_rope, cs, again[..., 512:]))
    run = (
        functools.partial(skinny_gemm.head_gemm, pdl=False)
        if choice["impl"] == "triton-heads"
        else tuned.fallback
    )
    run(q_nope, w, direct[..., :512], rope=(q_rope, cs, direct[..., 512:]))
    assert not again.isnan().any() and torch.equal(again, direct)


def _candidates_look_fastest(monkeypatch) -> None:
    """The tuning's clock made to say every candidate beats the fallback (timed first), so only
    the correctness check can refuse one."""
    from decodecliff.bench import timing

    times = iter([1.0] + [1e-3] * 1000)
    monkeypatch.setattr(timing, "graph_median_ms", lambda *args, **kwargs: next(times))


def test_the_per_head_tuning_refuses_a_kernel_that_leaves_elements_unwritten(monkeypatch):
    """A fault no real input causes: a per-head kernel that writes only half its output, the
    other half keeping what was there (the fallback's right answer, unless the tuning poisons
    the outputs first). Timed as the fastest, it is still refused: the shape keeps the bmm."""
    from decodecliff.engine import skinny_gemm
    from decodecliff.engine.model import head_gemm

    real = skinny_gemm.head_gemm

    def half_written(x, w, out, pdl, rope=None):
        full = real(x, w, torch.empty_like(out), pdl)
        half = out.shape[2] // 2
        out[:, :, :half] = full[:, :, :half]
        return out

    monkeypatch.setattr(skinny_gemm, "head_gemm", half_written)
    _candidates_look_fastest(monkeypatch)
    tuned = head_gemm("auto", torch.device("cuda"))
    q_nope, w, _, _ = _heads_case(16, seed=3)
    out = torch.empty(16, 8, 512, device="cuda", dtype=torch.bfloat16)
    tuned(q_nope, w, out)
    assert [c["impl"] for c in tuned.describe()] == ["bmm"]
    assert not out.isnan().any()


def test_the_gemm_tuning_refuses_a_kernel_that_leaves_elements_unwritten(monkeypatch):
    """The same fault in the weight GEMM: every configuration writes half the columns into a
    buffer that holds the right answer (as a reused allocation could). Timed as the fastest,
    none is picked (their outputs poisoned first): the shape keeps cuBLAS."""
    from decodecliff.engine.skinny_gemm import SkinnyGemm, WeightGemm

    class HalfWritten(SkinnyGemm):
        def __call__(self, x, w, cfg, out=None, **options):
            full = super().__call__(x, w, cfg, **options)
            out = x @ w if out is None else out
            out[:, : out.shape[1] // 2] = full[:, : out.shape[1] // 2]
            return out

    _candidates_look_fastest(monkeypatch)
    gemm = WeightGemm()
    gemm.skinny = HalfWritten()
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(16, 1024, generator=g, device="cuda").bfloat16()
    w = torch.randn(1024, 512, generator=g, device="cuda").bfloat16()
    assert torch.equal(gemm(x, w), x @ w)
    assert [c["impl"] for c in gemm.describe()] == ["cublas"]


def test_the_gemm_bench_times_cublas_cublaslt_and_the_triton_kernel(tmp_path):
    from decodecliff.bench import engine as bench

    out = tmp_path / "gemms.json"
    before = torch.backends.cuda.preferred_blas_library()
    argv = ["--device", "cuda", "--preset", "tiny", "--parts", "gemms", "--repeats", "1"]
    assert bench.cli([*argv, "--tree-nodes", "16", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["gemms"]["rows"]
    ok = {r["impl"] for r in rows if r["status"] == "ok"}
    assert ok == {"cublas", "cublaslt", "triton"}
    assert torch.backends.cuda.preferred_blas_library() == before  # switched for its rows only


# The folded weight GEMMs (--gemm fused): scripts/gpu_backends_run.sh's engine-fused part runs
# the tests named test_gemm_fold_*.


@pytest.mark.parametrize("backend", capturable_backends())
def test_gemm_fold_engine_graphs_give_its_eager_tokens(backend):
    """gemm fused: the normed projections (q_a|kv_a, the LM head), gate|up and the two adding
    ones (o, down) are chosen as folds (against cuBLAS with the separate kernels) eagerly, q_b
    plainly; with the same choices the graphs replay the eager step's kernels: the same
    tokens."""
    eager_engine = engine(backend=backend, spec="chain", gemm="fused")
    eager = outputs(eager_engine)
    tuned = eager_engine.model.mm.describe()
    folds = {(c["norm"], c["gate_up"], c["add"]) for c in tuned}
    plain, normed, gated, added = (False,) * 3, (True, False, False), (True, True, False), (
        False, False, True)  # fmt: skip
    assert folds == {plain, normed, gated, added}
    eng = engine(backend=backend, spec="chain", gemm="fused", cuda_graph=True)
    eng.model.mm.choices.update(eager_engine.model.mm.choices)
    eng.model.heads_mm.choices.update(eager_engine.model.heads_mm.choices)
    assert outputs(eng) == eager
    assert not eng.model.mm.untuned_in_capture


def test_gemm_fold_forward_matches_the_unfused_one_at_kimi_shapes():
    """The Kimi-K2 rank's layers, bf16, a chain of 16 on 2 requests: the folded projections
    (every projection the Triton kernel at one configuration) give the unfused forward's
    logits to bf16 rounding."""
    from test_model_fused import verify_step
    from test_skinny_gemm import CountingGemm

    from decodecliff.engine.projections import FoldedProjections, Projections
    from decodecliff.engine.skinny_gemm import Config, WeightGemm
    from decodecliff.kernels.reference import TorchAttention

    cfg = dataclasses.replace(PRESETS["kimi-k2-tp8-rank"], num_layers=4, vocab_size=4096)
    model = SyntheticMLA(cfg, "cuda", torch.bfloat16, seed=3)
    step, pages = verify_step([300, 41], 16, 1, False, seed=4)
    step = StepInput(**{k: v.cuda() if torch.is_tensor(v) else v for k, v in vars(step).items()})
    g = torch.Generator(device="cuda").manual_seed(5)
    cache = torch.randn(cfg.num_layers, pages, 1, cfg.kv_row_dim, generator=g, device="cuda")
    cache = cache.bfloat16()
    model.mm, model.proj = torch.matmul, Projections(torch.matmul)
    ref = model.forward(step, cache.clone(), TorchAttention())
    gemm = WeightGemm(fixed=Config(16, 128, 2))
    gemm.skinny = CountingGemm()
    model.mm, model.proj = gemm, FoldedProjections(gemm)
    folded = model.forward(step, cache.clone(), TorchAttention())
    assert (folded - ref).abs().max() <= 3e-2 * ref.abs().max()
    assert len(gemm.skinny.folds) == 5 * cfg.num_layers + 1  # every projection a Triton launch


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_gemm_fold_kernels_compute_the_separate_kernels_math(layout):
    """Each fold against the kernels it replaces, compiled (ragged K and N, split-K and not):
    gate|up and the residual add the same bits as the GEMM then silu_mul or the add; the norm
    to bf16 rounding of the norm kernel then the GEMM."""
    from decodecliff.engine import fused_triton
    from decodecliff.engine.skinny_gemm import Config, Fold, SkinnyGemm

    g = torch.Generator(device="cuda").manual_seed(6)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device="cuda").bfloat16()

    def stored(w: torch.Tensor) -> torch.Tensor:
        return w if layout == "kn" else w.t().contiguous().t()

    x, nw = rand(5, 3000) * 3, rand(3000).abs() + 0.5
    w, w2, stream = stored(rand(3000, 1000) / 50), stored(rand(3000, 2000) / 50), rand(5, 1000)
    gemm = SkinnyGemm()
    for cfg in (Config(32, 256, 4), Config(16, 128, 1), Config(16, 128, 3)):
        normed = gemm(x, w, cfg, fold=Fold(norm=True), norm_weight=nw)
        apart = gemm(fused_triton.add_rms_norm(x, None, nw, 1e-6, False), w, cfg)
        torch.testing.assert_close(normed, apart, rtol=2e-2, atol=2e-2 * apart.abs().max().item())
        gated = gemm(x, w2, cfg, fold=Fold(gate_up=True))
        assert torch.equal(gated, fused_triton.silu_mul(gemm(x, w2, cfg), False))
        added = stream.clone()
        gemm(x, w, cfg, out=added, fold=Fold(add=True))
        assert torch.equal(added, stream + gemm(x, w, cfg))


def _fold_case(seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).bfloat16()

    x, norm = rand(16, 1024), rand(1024).abs() + 0.5
    w, w2 = rand(1024, 512, scale=1e-3), rand(1024, 1024, scale=0.03)
    return x, norm, w, w2, rand(16, 512, scale=10)


def test_gemm_fold_choice_is_the_kernel_where_it_is_fastest(monkeypatch):
    """With every candidate timed as faster than the fallback, each fold (the norm, gate|up
    with the norm, the add) chooses the Triton kernel and runs it: a positive control for the
    refusals below, and the stream the add is tuned on is a copy (the real one changes once)."""
    from decodecliff.engine import fused_triton
    from decodecliff.engine.skinny_gemm import WeightGemm

    x, norm, w, w2, stream = _fold_case(8)
    gemm = WeightGemm()
    _candidates_look_fastest(monkeypatch)
    normed = gemm.normed(x, norm, w)
    _candidates_look_fastest(monkeypatch)
    gated = gemm.gated(x, norm, w2)
    _candidates_look_fastest(monkeypatch)
    y = stream.clone()
    gemm.add_into(y, x, w)
    assert [c["impl"] for c in gemm.describe()] == ["triton"] * 3
    h = fused_triton.add_rms_norm(x, None, norm, 1e-6, False)
    for got, want in ((normed, h @ w), (gated, fused_triton.silu_mul(h @ w2, False))):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
    torch.testing.assert_close(y.float(), (stream + x @ w).float(), rtol=1e-2, atol=1e-3)


def test_gemm_fold_add_check_refuses_a_kernel_that_adds_half_its_columns(monkeypatch):
    """An adding configuration is checked on a zero stream with a random input: one that adds
    to half the columns (the rest keep the stream's values, close to the sum here, where the
    product is small) is refused though timed as the fastest; the shape keeps cuBLAS and the
    add."""
    from decodecliff.engine.skinny_gemm import SkinnyGemm, WeightGemm

    class HalfAdded(SkinnyGemm):
        def __call__(self, x, w, cfg, out=None, **options):
            half = out[:, : out.shape[1] // 2]
            super().__call__(x, w[:, : half.shape[1]], cfg, out=half, **options)
            return out

    _candidates_look_fastest(monkeypatch)
    gemm = WeightGemm()
    gemm.skinny = HalfAdded()
    x, _, w, _, stream = _fold_case(7)
    y = stream.clone()
    gemm.add_into(y, x, w)
    assert torch.equal(y, stream + x @ w)
    assert [c["impl"] for c in gemm.describe()] == ["cublas"]
