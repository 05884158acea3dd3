"""The analysis notebooks: one table of what differs between them (inputs, papermill parameters,
report categories), read by the one rule statement of workflow/rules/notebooks.smk.

Input and parameter functions take Snakemake's ``wildcards`` (anything with the same attributes
will do). Parameters never take ``input``: Snakemake records a params function of the wildcards
alone with the job, so a changed parameter (the config, tau) reruns the notebook; one that reads
``input`` is left out of that record, and the report went stale after a config edit.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from decodecliff.analysis import layout
from decodecliff.study import paths
from decodecliff.study.plan import Study

# Passed with -y: the config is a mapping, and a published path may be empty.
YAML_PARAMETERS = ("published", "config")


@dataclass(frozen=True)
class Notebook:
    """notebooks/<name>.ipynb, run by papermill; its figures and tables are layout.py's <name>.

    ``parameters(wildcards)`` gives papermill's parameters in the notebook's order;
    ``figures`` / ``tables`` name the category of its figures / tables in Snakemake's report
    (None: its tables are outputs but not shown there).
    """

    inputs: dict[str, str | Callable]
    parameters: Callable[..., dict]
    figures: str | None = None
    tables: str | None = None
    log_dir: str = "analysis"


def notebooks(study: Study) -> dict[str, Notebook]:
    """The notebooks of the study by name, in the order they run (the report last)."""
    cfg = study.config
    common = {"results": paths.RESULTS, "study_name": cfg["study"]["name"]}
    tau = {"tau": cfg["sweep"]["acceptance_length"]}

    def published(wildcards: object = None) -> list[str]:
        return study.published_inputs()

    def figures(wildcards: object = None) -> list[str]:
        return report_figures(study, table)

    table = {
        "kernels": Notebook(
            inputs={
                "kernels": paths.SUMMARY_KERNELS,
                "flashinfer": paths.FLASHINFER_SM120,
                "published": published,
            },
            parameters=lambda wildcards: {
                "kernels_csv": paths.SUMMARY_KERNELS,
                **common,
                "published": study.published_dir(),
                "flashinfer_sm120": paths.FLASHINFER_SM120,
            },
            figures="5. Kernel microbenchmark",
        ),
        "sweep": Notebook(
            inputs={"sweep": paths.SUMMARY_SWEEP},
            parameters=lambda wildcards: {
                "sweep_csv": paths.SUMMARY_SWEEP,
                "server": wildcards.server,
                **common,
                **tau,
            },
            figures="6. Context sweep",
        ),
        "compare": Notebook(
            inputs={
                "sweep": paths.SUMMARY_SWEEP,
                "kernels": paths.SUMMARY_KERNELS,  # the ceilings the steps' floor is counted at
                "reference": cfg["reference"],
                "published": published,
            },
            parameters=lambda wildcards: {
                "sweep_csv": paths.SUMMARY_SWEEP,
                "kernels_csv": paths.SUMMARY_KERNELS,
                "reference_csv": cfg["reference"],
                **common,
                **tau,
                "published": study.published_dir(),
            },
            figures="7. Baseline vs custom",
        ),
        "engine": Notebook(  # the step anatomy, when the config has an engine section
            inputs={
                "bench": paths.ENGINE_BENCH,
                "published": lambda wildcards: study.published_engine_input(),
            },
            parameters=lambda wildcards: {
                "bench_json": paths.ENGINE_BENCH,
                "results": paths.RESULTS,
                "published": study.published_dir(),
            },
            figures="8. Step anatomy",
        ),
        # the report page: the headline tables, the setup and every figure of the notebooks above
        "report": Notebook(
            inputs={
                "kernels": paths.SUMMARY_KERNELS,
                "sweep": paths.SUMMARY_SWEEP,
                "bench": paths.KERNEL_BENCH,
                "build": paths.BUILD_INFO,
                "reference": cfg["reference"],
                "figures": figures,
                "published": published,
                "notes": paths.NOTES,  # this run's NOTES.md, shown under its targets
            },
            parameters=lambda wildcards: {
                "summary_dir": paths.SUMMARY_DIR,
                "results": paths.RESULTS,
                "bench_json": paths.KERNEL_BENCH,
                "build_json": paths.BUILD_INFO,
                "reference_csv": cfg["reference"],
                "published": study.published_dir(),
                "config": cfg,
            },
            tables="0. Report",
            log_dir="report",
        ),
    }
    if "engine" not in cfg:
        del table["engine"]
    return table


def report_figures(study: Study, table: dict[str, Notebook]) -> list[str]:
    """Every figure the report page embeds: those of the other notebooks (sweep: per server)."""
    out = []
    for name in table:
        for server in list(study.servers) if name in layout.PER_SERVER else [None]:
            out += layout.figure_paths(paths.RESULTS, name, server)
    return out


def server_wildcard(name: str) -> str | None:
    """The wildcard of a notebook run once per server configuration."""
    return "{server}" if name in layout.PER_SERVER else None


def output(name: str) -> str:
    """The executed notebook."""
    suffix = "-{server}" if server_wildcard(name) else ""
    return f"{paths.NOTEBOOK_DIR}/{name}{suffix}.ipynb"


def log(name: str, log_dir: str) -> str:
    suffix = "_{server}" if server_wildcard(name) else ""
    return f"{paths.RESULTS}/logs/{log_dir}/notebook_{name}{suffix}.log"


def papermill_options(values: dict) -> str:
    """papermill's -y and -p options for the parameters, every -y first (papermill reads them
    before any -p, so they come in that order here too), shell-quoted."""
    args = []
    for key in [k for k in values if k in YAML_PARAMETERS]:
        # keys sorted: the config's order is what --config and --configfile set, not its content
        args += ["-y", json.dumps({key: values[key]}, sort_keys=True)]
    for key in [k for k in values if k not in YAML_PARAMETERS]:
        args += ["-p", key, str(values[key])]
    return " ".join(shlex.quote(arg) for arg in args)
