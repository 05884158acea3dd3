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
# # Triton baseline vs the custom kernel, end to end
#
# Verify steps per second per context for every server configuration (medians over each point's
# requests, bars min–max), compared like with like against the published RTX PRO 6000 sweep
# (SGLang Triton backend, TP8, a real model with real acceptance): its slowdown relative to its
# own shortest context against each server's, and absolute tokens/s only where the units agree
# (the servers' verify steps/s times the acceptance length tau of the configuration).

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from decodecliff.analysis import figures, headline, layout, style, summarize, tables

# %% tags=["parameters"]
sweep_csv = "results/summary/sweep.csv"  # from the summarize rule
kernels_csv = "results/summary/kernels.csv"  # its ceilings: the steps' floor (analysis/floors.py)
reference_csv = "data/reference/seed-rtx-pro-6000-triton.csv"  # the published table
results = "results"  # figures and tables go under {results}/figures|tables/compare/
published = ""  # a published study folder with the same layout, shown beside this one if present
baseline = ""  # the server configuration to compare against (default: the Triton one)
study_name = "this-study"  # the config's study.name: figure titles name the run
tau = 3.0  # acceptance length of "tok/s at tau" (the config's sweep.acceptance_length)

# %%

style.apply()
sweeps = {"this run": pd.read_csv(sweep_csv)}
titles = {"this run": summarize.study_title(study_name, sweeps["this run"])}
ceilings = {"this run": summarize.ceilings_of(pd.read_csv(kernels_csv))}
if published and Path(published).is_dir():
    published_study = summarize.load_study(published)
    sweeps["published"], ceilings["published"] = published_study.sweep, published_study.ceilings
    titles["published"] = summarize.study_title(Path(published).name, sweeps["published"], True)
for sweep in sweeps.values():
    style.register_servers(sweep)
reference, source = summarize.reference_table(reference_csv)
bases = {k: tables.baseline_server(s, baseline or None) for k, s in sweeps.items()}
layout.table_dir(results, "compare").mkdir(parents=True, exist_ok=True)
display(Markdown(f"**Reference:** {source}"))
display(Markdown(", ".join(f"baseline of {titles[k]}: `{v}`" for k, v in bases.items())))

# %% [markdown]
# ## The finding: verify steps/s against context
# The servers that matter (SGLang Triton, FlashInfer, the custom kernel; CUDA graphs solid, eager
# dashed), the rate of a step at its floor (black dashed), the RTX PRO 6000 table overlaid in its
# own unit, the cliff and the win annotated. The
# report page and the README open with this figure (this run's, and the published study's).

# %%
for study, sweep in sweeps.items():
    title = f"{titles[study]}: verify steps/s against context"
    fig = headline.figure(sweep, reference, title, ceilings[study])
    pub = study != "this run"
    figures.save(fig, layout.figure_path(results, "compare", "headline", published=pub))
    plt.show()

# %% [markdown]
# ## The slowdown along the context, like with like

# %%
fig = figures.compare_relative(sweeps, reference, titles)
figures.save(fig, layout.figure_path(results, "compare", "relative"))
plt.show()

# %% [markdown]
# ## Tokens/s at acceptance length tau beside the published tokens/s

# %%
fig = figures.compare_absolute(sweeps, reference, titles, tau)
figures.save(fig, layout.figure_path(results, "compare", "absolute"))
plt.show()

# %%
speedups = {k: tables.sweep_speedup(s, bases[k]) for k, s in sweeps.items()}
speedups["this run"].to_csv(layout.table_path(results, "compare", "speedup"), index=False)
graphs = {k: style.graph_servers(s) for k, s in sweeps.items()}
fig = figures.compare_speedup(speedups, bases, titles, graphs)
figures.save(fig, layout.figure_path(results, "compare", "speedup"))
plt.show()

# %% [markdown]
# ## Verify steps/s per context and speedup over the baseline

# %%
for study, sweep in sweeps.items():
    display(Markdown(f"### {titles[study]}\n{tables.counts(sweep)}."))
    display(tables.sweep_headline(sweep, bases[study]))

# %% [markdown]
# ## The reference table

# %%
display(reference)
