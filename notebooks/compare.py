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
# # Triton baseline vs the custom kernel, end to end
#
# Decode tok/s per context for every server configuration, the speedup over the Triton baseline,
# and the published RTX PRO 6000 sweep (SGLang Triton backend, TP8) overlaid as the reference.

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from decodecliff.analysis import figures, layout, style, summarize, tables

# %% tags=["parameters"]
sweep_csv = "results/summary/sweep.csv"  # from the summarize rule
reference_csv = "data/reference/seed-rtx-pro-6000-triton.csv"  # the published table
results = "results"  # figures and tables go under {results}/figures|tables/compare/
published = ""  # a published study folder with the same layout, shown beside this one if present
baseline = ""  # the server configuration to compare against (default: the Triton one)

# %%

style.apply()
sweeps = {"this run": pd.read_csv(sweep_csv)}
if published and Path(published).is_dir():
    sweeps["published"] = summarize.load_study(published).sweep
for sweep in sweeps.values():
    style.register_servers(sweep)
reference, source = summarize.reference_table(reference_csv)
bases = {k: tables.baseline_server(s, baseline or None) for k, s in sweeps.items()}
table_dir = layout.table_dir(results, "compare")
table_dir.mkdir(parents=True, exist_ok=True)
display(Markdown(f"**Reference:** {source}"))
display(Markdown(", ".join(f"baseline of {k}: `{v}`" for k, v in bases.items())))

# %%
fig = figures.compare_decode(sweeps, reference)
figures.save(fig, layout.figure_dir(results, "compare") / "decode.png")
plt.show()

# %%
speedups = {k: tables.sweep_speedup(s, bases[k]) for k, s in sweeps.items()}
speedups["this run"].to_csv(table_dir / "speedup.csv", index=False)
fig = figures.compare_speedup(speedups, bases)
figures.save(fig, layout.figure_dir(results, "compare") / "speedup.png")
plt.show()

# %% [markdown]
# ## Decode tok/s per context and speedup over the baseline

# %%
for study, sweep in sweeps.items():
    display(Markdown(f"### {study}"))
    display(tables.sweep_headline(sweep, bases[study]))

# %% [markdown]
# ## The reference table

# %%
display(reference)
