"""What a validated study config runs: its servers and their points, the benches' flags, the
published study it is shown beside. The workflow's input and params functions read these."""

from __future__ import annotations

import glob
import math
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from decodecliff.helpformat import did_you_mean
from decodecliff.kernels import registry
from decodecliff.study import config as study_config
from decodecliff.study import paths
from decodecliff.study import servers as srv


class PointError(LookupError):
    """A requested point that is not in the config."""


# A context as a point file spells it (ctx1024.json): no sign, no leading zero, no unit.
CONTEXT = re.compile(r"[1-9][0-9]*")
POINT_FILE = re.compile(rf"ctx({CONTEXT.pattern})\.json")


@dataclass(frozen=True)
class Point:
    """One context point of one server: the sweep_point job's settings."""

    server: str
    ctx: int
    chunk: dict
    requests: int  # recorded requests (rounds): the chunk's setting, else the sweep's
    concurrency: int
    target: str  # `decodecliff sweep`'s --server-cmd or --url
    skip_reason: str | None  # why it is recorded as skipped without launching anything
    needs_kernel_lib: bool
    priority: int  # earlier servers and earlier points of a chunk list run first

    @property
    def file(self) -> str:
        return paths.point_file(self.server, self.ctx)

    @property
    def runtime_min(self) -> int:
        """The job's wall-clock limit in minutes (read by cluster executors): the chunk's timeout
        with room for the job around the runner, so a point that runs into its own timeout is
        recorded as a failed point rather than killed by the scheduler."""
        return math.ceil(self.chunk["timeout_s"] / 60) + 2


