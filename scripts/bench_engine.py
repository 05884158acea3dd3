"""Time the engine's decode and verify steps at given contexts, and the part that is not attention.

For every context the KV pool is filled with random rows (no prefill: a 185k prefill of the full
model would take longer than the measurement), a batch of requests is placed at that length, and
the step is timed through the engine's own forward (device-synchronised, warm-up excluded, median
of repeats). The same step with a no-op attention backend gives the model's non-attention time;
attention time is the difference.

    python scripts/bench_engine.py --preset tiny --device cpu --contexts 256 1024 --out bench.json
    python scripts/bench_engine.py --preset kimi-k2-tp8-rank --backend triton \
        --contexts 1024 8192 32768 131072 185000 --modes decode chain tree --out results/engine.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

import torch

from decodecliff import envinfo
from decodecliff.engine.config import PRESETS, EngineConfig
from decodecliff.engine.engine import Engine
from decodecliff.engine.model import StepInput
from decodecliff.engine.request import Request, SamplingParams
from decodecliff.engine.spec import DraftTree
from decodecliff.kernels.api import AttnBatch
from decodecliff.kernels.registry import BACKENDS


class NoAttention:
    """A backend that does no attention work: the step then costs only the rest of the model."""

    name = "none"

    def __call__(self, batch: AttnBatch, out: torch.Tensor | None = None) -> torch.Tensor:
        return batch.new_output().zero_() if out is None else out


def random_tree(n: int, seed: int) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    return DraftTree(tokens=[1] * n, parents=parents)


def place_requests(engine: Engine, batch: int, context: int) -> list[Request]:
    """Requests whose first `context` tokens are cached (random KV), ready for one more step."""
    reqs = []
    for b in range(batch):
        req = Request(
            prompt=[1 + (b + i) % 100 for i in range(context + 1)], params=SamplingParams()
        )
        req.row = engine.pool.open()
        engine.pool.reserve(req.row, context + engine.cfg.spec_tokens)
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


def time_step(engine: Engine, step: StepInput, forward, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        forward(step).argmax(-1).tolist()
    times = []
    for _ in range(repeats):
        engine._sync()
        t0 = time.perf_counter()
        forward(step).argmax(-1).tolist()  # the sampler's host read ends the step, as in serving
        engine._sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def measure(args: argparse.Namespace, mode: str, context: int) -> dict:
    spec = {"decode": "none", "chain": "chain", "tree": "tree"}[mode]
    cfg = EngineConfig(
        preset=args.preset,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        page_size=args.page_size,
        max_total_tokens=args.batch * (context + 300) + args.page_size * args.batch,
        max_running_requests=args.batch,
        spec=spec,
        draft_len=args.draft_len,
        tree_nodes=args.tree_nodes,
        cuda_graph=args.cuda_graph,
        scatter_seed=args.scatter_seed,
        seed=args.seed,
        threads=args.threads,
    )
    engine = Engine(cfg)
    engine.pool.cache.normal_()
    reqs = place_requests(engine, args.batch, context)
    if args.defrag:
        engine.pool.defragment()  # the layout --defrag gives a running request
    step = make_step(engine, reqs, mode, cfg.spec_tokens)
    noop = NoAttention()
    if engine.graphs is not None:
        from decodecliff.engine.graphs import GraphRunner

        noop_graphs = GraphRunner(engine, backend=noop)
        real_fwd, noop_fwd = engine.graphs.forward, noop_graphs.forward
    else:
        real_fwd = lambda s: engine.model.forward(s, engine.pool.cache, engine.backend)  # noqa: E731
        noop_fwd = lambda s: engine.model.forward(s, engine.pool.cache, noop)  # noqa: E731
    real = time_step(engine, step, real_fwd, args.warmup, args.repeats)
    rest = time_step(engine, step, noop_fwd, args.warmup, args.repeats)
    step_ms, rest_ms = statistics.median(real), statistics.median(rest)
    row = {
        "mode": mode,
        "context": context,
        "batch": args.batch,
        "q_len": cfg.spec_tokens,
        "step_ms": step_ms,
        "non_attention_ms": rest_ms,
        "attention_ms": step_ms - rest_ms,
        "attention_ms_per_layer": (step_ms - rest_ms) / cfg.model.num_layers,
        "step_ms_all": real,
        "non_attention_ms_all": rest,
        "graphs_captured": engine.graphs.captured_shapes() if engine.graphs else [],
        "page_fragmentation": engine.pool.fragmentation()["request_fragmentation"],
    }
    return row


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--backend", choices=sorted(BACKENDS), default="torch")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if any")
    p.add_argument("--dtype", default=None)
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--modes", nargs="+", choices=["decode", "chain", "tree"], default=["decode"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--draft-len", type=int, default=16)
    p.add_argument("--tree-nodes", type=int, default=64)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--scatter-seed", type=int, default=0, help="scattered slots (none: -1)")
    p.add_argument("--cuda-graph", action="store_true")
    p.add_argument("--defrag", action="store_true", help="compact the requests' pages first")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSON file to write")
    args = p.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.scatter_seed = None if args.scatter_seed < 0 else args.scatter_seed
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rows = []
    for mode in args.modes:
        for context in args.contexts:
            row = measure(args, mode, context)
            rows.append(row)
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()  # the engine of this point is gone; free its pool
            print(
                f"{mode:>6} ctx {context:>7}: step {row['step_ms']:8.3f} ms, "
                f"non-attention {row['non_attention_ms']:8.3f} ms, "
                f"attention/layer {row['attention_ms_per_layer']:7.3f} ms",
                flush=True,
            )
    result = {
        "command": " ".join(sys.argv),
        "args": vars(args),
        "env": envinfo.collect(),
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
