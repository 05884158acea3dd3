#!/usr/bin/env python3
"""Per shape of a kernel bench: the custom kernel as planned, its fastest configuration, FlashInfer.

    scripts/fastest_custom.py BENCH_JSON [BEFORE_JSON]
    scripts/fastest_custom.py --splits VARIANT BENCH_JSON [BENCH_JSON ...]

Reads `decodecliff bench-kernels` output holding custom variants at set split counts
(--custom-splits) and prints, per build (the GPU's own, or the sm_120 model) and shape, the
plan's time (auto), the fastest custom label and FlashInfer's fa2 (fa3 beside it on the GPU's own
build), in microseconds, with the floor. BEFORE_JSON: another bench of the same shapes (another
tree's plan on the same library), whose plan is printed beside this one's. --splits: per build and
shape of the files together, VARIANT at each split count it was timed at (its labels VARIANT-sN),
beside fa2, fa3 and the floor. Standard library only: it runs on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

MODEL = "-sm120"


def label(point: dict) -> str:
    """The point's configuration as the bench labels it ("auto" where the label is empty)."""
    return point["triton_config"] or "auto"


def build_of(name: str) -> str:
    return "sm120 model" if MODEL in name else "own"


def shapes(points: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(build, mode, heads, ctx, page) -> {backend/label: point}, for the points that ran."""
    out: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for p in points:
        if p["status"] != "ok" or p["backend"] not in ("custom", "flashinfer"):
            continue
        name = label(p)
        key = (build_of(name), p["mode"], p["heads"], p["ctx"], p["page_size"])
        out[key][f"{p['backend']}/{name.replace(MODEL, '')}"] = p
    return out


def us(p: dict | None) -> str:
    """A point's time in microseconds ("-" without the point)."""
    return "-" if p is None else f"{p['ms'] * 1e3:.1f}"


def _shape(key: tuple) -> str:
    build, mode, heads, ctx, page = key
    return f"{build:11s} {mode:8s} h{heads:<3d} {ctx:>7d} p{page:<3d}"


def row(key: tuple, found: dict[str, dict], before: dict[str, dict] | None = None) -> str | None:
    """One line: plan (and ``before``'s, where given), fastest custom configuration, FlashInfer,
    floor (us); None without a plan."""
    plan = found.get("custom/auto")
    if plan is None:
        return None
    customs = {k.split("/", 1)[1]: p for k, p in found.items() if k.startswith("custom/")}
    best = min(customs, key=lambda k: customs[k]["ms"])

    def how(p: dict) -> str:
        return f"{p['detail'].get('variant')}/{p['detail'].get('num_splits')}"

    def was() -> str:
        if before is None:
            return ""
        prev = before.get("custom/auto")
        return f"before {us(prev):>7s} ({how(prev)})  " if prev else "before       -  "

    return (
        f"{_shape(key)} plan {us(plan):>7s} "
        f"({how(plan)})  {was()}best {best:>10s} {us(customs[best]):>7s} ({how(customs[best])})  "
        f"fa2 {us(found.get('flashinfer/fa2')):>7s}  fa3 {us(found.get('flashinfer/fa3')):>7s}  "
        f"floor {us({'ms': plan['floor_ms']})}"
    )


def split_row(key: tuple, found: dict[str, dict], variant: str) -> str | None:
    """One line of --splits: ``variant`` at each split count found, FlashInfer, floor (us)."""
    prefix = f"custom/{variant}-s"
    counts = sorted(int(k.removeprefix(prefix)) for k in found if k.startswith(prefix))
    if not counts:
        return None
    times = "  ".join(f"s{n} {us(found[prefix + str(n)])}" for n in counts)
    fa = "  ".join(f"{v} {us(found[f'flashinfer/{v}'])}" for v in ("fa2", "fa3")
                   if f"flashinfer/{v}" in found)  # fmt: skip
    floor = us({"ms": found[prefix + str(counts[0])]["floor_ms"]})
    return f"{_shape(key)} {times}  {fa}  floor {floor}"


def _points(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return json.load(f)["points"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"fastest_custom.py: {path}: no bench-kernels document ({exc!r})"
        ) from None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="fastest_custom.py",
        usage="%(prog)s BENCH_JSON [BEFORE_JSON]\n"
        "       %(prog)s --splits VARIANT BENCH_JSON [BENCH_JSON ...]",
        description=__doc__.splitlines()[1],
    )
    p.add_argument("--splits", metavar="VARIANT", help="VARIANT at each split count it ran at")
    p.add_argument("files", nargs="+", metavar="BENCH_JSON", help="bench-kernels output")
    args = p.parse_args(argv)
    if args.splits is None and len(args.files) > 2:
        p.error("without --splits: one bench and at most one bench before it")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.splits is not None:
        found = shapes([p for path in args.files for p in _points(path)])
        lines = [ln for key in sorted(found) if (ln := split_row(key, found[key], args.splits))]
        if not lines:
            print(f"no {args.splits}-sN point in {' '.join(args.files)}", file=sys.stderr)
            return 1
        print("\n".join(lines))
        return 0
    found_in = [shapes(_points(path)) for path in args.files]
    before = found_in[1] if len(found_in) == 2 else None
    lines = [
        line
        for key, found in sorted(found_in[0].items())
        if (line := row(key, found, None if before is None else before.get(key, {})))
    ]
    if not lines:
        print(f"{args.files[0]}: no shape with a custom plan (auto) that ran", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
