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
#   title: 'decodecliff: why MLA verify attention collapses at long context, and what
#     wins it back'
# ---

# %% [markdown]
# # Why MLA verify attention collapses at long context, and what wins it back
#
# Speculative decoding verifies a draft of 16 tokens per step; on MLA models (Kimi K2) SGLang's
# Triton backend does that ever slower as the context grows (the "1.4 tok/s cliff"). Below: the
# finding first, then the evidence, then every number; all computed from the run's result files.

# %%
import json
from pathlib import Path

import pandas as pd
import yaml
from IPython.display import HTML, Markdown, display

from decodecliff.analysis import headline, layout, page, provenance, summarize, tables, targets

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
study_name = (config.get("study") or {}).get("name", "this-study")
tau = float((config.get("sweep") or {}).get("acceptance_length", 3.0))
# How every heading names each study: its name and GPU, the study beside this run "published"
# (the keys of `studies` are the notebook's own, no heading's).
titles = {"this run": summarize.study_title(study_name, here.sweep)}
if "published" in studies:
    titles["published"] = summarize.study_title(
        Path(published).name, studies["published"].sweep, True
    )
engine_json = {"this run": Path(results) / "engine" / "bench.json"}
engine_json["published"] = Path(published or "-") / "engine" / "bench.json"
shown: set[str] = set()  # the figures shown so far; the rest follow under "Every figure"
# This study's analyses and servers, from its config: a figure an earlier config left on disk (a
# server since removed, an engine section, a published study) is not this study's.
servers = [server["name"] for server in config["sweep"]["servers"]] if config else None
analyses = [a for a in layout.FIGURES if a != "engine" or "engine" in config] if config else None


def in_study(analysis: str) -> bool:
    return layout.in_study(results, analysis, analyses)


def engine(name: str) -> pd.DataFrame | None:
    """A study's step anatomy; none for this run where its config has no engine bench (a file
    left by an earlier config is not this run's)."""
    if name == "this run" and not in_study("engine"):
        return None
    path = engine_json[name]
    return headline.engine_rows(json.loads(path.read_text())) if path.is_file() else None


def show(df: pd.DataFrame, table_id: str) -> None:
    display(HTML(page.table(df, table_id)))


def show_figure(key: str, caption: str | None = None) -> None:
    """A figure of layout.py by key ("kernels/peers"), this run's and the published study's."""
    analysis, name = key.split("/", 1)
    if not in_study(analysis):
        return
    for pub in (False, True) if "published" in studies else (False,):
        path = layout.figure_path(results, analysis, name, published=pub)
        if not path.is_file():
            if not pub:
                display(HTML(page.missing(path)))
            continue
        text = caption or layout.FIGURES[analysis][name].format(study=titles["this run"], tau=tau)
        who = titles.get("published" if pub else "this run", "")
        fig_key = f"{analysis}/{layout.PUBLISHED if pub else ''}{name}"
        display(HTML(page.figure(path, f"{who}: {text}", fig_key)))
        shown.add(fig_key)


# %% [markdown]
# ## The finding

# %%
finding = ["published", "this run"] if "published" in studies else ["this run"]
for name in finding:
    sweep = studies[name].sweep
    path = layout.figure_path(results, "compare", "headline", published=name != "this run")
    if path.is_file():
        fig_key = f"compare/{layout.PUBLISHED if name != 'this run' else ''}headline"
        display(HTML(page.figure(path, f"{titles[name]}: {headline.alt_text(sweep)}", fig_key)))
        shown.add(fig_key)
    said = headline.sentences(sweep, engine(name), reference, studies[name].ceilings)
    display(Markdown("\n\n".join(said)))

# %% [markdown]
# ## The evidence
# ### Attention time per layer against context, beside the peers
# One attention call (one layer of the 61) per context, the custom kernel beside what a user
# could run instead, timed in the same run on the same inputs; the dashed line is each point's
# floor (the latent read once at the measured copy rate, or the FLOPs at the matmul rate).

# %%
show_figure("kernels/peers")

# %% [markdown]
# ### Where a verify step's time goes
# One verify step of the served model per context, split into attention, GEMMs and the rest,
# beside the step's floor (weights and latent KV read once at the measured copy rate).

