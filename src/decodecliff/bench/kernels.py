"""`decodecliff bench-kernels`: time each attention backend against the device's measured roofline.

Backends are this repository's (torch, triton, custom) and the peers a user could pick instead
(sglang, flashinfer, cublas: kernels/peers.py), all timed in the same run on the same inputs.
For every (heads, page size, mode, context, backend, variant) point it builds one random problem
(scattered pages) and, before timing, checks the backend twice (NaN-poisoned output buffers, so a
kernel that writes nothing fails): its relative error against the float64 reference on the random
problem, and its per-row maximum error against a float64 reference on a planted problem of the same
shape (kernels/planted.py), which fails on any wrong mask decision. Then it times the launch-only
step (plan / metadata built outside the timed region; on a GPU replayed from a CUDA graph, as the
graph-mode servers run it, wherever the backend can be captured: `timing` says which) and reports
ms per layer (the median of the repeats, their fastest and slowest beside it as ``ms_min`` and
``ms_max``), effective GB/s, TFLOP/s and the fraction of the roofline floor (see roofline.py for
the exact definitions). The problem, the checks and their tolerance are the ones `check-kernel`
uses (core.py), which times eagerly. A
backend that cannot serve a point (no GPU, not installed, no tree mask) records it as skipped with
the reason. The JSON is rewritten atomically after every point, so an interrupted run keeps what it
measured; a progress bar on stderr shows points done / total, elapsed time and an estimate.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import envinfo
from ..jsonio import write_json
from ..kernels import planted as planting
from ..kernels.api import AttentionBackend, AttnBatch
from ..kernels.custom import VARIANTS as CUSTOM_VARIANTS
from ..kernels.peers import INDEX_DTYPES, SGLANG_KV_INDEX_DTYPE
from ..kernels.registry import BACKENDS, get_backend, unavailable
from . import core, roofline
from .timing import refuse_repeats, refuse_unusable, wall_ms

SCHEMA = "decodecliff.kernel-bench/1"
DEFAULT_CONTEXTS = [1024, 4096, 16384, 32768, 65536, 131072, 185000]
CPU_GUARD_FLOPS = 2e10  # above this the CPU skips the correctness guard (reference too slow)
CPU_PLANTED_FLOPS = 2e9  # the planted check on a CPU (backend + float64 reference) up to this size
DECODE_SPLITS = ["sglang", 8, 64]  # "sglang": the count SGLang's Triton backend picks for MLA
FLASHINFER_BACKENDS = ["fa2", "fa3"]
SM120 = ("model", "sm120")  # run as configured on sm_120 (kernels/sm120_model.py)


def parse_mode(mode: str) -> tuple[int, bool]:
    """``decode`` -> (1, chain); ``chainN`` -> (N, chain); ``treeN`` -> (N, random tree)."""
    if mode == "decode":
        return 1, False
    match = re.fullmatch(r"(chain|tree)(\d+)", mode)
    if not match or int(match.group(2)) < 1:
        raise ValueError(f"mode {mode!r} is not decode, chainN or treeN (N >= 1)")
    return int(match.group(2)), match.group(1) == "tree"


@dataclass(frozen=True)
class Variant:
    backend: str
    label: str | None  # the kernel / block config / decode split count; None for single kernels
    options: tuple[tuple[str, object], ...] = ()


def split_label(splits: int | str) -> str:
    """s8, s64, ... or "sglang" (the count SGLang's Triton backend picks, in the point's detail)."""
    return "sglang" if splits == "sglang" else f"s{splits}"


def by_index_dtype(variants: list[Variant], args: argparse.Namespace) -> list[Variant]:
    """Each SGLang-algorithm variant once per ``--index-dtypes`` entry: SGLang's own dtype keeps
    the plain label, another gets it appended (sm90-int32), so both stand side by side."""
    return [
        Variant(
            v.backend,
            v.label if d == SGLANG_KV_INDEX_DTYPE else f"{v.label}-{d}",
            (*v.options, ("index_dtype", d)),
        )  # fmt: skip
        for v in variants
        for d in args.index_dtypes
    ]


def peer_variants(backend: str, q_len: int, args: argparse.Namespace) -> list[Variant]:
    """The sglang kernels (extend + split-KV verify, or decode per split count) and FlashInfer's."""
    if backend == "flashinfer":
        out = [Variant("flashinfer", b, (("backend", b),)) for b in args.flashinfer_backends]
        if args.sm120_model and "fa2" in args.flashinfer_backends:  # sm_120 has no fa3
            out.append(Variant("flashinfer", "fa2-sm120", (("backend", "fa2"), SM120)))
        return out
    if q_len > 1:
        return by_index_dtype(
            [Variant("sglang", k, (("kernel", k),)) for k in ("extend", "verify")], args
        )
    decode = [
        Variant("sglang", f"decode-{split_label(s)}", (("kernel", "decode"), ("num_kv_splits", s)))
        for s in args.decode_splits
        if s != 0
    ]
    return by_index_dtype(decode, args)


