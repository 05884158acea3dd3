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
# # Kernel microbenchmark: verify attention vs context
#
# One attention call per layer at the Kimi-K2 TP8-rank shape (absorbed MLA, latent KV 576 wide),
# per backend, against the ceilings measured on the same device in the same run.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from decodecliff.analysis import figures, layout, style, summarize, tables

# %% tags=["parameters"]
kernels_csv = "results/summary/kernels.csv"  # from the summarize rule
results = "results"  # figures and tables go under {results}/figures|tables/kernels/
published = ""  # a published study folder with the same layout, shown beside this one if present
study_name = "this-study"  # the config's study.name: figure titles name the run
flashinfer_sm120 = ""  # the JSON of `python -m decodecliff.bench.flashinfer_sm120`, if it ran

# %%
style.apply()
studies = {"this run": pd.read_csv(kernels_csv)}
if published and Path(published).is_dir():
    studies["published"] = summarize.load_study(published).kernels
layout.table_dir(results, "kernels").mkdir(parents=True, exist_ok=True)
kernels = studies["this run"]
print(
    f"{len(kernels)} points on {kernels['device'].iloc[0]}:",
    kernels["status"].value_counts().to_dict(),
)


# %%
def draw(study: str, name: str, fig) -> None:
    """Save the figure of this run under its layout name, the published study's beside it."""
    device = studies[study]["device"].dropna()
    title = study_name if study == "this run" else f"published {Path(published).name}"
    fig.suptitle(f"{title} ({device.iloc[0] if len(device) else 'CPU'})", fontweight="bold", y=1.02)
    figures.save(fig, layout.figure_path(results, "kernels", name, published=study != "this run"))
    plt.show()


# %% [markdown]
# ## Time per layer and effective bandwidth
# Effective GB/s counts the latent KV read once (ctx x 576 x 2 bytes); the dashed line is the
# device's measured copy bandwidth, the ceiling for a memory-bound kernel.

# %%
for study, df in studies.items():
    draw(study, "time_per_layer", figures.kernel_lines(df, "ms", "time per layer (ms)"))
    draw(
        study,
        "bandwidth",
        figures.kernel_lines(df, "gbs", "effective bandwidth (GB/s)", "copy_gbs"),
    )

# %% [markdown]
# ## Roofline
# Attained TFLOP/s against arithmetic intensity, under the measured copy and matmul ceilings.

# %%
for study, df in studies.items():
    draw(study, "roofline", figures.roofline(df))

# %% [markdown]
# ## Speedup of the custom kernel over the Triton baseline

# %%
for study, df in studies.items():
    speedup = tables.kernel_speedup(df)
    if study == "this run":
        speedup.to_csv(layout.table_path(results, "kernels", "speedup"), index=False)
    draw(study, "speedup", figures.kernel_speedup(speedup, df))
    display(speedup.round(3))

# %% [markdown]
# ## The custom kernel beside the peers a user could pick instead
# SGLang's own Triton kernels (extend, its split-KV verify, decode at SGLang's split count and at 8
# and 64), FlashInfer's MLA wrapper (fa2 = mma.sync, fa3 = Hopper wgmma) and gather + cuBLAS, timed
# in the same run on the same inputs. Per point: the custom kernel, the fastest peer, each as a
# fraction of the roofline floor (1 = at the floor), and peer ms over custom ms (> 1: custom wins).

# %%
for study, df in studies.items():
    peers = tables.kernel_vs_peers(df)
    if study == "this run":
        peers.to_csv(layout.table_path(results, "kernels", "peers"), index=False)
    draw(study, "peers", figures.kernel_vs_peers(df))
    display(peers.round(3) if len(peers) else f"{study}: no point where custom and a peer both ran")

# %% [markdown]
# ## Does FlashInfer's MLA kernel build for sm_120 within 99 KB of shared memory?
# Compiled on the CPU with nvcc for sm_120 in the tile configuration FlashInfer's dispatcher picks
# for sm_120's 100 KB per SM (read from its source); the shared memory per block is measured from
# the same headers, beside the configuration sm_90 (an H100's or H200's 228 KB per SM) gets.

# %%
fi_doc = json.loads(Path(flashinfer_sm120).read_text()) if flashinfer_sm120 else {}
fi_keys = ["status", "reason", "flashinfer", "builds", "sm120_config", "smem_per_block"]
fi_keys += ["smem_limit_per_block", "fits", "registers", "spill_bytes", "h200_config"]
fi_keys += ["h200_smem_per_block", "seconds"]
fi = pd.DataFrame([{k: json.dumps(fi_doc[k]) if isinstance(fi_doc.get(k), dict) else fi_doc.get(k)
                    for k in fi_keys}])  # fmt: skip
if not fi_doc:
    fi["status"], fi["reason"] = "skipped", "no flashinfer_sm120 JSON given"
fi.to_csv(layout.table_path(results, "kernels", "flashinfer_sm120"), index=False)
display(fi.T)

# %% [markdown]
# ## Points that did not run, and why

# %%
not_ok = tables.not_ok(kernels, "kernels")
not_ok.to_csv(layout.table_path(results, "kernels", "not_ok"), index=False)
display(not_ok if len(not_ok) else "every point ran")
