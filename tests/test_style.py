"""One colour per backend, kernel series and server, defined once in analysis/style.py: every name
a study can produce has one, the servers of one study differ, and the figures keep their legends
short."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import yaml

from decodecliff.analysis import figures, layout, style, summarize
from decodecliff.bench.kernels import DECODE_SPLITS, FLASHINFER_BACKENDS, split_label
from decodecliff.kernels.custom import VARIANTS
from decodecliff.kernels.registry import BACKENDS
from decodecliff.kernels.triton_baseline import ARCH_CONFIGS

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "results" / "published" / "h200"
CONFIGS = [ROOT / "config.yaml", *sorted((ROOT / "config").glob("*.yaml"))]


def kernel_series() -> list[str]:
    """Every series name the kernel bench can write: backend, or backend (variant)."""
    splits = [split_label(s) for s in [*DECODE_SPLITS, 8, 16, 32, 64] if s != 0]
    variants = {
        "triton": [*ARCH_CONFIGS, *(f"{a}-extend" for a in ARCH_CONFIGS)]
        + [f"grouped-{s}" for s in splits],
        "sglang": ["extend", "verify", *(f"decode-{s}" for s in splits)],
        "flashinfer": FLASHINFER_BACKENDS,
        "custom": list(VARIANTS),
    }
    names = list(BACKENDS)
    for backend, labels in variants.items():
        names += [f"{backend} ({label})" for label in labels]
    return names


def config_servers() -> dict[Path, list[str]]:
    return {
        path: [s["name"] for s in (yaml.safe_load(path.read_text()).get("sweep") or {}).get(
            "servers", []
        )]
        for path in CONFIGS
    }  # fmt: skip


@pytest.mark.parametrize("name", kernel_series())
def test_every_backend_and_kernel_series_has_a_colour(name: str) -> None:
    assert style.has_color(name), f"{name!r} has no colour in analysis/style.py"
    assert style.color(name) != style.FALLBACK


def test_every_backend_of_the_registry_is_listed_by_name() -> None:
    assert set(BACKENDS) <= set(style.BACKEND_COLORS), set(BACKENDS) - set(style.BACKEND_COLORS)
    assert len(set(style.BACKEND_COLORS.values())) == len(style.BACKEND_COLORS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_server_of_every_config_has_its_own_colour(path: Path) -> None:
    names = config_servers()[path]
    missing = [n for n in names if n not in style.SERVER_COLORS]
    assert not missing, f"{path.name}: servers without a colour in analysis/style.py: {missing}"
    colours = [style.color(n) for n in names]
    assert len(set(colours)) == len(colours), dict(zip(names, colours, strict=True))


def test_a_peer_kernel_series_differs_from_the_others_in_its_figure() -> None:
    """The peers figure draws custom, SGLang's, FlashInfer's and cuBLAS series in one panel."""
    decode = ["custom", "sglang (decode-sglang)", "flashinfer (fa2)", "flashinfer (fa3)", "cublas"]
    verify = ["custom", "sglang (extend)", "sglang (verify)", "flashinfer (fa2)"]
    verify += ["flashinfer (fa3)", "cublas"]
    for panel in (decode, verify):
        assert len({style.color(n) for n in panel}) == len(panel), panel


def test_eager_servers_are_dashed() -> None:
    assert style.linestyle(True) == "-" and style.linestyle("True") == "-"
    assert style.linestyle(False) == "--" and style.linestyle(float("nan")) == "--"


def legend_entries(fig) -> int:
    return sum(len(leg.get_texts()) for leg in [*fig.legends, *(a.get_legend() for a in fig.axes)]
               if leg is not None)  # fmt: skip


@pytest.mark.skipif(not PUBLISHED.is_dir(), reason="no published study in this checkout")
def test_kernel_figures_keep_their_legends_short() -> None:
    style.apply()
    kernels = summarize.load_study(PUBLISHED).kernels
    drawn = {
        "time_per_layer": figures.kernel_lines(kernels, "ms", "time per layer (ms)"),
        "peers": figures.kernel_vs_peers(kernels),
    }
    for name, fig in drawn.items():
        assert legend_entries(fig) <= 10, (name, legend_entries(fig))  # 8 + seaborn's subtitles
        plt.close(fig)


def test_the_step_anatomy_of_many_configurations_is_a_grid() -> None:
    """Seven backends on two paths: rows of four panels, none wider than four, every panel
    titled with its configuration, the empty places hidden."""
    backends = ["custom", "custom (sm120)", "triton", "sglang", "flashinfer (fa2)",
                "flashinfer (fa3)", "flashinfer (fa2-sm120)"]  # fmt: skip
    rows = [
        {"backend": b, "path": p, "mode": "chain", "context": c, "attention_ms": 1.0 + c / 1e5,
         "gemm_ms": 3.8, "rest_ms": 1.5, "step_floor_ms": 2.3 + c / 1e5, "weights_floor_ms": 2.25,
         "step_ms": 6.3 + c / 1e5}
        for b in backends for p in ("graphs", "eager") for c in (1024, 185000)
    ]  # fmt: skip
    style.apply()
    fig = figures.engine_anatomy(pd.DataFrame(rows), "anatomy")
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(shown) == 14 and len(fig.axes) == 16
    assert fig.get_size_inches()[0] <= 3.6 * figures.ANATOMY_COLUMNS + 1e-9
    titles = {ax.get_title() for ax in shown}
    assert {f"{b}, {p} (chain)" for b in backends for p in ("graphs", "eager")} == titles
    plt.close(fig)
    one = figures.engine_anatomy(pd.DataFrame(rows[:2]), "one")
    assert len(one.axes) == 1
    plt.close(one)


def test_a_step_whose_parts_are_not_resolved_says_so() -> None:
    """A part below zero (timing noise over its size) is drawn as 0 and the panel names it; the
    measured step is marked on every bar."""
    rows = [
        {"backend": "torch", "path": "eager", "mode": "chain", "context": c, "step_ms": 6.0,
         "attention_ms": 0.5, "gemm_ms": 6.2, "rest_ms": rest, "step_floor_ms": 0.1,
         "weights_floor_ms": 0.1}
        for c, rest in ((256, -0.7), (1024, 0.2))
    ]  # fmt: skip
    fig = figures.engine_anatomy(pd.DataFrame(rows), "anatomy")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "1 of 2 contexts: a part below 0 (noise), drawn as 0" in texts
    marks = [line for line in fig.axes[0].lines if line.get_label() == "measured step"]
    assert list(marks[0].get_ydata()) == [6.0, 6.0]
    plt.close(fig)


def test_an_engine_configuration_on_another_gemm_path_keeps_its_backends_colour() -> None:
    assert style.color("custom + fused GEMMs") == style.color("custom")
    assert style.color("custom (sm120) + fused GEMMs") == style.color("custom (sm120)")


def test_the_tokens_figure_says_no_draft_is_accepted_only_where_the_points_show_it() -> None:
    """The tok/s-at-tau figure's note on drafts is each panel's data: acceptance 1 (the bonus
    token alone) at every point drawn reads 'random weights accept no draft'; other measured
    acceptance is given as measured; points that record none say nothing of it."""
    data = Path(__file__).resolve().parent / "data"
    sweeps = {
        "none accepted": summarize.load_study(data / "study").sweep,  # 1 token per verify step
        "accepted": summarize.load_study(data / "published").sweep,  # 2 tokens per verify step
    }
    sweeps["unrecorded"] = sweeps["none accepted"].drop(columns="spec_accept_length")
    titles = {k: k for k in sweeps}
    fig = figures.compare_absolute(sweeps, None, titles, 3.0)
    said = {ax.get_title(): " ".join(t.get_text() for t in ax.texts) for ax in fig.axes}
    plt.close(fig)
    assert "random weights accept no draft" in said["none accepted, assumed τ=3"]
    assert "random weights accept no draft" not in said["accepted, assumed τ=3"]
    assert "measured: 2 tokens per verify step" in said["accepted, assumed τ=3"]
    for title in ("accepted, assumed τ=3", "unrecorded, assumed τ=3"):
        assert "no draft" not in said[title] and "verify steps/s x 3" in said[title]
    assert "tokens per verify step" not in said["unrecorded, assumed τ=3"]
    # the caption beside it says nothing the panels' data may not show
    assert "no draft" not in layout.FIGURES["compare"]["absolute"]
