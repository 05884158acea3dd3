# One job per context point: the sweep runner starts the server, runs the point and stops the
# server, so a point can be rerun alone (README: "Rerunning one context point") and a failed point
# never costs the others.


rule sweep_point:
    message:
        "sweep {wildcards.server} at {wildcards.ctx} tokens (log: {log})"
    # Any server name and context here (the Snakefile's constraints allow only the config's
    # servers and plain numbers), so a mistyped target (ctx01024.json, ctx1k.json) reaches
    # point(), which names the valid ones instead of "No rule to produce".
    wildcard_constraints:
        server=r"[^/]+",
        ctx=r"[^/]+",
    input:
        unpack(sweep_point_input),
    output:
        report(
            "results/sweep/{server}/ctx{ctx}.json",
            caption="../report/sweep_point.rst",
            category="3. Context sweep",
            subcategory="{server}",
            labels={"server": "{server}", "context": "{ctx}"},
        ),
    params:
        target=lambda wildcards: point(wildcards).target,
        skip=skip_flag,
        gen_tokens=config["sweep"]["gen_tokens"],
        requests=lambda wildcards: point(wildcards).requests,
        concurrency=lambda wildcards: point(wildcards).concurrency,
        outdir=lambda wildcards, output: os.path.dirname(output[0]),
        server_log=lambda wildcards: server_log(wildcards.server, wildcards.ctx),
        lib=KERNEL_LIB,
        interpret=triton_interpret(config["sweep"]["device"]),
    log:
        "results/logs/sweep/{server}/ctx{ctx}.log",
    benchmark:
        "results/benchmarks/sweep/{server}/ctx{ctx}.tsv"
    priority: lambda wildcards: point(wildcards).priority
    threads: every_core
    resources:
        # timed jobs hold the single measurement slot (profiles/default), so they never overlap
        measurement=1,
        gpu=gpus_for(config["sweep"]["device"]),
        runtime=lambda wildcards: point(wildcards).runtime_min,
        # The timeouts are resources, not params: Snakemake reruns a job whose params changed, and
        # a timeout raised to rescue one failed point must not measure every ok point again.
        start_timeout=str(config["sweep"]["start_timeout_s"]),
        point_timeout=lambda wildcards: str(point(wildcards).chunk["point_timeout_s"]),
        job_timeout=lambda wildcards: str(point(wildcards).chunk["timeout_s"]),
    conda:
        "../../envs/serve.yaml"
    shell:
        # exec: the sweep runner replaces the shell, so a stop signal reaches it and its server.
        # A failed or skipped point is written as such, and --failed-points-ok keeps the job (and
        # so the file) successful: a failed point is a result of the study. A server that cannot
        # run here (its backend needs a GPU or a package) gets --skip-reason: every point is
        # written as skipped with that reason, and nothing is launched. --stop-with-parent: a
        # Snakemake killed outright leaves no sweep measuring beside the resumed run's ($PPID:
        # the shell's parent, Snakemake, which the exec'd sweep inherits).
        "export DECODECLIFF_KERNEL_LIB={params.lib} TRITON_INTERPRET={params.interpret}; "
        "exec decodecliff sweep {params.target} --name {wildcards.server}"
        " --contexts {wildcards.ctx} --gen-tokens {params.gen_tokens}"
        " --requests-per-point {params.requests} --concurrency {params.concurrency}"
        " --point-timeout {resources.point_timeout} --chunk-timeout {resources.job_timeout}"
        " --start-timeout {resources.start_timeout} --no-progress --failed-points-ok"
        " --stop-with-parent $PPID {params.skip} --server-log {params.server_log}"
        " --out {params.outdir} > {log} 2>&1"


rule sweep_point_misnamed:
    # Every other file under results/sweep/<server>/ (64.json, ctx64): misnamed_point stops
    # Snakemake naming the server's point files before any job, so this rule's command never runs.
    wildcard_constraints:
        server=r"[^/]+",
        file=r"(?!ctx[^/]*\.json$)[^/]+",
    input:
        misnamed_point,
    output:
        "results/sweep/{server}/{file}",
    log:
        "results/logs/sweep/{server}/{file}.log",
    conda:
        "../../envs/serve.yaml"
    shell:
        "exit 1"
