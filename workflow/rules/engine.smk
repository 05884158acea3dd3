# The step anatomy: decodecliff bench-engine times one verify step of the served model per
# context, split into attention, GEMMs and the rest beside each floor; the engine notebook
# (notebooks.smk) draws it (stacked time per step vs context, per configuration, floor drawn).
# Defined only when the config has an `engine` section.

if "engine" in config:

    rule bench_engine:
        message:
            "time one verify step's anatomy (log: {log})"
        input:
            **({"lib": KERNEL_LIB} if STUDY.engine_needs_kernel_lib() else {}),
        output:
            report(
                ENGINE_BENCH,
                caption="../report/bench_engine.rst",
                category="3. Engine step",
            ),
        params:
            flags=STUDY.engine_flags(),
            lib=KERNEL_LIB,
            interpret=triton_interpret(config["engine"]["device"]),
        log:
            "results/logs/engine/bench_engine.log",
        benchmark:
            "results/benchmarks/engine/bench_engine.tsv"
        threads: every_core
        resources:
            measurement=1,
            gpu=gpus_for(config["engine"]["device"]),
        conda:
            "../../envs/kernels.yaml"
        shell:
            "export DECODECLIFF_KERNEL_LIB={params.lib} TRITON_INTERPRET={params.interpret}; "
            "exec decodecliff bench-engine {params.flags} --out {output} > {log} 2>&1"
