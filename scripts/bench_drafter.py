"""Host cost of speculative drafting and of the rest of a decode step, against the context length.

Two measurements, both on the host (no accelerator needed):

- drafter: the n-gram drafter alone on a token history of each length (random ids, as the sweep's
  prompts): indexing the whole history once, the first draft of a fresh state (what a request paid
  at its first verify step when the prompt was indexed there), and the median draft of a running
  request (a few accepted tokens appended, then one draft), for a chain and a tree.
- engine: one request through the real engine (tiny preset, a no-op attention backend so that a
  long prompt prefills in seconds): the wall time of every decode/verify step minus its
  synchronised forward time (``decode_ms``), i.e. the host work per step outside the verify step,
  and the sweep's view of it: decode wall per token minus the mean verify step.

    python scripts/bench_drafter.py --contexts 1024 32768 131072 185000 --out drafter.json
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time

import torch

from decodecliff import envinfo
from decodecliff.engine.config import EngineConfig
from decodecliff.engine.engine import Engine
from decodecliff.engine.request import Request, SamplingParams, Update
from decodecliff.engine.spec import NgramDrafter
from decodecliff.kernels.api import AttnBatch


class NoAttention:
    """A backend that does no attention work, so the step costs only the model and the host."""

    name = "none"

    def __call__(self, batch: AttnBatch, out: torch.Tensor | None = None) -> torch.Tensor:
        return batch.new_output().zero_() if out is None else out


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def bench_drafter(context: int, mode: str, size: int, steps: int, vocab: int, seed: int) -> dict:
    rng = random.Random(seed)
    history = [rng.randrange(1, vocab) for _ in range(context)]
    drafter = NgramDrafter()
    draft = drafter.draft_chain if mode == "chain" else drafter.draft_tree

    state = drafter.new_state()
    t0 = time.perf_counter()
    state.update(history)
    index_ms = _ms(t0)

    fresh = drafter.new_state()
    t0 = time.perf_counter()
    draft(fresh, history, size)
    first_ms = _ms(t0)

    step_ms = []
    for _ in range(steps):
        history.extend(rng.randrange(1, vocab) for _ in range(rng.randint(1, 3)))  # accepted
        t0 = time.perf_counter()
        draft(state, history, size)
        step_ms.append(_ms(t0))
    return {
        "context": context,
        "mode": mode,
        "size": size,
        "index_ms": index_ms,
        "first_draft_ms": first_ms,
        "step_ms_median": statistics.median(step_ms),
        "step_ms_max": max(step_ms),
        "step_ms_all": step_ms,
    }


def bench_engine(context: int, spec: str, gen: int, args: argparse.Namespace) -> dict:
    """One request, prefilled through the engine; host time of each decode step."""
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
    stamps: list[tuple[float, int]] = []

    def on_update(update: Update) -> None:
        stamps.append((time.perf_counter(), len(update.output_ids)))

    params = SamplingParams(max_new_tokens=gen, ignore_eos=True)
    req = Request(prompt=prompt, params=params, on_update=on_update)
    engine.check(req.prompt, params)
    engine.waiting.append(req)
    sent = time.perf_counter()
    host_ms = []
    while req.finish_reason is None:
        before = len(req.decode_ms)
        t0 = time.perf_counter()
        engine.step()
        t1 = time.perf_counter()
        if len(req.decode_ms) == before:
            continue  # a prefill chunk only
        # The last prefill chunk and the first decode step share a scheduler step: count from
        # the first token on, as the sweep's decode wall does.
        start = max([t0] + [t for t, n in stamps if n > 0][:1])
        host_ms.append((t1 - start) * 1e3 - sum(req.decode_ms[before:]))
    ttft_s = next(t for t, n in stamps if n > 0) - sent
    first_t = next(t for t, n in stamps if n > 0)
    n = len(req.output)
    decode_wall_ms = (stamps[-1][0] - first_t) * 1e3
    step_ms = statistics.fmean(req.decode_ms)
    per_token = decode_wall_ms / (n - 1)
    outside = (decode_wall_ms - sum(req.decode_ms)) / (n - 1)  # every decode step ran after it
    return {
        "context": context,
        "spec": spec,
        "q_len": cfg.spec_tokens,
        "tokens": n,
        "steps": len(host_ms),
        "ttft_s": ttft_s,
        "prefill_ms": req.prefill_ms,
        "host_ms_first_step": host_ms[0],
        "host_ms_median": statistics.median(host_ms),
        "host_ms_all": host_ms,
        "step_ms_mean": step_ms,
        "accept_length": req.accepted / len(req.verify_ms) if req.verify_ms else None,
        "decode_ms_per_token": per_token,
        # decode wall minus the synchronised steps in it, per token after the first
        "outside_step_ms_per_token": outside,
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 32768, 131072, 185000])
    parts, specs = ["drafter", "engine"], ["none", "chain", "tree"]
    p.add_argument("--parts", nargs="+", choices=parts, default=parts)
    p.add_argument("--specs", nargs="+", choices=specs, default=["chain", "tree"])
    p.add_argument("--draft-len", type=int, default=16)
    p.add_argument("--tree-nodes", type=int, default=64)
    p.add_argument("--steps", type=int, default=50, help="drafter steps per context")
    p.add_argument("--gen", type=int, default=24, help="generated tokens per engine request")
    p.add_argument("--vocab", type=int, default=163840 // 8, help="drafter history ids")
    p.add_argument("--chunk-size", type=int, default=4096)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSON file to write")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    drafter_rows, engine_rows = [], []
    if "drafter" in args.parts:
        print(f"{'mode':>6} {'context':>8} {'index ms':>10} {'first draft ms':>15} {'step ms':>9}")
        for mode in ("chain", "tree"):
            size = args.draft_len - 1 if mode == "chain" else args.tree_nodes
            for ctx in args.contexts:
                row = bench_drafter(ctx, mode, size, args.steps, args.vocab, args.seed)
                drafter_rows.append(row)
                print(
                    f"{mode:>6} {ctx:>8} {row['index_ms']:>10.2f} {row['first_draft_ms']:>15.2f} "
                    f"{row['step_ms_median']:>9.4f}",
                    flush=True,
                )
                gc.collect()
    if "engine" in args.parts:
        print(
            f"{'spec':>6} {'context':>8} {'ttft s':>8} {'host ms 1st':>12} {'host ms p50':>12} "
            f"{'outside ms/tok':>15}"
        )
        for spec in args.specs:
            for ctx in args.contexts:
                row = bench_engine(ctx, spec, args.gen, args)
                engine_rows.append(row)
                print(
                    f"{spec:>6} {ctx:>8} {row['ttft_s']:>8.2f} {row['host_ms_first_step']:>12.2f} "
                    f"{row['host_ms_median']:>12.3f} {row['outside_step_ms_per_token']:>15.3f}",
                    flush=True,
                )
                gc.collect()
    result = {
        "command": " ".join(sys.argv),
        "args": vars(args),
        "env": envinfo.collect(),
        "drafter": drafter_rows,
        "engine": engine_rows,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
