# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: title
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

from decodecliff.analysis import figures, layout, style

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
    """The step anatomy figure (analysis/figures.py), saved under its layout path."""
    fig = figures.engine_anatomy(table, title)
    figures.save(fig, path)
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
