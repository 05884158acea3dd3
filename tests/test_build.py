"""The kernel build (CPU): fat binary with sm_120 + sm_90 SASS, smem within 99 KB, no spills."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from decodecliff.kernels import abi, build, sass, sm120_model
from decodecliff.kernels.custom import (
    RAGGED_BELOW,
    RAGGED_EVEN_WAVES,
    RAGGED_LONG_SLOTS_PER_REQUEST,
    RAGGED_LONG_SPLIT,
    RAGGED_SLOTS_PER_REQUEST,
    auto_plan,
    auto_variant,
    load_library,
    plan_launch,
    takes_v5,
)

needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None and not build.Path("/usr/local/cuda/bin/nvcc").is_file(),
    reason="nvcc not installed",
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("kernels")
    assert build.cli(["--out", str(out), "--sm120-model", "90"]) == 0
    return out, json.loads((out / "build.json").read_text())


@pytest.mark.slow  # nvcc builds the fat binary: seconds per test
@needs_nvcc
def test_build_has_required_sass_and_fits_smem(built):
    out, info = built
    assert (out / build.LIB_NAME).is_file()
    assert {120, 90} <= set(info["sass_archs"])
    assert info["ok"]["sass"] and info["ok"]["smem"]
    archs = {k["arch"] for k in info["kernels"]}
    assert archs == {80, 90, 120}
    attn = [k for k in info["kernels"] if "mla_attn_kernel" in k["kernel"]]
    assert len(attn) == 27  # v1..v4 x two row-tile sizes x three archs, v5 (64 rows) x three
    found = {(k["variant"], k["mtiles"], k["arch"]) for k in attn}
    assert found == {(v, m, a) for v in VARIANTS for m in VARIANTS[v] for a in (80, 90, 120)}
    for k in info["kernels"]:
        assert 0 < k["smem_total"] <= build.SMEM_LIMIT, k
        spilled = k["spill_stores"] + k["spill_loads"]
        # v3/v4 on sm_90 trade a few spilled bytes for two CTAs per SM (faster on the H200)
        limit = SPILL_BUDGET if (k.get("variant"), k["arch"]) in TWO_CTA | V5_SPILLS else 0
        assert spilled <= limit, k
    # the big buffers are dynamic: the report must count them, not only ptxas' static bytes
    assert min(k["dynamic_smem"] for k in attn) > 64 * 1024
    for k in attn:
        assert k["dynamic_smem"] == expected_smem(k["variant"], k["mtiles"]), k
    # v2's 16-row kernel is held to 128 registers (two CTAs per SM where shared memory allows)
    assert all(k["registers"] <= 128 for k in attn if (k["variant"], k["mtiles"]) == ("v2", 1))
    # v3 and v4 are held to 128 registers on sm_90 (two CTAs per SM), v1's budget elsewhere
    assert all(k["registers"] <= 128 for k in attn if (k["variant"], k["arch"]) in TWO_CTA)


@pytest.mark.slow  # nvcc builds the fat binary: seconds per test
@needs_nvcc
def test_each_kernel_s_main_loop_issues_exactly_its_tile_s_mma(built):
    """Read from the SASS (kernels/sass.py): a KV tile of n tokens for 16 m rows is m/16 x n/8
    x 36 HMMA for the scores (576 dims) and m/16 x 64 x n/16 for the values (512), over 8
    warps: each warp's loop body holds exactly that many, once each, in every build."""
    _, info = built
    if info["main_loops"].startswith("not read"):
        pytest.skip(info["main_loops"])
    for k in (k for k in info["kernels"] if "mla_attn_kernel" in k["kernel"]):
        block_n = VARIANTS[k["variant"]][k["mtiles"]][0]
        loop = k["main_loop"]
        assert loop["hmma"] * 16 == 17 * k["mtiles"] * block_n, k
        assert loop["instructions"] > loop["hmma"] > 0 and loop["shared"] > 0, k
        assert loop["barrier"] >= 1 and loop["wait"] >= 1, k  # the ring: a barrier, a copy wait
        assert (loop["local"] > 0) <= (k["spill_loads"] + k["spill_stores"] > 0), k


def test_a_function_s_closing_branch_to_itself_is_no_loop():
    """Every function ends with a branch to itself after EXIT (padding): not a main loop."""
    text = """
        Function : f
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   EXIT ;
        /*0020*/                   BRA 0x20;
        Function : g
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0020*/              @!P0 BRA P1, 0x10 ;
        /*0030*/                   EXIT ;
        /*0040*/                   BRA 0x40;
    """
    found = sass.functions(text)
    assert sass.main_loop(found["f"]) is None
    loop = sass.main_loop(found["g"])
    assert loop["instructions"] == 2 and loop["hmma"] == 1


def expected_smem(variant: str, mtiles: int) -> int:
    """The shared-memory arithmetic of notes/kernel.md: KV ring + partial S + P + row scalars."""
    block_n, stages, dim_groups = VARIANTS[variant][mtiles]
    if variant == "v5":  # partial S and P in mma-fragment order: no padding
        rows = 16 * mtiles
        tiles = dim_groups * rows * block_n * 4 + rows * block_n * 2
        return stages * block_n * 1152 + tiles + 3 * rows * 4
    rows, stride = 16 * mtiles, block_n + 8
    return (
        stages * block_n * 1152 + dim_groups * rows * stride * 4 + rows * stride * 2 + 3 * rows * 4
    )