# %%
show_figure("engine/anatomy")
if not in_study("engine"):
    display(Markdown("*This study measured no step anatomy (no `engine` section in its config).*"))

# %% [markdown]
# ### How far from the floor
# Attained TFLOP/s under the measured ceilings, and the effective bandwidth against the measured
# copy bandwidth.

# %%
show_figure("kernels/roofline")
show_figure("kernels/bandwidth")

# %% [markdown]
# ### Fidelity to SGLang
# The study's Triton baseline beside SGLang's own kernel as SGLang runs it (extend for a verify,
# decode at SGLang's split count), page size 1: ms per layer and their ratio (1 = the same time).

# %%
for name, study in studies.items():
    contexts = tables.key_contexts(study.kernels["ctx"], key_contexts) if len(study.kernels) else []
    same = tables.fidelity(study.kernels, contexts) if contexts else pd.DataFrame()
    display(Markdown(f"**{titles[name]}**"))
    if same.empty:
        display(Markdown("*SGLang's kernels did not run beside the Triton baseline here.*"))
        continue
    show(
        same.round(3).set_index(["mode", "heads", "context"]), f"fidelity-{name.replace(' ', '-')}"
    )

# %% [markdown]
# ### FlashInfer on sm_120's shared memory
# FlashInfer picks its fa2 MLA kernel's tiles from the GPU's shared memory per SM: the build
# check compiles it for sm_120 and reads the configuration its dispatch takes there.

# %%
for name, study in studies.items():
    check = layout.table_path(study.root, "kernels", "flashinfer_sm120")
    display(Markdown(f"**{titles[name]}**: {tables.flashinfer_sm120(check)}"))

# %% [markdown]
# ## End to end, every number
# Verify steps per second on the client's clock, the median over each point's requests (after a
# warm-up request per server launch) with their min–max in brackets; a row per server
# configuration, the fastest at the longest context first, under the floor's (the weights read
# once at the measured copy rate, each layer's attention at the copy rate or the matmul rate, the
# larger); after the `·`, the speedup over the Triton baseline at the same context. How tokens/s
# relate to verify steps/s follows each study's name, from the acceptance its points recorded.

# %%
for name, study in studies.items():
    base = tables.baseline_server(study.sweep, baseline or None)
    table = tables.sweep_headline(study.sweep, base, study.ceilings)
    if name == "this run":
        table.to_csv(layout.table_path(results, "report", "headline"))
    display(Markdown(
        f"**{titles[name]}** (baseline `{base}`): {tables.counts(study.sweep)}. "
        f"{tables.tokens_said(study.sweep)}."
    ))  # fmt: skip
    show(table, "headline" if name == "this run" else f"headline-{name}")
for key in ("compare/relative", "compare/absolute", "compare/speedup"):
    show_figure(key)

# %% [markdown]
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
    body = page.table(
        long.set_index(["server", "context"]), "sweep" if name == "this run" else f"sweep-{name}"
    )
    display(HTML(page.details(f"Every end-to-end number: {titles[name]}", body)))

# %% [markdown]
# ## Targets
# This run's targets (the configuration's `targets`), checked against its result files: met,
# missed and by how much, or not measured and why. A published study shows the targets it was
# judged by when it was published, its own configuration's, and its `NOTES.md` (why a target
# was missed, what would close it) follows its table.

# %%
target_list = targets.parse(config.get("targets"))
for name, study in studies.items():
    own = None if name == "this run" else targets.published(study.root)
    checked = targets.evaluate(study, target_list) if own is None else own
    if name == "this run":
        checked.to_csv(layout.table_path(results, "report", "targets"), index=False)
    if checked.empty:
        display(Markdown(f"*No targets for {titles[name]}.*"))
        continue
    display(Markdown(f"**{titles[name]}**"))
    show(targets.display_table(checked), "targets" if name == "this run" else f"targets-{name}")
    study_notes = targets.notes(study.root)
    if study_notes:
        display(Markdown(f"*Notes on {titles[name]} (`NOTES.md`):*"))
        display(Markdown(page.nested_notes(study_notes, f"notes-{name.replace(' ', '-')}")))

