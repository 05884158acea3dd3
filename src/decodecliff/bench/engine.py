"""`decodecliff bench-engine`: a decode / verify step's anatomy beside its floor.

For every backend, path (CUDA graphs or eager), mode and context, the KV pool is filled with random
rows (a 185k prefill of the full model would take longer than the measurement), requests are placed
at that length, and the step is timed through the engine's own forward (synchronised, warm-up
excluded, median of repeats; the sampler's host read ends the step, as in serving). The step is
split three ways:

* attention = step - the same step with a no-op attention backend (``NoAttention``), same path;
* GEMMs = the device time of the projection kernels (aten mm/bmm/addmm) in a torch.profiler trace
  of one eager no-op step (on a CPU, their CPU time). Graphs replay the same kernels;
* rest = the no-op step - GEMMs: elementwise kernels, launch gaps and host work.

On CUDA each row also holds the step's kernels folded by layer (bench/timeline.py: per kernel of
a layer its mean duration and the gap before it; the step's busy time against its span), traced
on the step's own path, and the profile holds the same for the eager no-op step, where the host's
slow launches leave kernels little to overlap (a chained kernel that starts before the one it
waits for has ended counts its wait: a negative gap before it says so).

Each part stands beside its floor, from ceilings measured in the same run (bench/roofline.py):
GEMMs max(weight bytes / copy rate, GEMM FLOPs / matmul rate), attention max(KV bytes / copy rate,
attention FLOPs / matmul rate), rest 0. ``--parts loop`` runs the engine's serving loop (drafting,
stepping, sampling, emitting; no HTTP) on one request at each context and reports verify steps/s;
``--parts drafter host`` time the n-gram drafter alone and the host work outside a step.

    decodecliff bench-engine --preset tiny --device cpu --contexts 256 1024 --out bench.json
    decodecliff bench-engine --preset kimi-k2-tp8-rank --backends custom triton \\
        --paths graphs eager --contexts 1024 185000 --parts anatomy loop --out engine.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import itertools
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from decodecliff import envinfo
from decodecliff.engine.config import (
    DEFAULT_GEMM,
    GEMM_PREFETCH_MB,
    GEMMS,
    PRESETS,
    EngineConfig,
    gemm_label,
)
from decodecliff.engine.engine import Engine
from decodecliff.engine.model import WEIGHT_LAYOUTS, StepInput, SyntheticMLA
from decodecliff.engine.request import Request, SamplingParams, Update
from decodecliff.engine.spec import DraftTree, NgramDrafter
from decodecliff.jsonio import write_json
from decodecliff.kernels import sm120_model
from decodecliff.kernels.api import NoAttention
from decodecliff.kernels.registry import BACKENDS, parse_spec, spec_label

from . import gemms, roofline, timeline
from .timing import refuse_repeats, refuse_unusable, sync, wall_ms, wall_times_ms

if TYPE_CHECKING:
    from torch.profiler import profile

HOST = torch.device("cpu")  # the drafter is host work: timed without a device sync
MODES = {"decode": "none", "chain": "chain", "tree": "tree"}
PARTS = ("anatomy", "gemms", "loop", "drafter", "host")
GEMM_OPS = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"}
SKINNY_KERNELS = ("_skinny_gemm_kernel", "_head_gemm_kernel")  # engine/skinny_gemm.py's
# Targets on the anatomy of a chain verify step (issue: a verify step at its memory floor).
TARGETS = {
    "graphs_non_attention_over_floor": 1.3,
    "eager_over_graphs_non_attention": 3.0,
    "loop_verify_steps_per_s_min": 40.0,
}


# ---------------------------------------------------------------------------------------------
# placing requests and timing a step


def random_tree(n: int, seed: int) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    return DraftTree(tokens=[1] * n, parents=parents)


def place_requests(engine: Engine, batch: int, context: int, extra: int = 0) -> list[Request]:
    """Requests whose first `context` tokens are cached (random KV), ready for the next step."""
    vocab = engine.mcfg.vocab_size
    rng = random.Random(context)
    reqs = []
    for _ in range(batch):
        prompt = [rng.randrange(1, vocab) for _ in range(context + 1)]
        req = Request(prompt=prompt, params=SamplingParams(max_new_tokens=10**6, ignore_eos=True))
        req.row = engine.pool.open()
        engine.pool.reserve(req.row, context + engine.cfg.spec_tokens + extra)
        req.prefilled = len(req.prompt)
        req.kv_len = context
        reqs.append(req)
    return reqs


def make_step(engine: Engine, reqs: list[Request], mode: str, q: int) -> StepInput:
    if mode == "decode":
        return engine.build_step(
            reqs, [[r.tokens[-1]] for r in reqs], [[0]] * len(reqs), None, None
        )
    if mode == "chain":
        tokens = [[r.tokens[-1]] + [2] * (q - 1) for r in reqs]
        return engine.build_step(reqs, tokens, [list(range(q))] * len(reqs), None, None)
    trees = [random_tree(q, seed=i) for i in range(len(reqs))]
    mask = torch.stack([t.ancestor_mask() for t in trees])
    return engine.build_step(
        reqs, [t.tokens for t in trees], [t.depths() for t in trees], mask, None
    )


def time_step(
    device: torch.device, forward: Callable[[], torch.Tensor], warmup: int, repeats: int
) -> list[float]:
    """Wall ms of each timed step; the sampler's host read ends the step, as in serving."""
    return wall_times_ms(lambda: forward().argmax(-1).tolist(), device, repeats, warmup)