SPILL_BUDGET = 256  # bytes of spill stores + loads allowed where a kernel is cut to 128 registers
TWO_CTA = {("v3", 90), ("v4", 90)}  # (variant, arch) cut to 128 registers for two CTAs per SM
# v5 holds Q (72) and O (128 registers) of 64 rows: at 252-255 registers an edit can push a few
# loop invariants to sm_120's stack (24 B stores, 28 B loads with nvcc 13.0 once; none now)
V5_SPILLS = {("v5", 120)}

# variant -> m-tiles -> (KV tokens per tile, ring stages, partial-S dim groups)
VARIANTS = {
    "v1": {1: (32, 2, 4), 2: (32, 2, 4)},
    "v2": {1: (16, 4, 4), 2: (16, 4, 4)},
    "v3": {1: (32, 2, 4), 2: (32, 2, 4)},
    "v4": {1: (32, 2, 4), 2: (32, 2, 4)},
    "v5": {4: (16, 4, 4)},  # one kernel, 64-row tiles, whatever m-tiles the host plans with
}


@pytest.mark.slow  # nvcc builds the fat binary: seconds per test
@needs_nvcc
def test_missing_required_sass_fails(tmp_path):
    # the binary is read for its SASS, whatever was asked of nvcc (the CLI refuses a --require
    # outside --arch before nvcc runs)
    with pytest.raises(build.BuildError, match="SASS missing"):
        build.build([80], tmp_path, [120, 90])


def test_missing_nvcc_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no nvcc anywhere
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(build, "CUDA_ROOTS", ())
    assert build.cli(["--out", str(tmp_path / "out")]) == 1
    assert "nvcc not found" in capsys.readouterr().err


def test_every_option_says_its_default_in_plain_text():
    p = build.parser()
    assert "``" not in p.description
    for action in p._actions:
        if action.dest != "help":
            assert "(default: " in action.help and "``" not in action.help, action.dest
    assert p.parse_args([]).out == build.DEFAULT_OUT


def test_parse_ptxas():
    name = "_ZN5dcmla15mla_attn_kernelILi2ELi1EEEvNS_6ParamsE"
    log = (
        f"ptxas info    : Compiling entry function '{name}' for 'sm_90'\n"
        f"ptxas info    : Function properties for {name}\n"
        "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 198 registers, used 1 barriers, 1024 bytes smem\n"
    )
    (k,) = build.parse_ptxas(log)
    assert (k["arch"], k["registers"], k["static_smem"]) == (90, 198, 1024)
    assert (k["stack_bytes"], k["spill_stores"], k["spill_loads"]) == (16, 8, 4)
    assert build.attn_params(k["kernel"]) == (2, 1)
    assert build.attn_params("_ZN5dcmla15mla_attn_kernelILi1ELi2EEEvNS_6ParamsE") == (1, 2)
    assert build.attn_params("_ZN5dcmla18mla_combine_kernelEPKfS1_P13__nv_bfloat16i") is None


def test_unknown_variant_is_a_clear_error():
    from decodecliff.kernels.custom import CustomAttention

    with pytest.raises(ValueError, match="variant"):
        CustomAttention(variant="v9")


CUDA_ERROR_INVALID_VALUE = 1


@pytest.mark.slow  # nvcc builds the fat binary: seconds per test
@needs_nvcc
def test_library_answers_through_its_bound_interface(built):
    """Host-side calls only (no GPU): the queries, and launches the library refuses before any
    CUDA call, each with one argument out of range, passed by name (kernels/abi.py)."""
    out, _ = built
    lib = load_library(out / build.LIB_NAME)
    assert lib.dcmla_max_splits() >= 1024
    assert lib.dcmla_smem_bytes(2, 1) == expected_smem("v2", 1)
    assert lib.dcmla_smem_bytes(9, 1) == -1
    assert lib.dcmla_error_string(CUDA_ERROR_INVALID_VALUE) == b"invalid argument"
    pointers = [name for name, ctype in abi.MLA_ATTENTION[:-1] if ctype is abi.PTR]
    valid = dict.fromkeys(pointers) | dict(
        batch=1, heads=8, total_q=16, max_q_len=16, page_size=64, pt_stride=4, tree_stride=16,
        num_splits=4, split_tokens=0, mtiles=2, variant=1, dependent=0, sm_scale=0.07,
    )  # fmt: skip

    def launch(**change) -> int:
        return lib.dcmla_mla_attention(*abi.mla_attention_args(valid | change), None)

    assert launch(batch=0) == 0  # nothing to do: returns before touching the device
    assert launch(total_q=0) == 0
    for name in ("heads", "max_q_len", "page_size", "pt_stride", "num_splits", "mtiles"):
        assert launch(**{name: 0}) == CUDA_ERROR_INVALID_VALUE, name
    assert launch(variant=len(VARIANTS) + 1) == CUDA_ERROR_INVALID_VALUE
    assert launch(num_splits=lib.dcmla_max_splits() + 1) == CUDA_ERROR_INVALID_VALUE
    assert launch(split_tokens=-1) == CUDA_ERROR_INVALID_VALUE
    assert launch(dependent=2) == CUDA_ERROR_INVALID_VALUE
    assert launch(tree_mask=1, tree_stride=15) == CUDA_ERROR_INVALID_VALUE