def custom_variants(args: argparse.Namespace) -> list[Variant]:
    """Each --custom-variants entry split as its plan says ("auto" keeps no label: the backend
    as the engine runs it), then at each --custom-splits count (label suffix s16, ...)."""
    base = [(None if v == "auto" else v, () if v == "auto" else (("variant", v),))
            for v in args.custom_variants]  # fmt: skip
    if args.sm120_model:
        base += [(f"{v}-sm120", (("variant", v), SM120)) for v in args.custom_variants]
    out = [Variant("custom", label, opts) for label, opts in base]
    for n in dict.fromkeys(args.custom_splits):
        out += [
            Variant("custom", f"{label or 'auto'}-{split_label(n)}", (*opts, ("num_splits", n)))
            for label, opts in base
        ]
    return out


def variants(backend: str, q_len: int, args: argparse.Namespace, device: torch.device) -> list:
    """Which configurations of ``backend`` to time at this q_len."""
    if backend in ("sglang", "flashinfer"):
        return peer_variants(backend, q_len, args)
    if backend == "custom":
        return custom_variants(args)
    if backend != "triton":
        return [Variant(backend, None)]
    from ..kernels.triton_baseline import resolve_arch_config

    configs = list(dict.fromkeys(resolve_arch_config(c, device).name for c in args.triton_config))
    extend = [Variant("triton", c, (("arch_config", c), ("decode", "extend"))) for c in configs]
    if q_len > 1:
        return by_index_dtype(extend, args)
    out = []
    for splits in args.decode_splits:
        if splits == 0:  # decode through the extend kernel, as a one-token verify
            out += [Variant("triton", f"{v.label}-extend", v.options) for v in extend]
        else:
            opts = (("decode", "grouped"), ("num_kv_splits", splits))
            out.append(Variant("triton", f"grouped-{split_label(splits)}", opts))
    return by_index_dtype(out, args)


class Backends:
    """Backends constructed once per variant, so their workspaces persist across points."""

    def __init__(self) -> None:
        self._made: dict[Variant, AttentionBackend | Exception] = {}

    def get(self, variant: Variant) -> AttentionBackend | Exception:
        if variant not in self._made:
            try:
                self._made[variant] = get_backend(variant.backend, **dict(variant.options))
            except Exception as exc:  # unavailable: not built, no GPU, missing module
                self._made[variant] = exc
        return self._made[variant]


class Point(dict):
    """One JSON point; keys follow the schema documented in the module docstring."""


def base_point(
    variant: Variant, heads: int, ctx: int, mode: str, page_size: int, args: argparse.Namespace
) -> Point:
    q_len, _ = parse_mode(mode)
    return Point(
        backend=variant.backend, triton_config=variant.label, heads=heads, ctx=ctx, mode=mode,
        q_len=q_len, page_size=page_size, batch=args.batch, ragged=args.ragged, ms=None,
        ms_min=None, ms_max=None, gbs=None, tflops=None, floor_ms=None, roofline_frac=None,
        rel_err=None, planted_err=None, planted_row=None, detail=None, timing=None,
        status="skipped", reason=None,
    )  # fmt: skip


