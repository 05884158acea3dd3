"""CPU correctness: the torch reference against an independent float64 loop, the Triton baseline
under the Triton interpreter against the reference, and the backends' error handling."""

from __future__ import annotations

import importlib
import inspect
import math
import os

import pytest
import torch

from decodecliff.kernels import D_QK, D_V, get_backend
from decodecliff.kernels.api import AttnBatch, cache_rows, token_slot, token_slots
from decodecliff.kernels.reference import TorchAttention, reference_attention
from decodecliff.kernels.registry import parse_spec, spec_label
from decodecliff.kernels.synthetic import random_batch, relative_error
from decodecliff.server import cli as serve_cli

BF16_TOL = 2e-2


def naive_attention(batch) -> torch.Tensor:
    """Row by row in float64, addressing the cache through the page-table formula of api.py."""
    ps, cache = batch.meta.page_size, batch.kv_cache.double().reshape(-1, D_QK)
    out = torch.zeros(batch.q.shape[0], batch.meta.num_heads, D_V, dtype=torch.float64)
    for b in range(batch.meta.batch_size):
        q0, q1 = int(batch.meta.q_indptr[b]), int(batch.meta.q_indptr[b + 1])
        kv_len, q_len = int(batch.meta.kv_lens[b]), q1 - q0
        rows = [int(batch.meta.page_table[b, t // ps]) * ps + t % ps for t in range(kv_len)]
        kv = cache[rows]
        prefix = kv_len - q_len
        for i in range(q_len):
            if batch.meta.tree_mask is None:
                draft = [j for j in range(q_len) if j <= i]
            else:
                draft = [j for j in range(q_len) if bool(batch.meta.tree_mask[b, i, j])]
            seen = kv[list(range(prefix)) + [prefix + j for j in draft]]
            scores = batch.q[q0 + i].double() @ seen.T * batch.meta.sm_scale  # [H, n]
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


def test_token_slots_follow_the_page_table() -> None:
    """api.token_slots (tensors) and token_slot (one token) against the formula, written out."""
    ps, g = 4, torch.Generator().manual_seed(0)
    table = torch.randperm(40, generator=g).to(torch.int32).view(2, 20)[:, :5]  # 5 pages a row
    tokens = torch.arange(20)
    expect = [[int(table[b, t // ps]) * ps + t % ps for t in range(20)] for b in range(2)]
    assert token_slots(table, tokens, ps).tolist() == expect
    assert token_slots(table[1], tokens[3:9], ps).tolist() == expect[1][3:9]
    assert token_slots(table, tokens, ps).dtype == torch.int64
    assert [token_slot(table[0].tolist(), t, ps) for t in range(20)] == expect[0]
    past = torch.tensor([20, 23, 41])
    with pytest.raises(IndexError):  # past the table: an error, unless asked to clamp
        token_slots(table[0], past, ps)
    clamped = token_slots(table[0], past, ps, clamp=True).tolist()
    assert clamped == [int(table[0, 4]) * ps + off for off in (0, 3, 1)]  # the table's last page
    out = torch.empty(2, 20, dtype=torch.int64)
    assert token_slots(table, tokens, ps, out=out) is out and out.tolist() == expect


def test_triton_token_slots_pad_past_the_table() -> None:
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    batch = random_batch([30, 9], 1, heads=2, page_size=8, seed=4)  # 4 pages a row
    batch.meta.max_kv_len = 50  # a bound past the table: CUDA graphs pin it to the pool's size
    slots = tb.TritonAttention().token_slots(batch.meta)
    table = batch.meta.page_table.tolist()
    assert slots.tolist() == [[row[min(t // 8, 3)] * 8 + t % 8 for t in range(50)] for row in table]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs Triton compiled")
def test_triton_runs_in_the_interpreter_without_cuda() -> None:
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
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
    # ragged: requests of one step verifying different numbers of tokens (q_indptr mixed)
    (dict(kv_lens=[120, 40, 75], q_len=[16, 1, 5], page_size=4), dict(arch_config="sm90")),
    (dict(kv_lens=[90, 50], q_len=[7, 3], tree=True, heads=2), dict(arch_config="sm120")),
]


SLOW_TRITON_CASES = {6}  # 20 heads x 64 splits: seconds of the Triton interpreter


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(i, marks=pytest.mark.slow) if i in SLOW_TRITON_CASES else i
        for i in range(len(TRITON_CASES))
    ],
)
def test_triton_matches_reference(case: int) -> None:
    pytest.importorskip("decodecliff.kernels.triton_baseline")
    kwargs, options = TRITON_CASES[case]
    batch = random_batch(**kwargs, seed=10 + case, spare_pages=2)
    out = batch.new_output().fill_(float("nan"))  # a row the kernel skips stays NaN and fails
    get_backend("triton", **options)(batch, out)
    err = relative_error(out, reference_attention(batch))
    assert err < BF16_TOL, f"rel err {err} for {kwargs} {options}"


def test_a_ragged_batch_is_each_request_on_its_own() -> None:
    # Mixed q_len in one step: each request's rows equal that request verified alone.
    batch = random_batch([90, 50, 33], [7, 1, 3], heads=2, tree=True, seed=3)
    assert batch.meta.q_indptr.tolist() == [0, 7, 8, 11] and batch.meta.max_q_len == 7
    assert not batch.meta.tree_mask[1, 1:].any() and not batch.meta.tree_mask[2, :, 3:].any()
    out = reference_attention(batch)
    for b, (q0, q1) in enumerate(zip([0, 7, 8], [7, 8, 11], strict=True)):
        n = q1 - q0
        mask = batch.meta.tree_mask[b : b + 1, :n, :n]
        one = AttnBatch.build(
            q=batch.q[q0:q1], kv_cache=batch.kv_cache, page_table=batch.meta.page_table[b : b + 1],
            kv_lens=batch.meta.kv_lens[b : b + 1], q_indptr=torch.tensor([0, n], dtype=torch.int32),
            sm_scale=batch.meta.sm_scale, tree_mask=mask, max_q_len=n,
        )  # fmt: skip
        assert relative_error(out[q0:q1], reference_attention(one)) < 1e-6
    with pytest.raises(ValueError, match="one per kv_len"):
        random_batch([90, 50], [7])


def test_triton_reuses_its_workspace() -> None:
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    backend = tb.TritonAttention(decode="grouped", num_kv_splits=8)
    big = random_batch([90, 60], 1, heads=8, seed=1)
    backend(big)
    ptrs = {name: buf.data_ptr() for name, buf in backend._ws._bufs.items()}
    assert set(ptrs) == {"indices", "logits", "lse"}
    small = random_batch([40], 1, heads=8, seed=2)
    err = relative_error(backend(small), reference_attention(small))
    assert err < BF16_TOL
    backend(big)
    assert {name: buf.data_ptr() for name, buf in backend._ws._bufs.items()} == ptrs


def test_triton_verify_never_uses_the_decode_kernel() -> None:
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    backend = tb.TritonAttention(decode="grouped")
    backend(random_batch([50], 4, seed=4))
    assert "logits" not in backend._ws._bufs  # the split-KV workspace only exists for L = 1


def test_arch_configs_follow_sglang_for_lq_576() -> None:
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    sm90, sm120 = tb.resolve_arch_config("sm90"), tb.resolve_arch_config("sm120")
    assert (sm90.block_m, sm90.block_n, sm90.num_warps, sm90.num_stages) == (32, 64, 8, 1)
    assert (sm120.block_m, sm120.block_n) == (32, 32)
    if not torch.cuda.is_available():
        assert tb.resolve_arch_config("auto").name == "sm90"


def test_backend_options_are_the_constructors_keywords() -> None:
    from decodecliff.kernels.registry import BACKENDS, OPTIONS

    not_from_text = {"compute_dtype"}  # the reference's torch.dtype: no KEY=VALUE sets it
    for name, (module, cls) in BACKENDS.items():
        made = getattr(importlib.import_module(module), cls)
        takes = set(inspect.signature(made.__init__).parameters) - {"self"} - not_from_text
        assert set(OPTIONS[name]) == takes, name


def test_the_registry_s_choices_are_what_the_backends_take() -> None:
    from decodecliff.kernels import custom, peers, registry

    assert set(registry.CHOICES["custom"]["variant"]) == {*custom.VARIANTS, "auto"}
    for name in ("triton", "sglang"):
        assert set(registry.CHOICES[name]["index_dtype"]) == set(peers.INDEX_DTYPES)
    with pytest.raises(ValueError, match=r"the triton backend's decode must be one of"):
        get_backend("triton", decode="bogus")  # before anything is built
    with pytest.raises(ValueError, match=r"the flashinfer backend's backend must be one of"):
        registry.parse_spec("flashinfer:backend=fa9")


def test_backend_errors() -> None:
    with pytest.raises(ValueError, match="unknown attention backend"):
        get_backend("cudnn")
    with pytest.raises(ValueError, match="the torch backend has no option 'foo'"):
        get_backend("torch", foo="bar")
    with pytest.raises(ValueError, match=r"no option 'varient' \(its options: num_splits, "):
        parse_spec("custom:varient=v5")
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


def test_a_count_option_given_as_text_is_refused_by_the_spec_check() -> None:
    """A study's config check parses the backend specs: a count that is no integer must fail
    there, not as a TypeError when the backend plans its first step."""
    for spec in ("custom:num_splits=eight", "sglang:kernel=decode,max_context_len=abc"):
        with pytest.raises(ValueError, match="must be an integer >= 0"):
            parse_spec(spec)
    assert parse_spec("sglang:max_context_len=131072")[1] == {"max_context_len": 131072}


def test_a_flag_option_reads_false_as_false_and_refuses_other_text() -> None:
    """ "interpreted=false" was the text "false", which the constructor read as true."""
    assert parse_spec("sglang:interpreted=false")[1] == {"interpreted": False}
    assert parse_spec("sglang:interpreted=true")[1] == {"interpreted": True}
    for spec in ("sglang:interpreted=no", "sglang:interpreted=1"):
        with pytest.raises(ValueError, match="must be true or false"):
            parse_spec(spec)
    assert spec_label("sglang:interpreted=false") == "sglang (interpreted=false)"
    # as `serve --backend-option` reads it, which a study's server passes on
    args = serve_cli.parse_args(["--backend", "sglang", "--backend-option", "interpreted=false"])
    assert dict(args.backend_option) == {"interpreted": False}
    serve_cli.check(["--backend", "sglang", "--backend-option", "interpreted=true"])


def _strided_lengths(batch):
    """The batch with kv_lens a strided view of the same values (column 0 of a [B, 2] tensor)."""
    lens = batch.meta.kv_lens
    batch.meta.kv_lens = torch.stack([lens, torch.zeros_like(lens)], 1)[:, 0]
    return batch


def test_triton_refuses_lengths_and_masks_its_kernels_would_misread() -> None:
    # The kernels index kv_lens and the tree mask through raw pointers: a strided kv_lens had
    # given wrong rows silently, a tree mask narrower than the draft was read out of bounds.
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    batch = _strided_lengths(random_batch([100, 40], 4, heads=2, page_size=4, seed=1))
    assert relative_error(TorchAttention()(batch), reference_attention(batch)) < BF16_TOL
    with pytest.raises(ValueError, match="kv_lens and q_indptr must be contiguous"):
        tb.TritonAttention()(batch)
    batch = random_batch([100, 40], 5, heads=2, tree=True, seed=1)
    batch.meta.tree_mask = batch.meta.tree_mask[:, :3, :3].contiguous()
    with pytest.raises(ValueError, match="tree_mask must be"):
        tb.TritonAttention()(batch)


def test_triton_refuses_a_narrow_tree_mask_without_a_max_q_len_hint() -> None:
    # Without the hint plan() reads the longest draft from q_indptr; the mask was checked only
    # against the hint, so a 3-wide mask under a 5-token draft was read at the wrong row stride.
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    batch = random_batch([30, 6], [5, 1], heads=2, tree=True, seed=1)
    batch.meta.max_q_len = None
    assert relative_error(tb.TritonAttention()(batch), reference_attention(batch)) < BF16_TOL
    batch.meta.tree_mask = batch.meta.tree_mask[:, :3, :3].contiguous()
    with pytest.raises(ValueError, match="tree_mask must be"):
        tb.TritonAttention()(batch)


def test_triton_refuses_a_page_table_of_fewer_rows_than_requests() -> None:
    # The token-slot list is built from the table's rows: a table of one row for two requests
    # gave a one-row slot list, and the kernels read the second request's slots past its end.
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    backend = tb.TritonAttention()
    batch = random_batch([30, 30], 1, heads=2, page_size=4, seed=1)
    assert backend.unsupported(batch.meta) is None
    batch.meta.page_table = batch.meta.page_table[:1]
    with pytest.raises(ValueError, match=r"page_table must be int32 \[>= B"):
        backend.check(batch.meta)  # what plan() runs first, before any slot or kernel


def test_triton_refuses_an_output_or_queries_its_kernels_would_misaddress() -> None:
    # The kernels write out[t, h] at out.stride(0), out.stride(1) with unit dims and take the
    # heads from the plan: a strided output had been written at the wrong addresses, and queries
    # of more heads than the plan left the others' rows unwritten, both without an error.
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    for q_len in (3, 1):  # the extend kernel, then the grouped decode
        batch = random_batch([40, 20], q_len, heads=2, page_size=4, seed=1)
        t, h = batch.q.shape[:2]
        strided = torch.full((t, D_V, h), float("nan"), dtype=batch.q.dtype).transpose(1, 2)
        with pytest.raises(ValueError, match=r"out must be \[T=.*unit last stride"):
            tb.TritonAttention()(batch, strided)
        with pytest.raises(ValueError, match=r"out must be \[T="):
            tb.TritonAttention()(batch, batch.new_output()[:, :1])
        wide = batch.meta.batch(torch.cat([batch.q, batch.q], 1), batch.kv_cache)
        with pytest.raises(ValueError, match=r"q must be \[T=.*, H=2, 576\]"):
            tb.TritonAttention()(wide, wide.new_output())
        out = tb.TritonAttention()(batch, batch.new_output())
        assert relative_error(out, reference_attention(batch)) < BF16_TOL


def test_triton_refuses_a_q_indptr_of_fewer_entries_than_requests_and_one() -> None:
    # The extend kernel reads request b's rows at q_indptr[b] .. q_indptr[b + 1]: a q_indptr of
    # B entries was read one past its end, here into the rest of the tensor it is a view of (the
    # second request's 3 rows taken as 1), and a result came back where the torch backend raises.
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    batch = random_batch([40, 20], 3, heads=2, page_size=4, seed=1)
    assert tb.TritonAttention().unsupported(batch.meta) is None
    batch.meta.q_indptr = torch.tensor([0, 3, 4, 6], dtype=torch.int32)[:2]
    with pytest.raises(ValueError, match=r"q_indptr must be \[B \+ 1\]"):
        tb.TritonAttention()(batch)


def empty_batch(**hints) -> AttnBatch:
    """A step of no requests: no query rows, a cache and a page table of spare rows."""
    i32 = {"dtype": torch.int32}
    return AttnBatch.build(
        torch.empty(0, 2, D_QK), torch.randn(3, 4, D_QK), torch.zeros(2, 2, **i32),
        torch.zeros(0, **i32), torch.zeros(1, **i32), 0.1, **hints,
    )  # fmt: skip


def test_triton_plans_an_empty_step_as_one_that_writes_nothing() -> None:
    # Without the hints plan() took the longest draft and context from the lengths, and max()
    # of no lengths raised; with them the "sglang" split count indexed an empty list. An empty
    # step is planned as the custom and torch backends plan it: run() launches nothing.
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    for options in ({}, {"decode": "extend"}, {"num_kv_splits": "sglang"}):
        for hints in ({}, {"max_q_len": 1, "max_kv_len": 8}):
            batch = empty_batch(**hints)
            assert tb.TritonAttention(**options)(batch).shape == (0, 2, D_V), (options, hints)
    assert TorchAttention()(empty_batch()).shape == (0, 2, D_V)


def test_custom_refuses_lengths_and_masks_its_kernel_would_misread(monkeypatch) -> None:
    from decodecliff.kernels import custom
    from decodecliff.kernels.api import AttnMeta

    monkeypatch.setattr(AttnMeta, "device", property(lambda self: torch.device("cuda")))
    custom.validate_meta(random_batch([100, 40], 4, tree=True).meta)  # as the engine plans it
    batch = _strided_lengths(random_batch([100, 40], 4, seed=1))
    with pytest.raises(ValueError, match="kv_lens and q_indptr must be contiguous"):
        custom.validate_meta(batch.meta)
    batch = random_batch([100, 40], 5, tree=True, seed=1)
    batch.meta.tree_mask = batch.meta.tree_mask[:, :3, :3].contiguous()
    with pytest.raises(ValueError, match="n >= max_q_len"):
        custom.validate_meta(batch.meta)


def test_custom_refuses_tensors_of_other_shapes_than_its_plan() -> None:
    # The kernel takes q's and the cache's strides from the plan: a q of other heads or a cache
    # of another page size had been read at the plan's strides, not refused.
    from decodecliff.kernels import custom

    batch = random_batch([100, 40], 4, heads=8, page_size=4, seed=1)
    q, kv, meta = batch.q, batch.kv_cache, batch.meta
    out = batch.new_output()
    custom.check_tensors(meta, q, kv, out)
    bad = {
        "q must be": (q[:, :4].contiguous(), kv, out),
        "kv_cache must be": (q, kv.reshape(-1, 2, kv.shape[2]), out),
        "out must be": (q, kv, out[:-1]),
        "must be bf16": (q.float(), kv, out),
        "must be contiguous": (q, kv, out.transpose(0, 1).contiguous().transpose(0, 1)),
    }
    for message, tensors in bad.items():
        with pytest.raises(ValueError, match=message):
            custom.check_tensors(meta, *tensors)


def test_custom_checks_a_call_whose_tensors_share_the_last_ones_pointers_but_not_layout() -> None:
    # run() launches a call of the last call's key with its arguments, skipping check_tensors
    # (the library needs a GPU, so the key is checked here). Keyed by the pointers and the q and
    # cache shapes, an output or q transposed in place, an output of more rows, or views of
    # another dtype at the same addresses were launched unchecked.
    from decodecliff.kernels import custom

    batch = random_batch([100, 40], 4, heads=8, page_size=4, seed=1)  # T = 8 rows of 8 heads
    q, kv, meta = batch.q, batch.kv_cache, batch.meta
    rows = torch.empty(9, 8, D_V, dtype=torch.bfloat16)
    out = rows[:8]
    custom.check_tensors(meta, q, kv, out)
    key = custom.call_key(q, kv, out)
    bad = {
        "out transposed": (q, kv, out.transpose(0, 1)),
        "q transposed": (q.transpose(0, 1), kv, out),
        "out of more rows": (q, kv, rows),
        "out of another dtype": (q, kv, out.view(torch.float16)),
        "cache of another dtype": (q, kv.view(torch.float16), out),
    }
    for what, tensors in bad.items():
        assert tensors[0].data_ptr() == q.data_ptr() and tensors[2].data_ptr() == out.data_ptr()
        with pytest.raises(ValueError):
            custom.check_tensors(meta, *tensors)
        assert custom.call_key(*tensors) != key, what
    assert custom.call_key(q, kv, rows[:8]) == key  # the same tensors again: launched as they were


def test_relative_error_flags_nan() -> None:
    ref = torch.ones(2, 3)
    assert math.isinf(relative_error(torch.full((2, 3), float("nan")), ref))


# Planted problems (kernels/planted.py): every mask decision shows in a row's output.
PLANTED = [
    dict(kv_lens=[1], q_len=1),
    dict(kv_lens=[64, 65, 2], q_len=1, page_size=64),
    dict(kv_lens=[300, 17, 64], q_len=16, page_size=64),
    dict(kv_lens=[200, 70], q_len=16, tree=True),
    dict(kv_lens=[129, 40], q_len=33, tree=True, page_size=64, heads=3),
]


def exact(batch):
    """The float64 reference of a batch (its own rounded inputs, upcast)."""
    return TorchAttention(torch.float64)(
        batch.meta.batch(batch.q.double(), batch.kv_cache.double())
    )


@pytest.mark.parametrize("case", range(len(PLANTED)))
def test_planted_reference_returns_the_visible_tokens(case: int) -> None:
    from decodecliff.kernels.planted import expected_output, planted_batch, row_errors

    plant = planted_batch(**PLANTED[case], seed=case)
    ref = exact(plant.batch)
    assert float(row_errors(ref, expected_output(plant)).max()) < 1e-6
    kinds = {k for row in plant.visible_kind + plant.hidden_kind for k in row}
    assert {"self", "past-end"} <= kinds
    assert relative_error(naive_attention(plant.batch), ref) < 1e-12


@pytest.mark.slow  # a 185k-token float64 reference
def test_planted_dominates_a_185k_prefix() -> None:
    from decodecliff.kernels.planted import expected_output, planted_batch, row_errors

    plant = planted_batch([185_000], 1, heads=2, seed=1)
    assert float(row_errors(exact(plant.batch), expected_output(plant)).max()) < 1e-6


def broken_masks(monkeypatch, kind: str) -> None:
    """Patch the reference's mask: off-by-one causal, tree read as a chain, or one token too far."""
    from decodecliff.kernels import reference

    good = reference.visible_mask

    def causal_off_by_one(q_len, kv_len, tree, device):
        mask = good(q_len, kv_len, tree, device)
        mask[:, kv_len - q_len :] = torch.ones(q_len, q_len, dtype=torch.bool).tril(1)
        return mask

    def tree_as_chain(q_len, kv_len, tree, device):
        return good(q_len, kv_len, None, device)

    def past_end(q_len, kv_len, tree, device):
        return torch.cat([good(q_len, kv_len, tree, device), torch.ones(q_len, 1).bool()], 1)

    patch = {"causal": causal_off_by_one, "tree": tree_as_chain, "past-end": past_end}[kind]
    monkeypatch.setattr(reference, "visible_mask", patch)
    if kind == "past-end":  # read kv_len + 1 rows
        real = reference.token_rows
        monkeypatch.setattr(reference, "token_rows", lambda p, n, ps: real(p, n + 1, ps))


@pytest.mark.parametrize(
    "kind, case",
    [("causal", dict(kv_lens=[4096, 100], q_len=16, page_size=64)),
     ("tree", dict(kv_lens=[300, 90], q_len=16, tree=True)),
     ("past-end", dict(kv_lens=[4096, 37], q_len=1, page_size=64))],
)  # fmt: skip
def test_planted_check_catches_a_broken_mask(monkeypatch, kind: str, case: dict) -> None:
    from decodecliff.kernels.planted import PLANTED_TOL, planted_batch, worst_row

    plant = planted_batch(**case, seed=2)
    long_only = {**case, "kv_lens": case["kv_lens"][:1]}  # 4096: where random data hides it
    random = random_batch(**long_only, dtype=torch.float32, seed=2, spare_pages=2)
    ref, ref_random = exact(plant.batch), exact(random)
    broken_masks(monkeypatch, kind)
    worst = worst_row(plant, TorchAttention(torch.float64)(plant.batch), ref)
    assert worst["max_err"] > 20 * PLANTED_TOL, worst
    if kind == "causal":  # what the planted inputs are for: random data hides this error
        assert relative_error(TorchAttention(torch.float64)(random), ref_random) < BF16_TOL


@pytest.mark.slow  # the Triton interpreter on long planted problems
@pytest.mark.parametrize("case", range(len(PLANTED)))
def test_triton_interpreter_passes_the_planted_check(case: int) -> None:
    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    from decodecliff.kernels.planted import PLANTED_TOL, planted_batch, worst_row

    plant = planted_batch(**PLANTED[case], seed=case)
    out = plant.batch.new_output().fill_(float("nan"))
    options = dict(decode="grouped", num_kv_splits="sglang") if PLANTED[case]["q_len"] == 1 else {}
    tb.TritonAttention(**options)(plant.batch, out)
    worst = worst_row(plant, out, exact(plant.batch))
    assert worst["max_err"] < PLANTED_TOL, worst


def test_cublas_peer_passes_the_planted_check() -> None:
    from decodecliff.kernels.planted import PLANTED_TOL, planted_batch, worst_row

    for case in PLANTED:
        plant = planted_batch(**case, seed=3)
        out = plant.batch.new_output().fill_(float("nan"))
        get_backend("cublas")(plant.batch, out)
        assert worst_row(plant, out, exact(plant.batch))["max_err"] < PLANTED_TOL, case


def sglang_peer(kernel: str, **options):
    pytest.importorskip("decodecliff.kernels.triton_baseline")  # SGLang's kernels need triton
    peers = pytest.importorskip("decodecliff.kernels.peers")
    try:
        return peers.SGLangAttention(kernel, interpreted=True, **options)
    except ModuleNotFoundError as exc:
        pytest.skip(f"sglang not installed: {exc}")


SGLANG_CASES = [
    ("extend", dict(kv_lens=[70, 33], q_len=4, page_size=16)),
    ("extend", dict(kv_lens=[70, 33], q_len=5, tree=True, heads=4)),
    ("verify", dict(kv_lens=[90, 40], q_len=4, page_size=16)),
    ("decode", dict(kv_lens=[100, 7, 1], q_len=1, page_size=16)),
]


@pytest.mark.parametrize("case", range(len(SGLANG_CASES)))
def test_sglang_kernels_in_the_interpreter_pass_the_planted_check(case: int) -> None:
    """SGLang's own kernel files, loaded with the shims, wired to this repository's layout (fp32:
    the interpreter's bf16 dot is wrong)."""
    from decodecliff.kernels.planted import PLANTED_TOL, planted_batch, worst_row

    kernel, kwargs = SGLANG_CASES[case]
    backend = sglang_peer(kernel, num_kv_splits=4)
    plant = planted_batch(**kwargs, dtype=torch.float32, seed=case)
    out = plant.batch.new_output().fill_(float("nan"))
    backend(plant.batch, out)
    assert worst_row(plant, out, exact(plant.batch))["max_err"] < PLANTED_TOL
    rand = random_batch(**kwargs, dtype=torch.float32, seed=case)
    assert relative_error(backend(rand), reference_attention(rand)) < BF16_TOL


def test_sglang_verify_without_a_prefix_is_declined() -> None:
    """Measured: SGLang's verify_shared_kv_fwd writes NaN for a request with kv_len == q_len."""
    from decodecliff.kernels.planted import planted_batch, row_errors

    backend = sglang_peer("verify")
    plant = planted_batch([16, 300], 16, dtype=torch.float32, seed=5)
    assert "needs a prefix" in backend.unsupported(plant.batch.meta)
    backend.unsupported = lambda meta: None  # run it anyway: the first request's rows are NaN
    err = row_errors(backend(plant.batch), exact(plant.batch))
    assert math.isinf(float(err[:16].max())) and float(err[16:].max()) < 1e-2


def test_sglang_plans_an_empty_step_as_one_that_writes_nothing() -> None:
    # plan() took max() of no query lengths (and concatenated no row lists); an empty step is
    # planned as the other backends plan it: run() launches nothing.
    for kernel in ("extend", "verify", "decode"):
        backend = sglang_peer(kernel, num_kv_splits=4)
        for hints in ({}, {"max_q_len": 1, "max_kv_len": 8}):
            assert backend(empty_batch(**hints)).shape == (0, 2, D_V), (kernel, hints)


def test_flashinfer_plans_an_empty_step_as_one_that_writes_nothing(monkeypatch) -> None:
    # plan() concatenated the requests' page lists, none for no request (torch.cat of nothing
    # raised), and planned FlashInfer's wrapper for a step of no query rows; an empty step is
    # planned as the other backends plan it, before any FlashInfer call: run() launches nothing.
    # Without a GPU: the backend is made without its constructor (which sets up FlashInfer on
    # one), and the step's metadata says it is on a GPU (FlashInfer refuses any other).
    from decodecliff.kernels import peers
    from decodecliff.kernels.api import AttnMeta

    monkeypatch.setattr(AttnMeta, "device", property(lambda self: torch.device("cuda")))
    backend = object.__new__(peers.FlashInferAttention)
    i32 = {"dtype": torch.int32}
    no_rows = AttnBatch.build(
        torch.empty(0, 2, D_QK), torch.randn(3, 4, D_QK), torch.zeros(2, 2, **i32),
        torch.tensor([3, 5], **i32), torch.zeros(3, **i32), 0.1,
    )  # fmt: skip
    for batch in (empty_batch(), empty_batch(max_q_len=1, max_kv_len=8), no_rows):
        assert backend(batch).shape == (0, 2, D_V), batch.meta


def test_int32_slots_are_refused_for_a_cache_past_their_reach() -> None:
    # The Triton baseline's kernels and SGLang's address a cache row's columns as slot x 576 +
    # column in int32: with int32 slots (index_dtype=int32), rows from 2^31 // 576 on were read
    # from other rows, silently. A plan knows the cache's rows on the host (AttnMeta.kv_rows,
    # from the cache's shape) and refuses such a cache; int64 slots reach every row. The cache
    # here is one row seen as many (the plans read its shape only).
    from decodecliff.kernels.api import INT32_SLOT_ROWS

    tb = pytest.importorskip("decodecliff.kernels.triton_baseline")
    assert INT32_SLOT_ROWS == 3_728_270 and (INT32_SLOT_ROWS + 1) * D_QK > 2**31
    backends = [tb.TritonAttention(index_dtype="int32"),
                tb.TritonAttention(decode="extend", index_dtype="int32")]  # fmt: skip
    try:
        peers = importlib.import_module("decodecliff.kernels.peers")
        for kernel in ("extend", "decode"):
            backends.append(peers.SGLangAttention(kernel, 4, index_dtype="int32", interpreted=True))
    except ModuleNotFoundError:
        pass  # sglang not installed: the Triton baseline's alone

    def batch(rows: int) -> AttnBatch:
        small = random_batch([40, 20], 1, heads=2, dtype=torch.float32, seed=1)
        cache = small.kv_cache[:1, :1].expand(rows, 1, D_QK)
        m = small.meta
        return AttnBatch.build(small.q, cache, m.page_table, m.kv_lens, m.q_indptr, m.sm_scale)

    assert batch(100).meta.kv_rows == 100
    for backend in backends:
        with pytest.raises(ValueError, match=r"cache of 3,728,271 rows .* 3,728,270 rows"):
            backend.plan(batch(INT32_SLOT_ROWS + 1).meta)
        backend.plan(batch(INT32_SLOT_ROWS).meta)  # its last row is within reach
    tb.TritonAttention(index_dtype="int64").plan(batch(INT32_SLOT_ROWS + 1).meta)


def test_sglang_refuses_a_request_of_fewer_kv_than_query_tokens() -> None:
    # plan() took kv_len - q_len as the request's prefix: a negative one sliced its row lists
    # from their end, and the kernels ran on them.
    for kernel, q_len in (("extend", 4), ("decode", 1)):
        batch = random_batch([40, 20], q_len, heads=2, dtype=torch.float32, seed=1)
        batch.meta.kv_lens[1] = q_len - 1
        with pytest.raises(ValueError, match=f"request 1 has kv_len {q_len - 1} < q_len {q_len}"):
            sglang_peer(kernel).plan(batch.meta)


def test_sglang_split_count_follows_its_triton_backend() -> None:
    backend = sglang_peer("decode")
    from decodecliff.kernels import peers

    assert peers.sglang_max_kv_splits(132) == 256 and peers.sglang_max_kv_splits(188) == 256
    assert peers.sglang_max_kv_splits(0) == 8
    for lens, heads, sms in [([185_000], 8, 132), ([185_000], 64, 132), ([1024], 8, 132),
                             ([40], 8, 132), ([5000, 300, 4000], 16, 188)]:  # fmt: skip
        cap = peers.sglang_max_kv_splits(sms)
        got = torch.zeros(len(lens), dtype=torch.int32)
        backend.ops.get_num_kv_splits_triton[(1,)](
            got, torch.tensor(lens, dtype=torch.int32), len(lens), 1, heads, 1, cap, sms,
            MAX_NUM_SEQ=256,
        )  # fmt: skip
        assert got.tolist() == peers.sglang_num_kv_splits(lens, heads, sms, cap), (lens, heads)
    assert peers.sglang_num_kv_splits([185_000], 8, 132, 256) == [256]


def test_a_cache_s_rows_are_a_layer_s_pages_times_page_size() -> None:
    layer = torch.empty(5, 64, D_QK, device="meta")
    model = torch.empty(3, 5, 64, D_QK, device="meta")  # layers first
    assert cache_rows(layer) == cache_rows(model) == 320
