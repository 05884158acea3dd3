# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Step anatomy: where a verify step's time goes
#
# One decode / verify step of the served model per context (`decodecliff bench-engine`), split
# into attention (the step minus the same step with a no-op attention), GEMMs (projection kernels
# in a profile of one step) and the rest (elementwise kernels, launch gaps, host work), per
# configuration (backend x CUDA graphs or eager), with the floor drawn: the weights read once
# plus the latent KV read once at the measured copy rate (or the FLOPs at the measured matmul
# rate, whichever is larger).

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from decodecliff.analysis import layout, style

# %% tags=["parameters"]
bench_json = "results/engine/bench.json"  # from the bench_engine rule
results = "results"  # the figure and table go under {results}/figures|tables/engine/
published = ""  # a published study folder: its engine/bench.json is drawn beside this run

# %%
style.apply()
doc = json.loads(Path(bench_json).read_text())
rows = pd.DataFrame(doc["rows"])
env, ceil = doc["env"], doc["ceilings"] or {}
device = env.get("gpu") or f"CPU ({env.get('cpu')})"
display(
    Markdown(
        f"**{device}**, commit `{env.get('git')}`, torch {env.get('torch')}; measured copy "
        f"{ceil.get('copy_gbs', float('nan')):.0f} GB/s, matmul "
        f"{ceil.get('matmul_tflops', float('nan')):.1f} TFLOP/s ({ceil.get('matmul')})."
    )
)
layout.figure_dir(results, "engine").mkdir(parents=True, exist_ok=True)
layout.table_dir(results, "engine").mkdir(parents=True, exist_ok=True)

# %%
columns = ["backend", "path", "mode", "context", "step_ms", "attention_ms", "gemm_ms", "rest_ms"]
columns += ["step_floor_ms", "weights_floor_ms", "attention_floor_ms", "non_attention_over_floor"]
table = rows[columns] if len(rows) else pd.DataFrame(columns=columns)
table.to_csv(layout.table_path(results, "engine", "anatomy"), index=False)
display(table.round(3))
for err in doc.get("errors", []):
    display(Markdown(f"*not measured: {err['what']}: `{err['error']}`*"))


# %%
def draw(table: pd.DataFrame, title: str, path: Path) -> None:
    """Stacked attention / GEMMs / rest per context, one panel per configuration, floor drawn."""
    configs = list(table.groupby(["mode", "backend", "path"], sort=False)) if len(table) else []
    n = max(len(configs), 1)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 4), squeeze=False)
    parts = [("attention_ms", "attention", "#0072B2"), ("gemm_ms", "GEMMs", "#E69F00")]
    parts.append(("rest_ms", "rest", "#999999"))
    for ax, ((mode, backend, path_), df) in zip(axes[0], configs, strict=False):
        df = df.sort_values("context")
        x = list(range(len(df)))
        bottom = pd.Series(0.0, index=df.index)
        for col, label, color in parts:
            height = df[col].clip(lower=0)
            ax.bar(x, height, bottom=bottom, color=color, label=label, width=0.7)
            bottom += height
        ax.plot(x, df["step_floor_ms"], "k_-", ms=18, lw=1, label="floor (weights + KV)")
        ax.plot(x, df["weights_floor_ms"], "k--", lw=0.8, label="weights floor")
        ax.set_xticks(x, [f"{c // 1000}k" if c >= 1000 else str(c) for c in df["context"]])
        ax.set_title(f"{backend}, {path_} ({mode})")
        ax.set_xlabel("context (tokens)")
        ax.set_ylim(0, bottom.max() * 1.15)  # each panel its own scale: Triton's 185k is ~2 s
    axes[0][0].set_ylabel("time per step (ms)")
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.show()


draw(table, f"Step anatomy on {device}", layout.figure_path(results, "engine", "anatomy"))

# %% [markdown]
# The published study's step anatomy (its raw bench output), when the configuration names one.

# %%
published_json = Path(published or "-") / "engine" / "bench.json"
if published and published_json.is_file():
    pub = json.loads(published_json.read_text())
    pub_table = pd.DataFrame(pub["rows"])[columns]
    display(pub_table.round(3))
    pub_device = pub["env"].get("gpu") or "CPU"
    title = (
        f"Published study: step anatomy on {pub_device} (commit {str(pub['env'].get('git'))[:7]})"
    )
    draw(pub_table, title, layout.figure_path(results, "engine", "anatomy", published=True))