def is_gemm(key: str) -> bool:
    """A profiler entry of a weight GEMM: an aten matmul op or the Triton weight-streaming one."""
    return key in GEMM_OPS or key.startswith(SKINNY_KERNELS)


def trace(device: torch.device, forward: Callable[[], torch.Tensor]) -> profile:
    """One step under torch.profiler, after an untraced one (compilation, lazy allocations)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    forward()
    sync(device)
    with profile(activities=activities) as prof:
        forward()
        sync(device)
    return prof


def profile_step(device: torch.device, forward: Callable[[], torch.Tensor], layers: int) -> dict:
    """GEMM time, the kernels' durations summed (overlapping ones each in full: the timeline's
    busy time counts overlap once), kernel count and the kernels folded by layer of one step."""
    prof = trace(device, forward)
    averages = prof.key_averages()
    cuda = device.type == "cuda"
    if cuda:
        gemm_us = sum(e.device_time_total for e in averages if is_gemm(e.key))
        kernels = timeline.of_profile(prof)
        kernel_us, count = sum(k.end_us - k.start_us for k in kernels), len(kernels)
        folded = timeline.fold(kernels, layers)
    else:
        gemm_us = sum(e.cpu_time_total for e in averages if e.key in GEMM_OPS)
        kernel_us, count = None, sum(e.count for e in averages if e.key.startswith("aten::"))
        folded = None
    return {
        "gemm_ms": gemm_us / 1e3,
        "kernel_ms": None if kernel_us is None else kernel_us / 1e3,
        "launches": count,
        "method": "torch.profiler: " + ("CUDA kernel time" if cuda else "CPU op time"),
        "timeline": folded,
    }


def step_timeline(
    device: torch.device, forward: Callable[[], torch.Tensor], layers: int
) -> dict | None:
    """The kernels of one step on its own path (graph replay or eager) folded by layer."""
    if device.type != "cuda":
        return None
    try:
        return timeline.fold(timeline.of_profile(trace(device, forward)), layers)
    except Exception as exc:  # the timings stand without it
        return {"error": repr(exc)}


# ---------------------------------------------------------------------------------------------
# floors


def floors(model: SyntheticMLA, rows: int, batch: int, context: int, q: int, ceil: dict) -> dict:
    """The step's floors (ms) from the measured copy rate and matmul rate."""
    cfg, copy, matmul = model.cfg, ceil["copy_gbs"], ceil["matmul_tflops"]
    weight_bytes = model.step_weight_bytes()
    gemm_flops = model.step_gemm_flops(rows)
    kv_bytes, attn_flops = roofline.step_attention(
        context, q, cfg.num_heads, cfg.num_layers, batch, model.embed.element_size()
    )
    gemm = roofline.floor_ms(weight_bytes, gemm_flops, copy, matmul)
    attention = roofline.floor_ms(kv_bytes, attn_flops, copy, matmul)
    return {
        "weight_bytes": weight_bytes,
        "gemm_flops": gemm_flops,
        "kv_bytes": kv_bytes,
        "attention_flops": attn_flops,
        "weights_floor_ms": roofline.floor_ms(weight_bytes, 0, copy, matmul),
        "gemm_floor_ms": gemm,
        "attention_floor_ms": attention,
        "rest_floor_ms": 0.0,
        "step_floor_ms": gemm + attention,
    }


