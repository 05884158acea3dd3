# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: title
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # End-to-end context sweep of one server configuration
#
# Several streaming requests per context after a warm-up: verify steps per second from the
# client's clock and from the server's own step times (the primary number; how tokens/s relate to
# it is said below, from the acceptance the points recorded), decode tok/s and tok/s at the
# configured acceptance length tau, time to first token, prefill rate, inter-token latency
# percentiles and accepted tokens per verify step. Each point is the median over its requests,
# the bars their min–max. Failed and skipped points are marked on the context axis (X failed,
# square skipped) and listed with their reasons below.

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from decodecliff.analysis import figures, layout, style, summarize, tables

# %% tags=["parameters"]
sweep_csv = "results/summary/sweep.csv"  # from the summarize rule
server = "triton"  # the server configuration to show
results = "results"  # figures and tables go under {results}/figures|tables/sweep/{server}/
study_name = "this-study"  # the config's study.name: figure titles name the run
tau = 3.0  # acceptance length of "tok/s at tau" (the config's sweep.acceptance_length)

# %%
style.apply()
sweep = pd.read_csv(sweep_csv)
style.register_servers(sweep)
points = sweep[sweep["server"] == server].sort_values("requested_ctx")
if points.empty:
    raise ValueError(f"no sweep points for server {server!r} in {sweep_csv}")
layout.table_dir(results, "sweep", server).mkdir(parents=True, exist_ok=True)
first = points.iloc[0]
display(
    Markdown(
        f"`{server}`: backend {first['backend']}, page size {first['page_size']}, "
        f"CUDA graphs {first['cuda_graph']}, defrag {first['defrag']}, spec {first['spec']}, "
        f"{int(first.get('concurrency', 1))} stream(s) at once. {tables.counts(points)}. "
        f"{tables.tokens_said(points)}."
    )
)
print(points["status"].value_counts().to_string())

# %%
title = summarize.study_title(study_name, sweep)
fig = figures.sweep_metrics(points, server, title, tau)
figures.save(fig, layout.figure_path(results, "sweep", "metrics", server))
plt.show()

# %% [markdown]
# ## Every point
# Medians over the point's requests; `requests` and `verify_steps` say what each rests on, the
# `_min`/`_max` columns of the summary table give the spread. The last four columns are the
# server's own account, read after the point: defragmentation runs and KV pages moved, the
# fragmentation of the requests' pages, CUDA graphs captured.

# %%
cols = [
    "requested_ctx",
    "prompt_tokens",
    "concurrency",
    "status",
    "requests",
    "verify_steps",
    "verify_steps_s_client",
    "verify_steps_s_client_min",
    "verify_steps_s_client_max",
    "verify_steps_s_server",
    "verify_step_ms_server",
    "decode_tok_s",
    "round_tok_s",
    "ttft_s",
    "prefill_tok_s",
    "itl_ms_p50",
    "itl_ms_p90",
    "itl_ms_p99",
    "tpot_ms",
    "spec_accept_length",
    "defrag_runs",
    "defrag_pages_moved",
    "request_fragmentation",
    "cuda_graphs_captured",
    "reason",
]
table = points[[c for c in cols if c in points]]
table.to_csv(layout.table_path(results, "sweep", "points", server), index=False)
display(table.round(3))
