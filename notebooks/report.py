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
# # decodecliff: long-context verify decode on MLA
#
# Why speculative-decoding verify attention collapses at long context with the Triton MLA backend
# (the "1.4 tok/s cliff"), and how much a custom split-KV kernel wins back. Every number below is
# computed from the raw result files of the run named in the setup section.

# %%
import html
from pathlib import Path

import pandas as pd
import yaml
from IPython.display import HTML, Image, Markdown, display

from decodecliff.analysis import layout, provenance, summarize, tables, targets

# %% tags=["parameters"]
summary_dir = "results/summary"  # kernels.csv and sweep.csv from the summarize rule
results = "results"  # the figures of the other notebooks are under {results}/figures/
bench_json = "results/kernels/bench.json"
build_json = "results/build/build.json"
reference_csv = "data/reference/seed-rtx-pro-6000-triton.csv"
published = ""  # a published study folder with the same layout, shown beside this one if present
baseline = ""  # the baseline server configuration (default: the Triton one)
key_contexts = []  # contexts for the kernel table (default: a spread of those that ran)
config = {}  # the study's configuration, shown as run

# %%
here = summarize.load_study(Path(summary_dir).parent)
here.kernels = pd.read_csv(Path(summary_dir) / "kernels.csv")
here.sweep = pd.read_csv(Path(summary_dir) / "sweep.csv")
bench = summarize.read_json(bench_json, summarize.KERNEL_SCHEMA)
build = summarize.read_json(build_json) if Path(build_json).is_file() else {}
studies = {"this run": here}
if published and Path(published).is_dir():
    studies["published"] = summarize.load_study(published)
reference, reference_source = summarize.reference_table(reference_csv)
layout.table_dir(results, "report").mkdir(parents=True, exist_ok=True)


def show(df: pd.DataFrame, table_id: str) -> None:
    """An HTML table with a stable id (the page's tests and readers can find it)."""
    display(HTML(df.to_html(table_id=table_id, na_rep="–", border=0, escape=True)))


env = bench.get("env") or {}
device = env.get("gpu") or f"CPU ({env.get('cpu')}, {env.get('cpu_count')} cores)"
display(
    Markdown(
        f"**This run:** {device}, commit `{env.get('git')}`, torch {env.get('torch')}, "
        f"Triton {env.get('triton')}, CUDA {env.get('cuda_runtime') or 'none'}."
    )
)

# %% [markdown]
# ## Headline: end-to-end verify steps per second
# Verify steps per second on the client's clock, the median over each point's requests (after a
# warm-up request per server launch) with their min–max in brackets, and each server
# configuration's speedup over the Triton baseline at the same context. With random weights no
# draft token is accepted, so tokens/s equal verify steps/s here; a real drafter's acceptance
# length multiplies every server alike (see the comparison figures).

# %%
study_name = (config.get("study") or {}).get("name", "this-study")
tau = float((config.get("sweep") or {}).get("acceptance_length", 3.0))
titles = {"this run": summarize.study_title(study_name, here.sweep)}
for name, study in studies.items():
    if name != "this run":
        titles[name] = summarize.study_title(Path(published).name, study.sweep, True)
for name, study in studies.items():
    base = tables.baseline_server(study.sweep, baseline or None)
    headline = tables.sweep_headline(study.sweep, base)
    if name == "this run":
        headline.to_csv(layout.table_path(results, "report", "headline"))
    display(Markdown(f"**{titles[name]}** (baseline `{base}`): {tables.counts(study.sweep)}."))
    show(headline, "headline" if name == "this run" else f"headline-{name}")

# %% [markdown]
# ## Every end-to-end number, and what the servers did
# Per server configuration and context: verify steps/s from the client's clock and from the
# server's own step times, tok/s and tok/s at the acceptance length tau of the configuration,
# TTFT (medians, min–max in brackets), the requests and verify steps each rests on, and the
# server's own account read after the point (defragmentation runs, KV pages moved, CUDA graphs
# captured; "–" where the study's files predate that record).

