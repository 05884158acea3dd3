# The step anatomy: decodecliff bench-engine times one verify step of the served model per
# context, split into attention, GEMMs and the rest beside each floor; the engine notebook draws
# it (stacked time per step vs context, per configuration, floor drawn) for the report.
# Defined only when the config has an `engine` section.

if "engine" in config:

    rule bench_engine:
        input:
            unpack(engine_bench_input),
        output:
            report(
                ENGINE_BENCH,
                caption="../report/bench_engine.rst",
                category="3. Engine step",
            ),
        params:
            flags=engine_bench_flags(),
            lib=KERNEL_LIB,
            interpret=triton_interpret(config["engine"]["device"]),
        log:
            "results/logs/engine/bench_engine.log",
        benchmark:
            "results/benchmarks/engine/bench_engine.tsv"
        resources:
            measurement=1,
            gpu=gpus_for(config["engine"]["device"]),
        conda:
            "../../envs/kernels.yaml"
        shell:
            "export DECODECLIFF_KERNEL_LIB={params.lib} TRITON_INTERPRET={params.interpret}; "
            "exec decodecliff bench-engine {params.flags} --out {output} > {log} 2>&1"

    rule notebook_engine:
        input:
            notebook="notebooks/engine.ipynb",
            bench=ENGINE_BENCH,
            published=published_engine_input,
        output:
            notebook=f"{NOTEBOOK_DIR}/engine.ipynb",
            **figure_outputs("engine", "8. Step anatomy"),
            tables=layout.table_paths("results", "engine"),
        params:
            published=published_param,
        log:
            "results/logs/analysis/notebook_engine.log",
        conda:
            "../../envs/analysis.yaml"
        shell:
            "papermill --no-progress-bar -k python3 {input.notebook} {output.notebook}"
            " -p bench_json {input.bench} -p results results -y {params.published:q} > {log} 2>&1"