def test_plan_fills_one_wave_and_respects_short_contexts():
    verify = plan_launch(8, 16, 185_000, 1, ctas_per_wave=132, max_splits=1024)
    assert (verify.mtiles, verify.row_tiles, verify.num_splits) == (2, 4, 33)
    decode = plan_launch(8, 1, 185_000, 1, ctas_per_wave=132, max_splits=1024)
    assert (decode.mtiles, decode.row_tiles, decode.num_splits) == (1, 1, 132)
    short = plan_launch(8, 1, 1000, 1, ctas_per_wave=132, max_splits=1024)
    assert short.num_splits == 4  # >= 256 tokens per split
    wide = plan_launch(64, 256, 185_000, 4, ctas_per_wave=132, max_splits=1024)
    assert wide.num_splits == 1
    assert plan_launch(8, 16, 10, 1, 132, 1024, num_splits=7).num_splits == 7
    with pytest.raises(ValueError, match="num_splits"):
        plan_launch(8, 16, 10, 1, 132, 1024, num_splits=2000)


def test_a_short_context_takes_one_cta_an_sm_and_short_splits():
    """Where a wave of two CTAs an SM would split below SHORT_SPLIT_BELOW tokens, the splits fill
    the SMs once, down to MIN_TOKENS_PER_SHORT_SPLIT; longer splits keep the wave's plan."""

    def splits(heads: int, q_len: int, ctx: int, wave: int = 264, batch: int = 1) -> int:
        return plan_launch(heads, q_len, ctx, batch, wave, 1024, sms=132).num_splits

    assert splits(8, 1, 1024) == 32  # 32 tokens each, where 256 a split gave 4
    assert splits(8, 1, 4096) == 128 and splits(8, 1, 16384) == 132  # one an SM, not two
    assert splits(64, 1, 4096) == 66  # two row tiles a split
    assert splits(8, 16, 4096) == 33  # four row tiles: 124 tokens a split
    assert splits(8, 16, 16384) == 64  # 248 tokens at two an SM: the long plan, 256 a split
    assert splits(8, 16, 185_000) == 66 == splits(8, 16, 185_000, wave=264)
    assert splits(8, 1, 1024, batch=4) == 32 and splits(8, 1, 1024, batch=8) == 16
    assert splits(8, 1, 10) == 1  # never an empty split by plan
    assert splits(8, 16, 1024, wave=132) == 32  # one CTA an SM already (sm_120): the floor only


def test_a_ragged_batch_is_split_by_tokens_so_no_cta_waits_on_a_longer_one():
    lens = [185_000, 138_750, 92_500, 46_250]
    even = plan_launch(8, 16, max(lens), 4, ctas_per_wave=264, max_splits=1024)
    assert (even.num_splits, even.split_tokens) == (16, 0)  # 185k / 16: 11,563 tokens a CTA
    ragged = plan_launch(8, 16, max(lens), 4, 264, 1024, total_kv_len=sum(lens))
    # 66 CTAs per row tile, less one per request's partial last split, share 462,500 tokens:
    # 7,460 each, so 25 splits of the longest, and every split of the batch fits one wave
    assert (ragged.split_tokens, ragged.num_splits) == (7460, 25)
    assert sum(math.ceil(n / ragged.split_tokens) for n in lens) <= 264 // ragged.row_tiles
    # a batch of equal lengths keeps the even plan; a graph's plan (num_splits fixed) too
    assert plan_launch(8, 16, 1000, 2, 264, 1024, total_kv_len=2000).split_tokens == 0
    fixed = plan_launch(8, 16, max(lens), 4, 264, 1024, num_splits=8, total_kv_len=sum(lens))
    assert (fixed.num_splits, fixed.split_tokens) == (8, 0)
    assert ragged.busy_splits == 66  # 462,500 / 7,460 rounded up, plus one partial per request
    # auto counts the CTAs with work: a long request among short ones leaves most splits empty
    few = plan_launch(8, 16, 4000, 8, 264, 1024, total_kv_len=4000 + 7 * 256)
    assert few.row_tiles * 8 * few.num_splits > 132 and auto_variant(few, 8, sms=132) == "v1"
    # a hint far above the lengths (an upper bound) never takes more than a wave's splits, nor
    # more than the batch's tokens need
    loose = plan_launch(8, 16, 2_000_000, 1, 264, 1024, total_kv_len=10_000)
    assert loose.num_splits <= 264 // loose.row_tiles
    short = [1024, 768, 512, 256]
    for hint in (1024, 4096, 185_000):  # 2,560 tokens over 128 CTAs, 32 a split, 84 with work
        plan = plan_launch(8, 1, hint, 4, 264, 1024, None, sum(short), sms=132)
        assert (plan.split_tokens, plan.busy_splits) == (32, 84)
        # the longest request is at most 2,557 tokens: 80 splits of 32, not 128 or 264
        assert plan.num_splits == math.ceil(min(hint, 2_560 - 3) / 32)