# %% [markdown]
# ## Kernels, every number
# One attention call (one layer) at the key contexts, per backend and page size; "skipped" and
# "failed" cells say the point did not run (the reasons are listed under *What ran where*).

# %%
display(Markdown(
    f"A time whose repeats spread by more than {tables.SPREAD_SHOWN:.0%} (half of the slowest "
    "minus the fastest, over the median) shows their range: median (fastest–slowest)."
))  # fmt: skip
for name, study in studies.items():
    if study.kernels.empty:
        continue
    contexts = tables.key_contexts(study.kernels["ctx"], key_contexts)
    table = tables.kernel_headline(study.kernels, contexts)
    if name == "this run":
        table.to_csv(layout.table_path(results, "report", "kernels_at_key_contexts"))
    display(Markdown(f"**{titles[name]}**"))
    show(table, "headline-kernels" if name == "this run" else f"headline-kernels-{name}")
    speedup = tables.kernel_speedup(study.kernels)
    speedup = speedup[speedup["ctx"].isin(contexts)]
    if len(speedup):
        pivot = speedup.pivot_table(
            index=["mode", "heads", "page_size", "baseline"], columns="ctx", values="speedup"
        ).map(lambda r: "–" if pd.isna(r) else tables.times(r))  # 0.967x, not a rounded 1.0
        pivot.columns = [tables.ctx_label(c) for c in pivot.columns]
        display(Markdown("Speedup of the custom kernel over the Triton baseline:"))
        show(pivot, f"kernel-speedup-{name.replace(' ', '-')}")

# %% [markdown]
# ## Every other figure

# %%
for key, title, png in layout.report_figures(results, analyses, servers, "published" in studies):
    if key in shown:
        continue
    if not png.is_file():
        display(HTML(page.missing(png)))
        continue
    text = title.format(study=titles["this run"], tau=tau)
    display(HTML(page.figure(png, f"{key}: {text}", key)))

# %% [markdown]
# ## Setup: hardware, versions, what ran where, configuration

# %%
env = bench.get("env") or {}
device = env.get("gpu") or f"CPU ({env.get('cpu')}, {env.get('cpu_count')} cores)"
display(
    Markdown(
        f"**{titles['this run']}:** {device}, commit `{env.get('git')}`, "
        f"torch {env.get('torch')}, Triton {env.get('triton')}, "
        f"CUDA {env.get('cuda_runtime') or 'none'}."
    )
)
parts = [f"<p><strong>{titles['this run']}</strong></p>"]
parts += [page.table(provenance.environment(env, here.sweep, build), "environment")]
for name, study in studies.items():
    if name != "this run":
        env_table = provenance.environment(study.bench_env, study.sweep, study.build)
        parts += [f"<p><strong>{titles[name]}</strong></p>"]
        parts += [page.table(env_table, f"environment-{name}")]
display(HTML(page.details("Hardware, driver, versions and commits", "".join(parts), "setup")))

# %%
parts = []
for stage, table in provenance.what_ran(here.kernels, here.sweep).items():
    parts += [f"<p><strong>{stage}</strong></p>"]
    parts += [page.table(table.set_index(table.columns[0]), f"ran-{stage.split()[0]}")]
if build:
    parts += ["<p><strong>custom kernel build</strong></p>"]
    parts += [page.table(provenance.build_facts(build), "build")]
    kernels_built = provenance.build_kernels(build)
    if len(kernels_built):
        parts += [page.table(kernels_built, "build-kernels")]
else:
    parts += ["<p><strong>custom kernel build:</strong> no build record in this run.</p>"]
summary = "What ran where: per backend and server, the device, the points that ran, and why not"
display(HTML(page.details(summary, "".join(parts), "what-ran")))

# %%
text = yaml.safe_dump(config, sort_keys=False) if config else "no configuration passed"
display(HTML(page.details("Configuration of this run", page.pre(text, "configuration"))))
ref_body = f"<p>Source: {reference_source}</p>" + page.table(reference, "reference")
display(HTML(page.details("The published RTX PRO 6000 table", ref_body, "reference-table")))
