# The report: the report notebook (notebooks.smk) assembles the headline tables, the setup and
# every figure of the analysis notebooks; nbconvert renders it as one self-contained page (code
# hidden, figures embedded as data URIs, no script fetched from the network).

rule render_report:
    message:
        "render {output}"
    input:
        notebook=nb.output("report"),
        template="notebooks/report.html.j2",
    output:
        report(REPORT, caption="../report/report_html.rst", category="0. Report"),
    params:
        outdir=lambda wildcards, output: os.path.dirname(output[0]),
        name=lambda wildcards, output: os.path.basename(output[0]).removesuffix(".html"),
    log:
        "results/logs/report/render_report.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "jupyter nbconvert --to html --no-input --no-prompt --template-file {input.template}"
        " {input.notebook} --output-dir {params.outdir} --output {params.name} > {log} 2>&1"


# The study's NOTES.md: the targets and the arithmetic of a verify step, rendered from the result
# files through a template (published with the study; never typed).
rule notes:
    message:
        "render {output}"
    input:
        kernels=rules.summarize.output.kernels,
        sweep=rules.summarize.output.sweep,
        bench=KERNEL_BENCH,
        # the step anatomy, read where a missed end-to-end target is explained
        **({"engine": ENGINE_BENCH} if "engine" in config else {}),
        template="workflow/report/notes.md.j2",
    output:
        report(NOTES, caption="../report/notes.rst", category="0. Report"),
    params:
        study=lambda wildcards, input: os.path.dirname(os.path.dirname(input.bench)),
        # a function: the config's command templates hold braces that are not wildcards; keys
        # sorted, as Snakemake orders them by what --config and --configfile set
        config=lambda wildcards: yaml.safe_dump(config, sort_keys=True),
    log:
        "results/logs/report/notes.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        # --sweep: the summary holds the config's points only; sweep/ may keep a dropped one's
        "echo {params.config:q} | python -m decodecliff.analysis.notes {params.study}"
        " --config - --sweep {input.sweep} --template {input.template} --out {output} > {log} 2>&1"
