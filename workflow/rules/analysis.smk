# Raw JSON -> tidy summary tables -> the analysis notebooks (papermill), each writing its figures
# and tables under results/figures|tables/<analysis>/ (per server configuration for the sweep).

include: "analysis_functions.smk"


rule summarize:
    input:
        bench=KERNEL_BENCH,
        points=sweep_outputs(),
    output:
        kernels=report(
            f"{SUMMARY_DIR}/kernels.csv",
            caption="../report/summary_kernels.rst",
            category="4. Summary tables",
        ),
        sweep=report(
            f"{SUMMARY_DIR}/sweep.csv",
            caption="../report/summary_sweep.rst",
            category="4. Summary tables",
        ),
        requests=f"{SUMMARY_DIR}/requests.csv",
        kernels_parquet=f"{SUMMARY_DIR}/kernels.parquet",
        sweep_parquet=f"{SUMMARY_DIR}/sweep.parquet",
    params:
        # a function: command templates hold braces that are not wildcards
        servers=lambda wildcards: json.dumps(config["sweep"]["servers"]),
        outdir=lambda wildcards, output: os.path.dirname(output.kernels),
    log:
        "results/logs/analysis/summarize.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "python -m decodecliff.analysis.summarize --bench {input.bench} --sweep {input.points}"
        " --servers {params.servers:q} --out {params.outdir} > {log} 2>&1"


rule notebook_kernels:
    input:
        notebook="notebooks/kernels.ipynb",
        kernels=rules.summarize.output.kernels,
        flashinfer=FLASHINFER_SM120,
        published=published_inputs,
    output:
        notebook=f"{NOTEBOOK_DIR}/kernels.ipynb",
        **figure_outputs("kernels", "5. Kernel microbenchmark"),
        tables=layout.table_paths("results", "kernels"),
    params:
        published=published_param,
        study=config["study"]["name"],
    log:
        "results/logs/analysis/notebook_kernels.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "papermill --no-progress-bar -k python3 {input.notebook} {output.notebook}"
        " -p kernels_csv {input.kernels} -p results results -p study_name {params.study}"
        " -y {params.published:q} -p flashinfer_sm120 {input.flashinfer}"
        " > {log} 2>&1"


rule notebook_sweep:
    input:
        notebook="notebooks/sweep.ipynb",
        sweep=rules.summarize.output.sweep,
    output:
        notebook=f"{NOTEBOOK_DIR}/sweep-{{server}}.ipynb",
        **figure_outputs("sweep", "6. Context sweep", "{server}"),
        tables=layout.table_paths("results", "sweep", "{server}"),
    params:
        study=config["study"]["name"],
        tau=config["sweep"]["acceptance_length"],
    log:
        "results/logs/analysis/notebook_sweep_{server}.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "papermill --no-progress-bar -k python3 {input.notebook} {output.notebook}"
        " -p sweep_csv {input.sweep} -p server {wildcards.server} -p results results"
        " -p study_name {params.study} -p tau {params.tau} > {log} 2>&1"


rule notebook_compare:
    input:
        notebook="notebooks/compare.ipynb",
        sweep=rules.summarize.output.sweep,
        reference=config["reference"],
        published=published_inputs,
    output:
        notebook=f"{NOTEBOOK_DIR}/compare.ipynb",
        **figure_outputs("compare", "7. Baseline vs custom"),
        tables=layout.table_paths("results", "compare"),
    params:
        published=published_param,
        study=config["study"]["name"],
        tau=config["sweep"]["acceptance_length"],
    log:
        "results/logs/analysis/notebook_compare.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "papermill --no-progress-bar -k python3 {input.notebook} {output.notebook}"
        " -p sweep_csv {input.sweep} -p reference_csv {input.reference} -p results results"
        " -p study_name {params.study} -p tau {params.tau} -y {params.published:q} > {log} 2>&1"