class Runner:
    def __init__(self, args: argparse.Namespace, device: torch.device, ceilings: dict) -> None:
        self.args, self.device, self.ceilings = args, device, ceilings
        self.backends = Backends()
        self.seconds_per_call: dict[tuple, tuple[int, float]] = {}  # key -> (ctx, s)
        self.reference: torch.Tensor | None = None
        self.planted: tuple[planting.Planted, torch.Tensor] | None = None  # per shape, with its ref
        self.shape: dict = {}

    def estimate(self, key: tuple, ctx: int) -> float | None:
        if key not in self.seconds_per_call:
            return None
        prev_ctx, seconds = self.seconds_per_call[key]
        return seconds * ctx / prev_ctx

    def calls(self) -> int:
        return self.args.repeats + self.args.warmup

    def reference_output(self, batch: AttnBatch) -> torch.Tensor | None:
        if self.reference is None:
            m = batch.meta
            flops = roofline.attention_flops(
                m.max_kv_len or 0, m.max_q_len or 1, m.num_heads, m.batch_size
            )
            if self.device.type == "cpu" and flops > CPU_GUARD_FLOPS:
                return None
            self.reference = core.reference(batch)
        return self.reference

    def planted_problem(self) -> tuple[planting.Planted, torch.Tensor]:
        """This shape's planted problem and its float64 reference, built once per shape."""
        if self.planted is None:
            sh = self.shape
            self.planted = core.planted_problem(
                sh["kv_lens"], sh["q_len"], sh["heads"], sh["page_size"], sh["tree"],
                device=self.device, seed=self.args.seed,
            )  # fmt: skip
        return self.planted

    def check_planted(self, point: Point, backend: AttentionBackend, batch: AttnBatch) -> bool:
        """The planted mask check; False (with the point failed) when a mask decision is wrong."""
        flops = roofline.attention_flops(
            point["ctx"], point["q_len"], point["heads"], batch.meta.batch_size
        )
        if self.device.type == "cpu" and flops > CPU_PLANTED_FLOPS:
            why = "planted mask check skipped on CPU at this size"
            point["reason"] = f"{point['reason']}; {why}" if point["reason"] else why
            return True
        worst = core.planted_error(backend, *self.planted_problem())
        point["planted_err"] = worst["max_err"]
        point["planted_row"] = f"{worst['visible']} vs {worst['hidden']}"
        if not worst["ok"]:
            point.update(
                status="failed",
                reason=f"planted mask check: row error {worst['max_err']:.3g} at token "
                f"{worst['token']} head {worst['head']} (shows {worst['visible']}, hides "
                f"{worst['hidden']})",
            )
            return False
        return True

    def run_point(self, point: Point, variant: Variant, batch: AttnBatch) -> Point:
        why = unavailable(variant.backend, self.device.type)
        if why:
            point["reason"] = why
            return point
        backend = self.backends.get(variant)
        if isinstance(backend, Exception):
            point["reason"] = f"{variant.backend} unavailable: {type(backend).__name__}: {backend}"
            return point
        why = backend.unsupported(batch.meta)
        if why:
            point["reason"] = why
            return point
        key = (variant, point["heads"], point["mode"], point["page_size"])
        limit = self.args.max_seconds_per_point
        est = self.estimate(key, point["ctx"])
        if est is not None and est * (self.calls() + 1) > limit:
            point["reason"] = f"estimated {est * (self.calls() + 1):.0f} s > {limit:g} s per point"
            return point
        out = core.poisoned_output(batch)
        first = wall_ms(backend.prepare(batch, out), self.device) / 1e3  # a GPU also compiles
        if not self.check_output(point, batch, out):
            return point
        if not self.check_planted(point, backend, batch):
            return point
        step = backend.prepare(batch, out)  # re-planned on the timed problem
        point["detail"] = backend.describe()
        if self.device.type == "cuda":
            first = wall_ms(step, self.device) / 1e3
        self.seconds_per_call.setdefault(key, (point["ctx"], first))
        if first * self.calls() > limit:
            point["reason"] = f"one call took {first:.1f} s; {self.calls()} would pass {limit:g} s"
            return point
        graph = self.args.timing == "graph"
        times = core.step_times(backend, batch, self.args.repeats, self.args.warmup, graph=graph)
        ms = statistics.median(times)
        point["timing"] = core.timing_label(backend, self.device, graph)
        self.seconds_per_call[key] = (point["ctx"], ms / 1e3)
        # the floor of the tokens the step reads: ctx x batch, or a ragged batch's sum
        shape = (sum(self.shape["kv_lens"]), point["q_len"], point["heads"], 1)
        point.update(ms=ms, ms_min=min(times), ms_max=max(times), status="ok")
        point.update(core.rates(ms, *shape, self.ceilings))
        return point

    def check_output(self, point: Point, batch: AttnBatch, out: torch.Tensor) -> bool:
        """The once-per-point correctness guard; False (with the point failed) on a bad output."""
        ref = self.reference_output(batch)
        err, why = core.output_error(out, ref)
        point["rel_err"] = err if err is not None and math.isfinite(err) else None
        if why:
            point.update(status="failed", reason=why)
            return False
        if ref is None:
            point["reason"] = "correctness guard skipped on CPU at this size"
        return True


