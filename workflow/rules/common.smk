"""Config validation and the input/params functions of the study's rules.

Everything the rules compute from the config lives here, so the rule files stay declarative.
"""

import glob
import json
import math
import os
import re
import shlex
import string
from collections.abc import Callable
from dataclasses import dataclass

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from decodecliff.analysis import layout

SCHEMA = "../schemas/config.schema.yaml"
KERNEL_LIB = "results/build/libdecodecliff_mla.so"
BUILD_INFO = "results/build/build.json"
KERNEL_BENCH = "results/kernels/bench.json"
FLASHINFER_SM120 = "results/kernels/flashinfer_sm120.json"  # does FlashInfer MLA build for sm_120
SUMMARY_DIR = "results/summary"
SUMMARY_KERNELS = f"{SUMMARY_DIR}/kernels.csv"
SUMMARY_SWEEP = f"{SUMMARY_DIR}/sweep.csv"
ENGINE_BENCH = "results/engine/bench.json"
NOTEBOOK_DIR = "results/notebooks"
REPORT = "results/report.html"
NOTES = "results/NOTES.md"


def _json_path(path) -> str:
    """`config.sweep.servers[1].spec.mode` for the jsonschema path [sweep, servers, 1, ...]."""
    out = "config"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _explain(err) -> str:
    """One line that names the offending key of a jsonschema ValidationError."""
    where = _json_path(err.absolute_path)
    if err.validator == "additionalProperties":
        allowed = list(err.schema.get("properties", {}))
        unknown = [key for key in err.instance if key not in allowed]
        return (
            f"invalid study config at {where}.{unknown[0]}: unknown key "
            f"(allowed here: {', '.join(allowed)})"
        )
    if err.validator == "required":
        missing = [key for key in err.validator_value if key not in err.instance]
        return f"invalid study config at {where}.{missing[0]}: missing (it is required)"
    if err.validator == "not":
        return f"invalid study config at {where}: give either command or url, not both"
    return f"invalid study config at {where}: {err.message}"


def validate_config(cfg: dict) -> None:
    """Validate against the schema (filling defaults), then the checks a schema cannot express.

    A failure names the offending key, e.g. `config.sweep.servers[0].spec.mode`.
    """
    try:
        validate(cfg, schema=SCHEMA)
    except WorkflowError as exc:
        err = exc.__context__  # the jsonschema ValidationError that validate() wrapped
        if not hasattr(err, "absolute_path"):
            raise
        raise WorkflowError(_explain(err)) from None
    names = [server["name"] for server in cfg["sweep"]["servers"]]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise WorkflowError(
                f"invalid study config at config.sweep.servers[{i}].name: "
                f"server name {name!r} is used twice (names must be unique)"
            )
    for i, server in enumerate(cfg["sweep"]["servers"]):
        seen: set[int] = set()
        for j, chunk in enumerate(server["chunks"]):
            for ctx in chunk["contexts"]:
                if ctx in seen:
                    raise WorkflowError(
                        f"invalid study config at config.sweep.servers[{i}].chunks[{j}].contexts: "
                        f"context {ctx} appears in more than one chunk of server {server['name']!r}"
                    )
                seen.add(ctx)
        if server.get("cuda_graph") and cfg["sweep"]["device"] != "cuda":
            raise WorkflowError(
                f"invalid study config at config.sweep.servers[{i}].cuda_graph: "
                "CUDA graphs need sweep.device: cuda"
            )
        _check_timeouts(server, i)
        if not server.get("url"):
            _check_template(cfg, server, i)
            _check_pool(cfg, server, i)


# Placeholders of a server command template: the server's settings (server_fields) and the two
# the sweep runner fills per launch.
TEMPLATE_FIELDS = {
    "name", "preset", "device", "backend", "page_size", "chunk_size", "spec_mode", "draft_len",
    "tree_nodes", "switches", "args", "host", "port",
}  # fmt: skip
# The embedded server's KV pool on a CPU without --max-total-tokens (EngineConfig.CPU_DEFAULT_TOKENS)
CPU_DEFAULT_POOL = 65536