# ---------------------------------------------------------------------------------------------
# the anatomy of a step


def engine_config(
    args: argparse.Namespace, backend: str, spec: str, tokens: int, graphs: bool, gemm: str
) -> EngineConfig:
    name, options = parse_spec(backend)  # "flashinfer:backend=fa3"
    return EngineConfig(
        preset=args.preset,
        backend=name,
        backend_options=options,
        device=args.device,
        dtype=args.dtype,
        page_size=args.page_size,
        max_total_tokens=tokens,
        max_running_requests=args.batch,
        spec=spec,
        draft_len=args.draft_len,
        tree_nodes=args.tree_nodes,
        cuda_graph=graphs,
        gemm=gemm,
        gemm_prefetch_mb=args.gemm_prefetch_mb,
        l2_overlap_mb=args.l2_overlap_mb,
        scatter_seed=args.scatter_seed,
        seed=args.seed,
        threads=args.threads,
    )


def build_engine(args: argparse.Namespace, cfg: EngineConfig) -> Engine:
    engine = Engine(cfg)
    if args.weight_layout != "kn":  # the same seeded weights, stored N-major
        engine.model = None
        gc.collect()
        engine.model = SyntheticMLA(
            cfg.model, engine.device, cfg.torch_dtype, cfg.seed, args.weight_layout, cfg.gemm,
            cfg.gemm_prefetch_mb, cfg.l2_overlap_mb,
        )  # fmt: skip
        engine.model.rope.reserve(engine.pool.max_total_tokens)
    engine.pool.cache.normal_()
    return engine


def run_label(backend: str, gemm: str) -> str:
    """How rows name an engine configuration: "flashinfer (fa3)", "custom + fused GEMMs"."""
    return gemm_label(spec_label(backend), gemm)


def anatomy(
    args: argparse.Namespace, backend: str, gemm: str, path: str, mode: str, ceil: dict
) -> list:
    """One engine per (backend, GEMM path, path, mode); every context reuses it (and its
    graphs)."""
    graphs = path == "graphs"
    spec = MODES[mode]
    room = args.draft_len if spec == "chain" else args.tree_nodes if spec == "tree" else 1
    tokens = args.batch * (max(args.contexts) + room + args.page_size) + args.page_size
    engine = build_engine(args, engine_config(args, backend, spec, tokens, graphs, gemm))
    dev, q = engine.device, engine.cfg.spec_tokens
    layers = engine.model.cfg.num_layers
    noop = NoAttention()
    if graphs:
        real_runner, noop_runner = engine.graphs, engine.graph_runner(noop)
    rows, profile = [], None
    for context in args.contexts:
        reqs = place_requests(engine, args.batch, context)
        step = make_step(engine, reqs, mode, q)
        cache = engine.pool.cache
        eager_noop = functools.partial(engine.model.forward, step, cache, noop)
        if graphs:
            real = functools.partial(real_runner.forward, step)
            rest = functools.partial(noop_runner.forward, step)
        else:
            real = functools.partial(engine.model.forward, step, cache, engine.backend)
            rest = eager_noop
        if profile is None:  # the GEMMs do not depend on the context, the backend or the path
            try:
                profile = profile_step(dev, eager_noop, layers)
            except Exception as exc:  # keep the timings even if the profiler fails here
                profile = {"gemm_ms": float("nan"), "kernel_ms": None, "launches": None,
                           "timeline": None}  # fmt: skip
                profile["method"] = f"profile failed: {exc!r}"
        step_all = time_step(dev, real, args.warmup, args.repeats)
        rest_all = time_step(dev, rest, args.warmup, args.repeats)
        step_ms, noattn_ms = statistics.median(step_all), statistics.median(rest_all)
        floor = floors(engine.model, step.input_ids.shape[0], args.batch, context, q, ceil)
        row = {
            "backend": run_label(backend, gemm),
            "path": path,
            "mode": mode,
            "context": context,
            "batch": args.batch,
            "q_len": q,
            "step_ms": step_ms,
            "non_attention_ms": noattn_ms,
            "attention_ms": step_ms - noattn_ms,
            "gemm_ms": profile["gemm_ms"],
            "rest_ms": noattn_ms - profile["gemm_ms"],
            "profile": profile,
            "gemm": gemm,
            "gemm_prefetch_mb": args.gemm_prefetch_mb if gemm == "pdl" else None,
            "l2_overlap_mb": args.l2_overlap_mb,
            "gemm_choices": [
                *getattr(engine.model.mm, "describe", list)(),
                *getattr(engine.model.heads_mm, "describe", list)(),
            ],
            **floor,
            "non_attention_over_floor": noattn_ms / floor["weights_floor_ms"],
            "step_ms_all": step_all,
            "non_attention_ms_all": rest_all,
            "timeline": step_timeline(dev, real, layers),
            "graphs_captured": real_runner.captured_shapes() if graphs else [],
            "page_fragmentation": engine.pool.fragmentation()["request_fragmentation"],
        }
        rows.append(row)
        print(
            f"{row['backend']:>7} {path:>6} {mode:>6} ctx {context:>7}: step {step_ms:8.3f} ms = "
            f"attention {row['attention_ms']:8.3f} + GEMMs {row['gemm_ms']:7.3f} + rest "
            f"{row['rest_ms']:7.3f}  (floor {floor['step_floor_ms']:.3f}; non-attention "
            f"{row['non_attention_over_floor']:.2f}x its byte floor)",
            flush=True,
        )
        if row["timeline"] and "error" not in row["timeline"]:
            print(timeline.describe(row["timeline"]), flush=True)
        for req in reqs:
            engine.pool.close(req.row)
    return rows