def print_table(points: list[dict], ceilings: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    title = (
        f"{ceilings['device']}: copy {ceilings['copy_gbs']:.0f} GB/s, "
        f"matmul {ceilings['matmul_tflops']:.2f} TFLOP/s ({ceilings['matmul']})"
    )
    table = Table(title=title)
    cols = ["backend", "config", "heads", "ctx", "mode", "ps", "ms", "GB/s", "TFLOP/s", "floor ms"]
    for col in [*cols, "roofline", "rel err", "planted", "status"]:
        table.add_column(col, justify="left" if col in ("backend", "config", "mode") else "right")

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for p in points:
        status = p["status"] if not p["reason"] else f"{p['status']}: {p['reason']}"
        table.add_row(
            p["backend"], p["triton_config"] or "", str(p["heads"]), str(p["ctx"]), p["mode"],
            str(p["page_size"]), num(p["ms"], ".4g"), num(p["gbs"], ".4g"), num(p["tflops"], ".3g"),
            num(p["floor_ms"], ".3g"), num(p["roofline_frac"], ".2%"), num(p["rel_err"], ".2g"),
            num(p.get("planted_err"), ".2g"), status,
        )  # fmt: skip
    Console(width=200).print(table)


def splits_arg(value: str) -> int | str:
    if value == "sglang":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer or 'sglang'") from None


def _words(values) -> str:
    return " ".join(map(str, values))


DEFAULT_BACKENDS = ["torch", "triton", "custom"]
DEFAULT_MODES = ["decode", "chain16", "tree64"]
DEFAULT_PAGE_SIZES = [1, 64]
DEFAULT_HEADS = [8, 64]
DEFAULT_OUT = Path("results/kernels/bench.json")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="decodecliff bench-kernels",
        description="Time each attention backend against the device's measured roofline, after "
        "checking its output against the torch reference and a planted mask problem.",
    )
    p.add_argument(
        "--backends",
        nargs="+",
        default=DEFAULT_BACKENDS,
        help=f"backends to time, of {_words(BACKENDS)} (default: {_words(DEFAULT_BACKENDS)})",
    )
    p.add_argument(
        "--contexts",
        nargs="+",
        type=int,
        default=DEFAULT_CONTEXTS,
        help=f"KV lengths per request (default: {_words(DEFAULT_CONTEXTS)})",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        default=DEFAULT_MODES,
        help=f"decode, chainN or treeN: N draft tokens verified per request "
        f"(default: {_words(DEFAULT_MODES)})",
    )
    p.add_argument(
        "--page-sizes",
        nargs="+",
        type=int,
        default=DEFAULT_PAGE_SIZES,
        help=f"KV cache page sizes (default: {_words(DEFAULT_PAGE_SIZES)})",
    )
    p.add_argument(
        "--heads",
        nargs="+",
        type=int,
        default=DEFAULT_HEADS,
        help=f"query heads (default: {_words(DEFAULT_HEADS)})",
    )
    p.add_argument("--batch", type=int, default=1, help="requests per step (default: 1)")
    p.add_argument(
        "--ragged",
        action="store_true",
        help="a batch of mixed lengths, spread evenly from the context down to context / batch "
        "(the floor counts the tokens read) (default: every request at the context)",
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="timed calls (default: 20 on a GPU, 3 on a CPU)"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed calls after the first (default: 2 on a GPU, 0 on a CPU)",
    )
    p.add_argument(
        "--device",
        default="auto",
        help="auto (cuda if available), cuda, cuda:N or cpu (default: auto)",
    )
    p.add_argument(
        "--triton-config",
        nargs="+",
        default=["auto"],
        help="the triton extend kernel's block sizes: auto (this GPU's), sm80, sm90, sm120, ... "
        "(default: auto)",
    )
    p.add_argument(
        "--decode-splits",
        nargs="+",
        type=splits_arg,
        default=DECODE_SPLITS,
        help="KV splits of the triton grouped decode and sglang's decode_attention_fwd at decode "
        "points: N, 'sglang' (the count SGLang's Triton backend picks for MLA), 0 (triton only: "
        f"decode via the extend kernel) (default: {_words(DECODE_SPLITS)})",
    )
    p.add_argument(
        "--index-dtypes",
        nargs="+",
        choices=list(INDEX_DTYPES),
        default=[SGLANG_KV_INDEX_DTYPE],
        help="kv_indices dtypes of the SGLang-algorithm kernels (triton, sglang): the one SGLang "
        "passes keeps the plain label, another is timed beside it with the dtype in its label "
        f"(default: {SGLANG_KV_INDEX_DTYPE}, SGLang's own)",
    )
    p.add_argument(
        "--flashinfer-backends",
        nargs="+",
        choices=FLASHINFER_BACKENDS,
        default=FLASHINFER_BACKENDS,
        help=f"FlashInfer MLA paths to time, fa3 needs sm_90 "
        f"(default: {_words(FLASHINFER_BACKENDS)})",
    )
    p.add_argument(
        "--custom-variants",
        nargs="+",
        choices=[*CUSTOM_VARIANTS, "auto"],
        default=["auto"],
        help="custom kernel variants to time side by side; auto: the one the engine picks "
        "(default: auto)",
    )
    p.add_argument(
        "--custom-splits",
        nargs="+",
        type=int,
        default=[],
        help="also time each custom variant at these KV split counts (labels end in -s<N>) "
        "(default: none, each variant's own plan only)",
    )
    p.add_argument(
        "--sm120-model",
        action="store_true",
        help="also time the custom variants and FlashInfer's fa2 as they configure themselves "
        "on sm_120 (100 KB of shared memory per SM; labels end in -sm120): needs the libraries "
        "of `decodecliff build-kernel --sm120-model ARCH` and FlashInfer run under "
        "LD_PRELOAD of its shim (kernels/sm120_model.py) (default: the H200's own only)",
    )
    p.add_argument(
        "--timing",
        choices=["graph", "events"],
        default="graph",
        help="graph: each capturable backend's step replayed from a CUDA graph, as graph-mode "
        "servers run their layers (the torch reference and cuBLAS eagerly); events: every step "
        "launched eagerly between CUDA events; both flush the L2 before each repeat, and a CPU "
        "reads the wall clock (default: graph)",
    )
    p.add_argument(
        "--max-seconds-per-point",
        type=float,
        default=30.0,
        help="skip a point whose timed calls would take longer, as estimated from the previous "
        "context or the first call (default: 30)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the random and planted problems (default: 0)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"the JSON written after every point (default: {DEFAULT_OUT})",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no table at the end and no live progress bar (default: both shown; the per-point "
        "progress lines are always printed)",
    )
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    validate(p, args)
    return args


