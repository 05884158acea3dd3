rule bench_kernels:
    message:
        "time the attention backends on {params.device} (log: {log})"
    input:
        lib=KERNEL_LIB,
    output:
        report(
            KERNEL_BENCH,
            caption="../report/bench_kernels.rst",
            category="2. Kernel microbenchmark",
        ),
    params:
        device=config["kernels"]["device"],
        backends=config["kernels"]["backends"],
        contexts=config["kernels"]["contexts"],
        modes=config["kernels"]["modes"],
        page_sizes=config["kernels"]["page_sizes"],
        heads=config["kernels"]["heads"],
        max_seconds=config["kernels"]["max_seconds_per_point"],
        extra=STUDY.bench_extra_flags(),
        interpret=triton_interpret(config["kernels"]["device"]),
    log:
        "results/logs/kernels/bench_kernels.log",
    benchmark:
        "results/benchmarks/kernels/bench_kernels.tsv"
    threads: every_core
    resources:
        # timed jobs hold the single measurement slot (profiles/default), so they never overlap
        measurement=1,
        gpu=gpus_for(config["kernels"]["device"]),
    conda:
        "../../envs/kernels.yaml"
    shell:
        # On a CPU the custom backend records itself as skipped (with the reason) in the JSON.
        "export DECODECLIFF_KERNEL_LIB={input.lib} TRITON_INTERPRET={params.interpret}; "
        "exec decodecliff bench-kernels --device {params.device} --backends {params.backends}"
        " --contexts {params.contexts} --modes {params.modes} --page-sizes {params.page_sizes}"
        " --heads {params.heads} --max-seconds-per-point {params.max_seconds} {params.extra}"
        " --out {output} > {log} 2>&1"


rule flashinfer_sm120:
    message:
        "read the shared memory of FlashInfer's MLA kernel built for sm_120 (log: {log})"
    # Compiles FlashInfer's MLA kernel for sm_120 (~15 s of CPU) to read its shared memory per
    # block; without the flashinfer-python package files the JSON records the step as skipped.
    output:
        FLASHINFER_SM120,
    log:
        "results/logs/kernels/flashinfer_sm120.log",
    conda:
        "../../envs/kernels.yaml"
    shell:
        "python -m decodecliff.bench.flashinfer_sm120 --out {output} > {log} 2>&1"