# ---------------------------------------------------------------------------------------------
# the serving loop


def serving_loop(
    args: argparse.Namespace, backend: str, gemm: str, path: str, context: int
) -> dict:
    """Verify steps/s of one request at `context` through Engine.step (drafting, sampling, emit)."""
    steps = args.loop_steps
    q = args.draft_len
    tokens = context + (steps + 2) * q + 2 * args.page_size
    cfg = engine_config(args, backend, "chain", tokens, path == "graphs", gemm)
    engine = build_engine(args, cfg)
    req = place_requests(engine, 1, context, extra=(steps + 1) * q)[0]
    req.drafter_state = engine.drafter.new_state()
    engine.drafter.observe(req.drafter_state, req.prompt, len(req.prompt))
    engine.running.append(req)
    for _ in range(args.warmup):
        engine.step()
    before = len(req.verify_ms)
    wall = wall_ms(lambda: [engine.step() for _ in range(steps)], engine.device) / 1e3
    done = len(req.verify_ms) - before
    row = {
        "backend": run_label(backend, gemm),
        "gemm": gemm,
        "path": path,
        "context": context,
        "q_len": q,
        "steps": done,
        "wall_s": wall,
        "verify_steps_per_s": done / wall,
        "verify_step_ms_median": statistics.median(req.verify_ms[before:]),
        "accept_length": req.accepted / max(len(req.verify_ms), 1),
        "finish_reason": req.finish_reason,
    }
    print(
        f"loop {row['backend']:>7} {path:>6} ctx {context:>7}: "
        f"{row['verify_steps_per_s']:.1f} verify steps/s "
        f"(server-side step {row['verify_step_ms_median']:.2f} ms)",
        flush=True,
    )
    return row


# ---------------------------------------------------------------------------------------------
# drafter and host cost (tiny preset, CPU)


def bench_drafter(context: int, mode: str, size: int, steps: int, vocab: int, seed: int) -> dict:
    """Index a history once, draft from a fresh state, then median draft of a running request."""
    rng = random.Random(seed)
    history = [rng.randrange(1, vocab) for _ in range(context)]
    drafter = NgramDrafter()
    draft = drafter.draft_chain if mode == "chain" else drafter.draft_tree
    state, fresh = drafter.new_state(), drafter.new_state()
    index_ms = wall_ms(lambda: state.update(history), HOST)
    first_ms = wall_ms(lambda: draft(fresh, history, size), HOST)
    step_ms = []
    for _ in range(steps):
        history.extend(rng.randrange(1, vocab) for _ in range(rng.randint(1, 3)))  # accepted
        step_ms.append(wall_ms(lambda: draft(state, history, size), HOST))
    return {
        "context": context,
        "mode": mode,
        "size": size,
        "index_ms": index_ms,
        "first_draft_ms": first_ms,
        "step_ms_median": statistics.median(step_ms),
        "step_ms_max": max(step_ms),
    }


