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
# # End-to-end context sweep of one server configuration
#
# One streaming request per context: time to first token, prefill and decode rates, inter-token
# latency percentiles and accepted tokens per verify step. Failed and skipped points are marked
# on the context axis (X failed, square skipped) and listed with their reasons below.

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from decodecliff.analysis import figures, layout, style

# %% tags=["parameters"]
sweep_csv = "results/summary/sweep.csv"  # from the summarize rule
server = "triton"  # the server configuration to show
results = "results"  # figures and tables go under {results}/figures|tables/sweep/{server}/

# %%
style.apply()
sweep = pd.read_csv(sweep_csv)
style.register_servers(sweep)
points = sweep[sweep["server"] == server].sort_values("requested_ctx")
if points.empty:
    raise ValueError(f"no sweep points for server {server!r} in {sweep_csv}")
table_dir = layout.table_dir(results, "sweep", server)
table_dir.mkdir(parents=True, exist_ok=True)
first = points.iloc[0]
print(
    f"{server}: backend {first['backend']}, page size {first['page_size']}, "
    f"CUDA graphs {first['cuda_graph']}, defrag {first['defrag']}, spec {first['spec']}"
)
print(points["status"].value_counts().to_string())

# %%
fig = figures.sweep_metrics(points, server)
figures.save(fig, layout.figure_dir(results, "sweep", server) / "metrics.png")
plt.show()

# %% [markdown]
# ## Every point

# %%
cols = [
    "requested_ctx",
    "prompt_tokens",
    "status",
    "ttft_s",
    "prefill_tok_s",
    "decode_tok_s",
    "itl_ms_p50",
    "itl_ms_p90",
    "itl_ms_p99",
    "tpot_ms",
    "spec_accept_length",
    "reason",
]
table = points[[c for c in cols if c in points]]
table.to_csv(table_dir / "points.csv", index=False)
display(table.round(3))
