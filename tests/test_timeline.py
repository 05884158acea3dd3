"""A profiled step's kernels folded by layer (bench/timeline.py)."""

from __future__ import annotations

import pytest

from decodecliff.bench.timeline import Kernel, busy_us, describe, fold, layer_repeat, short_name

GEMM = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_64x64_tn>(Params)"
LAYER = [("_add_rms_norm", 2.0), (GEMM, 10.0), ("attention", 5.0), ("_skinny_gemm_kernel", 8.0)]


def step(layers: int, gap: float) -> list[Kernel]:
    """embed, the layers' kernels one after another ``gap`` apart, then the head."""
    names = [("embedding", 1.0)] + LAYER * layers + [("_add_rms_norm", 2.0), (GEMM, 30.0)]
    out, t = [], 0.0
    for name, us in names:
        out.append(Kernel(name, t, t + us))
        t += us + gap
    return out


def test_short_names_drop_templates_parameters_and_return_types():
    assert short_name(GEMM) == "cutlass::Kernel2"
    assert short_name("_skinny_gemm_kernel") == "_skinny_gemm_kernel"
    assert short_name("void f<a<b>, (c)>(int (*)(int))") == "f"


def test_the_layer_repeat_is_found_behind_a_prefix_and_before_a_suffix():
    names = [short_name(k.name) for k in step(5, 1.0)]
    assert layer_repeat(names, 5) == (1, len(LAYER))
    assert layer_repeat(["a", "b", "c", "d"], 3) is None


def test_a_layer_s_kernels_with_their_durations_and_gaps():
    folded = fold(step(5, 1.5), layers=5)
    assert folded["kernels"] == 1 + 5 * len(LAYER) + 2
    assert [k["kernel"] for k in folded["layer"]] == [
        "_add_rms_norm", "cutlass::Kernel2", "attention", "_skinny_gemm_kernel"
    ]  # fmt: skip
    assert [k["us"] for k in folded["layer"]] == pytest.approx([2, 10, 5, 8])
    assert all(k["gap_us"] == pytest.approx(1.5) for k in folded["layer"])
    assert folded["layer_us"] * 5 == pytest.approx(5 * 25 + 5 * 4 * 1.5 - 1.5)
    idle = (len(step(5, 1.5)) - 1) * 1.5
    assert folded["span_us"] - folded["busy_us"] == pytest.approx(idle)


def test_overlapping_kernels_count_once_and_show_a_negative_gap():
    kernels = [Kernel("a", 0, 10), Kernel("b", 8, 12), Kernel("c", 20, 25), Kernel("d", 21, 22)]
    assert busy_us(kernels) == pytest.approx(12 + 5)
    overlapped = step(4, -1.0)  # each kernel starts 1 us before the previous one ends
    folded = fold(overlapped, layers=4)
    assert all(k["gap_us"] == pytest.approx(-1.0) for k in folded["layer"])
    assert folded["busy_us"] == pytest.approx(folded["span_us"])


def test_a_step_without_kernels_or_repeat_is_described_not_failed():
    assert fold([], layers=3)["layer"] is None
    lone = fold([Kernel("a", 0, 1), Kernel("b", 2, 3)], layers=3)
    assert lone["layer"] is None and "no per-layer repeat" in describe(lone)
    text = describe(fold(step(3, 2.0), layers=3))
    assert "per layer" in text and "cutlass::Kernel2" in text and "+2.0" in text