def validate_triton_configs(p: argparse.ArgumentParser, names: list[str]) -> None:
    try:
        from ..kernels.triton_baseline import ARCH_CONFIGS
    except Exception:  # triton unusable here: its points are skipped with the reason
        return
    for name in names:
        if name != "auto" and name not in ARCH_CONFIGS:
            p.error(f"unknown --triton-config {name!r}; choose from auto {' '.join(ARCH_CONFIGS)}")


def validate(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in args.backends:
        if name not in BACKENDS:
            p.error(f"unknown backend {name!r}; choose from {sorted(BACKENDS)}")
    for mode in args.modes:
        try:
            parse_mode(mode)
        except ValueError as exc:
            p.error(str(exc))
    for label, values in [("contexts", args.contexts), ("page-sizes", args.page_sizes)]:
        if any(v < 1 for v in values):
            p.error(f"--{label} must be positive")
    if any(h < 1 for h in args.heads) or args.batch < 1:
        p.error("--heads and --batch must be positive")
    if "triton" in args.backends:
        validate_triton_configs(p, args.triton_config)
    if any(n < 1 for n in args.custom_splits):
        p.error("--custom-splits must be positive")
    if any(s != "sglang" and s < 0 for s in args.decode_splits):
        p.error("--decode-splits must be >= 0 or 'sglang'")
    if args.device not in ("auto", "cpu", "cuda") and not args.device.startswith("cuda:"):
        p.error(f"--device must be auto, cpu or cuda, got {args.device!r}")
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.warmup is not None and args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if not (math.isfinite(args.max_seconds_per_point) and args.max_seconds_per_point > 0):
        p.error(f"--max-seconds-per-point must be positive, got {args.max_seconds_per_point}")
    if not 0 <= args.seed < 2**63:
        p.error(f"--seed must be in 0..2^63-1, got {args.seed}")
    refuse_repeats(
        p, backends=args.backends, modes=args.modes, contexts=args.contexts,
        page_sizes=args.page_sizes, heads=args.heads, decode_splits=args.decode_splits,
        index_dtypes=args.index_dtypes, flashinfer_backends=args.flashinfer_backends,
        custom_variants=args.custom_variants,
    )  # fmt: skip
    refuse_unusable(p, args.device, args.out)


def run(args: argparse.Namespace) -> dict:
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    gpu = device.type == "cuda"
    args.repeats = (20 if gpu else 3) if args.repeats is None else args.repeats
    args.warmup = (2 if gpu else 0) if args.warmup is None else args.warmup
    ceilings = roofline.measure_ceilings(device)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    doc = {
        "schema": SCHEMA, "env": envinfo.collect(), "ceilings": ceilings,
        "config": {**config, "device": str(device)}, "peers": peer_versions(),
        "triton_native_config": native_config(device), "points": [],
        "complete": False,  # rewritten after every point; true once the last is done
    }  # fmt: skip
    runner = Runner(args, device, ceilings)
    shapes = [
        (heads, page_size, mode, ctx)
        for heads in args.heads
        for page_size in args.page_sizes
        for mode in args.modes
        for ctx in sorted(args.contexts)
    ]
    total = sum(len(todo_at(args, device, parse_mode(m)[0])) for _, _, m, _ in shapes)
    with BenchProgress(total, quiet=args.quiet) as progress:
        for shape in shapes:
            run_shape(runner, doc, *shape, progress)
    doc["complete"] = True
    write_json(args.out, doc, default=str)
    return doc


def native_config(device: torch.device) -> str | None:
    """The extend block config SGLang's table picks on this GPU (None on a CPU)."""
    if device.type != "cuda":
        return None
    from ..kernels.triton_baseline import resolve_arch_config

    return resolve_arch_config("auto", device).name


def print_fidelity(doc: dict) -> None:
    """The baseline's time over SGLang's own kernel at every point both were timed."""
    from ..analysis.fidelity import fidelity_rows

    rows = fidelity_rows(doc["points"], doc.get("triton_native_config") or "")
    for r in rows:
        print(
            f"fidelity {r['mode']:>8} h{r['heads']} ps{r['page_size']} ctx {r['ctx']:>7}: "
            f"triton {r['baseline']} {r['baseline_ms']:.4g} ms / sglang {r['sglang']} "
            f"{r['sglang_ms']:.4g} ms = {r['ratio']:.3f}",
            file=sys.stderr,
        )


def peer_versions() -> dict:
    """Installed versions of the peers' packages (None: not installed)."""
    import importlib.metadata

    out = {}
    for name in ("sglang", "flashinfer-python", "apache-tvm-ffi"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def todo_at(args: argparse.Namespace, device: torch.device, q_len: int) -> list[Variant]:
    return [v for b in args.backends for v in variants(b, q_len, args, device)]


class BenchProgress:
    """points done / total, elapsed and remaining time on stderr (rich), one log line per point."""

    def __init__(self, total: int, quiet: bool = False) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = Console(stderr=True, width=160)
        self.progress = Progress(
            TextColumn("[bold]bench-kernels[/] {task.description}"), BarColumn(),
            MofNCompleteColumn(), TextColumn("elapsed"), TimeElapsedColumn(),
            TextColumn("left ~"), TimeRemainingColumn(), console=self.console,
            disable=quiet or not self.console.is_terminal,
        )  # fmt: skip
        self.task = self.progress.add_task("", total=total)
        self.total, self.done, self.start = total, 0, time.perf_counter()

    def __enter__(self) -> BenchProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def describe(self, text: str) -> None:
        self.progress.update(self.task, description=text)

    def point_done(self, line: str) -> None:
        """Advance by one point; without a live terminal, the line carries the counts itself."""
        self.done += 1
        self.progress.advance(self.task)
        elapsed = time.perf_counter() - self.start
        left = elapsed / self.done * (self.total - self.done)
        counts = f"[{self.done}/{self.total} {elapsed:.0f}s, ~{left:.0f}s left]"
        self.console.print(f"{counts} {line}", markup=False, highlight=False)


def run_shape(
    runner: Runner, doc: dict, heads: int, page_size: int, mode: str, ctx: int,
    progress: BenchProgress,
) -> None:  # fmt: skip
    args, device = runner.args, runner.device
    q_len, tree = parse_mode(mode)
    todo = todo_at(args, device, q_len)
    progress.describe(f"h{heads} ps{page_size} {mode} ctx {ctx}")
    if ctx < q_len:
        for v in todo:
            point = base_point(v, heads, ctx, mode, page_size, args)
            point["reason"] = f"ctx {ctx} < q_len {q_len}"
            record(doc, point, args, progress)
        return
    kv_lens = kv_lengths(ctx, q_len, args.batch, args.ragged)
    try:
        batch = core.problem(kv_lens, q_len, heads, page_size, tree, device=device, seed=args.seed)
    except (RuntimeError, MemoryError, ValueError) as exc:  # out of memory: no point can run
        for v in todo:
            point = base_point(v, heads, ctx, mode, page_size, args)
            point.update(
                status="failed", reason=f"inputs not built: {type(exc).__name__}: {exc}"[:500]
            )
            record(doc, point, args, progress)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return
    runner.reference, runner.planted = None, None
    runner.shape = dict(kv_lens=kv_lens, q_len=q_len, heads=heads, page_size=page_size, tree=tree)
    for v in todo:
        point = base_point(v, heads, ctx, mode, page_size, args)
        try:
            runner.run_point(point, v, batch)
        except Exception as exc:  # a backend error fails this point; the bench goes on
            point.update(status="failed", reason=f"{type(exc).__name__}: {exc}"[:500])
            if device.type == "cuda":
                torch.cuda.empty_cache()
        record(doc, point, args, progress)
    del batch
    runner.reference, runner.planted = None, None


def kv_lengths(ctx: int, q_len: int, batch: int, ragged: bool) -> list[int]:
    """Each request's KV length: ``ctx`` for all, or (ragged) spread evenly from ``ctx`` down to
    ``ctx / batch``, as a serving batch mixes long and short requests."""
    if not ragged:
        return [ctx] * batch
    return [max(q_len, ctx * (batch - i) // batch) for i in range(batch)]


def record(doc: dict, point: dict, args: argparse.Namespace, progress: BenchProgress) -> None:
    doc["points"].append(dict(point))
    write_json(args.out, doc, default=str)
    ms = "-" if point["ms"] is None else f"{point['ms']:.4g} ms"
    label = point["triton_config"] or ""
    line = f"{point['backend']:<7} {label:<12} h{point['heads']} ps{point['page_size']} "
    line += f"{point['mode']:<8} ctx {point['ctx']:>7}: {point['status']} {ms}"
    progress.point_done(line + (f" ({point['reason']})" if point["reason"] else ""))


def cli(argv: list[str]) -> int:
    args = parse_args(argv)
    gpu = args.device != "cpu" and torch.cuda.is_available()
    if args.sm120_model and "flashinfer" in args.backends and gpu:
        from ..kernels import sm120_model

        sm120_model.preload_shim(["bench-kernels", *argv])
    doc = run(args)
    print_fidelity(doc)
    if not args.quiet:
        print_table(doc["points"], doc["ceilings"])
    failed = sum(p["status"] == "failed" for p in doc["points"])
    print(f"wrote {args.out} ({len(doc['points'])} points, {failed} failed)", file=sys.stderr)
    return 1 if failed and all(p["status"] != "ok" for p in doc["points"]) else 0
