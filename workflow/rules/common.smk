"""The study config, validated, and the small input/params functions of the rules.

What the rules compute from the config lives in the package (decodecliff.study, unit-tested
without Snakemake); the functions here only hand it the wildcards and wrap Snakemake's report().
"""

import json
import os
import shlex

import yaml
from snakemake.exceptions import WorkflowError

from decodecliff.analysis import layout
from decodecliff.study import notebooks as nb
from decodecliff.study.config import ConfigError
from decodecliff.study.paths import (
    BUILD_INFO,
    ENGINE_BENCH,
    FLASHINFER_SM120,
    KERNEL_BENCH,
    KERNEL_LIB,
    NOTEBOOK_DIR,
    NOTES,
    REPORT,
    SUMMARY_DIR,
    SUMMARY_KERNELS,
    SUMMARY_SWEEP,
)
from decodecliff.study.plan import Study, gpus_for, triton_interpret

SCHEMA = os.path.join(workflow.basedir, "workflow", "schemas", "config.schema.yaml")

# A config mistake stops `snakemake` (and `-n`) here, before any job, naming the key.
try:
    STUDY = Study(config, SCHEMA)  # fills in the schema's defaults, as validate() does
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# the sweep: one job per context point


def point(wildcards):
    """The point of results/sweep/{server}/ctx{ctx}.json (an error if the config has none)."""
    try:
        return STUDY.point(wildcards.server, wildcards.ctx)
    except LookupError as exc:
        raise WorkflowError(str(exc)) from None


def sweep_point_input(wildcards) -> dict[str, str]:
    """A server launched on the custom backend needs the built kernel library."""
    return {"lib": KERNEL_LIB} if point(wildcards).needs_kernel_lib else {}


def skip_flag(wildcards) -> str:
    """--skip-reason for a server that cannot run here: its points are written as skipped."""
    reason = point(wildcards).skip_reason
    return f"--skip-reason {shlex.quote(reason)}" if reason else ""


def every_core(wildcards) -> int:
    """A timed job's threads: every core of the run, so no other job (a notebook, a compile)
    shares the machine with a measurement; 1 where the run sets no core count (--report)."""
    return workflow._cores or 1


# ---------------------------------------------------------------------------------------------
# the notebooks (workflow/rules/notebooks.smk): their table, and the report() outputs of each

NOTEBOOKS = nb.notebooks(STUDY)


def figure_outputs(name: str) -> dict:
    """Named report() outputs, one per figure of the notebook, captioned by its .rst file."""
    server = nb.server_wildcard(name)
    extra = {"subcategory": server, "labels": {"server": server}} if server else {}
    return {
        figure: report(
            str(layout.figure_path("results", name, figure, server)),
            caption=f"../report/figures/{name}_{figure}.rst",
            category=NOTEBOOKS[name].figures,
            **extra,
        )
        for figure in layout.FIGURES.get(name, {})
    }


def table_outputs(name: str) -> list:
    """The notebook's tables; report() outputs, captioned by their .rst files, where shown."""
    category = NOTEBOOKS[name].tables
    table_paths = layout.table_paths("results", name, nb.server_wildcard(name))
    if not category:
        return table_paths
    captions = [f"../report/tables/{name}_{table}.rst" for table in layout.TABLES[name]]
    pairs = zip(table_paths, captions, strict=True)
    return [report(p, caption=c, category=category) for p, c in pairs]


def papermill_parameters(name: str):
    """The params function of a notebook job: papermill's -y and -p options."""
    return lambda wildcards, input: nb.papermill_options(
        NOTEBOOKS[name].parameters(wildcards, input)
    )