def _bad(where: str, why: str) -> WorkflowError:
    return WorkflowError(f"invalid study config at {where}: {why}")


def _check_timeouts(server: dict, i: int) -> None:
    """A request may not be allowed longer than the job around it (it would be cut silently)."""
    for j, chunk in enumerate(server["chunks"]):
        if chunk["point_timeout_s"] > chunk["timeout_s"]:
            raise _bad(
                f"config.sweep.servers[{i}].chunks[{j}].point_timeout_s",
                f"{chunk['point_timeout_s']:g} s is longer than the chunk's timeout_s "
                f"({chunk['timeout_s']:g} s), which covers server start, every request and stop",
            )


def _template_key(server: dict, i: int) -> str:
    return f"config.sweep.servers[{i}].command" if server.get("command") else "config.sweep.command"


def _check_template(cfg: dict, server: dict, i: int) -> None:
    """The launch template names only known placeholders and gets a {port} for every launch."""
    template = server.get("command") or cfg["sweep"]["command"]
    where = _template_key(server, i)
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise _bad(where, f"not a valid template ({exc}); write {{{{ and }}}} for braces")
    unknown = sorted(names - TEMPLATE_FIELDS)
    if unknown:
        raise _bad(
            where,
            f"unknown placeholder {{{unknown[0]}}} (known: "
            + ", ".join(f"{{{n}}}" for n in sorted(TEMPLATE_FIELDS))
            + ")",
        )
    if "port" not in names:
        raise _bad(where, "the template has no {port}: every launch gets a free port there")


def pool_tokens(cfg: dict, server: dict) -> int | None:
    """The KV pool of a server when the config fixes it: --max-total-tokens in its command, or
    the embedded server's CPU default; None when it depends on the GPU's free memory."""
    template = server.get("command") or cfg["sweep"]["command"]
    command = " ".join([template, server.get("args", "")])
    found = re.findall(r"--max-total-tokens[ =]+(\d+)", command)
    if found:
        tokens = int(found[-1])
    elif "decodecliff serve" in command and cfg["sweep"]["device"] == "cpu":
        tokens = CPU_DEFAULT_POOL
    else:
        return None
    return tokens // server["page_size"] * server["page_size"]


def _check_pool(cfg: dict, server: dict, i: int) -> None:
    """Every point fits the server's KV pool (concurrency streams of prompt + generated tokens)."""
    pool = pool_tokens(cfg, server)
    if pool is None:
        return  # checked at run time against the server's max_total_num_tokens
    gen, k = cfg["sweep"]["gen_tokens"], server_concurrency(server, cfg)
    for j, chunk in enumerate(server["chunks"]):
        for ctx in chunk["contexts"]:
            if ctx + gen > pool:
                raise _bad(
                    f"config.sweep.servers[{i}].chunks[{j}].contexts",
                    f"context {ctx} + {gen} generated tokens exceed the KV pool of server "
                    f"{server['name']!r} ({pool} tokens)",
                )
            if k * (ctx + gen) > pool:
                raise _bad(
                    f"config.sweep.servers[{i}].concurrency",
                    f"{k} streams of {ctx} + {gen} tokens exceed the KV pool of server "
                    f"{server['name']!r} ({pool} tokens)",
                )


def server_concurrency(server: dict, cfg: dict | None = None) -> int:
    """Streams per round of a server's points: its own setting, else the sweep's."""
    return server.get("concurrency") or (cfg or config)["sweep"]["concurrency"]


def point_requests(wildcards) -> int:
    """Recorded requests (rounds) per point: the chunk's setting, else the sweep's."""
    chunk = point_chunk(wildcards)
    return chunk.get("requests_per_point") or config["sweep"]["requests_per_point"]


validate_config(config)


# ---------------------------------------------------------------------------------------------
# servers and their points


def servers() -> dict[str, dict]:
    """The sweep's server configurations by name, in config order."""
    return {server["name"]: server for server in config["sweep"]["servers"]}


