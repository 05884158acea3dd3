rule build_kernel:
    message:
        "build the custom kernel for sm_{params.archs} (log: {log})"
    input:
        KERNEL_SOURCES,
    output:
        lib=KERNEL_LIB,
        info=report(
            BUILD_INFO,
            caption="../report/build_kernel.rst",
            category="1. Kernel build",
        ),
    params:
        archs=config["build"]["archs"],
        outdir=lambda wildcards, output: os.path.dirname(output.lib),
        extra=STUDY.build_extra_flags(),
    log:
        "results/logs/build/build_kernel.log",
    benchmark:
        "results/benchmarks/build/build_kernel.tsv"
    resources:
        # nvcc takes the CPU: not while something is being timed
        measurement=1,
    conda:
        "../../envs/kernels.yaml"
    shell:
        # Every requested architecture must be in the binary (--require). A failure, e.g. no
        # nvcc on this machine, is repeated on the terminal, not only in the log.
        "decodecliff build-kernel --arch {params.archs} --require {params.archs}"
        " --out {params.outdir} {params.extra} > {log} 2>&1"
        " || {{ tail -n 3 {log} >&2; exit 1; }}"
