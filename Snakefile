# decodecliff: build the custom kernel, time the attention backends, sweep each server
# configuration over its context points, summarise, and render the report.
#
#   snakemake --cores 2                                      the study in config.yaml
#   snakemake --cores 1 --configfile config/h200.yaml        the GPU study
#   snakemake --cores 1 --forcerun results/sweep/<server>/ctx<N>.json  one point again, and
#                                                            what depends on it

from snakemake.utils import min_version

min_version("9.0")

# A YAML syntax error in config.yaml is named by file and line here, before Snakemake reads it
# and says only that the config is not valid YAML. (A --configfile is read before this file is.)
import os

from decodecliff.study.config import ConfigError, check_syntax
from decodecliff.study.interrupt import hangup_as_interrupt

hangup_as_interrupt()  # a closed terminal stops the run as Ctrl-C does, releasing the locks

if os.path.exists("config.yaml"):
    try:
        check_syntax("config.yaml")
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


wildcard_constraints:
    server=STUDY.server_names_pattern(),
    ctx=r"[1-9][0-9]*",


include: "workflow/rules/build.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/sweep.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/engine.smk"
include: "workflow/rules/notebooks.smk"
include: "workflow/rules/report.smk"


rule all:
    message:
        "the study is complete"
    input:
        STUDY.final_outputs(),
    default_target: True