def server_points(name: str) -> list[tuple[int, dict]]:
    """(context, chunk) for every point of one server, in the order its chunks give."""
    return [(ctx, chunk) for chunk in servers()[name]["chunks"] for ctx in chunk["contexts"]]


def sweep_outputs(name: str | None = None) -> list[str]:
    """The point files of one server, or of every server."""
    names = [name] if name else list(servers())
    return [f"results/sweep/{n}/ctx{ctx}.json" for n in names for ctx, _ in server_points(n)]


def point_chunk(wildcards) -> dict:
    """The chunk that holds the point results/sweep/{server}/ctx{ctx}.json."""
    ctx = int(wildcards.ctx)
    for c, chunk in server_points(wildcards.server):
        if c == ctx:
            return chunk
    known = ", ".join(str(c) for c, _ in server_points(wildcards.server))
    raise WorkflowError(
        f"context {ctx} is not a point of server {wildcards.server!r} in the config "
        f"(its points: {known}); add it to one of the server's chunks first"
    )


def point_priority(wildcards) -> int:
    """Earlier servers and earlier points of a chunk list run first."""
    order = [(n, c) for n in servers() for c, _ in server_points(n)]
    key = (wildcards.server, int(wildcards.ctx))
    return len(order) - order.index(key) if key in order else 0


def point_runtime_min(wildcards) -> int:
    """The chunk's per-job wall-clock limit in minutes (read by cluster executors), with room for
    the job around the sweep runner, so a point that runs into its own timeout is recorded as a
    failed point rather than killed by the scheduler."""
    return math.ceil(point_chunk(wildcards)["timeout_s"] / 60) + 2


def uses_custom_kernel(server: dict) -> bool:
    return server["backend"] == "custom"


def sweep_point_input(wildcards) -> dict[str, str]:
    """A server on the custom backend needs the built kernel library."""
    return {"lib": KERNEL_LIB} if uses_custom_kernel(servers()[wildcards.server]) else {}


class _KeepUnknown(dict):
    """format_map mapping that leaves {host}, {port} (filled per launch by the sweep) intact."""

    def __missing__(self, key: str) -> str:
        return f"{{{key}}}"


def server_fields(server: dict) -> dict[str, str]:
    """The placeholders a command template may use, from one server entry."""
    spec = server["spec"]
    switches = [f"--{flag}" for flag in ("cuda-graph", "defrag") if server[flag.replace("-", "_")]]
    return {
        "name": server["name"],
        "preset": config["sweep"]["preset"],
        "device": config["sweep"]["device"],
        "backend": server["backend"],
        "page_size": str(server["page_size"]),
        "chunk_size": str(server["chunk_size"]),
        "spec_mode": spec["mode"],
        "draft_len": str(spec["draft_len"]),
        "tree_nodes": str(spec["tree_nodes"]),
        "switches": " ".join(switches),
        "args": server["args"],
    }


def server_command(server: dict) -> str:
    """The server's launch command with its own settings filled in; {host} and {port} stay."""
    template = server.get("command") or config["sweep"]["command"]
    try:
        text = string.Formatter().vformat(template, (), _KeepUnknown(server_fields(server)))
    except (ValueError, IndexError) as exc:
        raise WorkflowError(f"bad command template of server {server['name']!r}: {exc}") from None
    return " ".join(text.split())


def server_target(wildcards) -> str:
    """The sweep's --server-cmd (launched and stopped around the point) or --url (left running)."""
    server = servers()[wildcards.server]
    if server.get("url"):
        return f"--url {shlex.quote(server['url'])}"
    return f"--server-cmd {shlex.quote(server_command(server))}"


# ---------------------------------------------------------------------------------------------
# resources, lists for the command lines


def every_core(wildcards) -> int:
    """A timed job's threads: every core of the run, so no other job (a notebook, a compile)
    shares the machine with a measurement; 1 where the run sets no core count (--report)."""
    return workflow._cores or 1


