# The step anatomy: decodecliff bench-engine times one verify step of the served model per
# context, split into attention, GEMMs and the rest beside each floor; the engine notebook draws
# it (stacked time per step vs context, per configuration, floor drawn) for the report.
# Defined only when the config has an `engine` section.

ENGINE_BENCH = "results/engine/bench.json"


def engine_bench_input(wildcards) -> dict[str, str]:
    """The custom backend needs the built kernel library."""
    return {"lib": KERNEL_LIB} if "custom" in config["engine"]["backends"] else {}


def published_engine_input(wildcards) -> list[str]:
    """The published study's raw step anatomy, drawn beside this run's when it exists."""
    root = published_dir()
    path = f"{root}/gpu-logs/engine/engine.json"
    return [path] if root and os.path.isfile(path) else []


def engine_bench_flags() -> str:
    eng = config["engine"]
    flags = [
        f"--preset {eng['preset']} --device {eng['device']}",
        "--backends " + " ".join(eng["backends"]),
        "--paths " + " ".join(eng["paths"]),
        "--contexts " + " ".join(str(c) for c in eng["contexts"]),
        "--modes " + " ".join(eng.get("modes", ["chain"])),
        f"--draft-len {eng.get('draft_len', 16)} --repeats {eng.get('repeats', 5)}",
    ]
    if eng.get("loop_contexts"):
        flags.append("--parts anatomy loop --loop-contexts")
        flags.append(" ".join(str(c) for c in eng["loop_contexts"]))
    if eng["device"] == "cpu":
        flags.append("--threads 1")  # tiny GEMMs on a shared CPU: no intra-op spinning
    return " ".join(flags)


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
