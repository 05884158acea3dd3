# Raw JSON -> tidy summary tables, read by the analysis notebooks (notebooks.smk).


rule summarize:
    message:
        "summarise the raw files into {params.outdir}/"
    input:
        bench=KERNEL_BENCH,
        points=STUDY.point_files(),
    output:
        kernels=report(
            SUMMARY_KERNELS,
            caption="../report/summary_kernels.rst",
            category="4. Summary tables",
        ),
        sweep=report(
            SUMMARY_SWEEP,
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