def gpus_for(device: str) -> int:
    """A job on a CUDA device holds one GPU."""
    return 1 if device == "cuda" else 0


def triton_interpret(device: str) -> int:
    """On a CPU, Triton kernels run in its interpreter, which must be chosen before triton loads."""
    return 1 if device == "cpu" else 0


def bench_extra_flags() -> str:
    """Optional bench-kernels settings, passed only when the config sets them."""
    kernels = config["kernels"]
    flags = []
    if "repeats" in kernels:
        flags.append(f"--repeats {kernels['repeats']}")
    if kernels.get("triton_configs"):
        flags.append("--triton-config " + " ".join(kernels["triton_configs"]))
    if kernels.get("decode_splits"):
        flags.append("--decode-splits " + " ".join(str(s) for s in kernels["decode_splits"]))
    return " ".join(flags)


def server_names_pattern() -> str:
    return "|".join(re.escape(name) for name in servers())


def final_outputs() -> list[str]:
    """What `snakemake` with no target builds: the whole study up to the report."""
    return [BUILD_INFO, KERNEL_BENCH, *sweep_outputs(), REPORT, NOTES]


# ---------------------------------------------------------------------------------------------
# the engine's step anatomy (workflow/rules/engine.smk)


def engine_bench_input(wildcards) -> dict[str, str]:
    """The custom backend needs the built kernel library."""
    return {"lib": KERNEL_LIB} if "custom" in config["engine"]["backends"] else {}


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


# ---------------------------------------------------------------------------------------------
# the analysis notebooks (workflow/rules/notebooks.smk): their published-study inputs, the one
# table of what differs between them, and the input/output/params functions built from it


def published_dir() -> str:
    """The published study folder named by the config, '' when there is none (yet)."""
    path = config.get("published") or ""
    return path if path and os.path.isdir(path) else ""


def published_inputs(wildcards) -> list[str]:
    """The published study's tables, so a newly published study re-renders what shows it."""
    root = published_dir()
    if not root:
        return []
    patterns = ["summary/*.csv", "kernels/bench.json", "build/build.json", "sweep/*/ctx*.json"]
    patterns.append("NOTES.md")  # the publisher's account of the targets, shown in the report
    return sorted(p for pattern in patterns for p in glob.glob(f"{root}/{pattern}"))


def published_engine_input(wildcards) -> list[str]:
    """The published study's raw step anatomy, drawn beside this run's when it exists."""
    root = published_dir()
    path = f"{root}/engine/bench.json"
    return [path] if root and os.path.isfile(path) else []


def analysis_figures(wildcards) -> list[str]:
    """Every figure the report page embeds: those of the other notebooks (per server: sweep)."""
    paths = []
    for name in NOTEBOOKS:
        for server in list(servers()) if name in layout.PER_SERVER else [None]:
            paths += layout.figure_paths("results", name, server)
    return paths


@dataclass(frozen=True)
class Notebook:
    """notebooks/<name>.ipynb, run by papermill; its figures and tables are layout.py's <name>.

    ``parameters(wildcards, input)`` gives papermill's parameters in the notebook's order;
    ``figures`` / ``tables`` name the category of its figures / tables in Snakemake's report
    (None: its tables are outputs but not shown there).
    """

    inputs: dict[str, str | Callable]
    parameters: Callable[..., dict]
    figures: str | None = None
    tables: str | None = None
    log_dir: str = "analysis"


# Passed with -y: the config is a mapping, and a published path may be empty.
YAML_PARAMETERS = ("published", "config")


def _study() -> dict:
    return {"results": "results", "study_name": config["study"]["name"]}


def _tau() -> dict:
    return {"tau": config["sweep"]["acceptance_length"]}