class Study:
    """A validated config (defaults filled in) and the lookups the workflow needs."""

    def __init__(
        self,
        cfg: dict,
        schema: str | Path = study_config.SCHEMA,
        files: Sequence[str | Path] = (),
        overrides: dict | None = None,
    ) -> None:
        """``files``: the YAML files merged into ``cfg``, in order, so an error names its line;
        ``overrides``: Snakemake's --config values, which an error names as such."""
        self.config = study_config.validate(cfg, schema, files, overrides)
        self.sweep = self.config["sweep"]
        self.servers = {server["name"]: server for server in self.sweep["servers"]}

    # -- the sweep -------------------------------------------------------------------------------

    def server_points(self, name: str) -> list[tuple[int, dict]]:
        """(context, chunk) of every point of a server, in the order its chunks give."""
        return [(ctx, c) for c in self.servers[name]["chunks"] for ctx in c["contexts"]]

    def order(self) -> list[tuple[str, int]]:
        return [(name, ctx) for name in self.servers for ctx, _ in self.server_points(name)]

    def point_files(self, name: str | None = None) -> list[str]:
        """The point files of one server, or of every server."""
        return [paths.point_file(n, c) for n, c in self.order() if name in (None, n)]

    def server_names_pattern(self) -> str:
        return "|".join(re.escape(name) for name in self.servers)

    def _check_server(self, name: str) -> None:
        if name not in self.servers:
            raise PointError(
                f"no server {name!r} in the config; {did_you_mean(name, self.servers)}"
            )

    def point(self, name: str, ctx: int | str) -> Point:
        """The point results/sweep/<name>/ctx<ctx>.json; PointError if the config has none."""
        if isinstance(ctx, str) and not CONTEXT.fullmatch(ctx):  # ctx01024, ctx1k: no file's
            return self.point_at(name, f"ctx{ctx}.json")
        ctx = int(ctx)
        self._check_server(name)
        chunks = {c: chunk for c, chunk in self.server_points(name)}
        if ctx not in chunks:
            near = min(chunks, key=lambda c: abs(math.log(c / ctx)))
            raise PointError(
                f"context {ctx} is not a point of server {name!r} in the config; did you mean "
                f"{near}? (its points: {', '.join(map(str, chunks))}; add a new one to one of "
                "the server's chunks first)"
            )
        server, chunk, order = self.servers[name], chunks[ctx], self.order()
        skip = srv.skip_reason(self.sweep, server)
        return Point(
            server=name,
            ctx=ctx,
            chunk=chunk,
            requests=chunk.get("requests_per_point") or self.sweep["requests_per_point"],
            concurrency=srv.concurrency(self.sweep, server),
            target=srv.target(self.sweep, server),
            skip_reason=skip,
            needs_kernel_lib=skip is None
            and not server.get("url")  # runs elsewhere, on its own library
            and registry.needs_kernel_lib(server["backend"], server["backend_options"]),
            priority=len(order) - order.index((name, ctx)),
        )

    def point_at(self, name: str, file: str) -> Point:
        """The point whose file is results/sweep/<name>/<file> (ctx1024.json); PointError naming
        the server's point files, the closest first, for a name none has (ctx01024.json,
        ctx1k.json, 1024.json)."""
        self._check_server(name)
        if match := POINT_FILE.fullmatch(file):
            return self.point(name, int(match[1]))
        files = [Path(paths.point_file(name, ctx)).name for ctx, _ in self.server_points(name)]
        raise PointError(
            f"no point file {file!r} of server {name!r} (a point's is ctx<N>.json, N its context "
            f"in tokens); {did_you_mean(file, files)}"
        )

    def final_outputs(self) -> list[str]:
        """What `snakemake` with no target builds: the whole study up to the report."""
        return [
            paths.BUILD_INFO,
            paths.KERNEL_BENCH,
            *self.point_files(),
            paths.REPORT,
            paths.NOTES,
        ]

    # -- the device ------------------------------------------------------------------------------

    def cuda_sections(self) -> list[str]:
        """The config keys that put a stage on a CUDA GPU (kernels.device, ...)."""
        sections = ("kernels", "engine", "sweep")
        return [f"{s}.device" for s in sections if self.config.get(s, {}).get("device") == "cuda"]

    def gpu_warning(self, have_gpu: bool) -> str | None:
        """One line where the config runs stages on a GPU this machine lacks: what fails here.

        A warning, not an error: a GPU config is also rendered where no GPU is (a dry run that
        prints the GPU jobs' commands, publishing measured files, a cluster executor's login node).
        """
        keys = self.cuda_sections()
        if have_gpu or not keys:
            return None
        fails = [f"{rule} fails" for rule, key in BENCH_RULES if f"{key}.device" in keys]
        if "sweep.device" in keys:
            fails.append(self._points_failing_here())
        return (
            f"no NVIDIA GPU on this machine, but {', '.join(keys)} = cuda: a job run here "
            f"fails ({'; '.join(fails)}); fine for a dry run (-n), publishing measured files "
            "(--touch) or an executor that sends the jobs to GPU nodes"
        )

    def _points_failing_here(self) -> str:
        """How many points a sweep on a missing GPU records as failed: not those of a server
        recorded as skipped here (a package missing), nor of one swept at its URL (elsewhere)."""
        counts = {"failed": 0, "skipped": 0, "url": 0}
        for name, _ in self.order():
            server = self.servers[name]
            if server.get("url"):
                counts["url"] += 1
            else:
                counts["skipped" if srv.skip_reason(self.sweep, server) else "failed"] += 1
        said = (
            f"{counts['failed']} of the sweep's {len(self.order())} points are recorded as failed"
        )
        also = [f"{counts['skipped']} as skipped"] if counts["skipped"] else []
        also += [f"{counts['url']} swept at their url"] if counts["url"] else []
        return ", ".join([said, *also])

    # -- the benches -----------------------------------------------------------------------------

    def bench_extra_flags(self) -> str:
        """Optional bench-kernels settings, passed only when the config sets them."""
        kernels, flags = self.config["kernels"], []
        if "repeats" in kernels:  # no default: the bench's own depends on the device
            flags.append(f"--repeats {kernels['repeats']}")
        if kernels.get("triton_configs"):
            flags.append("--triton-config " + " ".join(kernels["triton_configs"]))
        if kernels.get("decode_splits"):
            flags.append("--decode-splits " + " ".join(map(str, kernels["decode_splits"])))
        if kernels.get("custom_variants"):
            flags.append("--custom-variants " + " ".join(kernels["custom_variants"]))
        if kernels.get("sm120_model"):
            flags.append("--sm120-model")
        return " ".join(flags)

    def build_extra_flags(self) -> str:
        """build-kernel's optional settings: the sm_120-model library for the study's GPU."""
        arch = self.config["build"].get("sm120_model")
        return f"--sm120-model {arch}" if arch else ""

    def engine_needs_kernel_lib(self) -> bool:
        specs = self.config.get("engine", {}).get("backends", [])
        return any(registry.needs_kernel_lib(*registry.parse_spec(spec)) for spec in specs)

    def engine_flags(self) -> str:
        """bench-engine's options from the config's engine section (defaults filled in)."""
        eng = self.config["engine"]
        flags = [
            f"--preset {eng['preset']} --device {eng['device']}",
            "--backends " + " ".join(eng["backends"]),
            "--paths " + " ".join(eng["paths"]),
            "--contexts " + " ".join(map(str, eng["contexts"])),
            "--modes " + " ".join(eng["modes"]),
            "--gemm " + " ".join(eng["gemms"]),
            f"--draft-len {eng['draft_len']} --repeats {eng['repeats']}",
        ]
        if eng["loop_contexts"]:
            flags.append("--parts anatomy loop --loop-contexts")
            flags.append(" ".join(map(str, eng["loop_contexts"])))
        if eng["device"] == "cpu":
            flags.append("--threads 1")  # tiny GEMMs on a shared CPU: no intra-op spinning
        return " ".join(flags)

    # -- the published study shown beside this one -------------------------------------------------

    def published_dir(self) -> str:
        """The published study folder named by the config, '' where it names none or no study is
        there (the main process warns of that: config.published_warning)."""
        path = self.config.get("published") or ""
        return path if path and study_config.is_study_folder(path) else ""

    def published_inputs(self) -> list[str]:
        """Its tables, raw files and notes, so a newly published study re-renders what shows it."""
        root = self.published_dir()
        if not root:
            return []
        patterns = ["summary/*.csv", "kernels/bench.json", "build/build.json", "sweep/*/ctx*.json"]
        patterns.append("NOTES.md")  # the publisher's account of the targets, in the report
        return sorted(p for pattern in patterns for p in glob.glob(f"{root}/{pattern}"))

    def published_engine_input(self) -> list[str]:
        """Its raw step anatomy, drawn beside this run's when it exists."""
        root = self.published_dir()
        path = f"{root}/engine/bench.json"
        return [path] if root and os.path.isfile(path) else []


# The timing jobs on a device, and the config section that names it.
BENCH_RULES = (("bench_kernels", "kernels"), ("bench_engine", "engine"))


def gpu_present() -> bool:
    """Whether this machine has an NVIDIA GPU driver (read without importing torch)."""
    return os.path.exists("/proc/driver/nvidia/version") or bool(shutil.which("nvidia-smi"))


def gpus_for(device: str) -> int:
    """A job on a CUDA device holds one GPU."""
    return 1 if device == "cuda" else 0


def triton_interpret(device: str) -> int:
    """On a CPU, Triton kernels run in its interpreter, chosen before triton loads."""
    return 1 if device == "cpu" else 0