def test_a_batch_within_an_eighth_of_equal_lengths_keeps_the_equal_plan():
    """One token shorter must not change the grid: where the equal plan idles at most an eighth
    of its CTAs (RAGGED_BELOW) it stands, as in a CUDA graph, which knows no total."""
    equal = plan_launch(64, 16, 16_384, 4, 132, 1024, cta_rows=64, sms=132)
    near = plan_launch(64, 16, 16_384, 4, 132, 1024, None, 4 * 16_384 - 1, cta_rows=64, sms=132)
    assert near == equal and equal.num_splits == 2
    eighth = plan_launch(64, 16, 16_384, 4, 132, 1024, None, 7 * 16_384 // 2 - 1, 64, 132)
    assert eighth.num_splits == 4  # more than an eighth short: ragged, split evenly
    at = plan_launch(64, 16, 16_384, 4, 132, 1024, None, 7 * 16_384 // 2, 64, 132)
    assert at == equal  # exactly an eighth short: still the equal plan


def test_an_empty_batch_plans_one_split():
    assert plan_launch(8, 1, 1024, 0, 264, 1024, None, 0, sms=132).num_splits == 1
    assert plan_launch(8, 0, 1024, 4, 264, 1024, None, 2_000, sms=132).num_splits == 1
    assert plan_launch(8, 1, 1024, 0, 264, 1024, num_splits=3).num_splits == 3
    # fewer tokens than requests (empty ones among them): the longest is still at least one
    tiny = plan_launch(8, 1, 1, 4, 264, 1024, None, 1, sms=132)
    assert tiny.num_splits == 1 and tiny.longest_split >= 1


# The plans of representative batches as plan_launch made them before equal-length plans were
# held to max_splits (today's plans): (heads, q_len, max_kv_len, batch, ctas_per_wave, max_splits,
# num_splits, total_kv_len, cta_rows, sms) -> (mtiles, row_tiles, num_splits, split_tokens, busy).
TODAYS_PLANS = [
    ((8, 16, 185_000, 1, 132, 1024, None, None, 0, 0), (2, 4, 33, 0, None)),  # verify
    ((8, 1, 185_000, 1, 264, 1024, None, None, 0, 132), (1, 1, 264, 0, None)),  # decode
    ((8, 1, 1000, 1, 132, 1024, None, None, 0, 132), (1, 1, 32, 0, None)),  # short context
    ((64, 256, 185_000, 4, 132, 1024, None, None, 0, 0), (2, 512, 1, 0, None)),  # wide
    ((64, 16, 16_384, 4, 132, 1024, None, 4 * 16_384, 64, 132), (2, 16, 2, 0, None)),  # v5
    ((8, 16, 16_384, 4, 264, 1024, None, 16_384 + 3 * 2_000, 0, 132), (2, 4, 46, 362, 66)),
    ((64, 16, 185_000, 60, 132, 1024, None, 60 * 100_000, 64, 132), (2, 16, 1, 0, None)),
    ((8, 1, 200_000, 1, 1056, 1024, None, None, 0, 132), (1, 1, 782, 0, None)),  # 256 a split
    ((8, 1, 262_144, 1, 1024, 1024, None, None, 0, 132), (1, 1, 1024, 0, None)),  # at the cap
    ((8, 1, 200_000, 1, 2048, 1024, None, None, 0, 132), (1, 1, 132, 0, None)),  # one an SM
    ((8, 1, 300_000, 2, 2048, 1024, None, 600_000, 0, 132), (1, 1, 1024, 0, None)),
]


@pytest.mark.parametrize(("args", "expected"), TODAYS_PLANS)
def test_plans_within_the_split_cap_stay_as_they_are(args, expected):
    plan = plan_launch(*args)
    assert (plan.mtiles, plan.row_tiles, plan.num_splits, plan.split_tokens,
            plan.busy_splits) == expected  # fmt: skip


def test_an_equal_batch_whose_wave_holds_more_splits_than_the_cap_plans_the_cap():
    """Equal lengths on a wave of over ``max_splits`` CTAs a request (row tile and request) take
    ``max_splits`` longer splits, as a ragged batch does, not a ValueError (the combine kernel
    merges at most that many partials a row)."""
    # 1,056 CTAs a wave (132 SMs x 8), one row tile of one request: 1,172 splits of 256 tokens
    long = plan_launch(8, 1, 300_000, 1, 1056, 1024, sms=132)
    assert (long.num_splits, long.split_tokens) == (1024, 0)
    assert long.longest_split == 300_000 / 1024 and long.ctas(1) == 1024
    # two requests of equal lengths (not ragged) over 2,112 CTAs
    assert plan_launch(8, 1, 300_000, 2, 2112, 1024, None, 600_000, sms=132).num_splits == 1024
    # the short-context rule's one CTA an SM, on 1,100 SMs
    assert plan_launch(8, 1, 100_000, 1, 2048, 1024, sms=1100).num_splits == 1024
    # a smaller cap holds the same way
    assert plan_launch(8, 1, 185_000, 1, 132, 64).num_splits == 64
    # a fixed split count over the cap is still refused
    with pytest.raises(ValueError, match=r"num_splits must be in 1\.\.1024, got 1025"):
        plan_launch(8, 1, 300_000, 1, 1056, 1024, num_splits=1025)


def test_a_short_ragged_batch_takes_one_cta_an_sm_and_short_splits():
    """The short-context rule holds for a ragged batch's split by tokens too: where the wave's
    share would be under SHORT_SPLIT_BELOW tokens, one CTA an SM shares the tokens, down to
    MIN_TOKENS_PER_SHORT_SPLIT; a longer share keeps the wave and its floor of 256."""
    lens = [1024, 768, 512, 256]  # bench-kernels --batch 4 --ragged at 1k

    def plan(heads: int, q_len: int, lens: list[int], sms: int = 132):
        return plan_launch(heads, q_len, max(lens), len(lens), 264, 1024, None, sum(lens), 0, sms)

    decode = plan(8, 1, lens)  # 2,560 tokens over 128 CTAs: 20 each, floored at 32
    assert (decode.split_tokens, decode.num_splits, decode.busy_splits) == (32, 32, 84)
    assert plan(8, 1, lens, sms=0).split_tokens == 256  # SMs unknown: the wave's floor, as before
    chain = plan(8, 16, lens)  # four row tiles: 33 CTAs an SM-wave, less one a request
    assert (chain.split_tokens, chain.num_splits) == (89, 12)
    long = plan(8, 16, [16 * n for n in lens])  # 40,960 tokens: 661 each over the wave
    assert long.split_tokens == 661 == plan(8, 16, [16 * n for n in lens], sms=0).split_tokens


def test_a_ragged_batch_on_too_few_slots_a_wave_is_split_evenly():
    """64 heads of chain16 in v5's 64-row CTAs: 16 row tiles, 8 CTAs a wave of 132. Four requests
    sharing one wave left four slots for their partial last splits, half the wave idle; each is
    split evenly instead, in as many as fill two waves (4: the fastest of 2-16 at 4k-16k, even
    with 8 at 64k-185k), in fewer where a split would be under v5's 384 tokens."""
    lens = [16_384, 12_288, 8_192, 4_096]
    plan = plan_launch(64, 16, max(lens), 4, 132, 1024, None, sum(lens), 64, sms=132)
    assert (plan.row_tiles, plan.num_splits, plan.split_tokens, plan.busy_splits) == (
        16,
        4,
        0,
        None,
    )
    assert plan_launch(64, 16, 1024, 4, 132, 1024, None, 2_560, 64, sms=132).num_splits == 2
    # a loose hint: the longest request is at most the total less a token for each other one
    loose = plan_launch(64, 16, 185_000, 2, 132, 1024, None, 1_152, 64, sms=132)
    assert loose.num_splits == 2  # 1,151 tokens // 384, where the total's 1,152 would give 3
    # without v5's rows the floor is the long contexts' 256 tokens
    v4 = plan_launch(64, 16, 1024, 4, 264, 1024, None, 2_560, sms=132)  # 32 tiles, 8 CTAs a wave
    assert (v4.num_splits, v4.split_tokens) == (4, 0)
    # at most two waves: 60 requests on 8 CTAs a wave take one split each, not four (the batch
    # alone takes 7.5 waves)
    many = plan_launch(64, 16, 185_000, 60, 132, 1024, None, 60 * 100_000, 64, sms=132)
    assert many.num_splits == 1 and many.split_tokens == 0
    five = [185_000, 150_000, 100_000, 50_000, 20_000]  # 2 x 8 // 5: three splits a request
    assert plan_launch(64, 16, 185_000, 5, 132, 1024, None, sum(five), 64, 132).num_splits == 3


def test_a_ragged_batch_shares_by_tokens_from_8_slots_a_request():
    """The boundary of the even split: a wave of exactly 8 slots a request shares by tokens, one
    slot fewer splits evenly; the short-context share needs 8 slots a request of the SMs too.
    (Shared splits of 1,652 tokens: under RAGGED_LONG_SPLIT, where 8-15 slots split evenly.)"""
    lens = [18_500, 13_875, 9_250, 4_625]
    # 8 heads of decode, v4: one row tile, so ctas_per_wave is the wave's slots
    at = plan_launch(8, 1, max(lens), 4, 32, 1024, None, sum(lens), sms=132)
    below = plan_launch(8, 1, max(lens), 4, 31, 1024, None, sum(lens), sms=132)
    assert at.split_tokens > 0 and at.busy_splits <= 32
    assert (below.split_tokens, below.num_splits) == (0, 8)  # 8 even splits a request
    short = [1024, 768, 512, 256]
    with_sms = plan_launch(8, 1, 1024, 4, 264, 1024, None, sum(short), sms=32)
    few_sms = plan_launch(8, 1, 1024, 4, 264, 1024, None, sum(short), sms=31)
    assert with_sms.split_tokens == 92  # 2,560 tokens over 32 - 4 SMs
    assert few_sms.split_tokens == 256  # the wave's share, floored as at long contexts


def test_a_ragged_batch_of_long_splits_under_16_slots_a_request_splits_evenly():
    """Where a wave holds 8-15 slots a request and the shared splits would be long, each request is
    split evenly in 16 (two waves): chain16 at 16 heads over four requests (8.25 slots) and at 8
    heads over eight, as measured; at 16k the splits are short and stay shared."""

    def plan(heads: int, batch: int, ctx: int) -> tuple[int, int]:
        lens = [ctx * (batch - i) // batch for i in range(batch)]
        p = plan_launch(heads, 16, ctx, batch, 132, 1024, None, sum(lens), 64, 132)
        return p.num_splits, p.split_tokens

    for heads, batch in ((16, 4), (8, 8)):
        assert plan(heads, batch, 65_536) == plan(heads, batch, 185_000) == (16, 0)
        assert plan(heads, batch, 16_384)[1] in range(1, RAGGED_LONG_SPLIT)  # shared, short
    assert plan(8, 4, 185_000) == (25, 7460)  # 16.5 slots a request: shared, however long
    # the boundary: shared splits of RAGGED_LONG_SPLIT - 1 tokens stay shared
    total = (33 - 4) * (RAGGED_LONG_SPLIT - 1)  # 4 requests over 33 slots a row tile
    at = plan_launch(16, 16, total // 2, 4, 132, 1024, None, total, 64, 132)
    over = plan_launch(16, 16, total // 2, 4, 132, 1024, None, total + 29, 64, 132)
    assert at.split_tokens == RAGGED_LONG_SPLIT - 1 and (over.split_tokens, over.num_splits) == (
        0,
        16,
    )


def test_a_ragged_batchs_splits_fit_its_plan_whatever_the_lengths():
    rng = random.Random(0)
    for _ in range(2000):
        heads, q_len = rng.choice([8, 16, 64]), rng.choice([1, 5, 9, 16, 64])
        cta_rows, wave = rng.choice([(0, 264), (64, 132)])  # v4 two a SM; v5 one, 64 rows
        batch = rng.randint(1, 40)
        lens = [rng.randint(1, rng.choice([2_000, 200_000])) for _ in range(batch)]
        hint = int(max(lens) * rng.choice([1, 1, 1.5, 10, 100]))  # an upper bound, maybe loose
        if sum(lens) >= RAGGED_BELOW * batch * hint:
            continue
        plan = plan_launch(heads, q_len, hint, batch, wave, 1024, None, sum(lens), cta_rows,
                           sms=rng.choice([0, 132]))  # fmt: skip
        # the kernel's split of each request (cta_work in mla_verify.cu): BN = 16 tokens a tile
        chunks = [max(-(-n // plan.num_splits), plan.split_tokens) for n in lens]
        assert max(chunks) <= math.ceil(plan.longest_split), (lens, hint, plan)  # what auto reads
        chunks = [-(-c // 16) * 16 for c in chunks]
        busy = sum(-(-n // c) for n, c in zip(lens, chunks, strict=True))
        assert busy <= (plan.busy_splits or batch * plan.num_splits), (lens, plan)
        slots = wave // plan.row_tiles
        if plan.split_tokens:  # shared over one wave: 8 slots a request, 16 for long splits
            assert slots >= RAGGED_SLOTS_PER_REQUEST * batch, (lens, plan)
            long = plan.split_tokens >= RAGGED_LONG_SPLIT
            assert not long or slots >= RAGGED_LONG_SLOTS_PER_REQUEST * batch, (lens, plan)
            assert plan.row_tiles * busy <= wave, (heads, q_len, lens, plan)
        else:  # split evenly, at most 8 (16 beside long splits) a request, in two waves
            assert plan.busy_splits is None, (lens, plan)
            assert plan.num_splits == 1 or batch * plan.num_splits <= RAGGED_EVEN_WAVES * slots
            few = slots < RAGGED_SLOTS_PER_REQUEST * batch
            most = RAGGED_SLOTS_PER_REQUEST if few else RAGGED_LONG_SLOTS_PER_REQUEST
            assert few or slots < RAGGED_LONG_SLOTS_PER_REQUEST * batch, (lens, plan)
            assert plan.num_splits <= most, (lens, plan)


def test_v5_is_planned_in_its_own_64_row_ctas():
    # 72 rows: three 32-row tiles, two v5 CTAs; the wave of 132 v5 CTAs gives 66 splits
    plan = plan_launch(8, 9, 185_000, 1, 132, 1024, cta_rows=64)
    assert (plan.row_tiles, plan.num_splits) == (2, 66)
    assert plan_launch(8, 16, 185_000, 1, 132, 1024, cta_rows=64).row_tiles == 2  # 128 rows


@pytest.mark.parametrize(
    ("heads", "q_len", "ctx", "expected"),
    [
        (8, 4, 185_000, "v4"),  # 32 rows: one row tile x 264 splits, two CTAs per SM
        (8, 1, 185_000, "v4"),
        (64, 64, 512, "v4"),  # 128 row tiles x 2 splits
        (8, 16, 1024, "v1"),  # 4 splits x 4 row tiles: 16 CTAs, a lone v4 CTA is no faster
        (64, 1, 16_384, "v1"),  # 2 row tiles x 64 splits = 128 CTAs on 132 SMs
    ],
)
def test_below_v5_auto_takes_v4_only_where_two_ctas_share_an_sm(heads, q_len, ctx, expected):
    # the H200: 132 SMs, v4 two CTAs per SM (the occupancy query's answer there); the shapes
    # v5 takes (takes_v5) never reach this choice
    plan = plan_launch(heads, q_len, ctx, 1, ctas_per_wave=264, max_splits=1024)
    v5 = plan_launch(heads, q_len, ctx, 1, ctas_per_wave=132, max_splits=1024, cta_rows=64)
    assert not takes_v5(heads * q_len, v5)
    assert auto_variant(plan, 1, sms=132) == expected


def test_auto_takes_v1_only_where_its_own_plan_keeps_one_cta_an_sm():
    """v1 is chosen from v4's plan (two CTAs an SM) but plans on its own wave (one an SM): a
    ragged batch whose v1 plan would spill past the SMs stays on v4."""
    wave = {"v1": 132, "v4": 264, "v5": 132}

    def plan_for(lens: list[int]):
        return lambda v: plan_launch(8, 1, max(lens), len(lens), wave[v], 1024, None, sum(lens),
                                     64 if v == "v5" else 0, 132)  # fmt: skip

    lens = [4_000, *range(1_000, 1_900, 57)][:17]  # v4 plans 122 CTAs with work: v1 by that
    assert auto_variant(plan_for(lens)("v4"), 17, 132) == "v1"
    assert plan_for(lens)("v1").ctas(17) == 136  # 8 even splits of 17 requests on 132 SMs
    assert auto_plan(plan_for(lens), 8, 17, 132, two_a_sm=True) == plan_for(lens)("v4")
    short = [1024, 768, 512, 256]  # v1's own plan fits: 84 CTAs with work
    assert auto_plan(plan_for(short), 8, 4, 132, two_a_sm=True) == plan_for(short)("v1")
    assert auto_plan(plan_for(short), 8, 4, 132, two_a_sm=False) == plan_for(short)("v4")


@pytest.mark.parametrize(
    ("heads", "q_len", "ctx", "expected"),
    [
        (8, 16, 185_000, "v5"),  # 128 rows, 66 splits of 2,803 tokens
        (8, 64, 16_384, "v5"),  # tree64: 16 splits of 1,024 tokens
        (8, 16, 32_768, "v5"),  # 66 splits of 496 tokens
        (64, 64, 1024, "v5"),  # tree64 at 64 heads: 2 splits of 512 tokens
        (64, 1, 185_000, "v5"),  # 64-head decode: 64 rows, 132 splits of 1,401 tokens
        (8, 16, 16_384, "v4"),  # 64 splits of 256 tokens: v5's prologue does not pay
        (64, 1, 16_384, "v4"),
        (8, 1, 185_000, "v4"),  # 8 rows: a 64-row tile would be mostly empty
    ],
)
def test_auto_takes_v5_for_many_rows_over_long_splits(heads, q_len, ctx, expected):
    # one v5 CTA of 64 rows per SM of 132, on either GPU
    v5 = plan_launch(heads, q_len, ctx, 1, ctas_per_wave=132, max_splits=1024, cta_rows=64)
    assert takes_v5(heads * q_len, v5) == (expected == "v5")


def test_auto_judges_v5_by_the_splits_the_plan_makes_not_by_a_loose_hint():
    """A ragged batch's splits are its share of tokens (or its longest request over the splits),
    not the ``max_kv_len`` hint over them: an upper-bound hint must not take v5 onto short ones."""
    lens = [1024, 768, 512, 256]

    def v5(hint: int):
        return plan_launch(8, 16, hint, 4, 132, 1024, None, sum(lens), cta_rows=64, sms=132)

    assert v5(1024).longest_split == v5(185_000).longest_split == 42  # 2,560 tokens over 62
    assert not takes_v5(128, v5(185_000))
    # the even split of 64 heads over two short requests: at most 499 tokens, whatever the hint
    two = plan_launch(64, 16, 185_000, 2, 132, 1024, None, 500, cta_rows=64, sms=132)
    assert (two.num_splits, two.longest_split) == (1, 499)


@pytest.mark.slow  # nvcc builds the fat binary: seconds per test
@needs_nvcc
def test_two_builds_load_side_by_side(built):
    # A GNU-unique symbol (a template's function-local static) is shared by every library that
    # defines it, even loaded RTLD_LOCAL: the sm_120-model build would read the regular one's
    # state (its shared-memory opt-in flags) and fail to launch. None may exist.
    out = built[0]
    regular, model = out / build.LIB_NAME, out / sm120_model.LIB_NAME
    assert model.is_file() and (out / sm120_model.SHIM_NAME).is_file()
    assert load_library(regular).dcmla_model_smem_per_sm() == 0
    assert load_library(model).dcmla_model_smem_per_sm() == sm120_model.SMEM_PER_SM
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    for lib in (regular, model):
        listing = subprocess.run([nm, "-C", str(lib)], capture_output=True, text=True)
        unique = [line for line in listing.stdout.splitlines() if " u " in line]
        assert listing.returncode == 0 and not unique, unique


@pytest.mark.slow  # nvcc builds the fat binary: seconds per test
@needs_nvcc
def test_a_machine_without_nvdisasm_builds_and_says_why_no_loop_is_read(tmp_path, monkeypatch):
    real = build.find_tool
    monkeypatch.setattr(build, "find_tool", lambda name: None if name == "nvdisasm" else real(name))
    assert build.cli(["--arch", "90", "--require", "90", "--out", str(tmp_path)]) == 0
    info = json.loads((tmp_path / "build.json").read_text())
    assert info["main_loops"] == "not read: cuobjdump or nvdisasm not found"
    assert not any("main_loop" in k for k in info["kernels"])


@pytest.mark.slow  # nvcc builds the library twice
@needs_nvcc
def test_a_failed_build_leaves_the_last_good_one_whole(tmp_path, capsys):
    assert build.cli(["--arch", "90", "--require", "90", "--out", str(tmp_path)]) == 0
    names = (build.LIB_NAME, "build.json", "ptxas.log")
    good = {n: (tmp_path / n).read_bytes() for n in names}
    assert "staging" not in good["build.json"].decode()
    # it compiles, but lacks the SASS it is asked to hold (the CLI refuses such a request, so
    # the build is called as a rule's wrong command could reach it)
    with pytest.raises(build.BuildError, match=r"SASS missing for sm_\[90\]"):
        build.build([120], tmp_path, [90])
    assert {n: (tmp_path / n).read_bytes() for n in names} == good
    assert (tmp_path / "failed-build" / "build.json").is_file()
    assert not list(tmp_path.glob(".staging-*"))


@pytest.mark.slow  # nvcc builds the library twice
@needs_nvcc
def test_a_build_stopped_in_its_swap_leaves_no_record_of_another_library(tmp_path, monkeypatch):
    """Stopped after the new library is moved in (a kill; here the log's move raises), the folder
    must not keep the old build.json, which describes the library replaced."""
    assert build.cli(["--arch", "90", "--require", "90", "--out", str(tmp_path)]) == 0
    real = os.replace

    def stopped(src, dst):
        if Path(dst).name == "ptxas.log":
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(build.os, "replace", stopped)
    with pytest.raises(KeyboardInterrupt):
        build.build([90, 120], tmp_path, [90])
    assert not (tmp_path / "build.json").exists()


def test_build_options_are_checked_before_nvcc_runs(tmp_path, capsys):
    for bad, said in (
        (["--arch", "70"], "needs sm_80"),
        (["--sm120-model", "0"], "needs sm_80"),
        (["--arch", "90", "--require", "120"], "--require 120: not among --arch 90"),
        (["--arch", "90", "--sm120-model", "120"], "--sm120-model 120: not among --arch 90"),
    ):
        with pytest.raises(SystemExit) as exc:
            build.cli([*bad, "--out", str(tmp_path / "out")])
        assert exc.value.code == 2 and said in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    for out in (tmp_path / "file", tmp_path / "file" / "sub"):  # the file itself, or above
        with pytest.raises(SystemExit):
            build.cli(["--out", str(out)])
        assert "is a file, not a folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # nvcc builds three architectures
@needs_nvcc
@pytest.mark.parametrize("tile", [64, 32])
def test_the_persistent_mlp_kernel_builds_for_sm_120_within_its_shared_memory(tmp_path, tile):
    """kernels/csrc/mlp_stream.cu (measured in notes/engine.md, not in the engine) has sm_120, sm_90
    and sm_80 SASS in both chunk shapes, a ring too deep for sm_120's 99 KB does not build, and
    its bulk-copy ring (with the queue of units) builds for sm_120 and sm_90 only, and its packed
    weights build on either ring."""
    nvcc, source = build.find_nvcc(), build.CSRC / "mlp_stream.cu"

    def compile_(lib, archs, *defines):
        cmd = build.nvcc_command(nvcc, archs, lib, defines, source)
        return subprocess.run(cmd, capture_output=True, text=True)

    lib = tmp_path / "mlp.so"
    done = compile_(lib, [120, 90, 80], f"DCMLP_TILE_N={tile}")
    assert done.returncode == 0, done.stderr
    cuobjdump = build.find_tool("cuobjdump")
    if cuobjdump is not None:
        assert build.sass_archs(cuobjdump, lib) == [80, 90, 120]
    deep = compile_(tmp_path / "deep.so", [120], f"DCMLP_TILE_N={tile}", "DCMLP_STAGES=5")
    assert deep.returncode != 0 and "99 KB" in deep.stderr
    # the bulk copies' ring (sm_90 and later): rows padded, so 32 x 256 chunks fit three slots
    stages = "DCMLP_STAGES=4" if tile == 64 else "DCMLP_STAGES=3"
    bulk = compile_(
        tmp_path / "bulk.so",
        [120, 90],
        f"DCMLP_TILE_N={tile}",
        "DCMLP_BULK",
        stages,
        "DCMLP_QUEUE=2",
    )
    assert bulk.returncode == 0, bulk.stderr
    assert compile_(tmp_path / "old.so", [80], "DCMLP_BULK").returncode != 0  # no bulk copies
    # packed weights: a chunk one contiguous read, by 16 B copies or (sm_90+) one bulk copy
    for archs, defines in (([120, 90, 80], ()), ([120, 90], ("DCMLP_BULK",))):
        packed = compile_(tmp_path / "packed.so", archs, f"DCMLP_TILE_N={tile}", "DCMLP_PACKED",
                          *defines)  # fmt: skip
        assert packed.returncode == 0, packed.stderr