# %%
for name, study in studies.items():
    long = tables.sweep_long(study.sweep, tau)
    if name == "this run":
        long.to_csv(layout.table_path(results, "report", "sweep"), index=False)
    display(Markdown(f"**{titles[name]}**"))
    show(long.set_index(["server", "context"]), "sweep" if name == "this run" else f"sweep-{name}")

# %% [markdown]
# ## Targets
# The study's targets (the configuration's `targets`), checked against each study's result files:
# met, missed and by how much, or not measured and why. A published study's `NOTES.md` (why a
# target was missed, what would close it) follows its table.

# %%
target_list = targets.parse(config.get("targets"))
if not target_list:
    display(Markdown("*No targets in the configuration.*"))
for name, study in studies.items():
    checked = targets.evaluate(study, target_list)
    if name == "this run":
        checked.to_csv(layout.table_path(results, "report", "targets"), index=False)
    if not target_list:
        continue
    display(Markdown(f"**{name}**"))
    show(targets.display_table(checked), "targets" if name == "this run" else f"targets-{name}")
    study_notes = targets.notes(study.root)
    if study_notes:
        display(Markdown(f"*Notes on {name} (`NOTES.md`):*"))
        display(Markdown(study_notes))

# %% [markdown]
# ## Headline: attention time per layer
# One attention call (one layer) at the key contexts, per backend and page size; "skipped" and
# "failed" cells say the point did not run (the reasons are listed under *What ran where*).

# %%
for name, study in studies.items():
    if study.kernels.empty:
        continue
    contexts = tables.key_contexts(study.kernels["ctx"], key_contexts)
    table = tables.kernel_headline(study.kernels, contexts)
    if name == "this run":
        table.to_csv(layout.table_path(results, "report", "kernels_at_key_contexts"))
    display(Markdown(f"**{name}** ({study.kernels['device'].iloc[0]})"))
    show(table, "headline-kernels" if name == "this run" else f"headline-kernels-{name}")
    speedup = tables.kernel_speedup(study.kernels)
    speedup = speedup[speedup["ctx"].isin(contexts)]
    if len(speedup):
        pivot = speedup.pivot_table(
            index=["mode", "heads", "page_size", "baseline"], columns="ctx", values="speedup"
        ).round(1)
        pivot.columns = [tables.ctx_label(c) for c in pivot.columns]
        display(Markdown("Speedup of the custom kernel over the Triton baseline (x):"))
        show(pivot, f"kernel-speedup-{name.replace(' ', '-')}")

# %% [markdown]
# ## Setup: hardware, versions, commit

# %%
show(provenance.environment(env, here.sweep, build), "environment")
for name, study in studies.items():
    if name != "this run":
        display(Markdown(f"**{name}**"))
        show(
            provenance.environment(study.bench_env, study.sweep, study.build), f"environment-{name}"
        )

# %% [markdown]
# ## What ran where
# Per backend and server configuration: the device it ran on, how many points ran, and why the
# others did not.

# %%
for stage, table in provenance.what_ran(here.kernels, here.sweep).items():
    display(Markdown(f"**{stage}**"))
    show(table.set_index(table.columns[0]), f"ran-{stage.split()[0]}")
if build:
    display(Markdown("**custom kernel build**"))
    show(provenance.build_facts(build), "build")
    kernels_built = provenance.build_kernels(build)
    if len(kernels_built):
        show(kernels_built, "build-kernels")
else:
    display(Markdown("**custom kernel build:** no build record in this run."))

# %% [markdown]
# ## Figures

# %%
for key, title, png in layout.report_figures(results):
    if not png.is_file():
        display(Markdown(f"*missing figure: `{png}`*"))
        continue
    display(Markdown(f"**{key}** — {title.format(study=titles['this run'], tau=tau)}"))
    display(Image(filename=str(png)))

# %% [markdown]
# ## Configuration of this run

# %%
text = yaml.safe_dump(config, sort_keys=False) if config else "no configuration passed"
display(HTML(f"<pre id='configuration'>{html.escape(text)}</pre>"))

# %% [markdown]
# ## The reference table

# %%
display(Markdown(f"Source: {reference_source}"))
show(reference, "reference")
