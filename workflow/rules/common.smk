"""The study config, validated, and the small input/params functions of the rules.

What the rules compute from the config lives in the package (decodecliff.study, unit-tested
without Snakemake); the functions here only hand it the wildcards and wrap Snakemake's report().
"""

import json
import os
import shlex
import sys

import yaml
from snakemake.exceptions import WorkflowError

from decodecliff.analysis import layout
from decodecliff.kernels.build import SOURCES
from decodecliff.study import notebooks as nb
from decodecliff.study.config import ConfigError, check_inputs, published_warning
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
    server_log,
)
from decodecliff.study.plan import PointError, Study, gpu_present, gpus_for, triton_interpret

SCHEMA = os.path.join(workflow.basedir, "workflow", "schemas", "config.schema.yaml")
# the files build_kernel compiles: an edit to any of them rebuilds the library
KERNEL_SOURCES = [str(path) for path in SOURCES]

# The YAML files merged into `config`, in the order they apply: the Snakefile's configfile,
# then those given with --configfile (which Snakemake applies over it).
CONFIG_FILES = [f for f in workflow.configfiles if f not in workflow.overwrite_configfiles]
CONFIG_FILES += list(workflow.overwrite_configfiles)
# The values given with --config (applied over the files): an error there names --config.
COMMAND_LINE_CONFIG = dict(workflow.config_settings.config)

# A config mistake stops `snakemake` (and `-n`) here, before any job, naming the key and the
# file and line that set it.
try:
    # fills in the schema's defaults, as validate() does
    STUDY = Study(config, SCHEMA, CONFIG_FILES, COMMAND_LINE_CONFIG)
    if workflow.is_main_process:  # a job's own parse may run where the reference is not staged
        check_inputs(STUDY.config, os.getcwd(), CONFIG_FILES, COMMAND_LINE_CONFIG)
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None

# A GPU config on a machine without one says so once, before anything runs (a warning: dry runs,
# publishing and cluster executors render GPU configs where no GPU is; README "GPU configs").
if workflow.is_main_process and (warning := STUDY.gpu_warning(gpu_present())):
    print(f"warning: {warning}", file=sys.stderr)
if workflow.is_main_process and (warning := published_warning(STUDY.config, os.getcwd())):
    print(f"warning: {warning}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# the sweep: one job per context point


def point(wildcards):
    """The point of results/sweep/{server}/ctx{ctx}.json. A target the config has no point for
    (a mistyped server or context) stops Snakemake with one line naming the valid ones: the
    exit is before any job, and Snakemake would wrap an exception in a traceback."""
    return point_at(wildcards.server, f"ctx{wildcards.ctx}.json")


def misnamed_point(wildcards) -> list[str]:
    """The sweep_point_misnamed rule's input: a target under results/sweep/<server>/ that no
    point file is named (1024.json) stops Snakemake as point() does, where Snakemake would say
    "Missing rule"."""
    point_at(wildcards.server, wildcards.file)
    return []


def point_at(server: str, file: str):
    try:
        return STUDY.point_at(server, file)
    except PointError as exc:
        print(f"error: results/sweep/{server}/{file}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


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
    return lambda wildcards: nb.papermill_options(NOTEBOOKS[name].parameters(wildcards))