def bench_host(context: int, spec: str, args: argparse.Namespace) -> dict:
    """One tiny request prefilled and decoded through the engine with no-op attention: the host
    time of every decode step outside its synchronised forward (the sweep's "outside" time)."""
    gen = args.gen
    cfg = EngineConfig(
        preset="tiny",
        max_total_tokens=context + gen + 2 * args.tree_nodes,
        chunk_size=args.chunk_size,
        spec=spec,
        draft_len=args.draft_len,
        tree_nodes=args.tree_nodes,
        threads=args.threads,
    )
    engine = Engine(cfg)
    engine.backend = NoAttention()
    rng = random.Random(args.seed)
    prompt = [rng.randrange(1, cfg.model.vocab_size) for _ in range(context)]
    stamps: list[tuple[float, int]] = []  # (time, tokens out so far) per update

    def on_update(update: Update) -> None:
        done = (stamps[-1][1] if stamps else 0) + len(update.new_ids)
        stamps.append((time.perf_counter(), done))

    params = SamplingParams(max_new_tokens=gen, ignore_eos=True)
    req = Request(prompt=prompt, params=params, on_update=on_update)
    engine.check(req.prompt, params)
    engine.waiting.append(req)
    while req.finish_reason is None:
        engine.step()
    if req.error:
        raise RuntimeError(f"host part: the request failed: {req.error}")
    first_t = next(t for t, n in stamps if n > 0)
    n = len(req.output)
    decode_wall_ms = (stamps[-1][0] - first_t) * 1e3
    return {
        "context": context,
        "spec": spec,
        "q_len": cfg.spec_tokens,
        "tokens": n,
        "prefill_ms": req.prefill_ms,
        "step_ms_mean": statistics.fmean(req.decode_ms),
        "decode_ms_per_token": decode_wall_ms / (n - 1),
        # decode wall minus the synchronised steps in it (every decode step runs after the first
        # token, which the prefill emits), per token after the first
        "outside_step_ms_per_token": (decode_wall_ms - sum(req.decode_ms)) / (n - 1),
    }


# ---------------------------------------------------------------------------------------------
# targets, the command line


def check_targets(rows: list[dict], loops: list[dict]) -> list[dict]:
    """The step-anatomy targets on chain rows: met or not, and by how much."""
    out = []

    def add(name: str, subject: str, value: float, limit: float, upper: bool) -> None:
        met = value <= limit if upper else value >= limit
        ratio = value / limit
        out.append(
            {
                "target": name,
                "subject": subject,
                "value": value,
                "limit": limit,
                "met": met,
                "missed_by": None if met else (ratio if upper else 1 / ratio),
            }
        )

    chain = [r for r in rows if r["mode"] == "chain"]
    eager = {(r["backend"], r["context"]): r for r in chain if r["path"] == "eager"}
    for r in (r for r in chain if r["path"] == "graphs"):
        key, subject = (r["backend"], r["context"]), f"{r['backend']} ctx {r['context']}"
        name = "graphs_non_attention_over_floor"
        add(name, subject, r["non_attention_over_floor"], TARGETS[name], True)
        if key in eager:
            name = "eager_over_graphs_non_attention"
            ratio = eager[key]["non_attention_ms"] / r["non_attention_ms"]
            add(name, subject, ratio, TARGETS[name], True)
    for loop in loops:
        name = "loop_verify_steps_per_s_min"
        subject = f"{loop['backend']} {loop['path']} ctx {loop['context']}"
        add(name, subject, loop["verify_steps_per_s"], TARGETS[name], False)
    return out