NOTEBOOKS = {
    "kernels": Notebook(
        inputs={
            "kernels": SUMMARY_KERNELS,
            "flashinfer": FLASHINFER_SM120,
            "published": published_inputs,
        },
        parameters=lambda wildcards, input: {
            "kernels_csv": input.kernels,
            **_study(),
            "published": published_dir(),
            "flashinfer_sm120": input.flashinfer,
        },
        figures="5. Kernel microbenchmark",
    ),
    "sweep": Notebook(
        inputs={"sweep": SUMMARY_SWEEP},
        parameters=lambda wildcards, input: {
            "sweep_csv": input.sweep,
            "server": wildcards.server,
            **_study(),
            **_tau(),
        },
        figures="6. Context sweep",
    ),
    "compare": Notebook(
        inputs={
            "sweep": SUMMARY_SWEEP,
            "reference": config["reference"],
            "published": published_inputs,
        },
        parameters=lambda wildcards, input: {
            "sweep_csv": input.sweep,
            "reference_csv": input.reference,
            **_study(),
            **_tau(),
            "published": published_dir(),
        },
        figures="7. Baseline vs custom",
    ),
    "engine": Notebook(  # the step anatomy, when the config has an engine section
        inputs={"bench": ENGINE_BENCH, "published": published_engine_input},
        parameters=lambda wildcards, input: {
            "bench_json": input.bench,
            "results": "results",
            "published": published_dir(),
        },
        figures="8. Step anatomy",
    ),
    # the report page: the headline tables, the setup and every figure of the notebooks above
    "report": Notebook(
        inputs={
            "kernels": SUMMARY_KERNELS,
            "sweep": SUMMARY_SWEEP,
            "bench": KERNEL_BENCH,
            "build": BUILD_INFO,
            "reference": config["reference"],
            "figures": analysis_figures,
            "published": published_inputs,
        },
        parameters=lambda wildcards, input: {
            "summary_dir": SUMMARY_DIR,
            "results": "results",
            "bench_json": input.bench,
            "build_json": input.build,
            "reference_csv": input.reference,
            "published": published_dir(),
            "config": config,
        },
        tables="0. Report",
        log_dir="report",
    ),
}
if "engine" not in config:
    del NOTEBOOKS["engine"]


def _server(name: str) -> str | None:
    """The wildcard of a notebook run once per server configuration."""
    return "{server}" if name in layout.PER_SERVER else None


def notebook_output(name: str) -> str:
    suffix = "-{server}" if _server(name) else ""
    return f"{NOTEBOOK_DIR}/{name}{suffix}.ipynb"


def notebook_log(name: str) -> str:
    suffix = "_{server}" if _server(name) else ""
    return f"results/logs/{NOTEBOOKS[name].log_dir}/notebook_{name}{suffix}.log"


def figure_outputs(name: str) -> dict:
    """Named report() outputs, one per figure of the notebook, captioned by its .rst file."""
    server = _server(name)
    extra = {"subcategory": server, "labels": {"server": server}} if server else {}
    return {
        figure: report(
            str(layout.figure_path("results", name, figure, server)),
            caption=f"../report/figures/{name}_{figure}.rst",
            category=NOTEBOOKS[name].figures,
            **extra,
        )
        for figure in layout.FIGURES.get(name, {})
    }


def table_outputs(name: str) -> list:
    """The notebook's tables; report() outputs, captioned by their .rst files, where shown."""
    category, paths = NOTEBOOKS[name].tables, layout.table_paths("results", name, _server(name))
    if not category:
        return paths
    captions = [f"../report/tables/{name}_{table}.rst" for table in layout.TABLES[name]]
    return [report(p, caption=c, category=category) for p, c in zip(paths, captions, strict=True)]


def papermill_parameters(name: str) -> Callable:
    """The params function of a notebook job: papermill's -y and -p options (papermill reads
    every -y before any -p, so they come in that order here too)."""

    def options(wildcards, input) -> str:
        values = NOTEBOOKS[name].parameters(wildcards, input)
        args = []
        for key in [k for k in values if k in YAML_PARAMETERS]:
            args += ["-y", json.dumps({key: values[key]})]
        for key in [k for k in values if k not in YAML_PARAMETERS]:
            args += ["-p", key, str(values[key])]
        return " ".join(shlex.quote(arg) for arg in args)

    return options
