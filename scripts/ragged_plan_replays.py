"""Each replay's time of v4's plan for a ragged decode batch, beside even splits (GPU).

    python scripts/ragged_plan_replays.py --out DIR [--ctx 185000] [--heads 8] [--repeats 60]

The kernel bench once timed the plan's replays bimodally at 185k (194-230 us where even splits
stayed within 3 us), while Nsight Compute found its kernels no slower; this showed the replays
steady, and the spread the warm-up of the first variant timed at a point (notes/kernel.md,
"Profiled, and found to be the bench's warm-up"). Each launch is captured in a CUDA graph and
replayed ``--repeats`` times with the L2 flushed before each replay (as the bench) and without:
the plan; the plan with its shared splits made ``--slack`` longer (fewer CTAs with work than
slots); even splits at the plan's count. Prints the spread of each; writes ``replays.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
from collections.abc import Iterator
from pathlib import Path

from decodecliff import envinfo
from decodecliff.bench import check_kernel, core, timing
from decodecliff.kernels import custom
from decodecliff.kernels.registry import get_backend


@contextlib.contextmanager
def longer_shared_splits(factor: float) -> Iterator[None]:
    """The ragged plan's tokens a shared split times ``factor`` while planning."""
    plain = custom._ragged_split_tokens
    custom._ragged_split_tokens = lambda *a: math.ceil(plain(*a) * factor)
    try:
        yield
    finally:
        custom._ragged_split_tokens = plain


def replays(backend, batch, repeats: int) -> dict:
    """Replay times (ms) of the backend's step captured once, flushed and not, and its plan."""
    step = backend.prepare(batch, batch.new_output())
    graph = timing.capture(step, warmup=2)
    flushed = timing.times_ms(graph.replay, batch.device, repeats, warmup=2, flush=True)
    warm = timing.times_ms(graph.replay, batch.device, repeats, warmup=2, flush=False)
    return {"plan": backend.describe(), "flushed": flushed, "warm": warm}


def spread(times: list[float]) -> str:
    us = sorted(t * 1e3 for t in times)
    slow = sum(t > 1.08 * us[0] for t in us)
    return (
        f"median {statistics.median(us):6.1f}  min {us[0]:6.1f}  max {us[-1]:6.1f}  "
        f"over min + 8%: {slow}/{len(us)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ctx", type=int, default=185000)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--slack", type=float, default=1.1)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kv_lens = check_kernel.kv_lengths(args.ctx, 1, args.batch, ragged=True)
    batch = core.problem(kv_lens, 1, args.heads, device="cuda", seed=1)
    runs = {"plan": replays(get_backend("custom", variant="v4"), batch, args.repeats)}
    with longer_shared_splits(args.slack):
        runs[f"plan, splits x{args.slack}"] = replays(
            get_backend("custom", variant="v4"), batch, args.repeats
        )
    splits = runs["plan"]["plan"]["num_splits"]
    runs[f"even, {splits} splits"] = replays(
        get_backend("custom", variant="v4", num_splits=splits), batch, args.repeats
    )
    for label, run in runs.items():
        print(f"{label:<24} {json.dumps(run['plan'])}")
        for kind in ("flushed", "warm"):
            print(f"  {kind:<8} {spread(run[kind])}")
    record = {"env": envinfo.collect(), "kv_lens": kv_lens, "heads": args.heads, "runs": runs}
    (args.out / "replays.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