def backend_spec(text: str) -> str:
    try:
        parse_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="decodecliff bench-engine",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--parts", nargs="+", choices=PARTS, default=["anatomy"], help="what to run")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="model preset")
    p.add_argument("--backends", nargs="+", type=backend_spec, default=["torch"],
                   help=f"NAME[:KEY=VALUE,...], NAME of {', '.join(sorted(BACKENDS))}: e.g. "
                   "custom, flashinfer:backend=fa3, triton:index_dtype=int32")  # fmt: skip
    p.add_argument("--paths", nargs="+", choices=["graphs", "eager"], default=["eager"],
                   help="CUDA graphs (CUDA only) and/or eager steps")  # fmt: skip
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if any")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024], help="cached tokens")
    p.add_argument("--modes", nargs="+", choices=sorted(MODES), default=["chain"])
    p.add_argument("--batch", type=int, default=1, help="requests per step")
    p.add_argument("--draft-len", type=int, default=16, help="chain length")
    p.add_argument("--tree-nodes", type=int, default=64, help="tree size")
    p.add_argument("--page-size", type=int, default=1, help="KV page size")
    p.add_argument("--scatter-seed", type=int, default=0, help="scattered slots (none: -1)")
    p.add_argument("--weight-layout", choices=WEIGHT_LAYOUTS, default="kn",
                   help="projections stored [K, N] (kn) or N-major (nk)")  # fmt: skip
    p.add_argument("--gemm", nargs="+", choices=GEMMS, default=[DEFAULT_GEMM],
                   help="weight GEMMs, one path or more, each measured as a configuration of "
                   "its own (rows name the path where it is not cublas): cuBLAS, the fastest "
                   "per shape of cuBLAS and the Triton kernel (auto), the same with the norms, "
                   "residual adds and silu folded into the kernel (fused), or that kernel "
                   "chained with the elementwise kernels by programmatic dependent launch (pdl; "
                   "engine/skinny_gemm.py), or cuBLAS with the other kernels chained "
                   "(cublas-pdl); --parts gemms takes one path and times the Triton "
                   "configurations chained with pdl when it is pdl")  # fmt: skip
    p.add_argument("--gemm-prefetch-mb", type=int, default=GEMM_PREFETCH_MB,
                   help="with --gemm pdl: MB of each projection's weights asked of the L2 "
                   "before it waits (0: none)")  # fmt: skip
    p.add_argument("--l2-overlap-mb", type=int, default=0,
                   help="MB of each layer's later weights (q_b, W_kc, W_vc, o, gate|up) asked "
                   "of the L2 on a side stream while its attention runs (0: none; measured "
                   "no faster on an H200: notes/engine.md)")  # fmt: skip
    p.add_argument("--warmup", type=int, default=2, help="untimed steps")
    p.add_argument("--repeats", type=int, default=5, help="timed steps (median)")
    p.add_argument("--loop-steps", type=int, default=30, help="engine steps per loop point")
    p.add_argument(
        "--loop-contexts", type=int, nargs="*", default=None,
        help="contexts of the loop part (default: the largest of --contexts)",
    )  # fmt: skip
    p.add_argument("--drafter-steps", type=int, default=50, help="drafter steps per context")
    p.add_argument("--gen", type=int, default=24, help="generated tokens per host-part request")
    p.add_argument("--chunk-size", type=int, default=4096, help="host part's prefill chunk")
    p.add_argument("--vocab", type=int, default=163840 // 8, help="drafter history ids")
    p.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    p.add_argument("--seed", type=int, default=0, help="weights and prompts")
    p.add_argument("--out", required=True, help="JSON file to write")
    args = p.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.scatter_seed = None if args.scatter_seed < 0 else args.scatter_seed
    if args.device != "cuda" and "graphs" in args.paths:
        p.error("--paths graphs needs a CUDA device")
    counts = [*args.contexts, *(args.loop_contexts or [])]
    counts += [args.repeats, args.batch, args.loop_steps, args.drafter_steps, args.gen]
    if min(counts) < 1 or args.chunk_size < 1 or args.warmup < 0 or args.vocab < 2:
        p.error(
            "contexts, loop contexts, repeats, batch, loop, drafter steps, gen and chunk size "
            "must be >= 1, warmup >= 0, vocab >= 2"
        )
    if "host" in args.parts and args.gen < 2:
        p.error("--gen must be >= 2 with --parts host: it times the tokens after the first")
    bounds = {f.name: f.metadata for f in dataclasses.fields(EngineConfig)}
    for name in ("gemm_prefetch_mb", "l2_overlap_mb"):
        low, high = bounds[name]["min"], bounds[name]["max"]
        if not low <= getattr(args, name) <= high:
            p.error(f"--{name.replace('_', '-')} must be in {low}..{high}")
    refuse_repeats(
        p, gemm=args.gemm, backends=args.backends, contexts=args.contexts, modes=args.modes,
        paths=args.paths, parts=args.parts, loop_contexts=args.loop_contexts,
    )  # fmt: skip
    if "gemms" in args.parts and len(args.gemm) > 1:  # it times one path's configurations
        p.error("--parts gemms takes one --gemm path (pdl: the Triton configurations chained)")
    if args.device != "cuda" and "gemms" in args.parts:  # cuBLAS, cuBLASLt and Triton kernels
        p.error("--parts gemms needs a CUDA device")
    for spec, gemm in itertools.product(dict.fromkeys(MODES[m] for m in args.modes), args.gemm):
        try:  # the engine's own limits
            engine_config(args, args.backends[0], spec, 1 << 20, False, gemm).validate()
        except ValueError as exc:
            p.error(str(exc))
    refuse_unusable(p, args.device, args.out)
    return args


def run_guarded(doc: dict, what: str, fn: Callable[[], object]) -> object | None:
    """One point; a failure is recorded with its reason and the bench goes on."""
    try:
        return fn()
    except Exception as exc:  # an out-of-memory point, a backend missing here
        doc["errors"].append({"what": what, "error": repr(exc)})
        print(f"{what}: failed: {exc!r}", file=sys.stderr, flush=True)
        return None
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def configurations(args: argparse.Namespace, modes: list[str] | None = None) -> itertools.product:
    """(backend, GEMM path, path, mode) of each engine a part builds, in the order it runs them:
    a backend's GEMM paths side by side."""
    return itertools.product(args.backends, args.gemm, args.paths, modes or args.modes)


def cli(argv: list[str]) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and sm120_model.wanted(args.backends):
        sm120_model.preload_shim(["bench-engine", *argv])
    doc = {
        "command": " ".join(["decodecliff", "bench-engine", *argv]),
        "args": vars(args),
        "env": envinfo.collect(),
        "ceilings": (
            roofline.measure_ceilings(device) if {"anatomy", "gemms"} & set(args.parts) else None
        ),
        "targets_spec": TARGETS,
        "rows": [],
        "loop": [],
        "drafter": [],
        "host": [],
        "errors": [],
    }
    if "anatomy" in args.parts:
        for backend, gemm, path, mode in configurations(args):
            fn = functools.partial(anatomy, args, backend, gemm, path, mode, doc["ceilings"])
            what = f"anatomy {run_label(backend, gemm)} {path} {mode}"
            doc["rows"] += run_guarded(doc, what, fn) or []
            write_json(args.out, doc)
    if "gemms" in args.parts:
        fn = functools.partial(gemms.bench_gemms, args, doc["ceilings"])
        doc["gemms"] = run_guarded(doc, "gemms", fn) if device.type == "cuda" else None
        write_json(args.out, doc)
    if "loop" in args.parts:
        for ctx in args.loop_contexts or [max(args.contexts)]:
            for backend, gemm, path, _ in configurations(args, modes=["chain"]):
                fn = functools.partial(serving_loop, args, backend, gemm, path, ctx)
                row = run_guarded(doc, f"loop {run_label(backend, gemm)} {path} {ctx}", fn)
                doc["loop"] += [row] if row else []
                write_json(args.out, doc)
    for mode in ("chain", "tree") if "drafter" in args.parts else ():
        size = args.draft_len - 1 if mode == "chain" else args.tree_nodes
        for ctx in args.contexts:
            fn = functools.partial(
                bench_drafter, ctx, mode, size, args.drafter_steps, args.vocab, args.seed
            )
            row = run_guarded(doc, f"drafter {mode} {ctx}", fn)
            doc["drafter"] += [row] if row else []
    for spec in ("chain", "tree") if "host" in args.parts else ():
        for ctx in args.contexts:
            row = run_guarded(
                doc, f"host {spec} {ctx}", functools.partial(bench_host, ctx, spec, args)
            )
            doc["host"] += [row] if row else []
    doc["targets"] = check_targets(doc["rows"], doc["loop"])
    for t in doc["targets"]:
        verdict = "met" if t["met"] else f"missed by {t['missed_by']:.2f}x"
        print(f"target {t['target']} ({t['subject']}): {t['value']:.3g} vs {t['limit']}: {verdict}")
    write_json(args.out, doc)
    measured = doc["rows"] or doc["loop"] or doc["drafter"] or doc["host"] or doc.get("gemms")
    return 1 if doc["errors"] and not measured else 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
