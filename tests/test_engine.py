"""The engine in-process on CPU (tiny preset): exactness of chunking, batching and speculation."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from decodecliff.engine.config import PRESETS, EngineConfig
from decodecliff.engine.engine import Engine
from decodecliff.engine.kv_pool import PageAllocator, PoolExhausted, page_breaks
from decodecliff.engine.model import StepInput, SyntheticMLA, layer_attention, mha_spans
from decodecliff.engine.request import Request, SamplingParams
from decodecliff.engine.spec import DraftTree, NgramDrafter, accept_chain, accept_tree
from decodecliff.kernels.reference import TorchAttention

GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_thread")


def prompt(n: int, seed: int, repeat: bool = True) -> list[int]:
    """Random tokens; with repeat the second half copies the first so n-gram drafts can hit."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, PRESETS["tiny"].vocab_size, (n,), generator=g).tolist()
    return ids + ids[: n // 2] if repeat else ids


def engine(**overrides) -> Engine:
    cfg = {"max_total_tokens": 4096, "chunk_size": 64, "draft_len": 6, "tree_nodes": 16}
    return Engine(EngineConfig(**{**cfg, **overrides}))


def outputs(eng: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list:
    return [r.output for r in eng.generate(prompts, params)]


@pytest.fixture(scope="module")
def plain() -> list[list[int]]:
    return outputs(engine(), [prompt(90, 1), prompt(150, 2)])


def test_plain_decode_gives_requested_tokens(plain):
    assert [len(o) for o in plain] == [24, 24]
    assert all(0 <= t < PRESETS["tiny"].vocab_size for o in plain for t in o)


@pytest.mark.parametrize(
    "overrides",
    [
        {"chunk_size": 7},
        {"chunk_size": 4096},
        {"page_size": 16},
        {"page_size": 3, "scatter_seed": 5},
        {"max_running_requests": 1},
    ],
    ids=["chunk7", "one-chunk", "page16", "page3-scattered", "one-at-a-time"],
)
def test_layout_and_scheduling_do_not_change_outputs(plain, overrides):
    assert outputs(engine(**overrides), [prompt(90, 1), prompt(150, 2)]) == plain


def test_batched_requests_equal_solo_runs(plain):
    eng = engine(scatter_seed=3)
    solo = [outputs(eng, [prompt(90, 1)])[0], outputs(eng, [prompt(150, 2)])[0]]
    assert solo == plain
    assert eng.pool.allocator.num_free == eng.pool.num_pages  # everything given back


@pytest.mark.parametrize("spec", ["chain", "tree"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_speculative_decoding_equals_plain_greedy(plain, spec, page_size):
    eng = engine(spec=spec, page_size=page_size, scatter_seed=11)
    reqs = eng.generate([prompt(90, 1), prompt(150, 2)], GREEDY)
    assert [r.output for r in reqs] == plain
    for r in reqs:
        meta = r.meta_info()
        assert meta["spec_verify_ct"] == len(r.verify_ms) > 0
        assert 1.0 <= meta["spec_accept_length"] <= eng.cfg.spec_tokens
        assert meta["verify_step_ms"] > 0
    assert eng.pool.allocator.num_free == eng.pool.num_pages


def test_speculation_accepts_more_than_one_token_on_repetitive_text():
    # A model that repeats itself: prompt lookup must then accept whole drafts.
    eng = engine(spec="chain")
    req = eng.generate([[7, 8, 9] * 30], SamplingParams(max_new_tokens=48, ignore_eos=True))[0]
    plain_req = engine().generate(
        [[7, 8, 9] * 30], SamplingParams(max_new_tokens=48, ignore_eos=True)
    )
    assert req.output == plain_req[0].output
    if len(set(req.output[-12:])) <= 3:  # the target settled into a short cycle
        assert req.meta_info()["spec_accept_length"] > 1.5


@pytest.mark.parametrize("spec", ["chain", "tree"])
def test_accepted_tokens_count_only_the_tokens_kept(spec):
    # At 30 tokens the last verify step of this prompt accepts more drafts than the request has
    # room for: the tokens past the limit are dropped, and must not count as accepted.
    eng = engine(spec=spec)
    req = eng.generate([[7, 8, 9] * 30], SamplingParams(max_new_tokens=30, ignore_eos=True))[0]
    meta = req.meta_info()
    assert meta["completion_tokens"] == 30
    # every token but the prefill's first comes from a verify step
    assert meta["spec_accepted_tokens"] == 29
    assert meta["spec_accept_length"] == 29 / meta["spec_verify_ct"]


def test_sampling_is_seeded_and_speculation_keeps_it():
    params = SamplingParams(max_new_tokens=16, temperature=1.0, ignore_eos=True, seed=42)
    a = outputs(engine(), [prompt(60, 4)], params)
    b = outputs(engine(), [prompt(60, 4)], params)
    greedy = outputs(engine(), [prompt(60, 4)])
    assert a == b
    assert a != [greedy[0][:16]]


def test_stop_token_and_eos_finish_early(plain):
    stop = plain[0][5]
    params = SamplingParams(max_new_tokens=24, stop_token_ids=frozenset({stop}))
    req = engine().generate([prompt(90, 1)], params)[0]
    eos = PRESETS["tiny"].eos_token_id
    first = min(i for i, t in enumerate(plain[0]) if t in (stop, eos))
    assert req.output == plain[0][: first + 1]
    assert req.finish_reason == {"type": "stop", "matched": plain[0][first]}


def test_worst_case_booking_queues_what_does_not_fit_the_pool():
    # At new_token_ratio 1 each request books 80 + 120 slots; 300 fit one at a time, so the
    # second waits its turn and nothing is ever retracted.
    eng = engine(max_total_tokens=300, new_token_ratio=1.0)
    params = SamplingParams(max_new_tokens=120, ignore_eos=True)
    alone = [outputs(engine(), [prompt(80, s)], params)[0] for s in (1, 2)]
    reqs = eng.generate([prompt(80, 1), prompt(80, 2)], params)
    assert [r.finish_reason["type"] for r in reqs] == ["length", "length"]
    assert [r.output for r in reqs] == alone
    assert reqs[1].first_token_at >= reqs[0].finished_at  # queued, not interleaved
    assert eng.retractions == 0
    assert eng.pool.allocator.num_free == eng.pool.num_pages


LONG = SamplingParams(max_new_tokens=60, ignore_eos=True)


@pytest.fixture(scope="module")
def long_prompts() -> list[list[int]]:
    return [prompt(30, seed) for seed in range(4)]  # 45 tokens each, repetitive for drafts


@pytest.fixture(scope="module")
def long_alone(long_prompts) -> list[list[int]]:
    return [outputs(engine(), [p], LONG)[0] for p in long_prompts]


@pytest.mark.parametrize("spec", ["none", "chain", "tree"])
def test_long_generations_outgrowing_the_pool_are_retracted_and_recomputed(
    long_prompts, long_alone, spec
):
    # Four requests of 105 tokens each in 200 slots: admitted on their next step alone (ratio
    # 0), they outgrow the pool; the youngest are retracted and recomputed, tokens unchanged.
    eng = engine(spec=spec, max_total_tokens=200, new_token_ratio=0.0)
    reqs = eng.generate(long_prompts, LONG)
    assert [r.output for r in reqs] == long_alone
    assert eng.retractions == sum(r.retractions for r in reqs) > 0
    assert eng.stats().retractions == eng.retractions
    assert [r.meta_info()["retractions"] for r in reqs] == [r.retractions for r in reqs]
    assert eng.pool.allocator.num_free == eng.pool.num_pages
    if spec != "none":  # a recomputed request emits nothing until the verify step it left
        assert [r.accepted for r in reqs] == [len(r.output) - 1 for r in reqs]


@pytest.mark.parametrize("spec", ["none", "chain", "tree"])
def test_a_retracted_request_samples_the_tokens_it_would_have(long_prompts, spec):
    # A verify step draws one sample per query row: the recomputed request must resume at the
    # step it left, not sample its next token in the prefill, or its generator's stream shifts.
    params = dataclasses.replace(LONG, temperature=0.9, seed=7)
    alone = [outputs(engine(spec=spec), [p], params)[0] for p in long_prompts]
    eng = engine(spec=spec, max_total_tokens=200, new_token_ratio=0.0)
    reqs = eng.generate(long_prompts, params)
    assert [r.output for r in reqs] == alone
    assert eng.retractions > 0
    assert eng.pool.allocator.num_free == eng.pool.num_pages
    if spec != "none":  # every token but the prompt prefill's first came from a verify step
        assert [r.accepted for r in reqs] == [len(r.output) - 1 for r in reqs]


def test_the_youngest_running_request_is_the_one_retracted():
    # 80, 90 and 70 slots at the end: the three outgrow 200 slots, the first two fit. The last
    # to arrive gives its KV back (whatever its length), then runs when the pool has room.
    eng = engine(max_total_tokens=200, new_token_ratio=0.0)
    params = SamplingParams(max_new_tokens=60, ignore_eos=True)
    lens = (20, 30, 10)
    reqs = eng.generate([prompt(n, n, repeat=False) for n in lens], params)
    assert [r.retractions for r in reqs] == [0, 0, 1]
    assert [len(r.output) for r in reqs] == [60, 60, 60]


def test_admission_books_the_next_step_plus_a_share_of_the_rest():
    fresh = Request(prompt=[1] * 100, params=SamplingParams(max_new_tokens=201))
    chain = engine(new_token_ratio=0.5, spec="chain")  # verify steps of 6 tokens
    assert chain._booked_tokens(fresh) == 100 + 6 + 100  # prompt, first step, half of 200 left
    worst = engine(new_token_ratio=1.0, spec="chain")
    assert worst._booked_tokens(fresh) == fresh.params.needed_tokens(100, 6)


def test_device_out_of_memory_aborts_the_step_and_recovers(monkeypatch):
    # torch's OOM cannot be caused on purpose on a CPU: this is the one mocked fault.
    eng = engine()
    real = eng.model.forward
    calls = {"n": 0}

    def flaky(step, cache, backend):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(step, cache, backend)

    monkeypatch.setattr(eng.model, "forward", flaky)
    req = eng.generate([prompt(90, 1)], GREEDY)[0]
    assert req.finish_reason["type"] == "abort" and req.status == 503
    assert eng.pool.allocator.num_free == eng.pool.num_pages
    assert len(outputs(eng, [prompt(90, 1)])[0]) == 24


def test_check_rejects_impossible_requests():
    eng = engine(max_total_tokens=256, spec="chain")
    with pytest.raises(ValueError, match="max_total_num_tokens"):
        eng.check([1] * 200, SamplingParams(max_new_tokens=56))
    eng.check([1] * 200, SamplingParams(max_new_tokens=51))
    with pytest.raises(ValueError, match="vocabulary"):
        eng.check([1, 512], GREEDY)
    with pytest.raises(ValueError, match="empty"):
        eng.check([], GREEDY)


def test_a_refused_generate_call_queues_none_of_its_prompts():
    eng = engine(max_total_tokens=256)
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    with pytest.raises(ValueError, match="exceeds max_total_num_tokens"):
        eng.generate([[5] * 20, [5] * 300], params)  # the second can never fit
    assert eng.stats().queued == 0
    short = SamplingParams(max_new_tokens=2, ignore_eos=True)
    assert [len(r.output) for r in eng.generate([[6] * 20], short)] == [2]
    # nothing of the refused call runs on, holding pages, after the next call returns
    assert eng.running == [] and not eng.waiting
    assert eng.pool.allocator.num_free == eng.pool.num_pages


def test_bad_config_is_rejected_clearly():
    with pytest.raises(ValueError, match="tree nodes"):
        EngineConfig(spec="tree", tree_nodes=8).validate()
    with pytest.raises(ValueError, match="CUDA"):
        EngineConfig(cuda_graph=True, device="cpu").validate()
    for nan in ({"new_token_ratio": math.nan}, {"defrag": True, "defrag_threshold": math.nan}):
        with pytest.raises(ValueError, match="must be a number, not nan"):
            EngineConfig(**nan).validate()  # no bound catches it: every comparison is false
    with pytest.raises(ValueError, match="l2 overlap mb must be in 0..64"):
        EngineConfig(l2_overlap_mb=65, device="cuda").validate()
    with pytest.raises(ValueError, match="--l2-overlap-mb needs a CUDA device"):
        EngineConfig(l2_overlap_mb=8, device="cpu").validate()
    for seed in ({"seed": 10**23}, {"seed": -1}, {"scatter_seed": 2**63}):  # torch's are 64-bit
        with pytest.raises(ValueError, match="seed must be in 0..4611686018427387904"):
            EngineConfig(**seed).validate()


def test_sixty_one_layers_stay_finite():
    cfg = dataclasses.replace(PRESETS["tiny"], num_layers=61)
    model = SyntheticMLA(cfg, "cpu", torch.bfloat16, seed=0)
    T = 32
    cache = torch.zeros(61, T, 1, cfg.kv_row_dim, dtype=torch.bfloat16)
    step = StepInput(
        input_ids=torch.arange(T) + 1,
        positions=torch.arange(T),
        out_slots=torch.arange(T),
        page_table=torch.arange(T, dtype=torch.int32)[None],
        kv_lens=torch.tensor([T], dtype=torch.int32),
        q_indptr=torch.tensor([0, T], dtype=torch.int32),
        tree_mask=None,
        max_q_len=T,
        max_kv_len=T,
    )
    logits = model.forward(step, cache, TorchAttention())
    assert torch.isfinite(logits).all() and torch.isfinite(cache).all()
    assert 0.1 < logits.std() < 10


def test_allocator_scatters_and_recycles():
    alloc = PageAllocator(64, scatter_seed=1)
    pages = alloc.alloc(32)
    assert page_breaks(pages) > 16  # a shuffled free list scatters a request
    alloc.free(pages)
    assert alloc.num_free == 64 and sorted(alloc.free_pages) == list(range(64))


def test_ngram_drafter_and_acceptance():
    drafter = NgramDrafter()
    state = drafter.new_state()
    history = [5, 1, 2, 3, 4, 9, 1, 2]
    assert drafter.draft_chain(state, history, 4) == [3, 4, 9, 1]
    assert drafter.draft_chain(drafter.new_state(), [1, 2, 3], 3) == [3, 3, 3]  # padded guesses
    tree = drafter.draft_tree(state, history, 16)
    assert len(tree.tokens) == 16 and all(p < i for i, p in enumerate(tree.parents))
    assert tree.tokens[0] == history[-1]
    assert accept_chain([3, 4, 7], [3, 4, 5, 6]) == [3, 4, 5]
    assert accept_chain([8, 4], [3, 4, 5]) == [3]
    t = DraftTree(tokens=[2, 3, 7, 4], parents=[-1, 0, 0, 1])
    assert accept_tree(t, [7, 4, 0, 0]) == ([0, 2], [7, 0])
    assert accept_tree(t, [3, 4, 0, 9]) == ([0, 1, 3], [3, 4, 9])
    mask = t.ancestor_mask()
    assert mask[3].tolist() == [True, True, False, True]


@pytest.mark.parametrize("spec", ["none", "tree"])
def test_defrag_keeps_outputs_identical(plain, spec):
    eng = engine(spec=spec, scatter_seed=7, defrag=True, defrag_threshold=0.0, defrag_interval=1)
    assert outputs(eng, [prompt(90, 1), prompt(150, 2)]) == plain
    assert eng.defrag_runs > 0 and eng.defrag_pages_moved > 0


def test_defragment_moves_every_request_s_rows_with_it():
    eng = engine(scatter_seed=9)
    pool = eng.pool
    rows = [pool.open() for _ in range(3)]
    for i, row in enumerate(rows):
        pool.reserve(row, 40 + 17 * i)
    pool.cache.copy_(torch.randn(pool.cache.shape))
    before = {row: pool.cache[:, pool.owners[row]].clone() for row in rows}
    assert pool.fragmentation()["request_fragmentation"] > 0.5
    assert pool.defragment() > 0
    assert pool.fragmentation()["request_fragmentation"] == 0.0
    for row in rows:
        pages = pool.owners[row]
        assert torch.equal(pool.cache[:, pages], before[row])
        assert pool.req_to_page[row, : len(pages)].tolist() == pages
    used = sorted(p for row in rows for p in pool.owners[row])
    assert used == list(range(len(used)))  # packed, no page shared
    assert sorted(pool.allocator.free_pages) == list(range(len(used), pool.num_pages))
    assert pool.allocator.alloc(2) == [len(used), len(used) + 1]  # future pages run on


def prefill_step(prefix: int, chunk: int, page_size: int, seed: int) -> StepInput:
    """A chunk of `chunk` tokens after `prefix` cached ones, in scattered pages."""
    total = prefix + chunk
    pages = PageAllocator(64, scatter_seed=seed).alloc(-(-total // page_size))
    table = torch.tensor(pages, dtype=torch.int32)[None]
    t = torch.arange(prefix, total)
    return StepInput(
        input_ids=torch.randint(1, 512, (chunk,), generator=torch.Generator().manual_seed(seed)),
        positions=t,
        out_slots=table[0, t // page_size].long() * page_size + t % page_size,
        page_table=table,
        kv_lens=torch.tensor([total], dtype=torch.int32),
        q_indptr=torch.tensor([0, chunk], dtype=torch.int32),
        tree_mask=None,
        max_q_len=chunk,
        max_kv_len=total,
    )


@pytest.mark.parametrize(
    "dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)], ids=["fp64", "fp32"]
)
@pytest.mark.parametrize("prefix,chunk", [(0, 33), (70, 1), (45, 20)])
def test_mha_prefill_attention_equals_the_absorbed_path_per_layer(dtype, tol, prefix, chunk):
    model = SyntheticMLA(PRESETS["tiny"], "cpu", dtype, seed=3)
    page_size = 3
    step = prefill_step(prefix, chunk, page_size, seed=prefix + chunk)
    cache = torch.randn(64, page_size, PRESETS["tiny"].kv_row_dim, dtype=dtype)
    h = torch.randn(chunk, PRESETS["tiny"].hidden, dtype=dtype)
    mha_cache = cache.clone()
    for layer in model.layers:
        absorbed = layer_attention(model, layer, h, step, cache)
        spans = mha_spans(step, page_size)
        mha = layer_attention(model, layer, h, step, mha_cache, spans)
        assert torch.equal(cache, mha_cache)  # the chunk's latent rows were cached the same way
        assert (mha - absorbed).abs().max() <= tol * absorbed.abs().max()
    # The whole model: same logits from caches that hold the same prefix.
    layers = torch.stack([cache] * len(model.layers))
    ref = model.forward(step, layers.clone(), TorchAttention())
    mha_logits = model.forward(dataclasses.replace(step, mha=True), layers, TorchAttention())
    assert (mha_logits - ref).abs().max() <= 10 * tol * ref.abs().max()


def test_a_step_s_plan_is_told_the_rows_of_its_cache():
    """The engine's steps give the plan the cache's rows (AttnMeta.kv_rows, read from its shape):
    a backend whose int32 slots cannot reach them all refuses the cache from it."""

    class Rows(TorchAttention):
        def __init__(self) -> None:
            super().__init__(torch.float32)
            self.rows: list[int | None] = []

        def plan(self, meta):
            self.rows.append(meta.kv_rows)
            return super().plan(meta)

    model = SyntheticMLA(PRESETS["tiny"], "cpu", torch.float32, seed=3)
    step, dim = prefill_step(0, 5, 3, seed=1), PRESETS["tiny"].kv_row_dim
    backend = Rows()
    model.forward(step, torch.zeros(len(model.layers), 64, 3, dim), backend)
    h = torch.randn(5, PRESETS["tiny"].hidden)
    layer_attention(model, model.layers[0], h, step, torch.zeros(64, 3, dim), backend=backend)
    assert backend.rows == [64 * 3, 64 * 3]


def test_a_pool_past_the_backends_reach_is_refused_before_it_is_allocated():
    """Triton's int32 slots reach INT32_SLOT_ROWS rows a layer: a larger pool is refused as the
    engine starts (no GB-sized allocation first, no failing step later); int64 slots take it."""
    from decodecliff.kernels.api import INT32_SLOT_ROWS

    pytest.importorskip("triton")
    past = {"backend": "triton", "max_total_tokens": INT32_SLOT_ROWS + 1}
    with pytest.raises(ValueError, match=r"KV pool of 3728271 tokens: a cache of 3,728,271 rows"):
        engine(**past, backend_options={"index_dtype": "int32"})
    assert engine(backend="triton", backend_options={"index_dtype": "int32"}).pool


class RecordingAttention(TorchAttention):
    """The torch backend, remembering how many query tokens per request each step had."""

    def __init__(self) -> None:
        super().__init__()
        self.q_lens: list[int] = []

    def plan(self, meta):
        self.q_lens.append(meta.max_q_len)
        return super().plan(meta)


@pytest.mark.parametrize(
    "overrides",
    [
        {"chunk_size": 7},
        {"chunk_size": 4096},
        {"page_size": 3, "scatter_seed": 5},
        {"spec": "chain"},
        {"max_running_requests": 1},
    ],
    ids=["chunk7", "one-chunk", "page3-scattered", "chain", "one-at-a-time"],
)
def test_mha_prefill_gives_the_same_greedy_tokens(plain, overrides):
    eng = engine(prefill_attention="mha", **overrides)
    eng.backend = RecordingAttention()
    assert outputs(eng, [prompt(90, 1), prompt(150, 2)]) == plain
    # The backend only ever served decode / verify steps: no prefill chunk reached it.
    assert set(eng.backend.q_lens) == {eng.cfg.spec_tokens}


def test_mha_prefill_in_bfloat16_matches_the_absorbed_path():
    prompts = [prompt(90, 1), prompt(150, 2)]
    absorbed = outputs(engine(dtype="bfloat16"), prompts)
    assert outputs(engine(dtype="bfloat16", prefill_attention="mha"), prompts) == absorbed


def test_mha_prefill_rejects_a_tree_mask_and_bad_settings():
    step = prefill_step(4, 4, 1, seed=0)
    step.tree_mask = torch.ones(1, 4, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="tree mask"):
        mha_spans(step, 1)
    with pytest.raises(ValueError, match="prefill attention"):
        EngineConfig(prefill_attention="flash").validate()


def test_pool_keeps_page_break_counts_in_step_with_its_page_lists():
    eng = engine(scatter_seed=5, max_total_tokens=512, max_running_requests=4)
    pool, rng = eng.pool, torch.Generator().manual_seed(0)
    lens: dict[int, int] = {}
    for i in range(200):
        op = int(torch.randint(0, 10, (1,), generator=rng))
        if op == 0 and lens:
            pool.close(lens.popitem()[0])
        elif op == 1 and lens:
            pool.defragment()
        elif lens and op < 5:
            row = next(iter(lens))
            lens[row] = int(torch.randint(0, lens[row] + 1, (1,), generator=rng))
            pool.truncate(row, lens[row])
        elif pool.free_rows or lens:
            row = pool.open() if pool.free_rows and (not lens or op == 9) else next(iter(lens))
            lens[row] = lens.get(row, 0) + int(torch.randint(1, 20, (1,), generator=rng))
            try:
                pool.reserve(row, lens[row])
            except PoolExhausted:
                pool.close(row)
                del lens[row]
        for row, pages in pool.owners.items():
            assert pool.breaks[row] == page_breaks(pages), i
    assert pool.fragmentation()["request_page_breaks"] == sum(
        page_breaks(p) for p in pool.owners.values()
    )


def test_pool_fragmentation_can_be_read_while_requests_come_and_go():
    # The server reads engine.stats() from its own thread: the engine may open or close a request
    # between any two bytecodes of the read. A page list whose len() opens one stands in for it.
    pool = engine(max_total_tokens=64, max_running_requests=4).pool
    first = pool.open()
    pool.reserve(first, 10)

    class OpensARequest(list):
        def __len__(self) -> int:
            if pool.free_rows:
                pool.reserve(pool.open(), 3)
            return super().__len__()

    pool.owners[first] = OpensARequest(pool.owners[first])
    info = pool.fragmentation()
    assert info["request_page_breaks"] == 0 and len(pool.owners) == 2
