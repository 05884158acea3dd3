"""The kernel figures (analysis/figures.py) drawn from kernel bench tables built here: a bench
need not hold every head count x mode pair (one merged by hand from two runs may lack one)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from decodecliff.analysis import figures, style, tables

CONTEXTS = (1024, 8192, 65536)
MODES = {"decode": 1, "chain16": 16}


def bench(missing: tuple[int, str] | None = None) -> pd.DataFrame:
    """A kernel bench of the Triton baseline and the custom kernel, 8 and 64 heads, decode and a
    16-token verify, page size 1, without the ``missing`` (heads, mode) pair."""
    rows = []
    for heads in (8, 64):
        for mode, q in MODES.items():
            if (heads, mode) == missing:
                continue
            for ctx in CONTEXTS:
                for backend, series, ms in (
                    ("triton", "triton (sm90)", 1e-5 * ctx),
                    ("custom", "custom", 2e-6 * ctx),
                ):
                    rows.append({
                        "backend": backend, "series": series, "status": "ok", "reason": None,
                        "heads": heads, "mode": mode, "q_len": q, "page_size": 1, "batch": 1,
                        "ctx": ctx, "ms": ms * heads / 8, "floor_ms": 1e-6 * ctx,
                        "gbs": 1.0, "tflops": 1.0, "gpu_capability": "sm_90",
                    })  # fmt: skip
    return pd.DataFrame(rows)


def panels(fig) -> dict[str, str]:
    """Each titled panel's title and what it says in its own text ('' where it drew lines)."""
    titled = [ax for ax in fig.axes if ax.get_title()]
    return {ax.get_title(): " ".join(t.get_text() for t in ax.texts) for ax in titled}


def test_a_bench_without_one_heads_and_mode_pair_draws_the_pairs_it_has() -> None:
    """The speedup figure of a bench lacking 64 heads x chain16: every other panel draws its
    speedups as with the whole bench, the missing pair's panel says it is not in the bench."""
    style.apply()
    whole, part = bench(), bench(missing=(64, "chain16"))
    full = figures.kernel_speedup(tables.kernel_speedup(whole), whole)
    fig = figures.kernel_speedup(tables.kernel_speedup(part), part)
    said = panels(fig)
    assert set(said) == set(panels(full))  # the grid keeps its place for the pair
    gone = "chain16 (q_len 16), 64 heads"
    assert said[gone] == "not in this bench"
    for title, text in said.items():
        if title != gone:
            assert text == "", (title, text)
    lines = {ax.get_title(): len(ax.get_lines()) for ax in fig.axes}
    assert lines[gone] == 0
    full_lines = {ax.get_title(): len(ax.get_lines()) for ax in full.axes}
    assert all(lines[t] == full_lines[t] for t in lines if t != gone)
    plt.close(full)
    plt.close(fig)


def test_the_other_kernel_grids_mark_the_missing_pair_too() -> None:
    """Time per layer and the peers' figure share the grid: the missing pair's panel is marked
    as not benchmarked there too, not 'no point ran'."""
    style.apply()
    part = bench(missing=(8, "decode"))
    for fig in (
        figures.kernel_lines(part, "ms", "time per layer (ms)"),
        figures.kernel_vs_peers(part),
    ):
        assert panels(fig)["decode (q_len 1), 8 heads"] == "not in this bench"
        plt.close(fig)
