# The analysis notebooks, one papermill job each: notebooks/<name>.ipynb runs with its parameters
# into results/notebooks/ and writes its figures and tables (analysis/layout.py), per server
# configuration for the sweep notebook. The report notebook assembles the others' figures.
#
# One rule statement for every notebook, driven by the NOTEBOOKS table
# (decodecliff.study.notebooks). It defines a rule per notebook, notebook_<name>, rather than one
# rule with the name as a wildcard: a rule's outputs are fixed when the workflow is parsed
# (Snakemake takes no function there), and each notebook writes its own number of figures and
# tables, each a report() output with its caption. Kernels talk over Unix sockets (papermill's
# engine ipc, decodecliff.study.ipc_engine): TCP ports picked by notebooks started side by side
# can collide. A kernel gets 5 minutes to start (not papermill's 60 s): a busy host imports slowly.

for name in NOTEBOOKS:

    rule:
        name:
            f"notebook_{name}"
        message:
            f"run notebooks/{name}.ipynb into {{output.notebook}} (log: {{log}})"
        input:
            notebook=f"notebooks/{name}.ipynb",
            **NOTEBOOKS[name].inputs,
        output:
            notebook=nb.output(name),
            **figure_outputs(name),
            tables=table_outputs(name),
        params:
            parameters=papermill_parameters(name),
        log:
            nb.log(name, NOTEBOOKS[name].log_dir),
        conda:
            "../../envs/analysis.yaml"
        shell:
            "papermill --no-progress-bar --engine ipc --start-timeout 300 -k python3"
            " {input.notebook} {output.notebook}"
            " {params.parameters} > {log} 2>&1"
