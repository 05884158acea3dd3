"""The study's targets, checked against its result tables: met, missed (and by how much), or not
measured (and why).

Targets are data (the config's ``targets`` list). Each names a ``kind``, a threshold (``min`` or
``max``) and the point it is measured at:

- ``kernel_ms``: ``backend``'s attention time per layer (ms) for ``mode`` at context ``ctx``;
- ``kernel_copy_fraction``: ``backend``'s effective GB/s there over the measured copy bandwidth;
- ``kernel_speedup``: ``baseline`` ms over ``backend`` ms, the worst point counting: at ``ctx``
  or, without one, every context from ``from_ctx`` up (every ``mode``, or the one given). At each
  point the baseline is its fastest variant (block configuration or KV split count);
- ``decode_speedup``: end-to-end decode tok/s of ``server`` over ``baseline_server`` at ``ctx``;
- ``verify_steps_per_s``: ``server``'s verify steps per second at ``ctx``, the median over the
  point's requests of ``spec_verify_ct`` (verify steps the server reports for the request) over
  ``decode_wall_s`` (first to last token, client clock).

Kernel targets select ``heads`` and ``page_size`` (page size 1 is the scattered layout). A
context is matched to the measured point whose context is nearest to ``ctx`` (relative
distance), if within ``ctx_tolerance`` (default 10%): ``ctx: 128000`` finds a 128,000 or a
131,072-token point, not a 64k one. ``server`` defaults to the first (by name) server of backend
``custom`` with neither CUDA graphs nor defragmentation, ``baseline_server`` to the first server
of backend ``baseline`` (default ``triton``) on the candidate's engine path (CUDA graphs or not,
no defragmentation).

``python -m decodecliff.analysis.targets STUDY --config CONFIG.yaml`` prints the table.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd
import yaml

from . import layout, summarize, tables

# The kinds of target, each with its unit and the fields it needs besides a threshold (the config
# schema's `target` says the same: tests/test_config_sources.py holds the two together).
UNITS = {
    "kernel_ms": "ms",
    "kernel_copy_fraction": "of copy GB/s",
    "kernel_speedup": "x",
    "decode_speedup": "x",
    "verify_steps_per_s": "steps/s",
}
KINDS = tuple(UNITS)
NEEDS = {
    "kernel_ms": ("mode", "ctx"),
    "kernel_copy_fraction": ("mode", "ctx"),
    "decode_speedup": ("ctx",),
    "verify_steps_per_s": ("ctx",),
}
COLUMNS = [
    "target", "kind", "subject", "op", "threshold", "unit", "measured", "ratio", "margin",
    "status", "reason",
]  # fmt: skip
MET, MISSED, NOT_MEASURED = "met", "missed", "not measured"


@dataclass(frozen=True)
class Target:
    """One target (see the module docstring for the kinds and their fields)."""

    kind: str
    min: float | None = None
    max: float | None = None
    name: str | None = None
    mode: str | None = None
    ctx: int | None = None
    from_ctx: int = 0
    heads: int = 8
    page_size: int = 1
    backend: str = "custom"
    baseline: str = "triton"
    server: str | None = None
    baseline_server: str | None = None
    ctx_tolerance: float = 0.1

    @property
    def op(self) -> str:
        return ">=" if self.min is not None else "<="

    @property
    def threshold(self) -> float:
        return self.min if self.min is not None else self.max

    @property
    def label(self) -> str:
        """The target as a reader would say it, e.g. 'chain16 at 185k: custom ms per layer'."""
        if self.name:
            return self.name
        at = f" at {tables.ctx_label(self.ctx)}" if self.ctx else ""
        if self.kind == "kernel_ms":
            return f"{self.mode}{at}: {self.backend} time per layer"
        if self.kind == "kernel_copy_fraction":
            return f"{self.mode}{at}: {self.backend} effective bandwidth"
        if self.kind == "kernel_speedup":
            where = at or (f" from {tables.ctx_label(self.from_ctx)} up" if self.from_ctx else "")
            what = self.mode or "every point"
            return f"{what}{where}: {self.backend} over {self.baseline} kernel"
        if self.kind == "decode_speedup":
            base = self.baseline_server or f"{self.baseline} server"
            return f"end-to-end decode{at}: {self.server or self.backend} over {base}"
        return f"verify steps per second{at}: {self.server or self.backend + ' server'}"


def parse(specs: list[dict] | None) -> list[Target]:
    """The config's ``targets`` list as Targets; a malformed entry raises ValueError naming it."""
    known = {f.name for f in fields(Target)}
    out = []
    for i, spec in enumerate(specs or []):
        where = f"targets[{i}]"
        if not isinstance(spec, dict):
            raise ValueError(f"{where}: expected a mapping, got {type(spec).__name__}")
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (allowed: {sorted(known)})")
        if spec.get("kind") not in KINDS:
            raise ValueError(f"{where}: kind {spec.get('kind')!r} is not one of {list(KINDS)}")
        if (spec.get("min") is None) == (spec.get("max") is None):
            raise ValueError(f"{where}: give exactly one of min and max")
        if not spec.get("min", spec.get("max")) > 0:
            raise ValueError(f"{where}: the threshold must be a positive number")
        for key in NEEDS.get(spec["kind"], ()):
            if spec.get(key) is None:
                raise ValueError(f"{where}: kind {spec['kind']} needs {key}")
        out.append(Target(**spec))
    return out


@dataclass(frozen=True)
class Measured:
    """A measurement for one target, or why there is none (``value`` None)."""

    value: float | None
    subject: str
    reason: str | None = None


def _nearest(contexts, ctx: int, tolerance: float) -> int | None:
    """The context nearest to ``ctx`` (relative distance), None if none is within tolerance."""
    have = sorted({int(c) for c in contexts if pd.notna(c)})
    if not have:
        return None
    best = min(have, key=lambda c: abs(c / ctx - 1))
    return best if abs(best / ctx - 1) <= tolerance else None


def _why_not(rows: pd.DataFrame) -> str:
    """'skipped: reason; failed: reason' of the rows that did not produce a number."""
    bad = rows[rows["status"] != "ok"]
    pairs = dict.fromkeys(f"{s}: {r}" for s, r in zip(bad["status"], bad["reason"], strict=True))
    return "; ".join(pairs) or "no point"


def _no_context(rows: pd.DataFrame, target: Target, col: str = "ctx") -> str:
    have = sorted({int(c) for c in rows[col].dropna()})
    span = ", ".join(tables.ctx_label(c) for c in have) or "none"
    near = f"{target.ctx_tolerance:.0%} of {tables.ctx_label(target.ctx)}"
    return f"no point within {near} (ran: {span})"


def _shape(target: Target) -> str:
    return f"{target.heads} heads, page size {target.page_size}"


def _kernel_rows(kernels: pd.DataFrame, target: Target, backend: str) -> pd.DataFrame | str:
    """The backend's points of the target's shape (and mode, if any), or why there are none.

    A backend that ran nowhere says so first: that reason covers every shape and mode.
    """
    rows = tables.as_run(kernels, backend)
    if rows.empty:
        return f"{backend} not in the microbenchmark"
    if not (rows["status"] == "ok").any():
        return f"{backend} not run ({_why_not(rows)})"
    sel = (rows["heads"] == target.heads) & (rows["page_size"] == target.page_size)
    if target.mode:
        sel &= rows["mode"] == target.mode
    rows = rows[sel]
    what = f"{backend} {target.mode or ''}".rstrip()
    if rows.empty:
        return f"{what} at {_shape(target)} not in the microbenchmark"
    if not (rows["status"] == "ok").any():
        return f"{what} not run at {_shape(target)} ({_why_not(rows)})"
    return rows


def _kernel_point(kernels: pd.DataFrame, target: Target) -> pd.Series | Measured:
    """The candidate's row at the target's mode and context, or why there is none; where the
    backend ran several series there (a Triton baseline's block configs, SGLang's extend and
    verify kernels), its fastest, named."""
    rows = _kernel_rows(kernels, target, target.backend)
    subject = f"{target.backend}, {target.mode}, {_shape(target)}"
    if isinstance(rows, str):
        return Measured(None, subject, rows)
    ctx = _nearest(rows["ctx"], target.ctx, target.ctx_tolerance)
    if ctx is None:
        return Measured(None, subject, _no_context(rows, target))
    at = rows[rows["ctx"] == ctx]
    subject += f", {tables.ctx_label(ctx)} ({ctx:,})"
    good = at[at["status"] == "ok"]
    if good.empty:
        row = at.iloc[0]
        return Measured(None, subject, f"{row['status']}: {row['reason']}")
    row = good.loc[good["ms"].idxmin()]
    if row["series"] != target.backend:
        subject = f"{row['series']}, {subject.split(', ', 1)[1]}"
    return row.rename(subject)


def kernel_ms(study: summarize.Study, target: Target) -> Measured:
    row = _kernel_point(study.kernels, target)
    return row if isinstance(row, Measured) else Measured(float(row["ms"]), row.name)


def kernel_copy_fraction(study: summarize.Study, target: Target) -> Measured:
    row = _kernel_point(study.kernels, target)
    if isinstance(row, Measured):
        return row
    copy = row.get("copy_gbs")
    if pd.isna(copy) or not copy:
        return Measured(None, row.name, "no measured copy bandwidth")
    subject = f"{row.name}: {row['gbs']:,.0f} of {copy:,.0f} GB/s"
    return Measured(float(row["gbs"]) / float(copy), subject)


def kernel_speedup(study: summarize.Study, target: Target) -> Measured:
    kernels = study.kernels
    cand = _kernel_rows(kernels, target, target.backend)
    base = _kernel_rows(kernels, target, target.baseline)
    subject = f"{target.backend} vs {target.baseline}, {target.mode or 'all modes'}, "
    subject += _shape(target)
    for rows in (cand, base):
        if isinstance(rows, str):
            return Measured(None, subject, rows)
    speed = tables.kernel_speedup(pd.concat([cand, base]), target.baseline, target.backend)
    if target.ctx:
        ctx = _nearest(speed["ctx"], target.ctx, target.ctx_tolerance)
        if ctx is None:
            return Measured(None, subject, _no_context(speed, target) + " with both backends")
        speed = speed[speed["ctx"] == ctx]
    else:
        speed = speed[speed["ctx"] >= target.from_ctx]
    if speed.empty:
        span = f" from {tables.ctx_label(target.from_ctx)} up" if target.from_ctx else ""
        return Measured(None, subject, f"no point{span} where both backends ran")
    # At each point the fastest baseline variant counts; then the worst point.
    per_point = speed.loc[speed.groupby(tables.KERNEL_KEYS)["speedup"].idxmin()]
    worst = per_point.loc[per_point["speedup"].idxmin()]
    subject += (
        f"; worst of {len(per_point)} points: {worst['mode']} at "
        f"{tables.ctx_label(worst['ctx'])} vs {worst['baseline']}"
    )
    return Measured(float(worst["speedup"]), subject)


def _flag(value) -> bool:
    return str(value).strip().lower() in ("true", "1", "1.0")


def candidate_server(sweep: pd.DataFrame, backend: str = "custom") -> str | None:
    """The first server (by name) of ``backend`` with neither CUDA graphs nor defragmentation."""
    return _first_on_path(sweep, backend, cuda_graph=False)


def paired_baseline(sweep: pd.DataFrame, server: str, backend: str) -> str | None:
    """The first server (by name) of ``backend`` on ``server``'s engine path: CUDA graphs as it
    has them, no defragmentation; None where the sweep has none."""
    graphs = "cuda_graph" in sweep and _flag(
        sweep.loc[sweep["server"] == server, "cuda_graph"].iloc[0]
    )
    return _first_on_path(sweep, backend, cuda_graph=graphs)


def _first_on_path(sweep: pd.DataFrame, backend: str, cuda_graph: bool) -> str | None:
    """The first server (by name) of ``backend`` with CUDA graphs as ``cuda_graph`` says and no
    defragmentation (a column the sweep lacks reads as off)."""
    if sweep.empty or "backend" not in sweep:
        return None
    rows = sweep[sweep["backend"] == backend]
    for col, wanted in (("cuda_graph", cuda_graph), ("defrag", False)):
        if col in rows:
            rows = rows[rows[col].map(_flag) == wanted]
        elif wanted:
            return None
    names = sorted(set(rows["server"]))
    return names[0] if names else None


def _no_server(sweep: pd.DataFrame, target: Target) -> str:
    if target.server:
        return f"no server {target.server!r} in the sweep"
    if "backend" in sweep and (sweep["backend"] == target.backend).any():
        return (
            f"no {target.backend} server without CUDA graphs and defragmentation in the sweep "
            "(name one as the target's `server`)"
        )
    return f"no {target.backend} server in the sweep"


def _sweep_point(sweep: pd.DataFrame, server: str, ctx: int, target: Target) -> pd.Series | str:
    """The server's row nearest to ``ctx`` (requested context), or why there is none."""
    rows = sweep[sweep["server"] == server]
    if not (rows["status"] == "ok").any():
        return f"{server} not run ({_why_not(rows)})"
    near = _nearest(rows["requested_ctx"], ctx, target.ctx_tolerance)
    if near is None:
        return _no_context(rows, target, "requested_ctx")
    row = rows[rows["requested_ctx"] == near].iloc[0]
    if row["status"] != "ok":
        return f"{server} {row['status']} at {tables.ctx_label(near)}: {row['reason']}"
    return row


def _server(study: summarize.Study, target: Target) -> str | Measured:
    sweep = study.sweep
    server = target.server or candidate_server(sweep, target.backend)
    if sweep.empty:
        return Measured(None, server or target.backend, "no end-to-end sweep results")
    if server is None or server not in set(sweep["server"]):
        return Measured(None, server or target.backend, _no_server(sweep, target))
    return server


def baseline_of(sweep: pd.DataFrame, server: str, target: Target) -> str | None:
    """The server a decode_speedup target compares ``server`` against: its ``baseline_server``,
    else the first of backend ``baseline`` on ``server``'s engine path (ValueError where the
    named one is not in the sweep)."""
    if target.baseline_server:
        return tables.baseline_server(sweep, target.baseline_server)
    return paired_baseline(sweep, server, target.baseline)


def decode_speedup(study: summarize.Study, target: Target) -> Measured:
    server = _server(study, target)
    if isinstance(server, Measured):
        return server
    try:
        base = baseline_of(study.sweep, server, target)
    except ValueError as exc:
        return Measured(None, server, str(exc))
    if base is None:
        return Measured(
            None,
            server,
            f"no {target.baseline} baseline server on {server}'s engine path"
            " (CUDA graphs as it has them, no defragmentation) in the sweep",
        )
    subject = f"{server} vs {base}"
    row = _sweep_point(study.sweep, server, target.ctx, target)
    if isinstance(row, str):
        return Measured(None, subject, row)
    ctx = int(row["requested_ctx"])
    subject += f", {tables.ctx_label(ctx)} ({ctx:,})"
    base_rows = study.sweep[(study.sweep["server"] == base) & (study.sweep["requested_ctx"] == ctx)]
    if base_rows.empty:
        return Measured(None, subject, f"baseline {base} has no point at {ctx:,}")
    base_row = base_rows.iloc[0]
    if base_row["status"] != "ok":
        return Measured(
            None, subject, f"baseline {base} {base_row['status']}: {base_row['reason']}"
        )
    subject += (
        f": {tables.num(row['decode_tok_s'])} vs {tables.num(base_row['decode_tok_s'])} tok/s"
    )
    unrecorded = [s for s, r in ((server, row), (base, base_row)) if pd.isna(r["decode_tok_s"])]
    if unrecorded:
        return Measured(
            None, subject, f"no decode tok/s recorded for {' and '.join(unrecorded)} there"
            " (a request of one token has no decode time)"
        )  # fmt: skip
    return Measured(float(row["decode_tok_s"]) / float(base_row["decode_tok_s"]), subject)


def verify_steps_per_s(study: summarize.Study, target: Target) -> Measured:
    server = _server(study, target)
    if isinstance(server, Measured):
        return server
    row = _sweep_point(study.sweep, server, target.ctx, target)
    if isinstance(row, str):
        return Measured(None, server, row)
    ctx = int(row["requested_ctx"])
    subject = f"{server}, {tables.ctx_label(ctx)} ({ctx:,})"
    rate = row.get(tables.PRIMARY)
    if rate is None or pd.isna(rate):
        return Measured(None, subject, "no verify steps recorded (spec_verify_ct, decode_wall_s)")
    n, steps = row.get("requests", 1), row.get("verify_steps")
    steps_text = "" if steps is None or pd.isna(steps) else f", {int(steps)} verify steps"
    subject += f": median of {int(n)} request{'s' if n != 1 else ''}{steps_text}"
    return Measured(float(rate), subject)


MEASURE = {
    "kernel_ms": kernel_ms,
    "kernel_copy_fraction": kernel_copy_fraction,
    "kernel_speedup": kernel_speedup,
    "decode_speedup": decode_speedup,
    "verify_steps_per_s": verify_steps_per_s,
}


def margin(op: str, threshold: float, measured: float) -> tuple[float, str, str]:
    """(ratio, text, status): ratio >= 1 is headroom, < 1 a shortfall (factors of the threshold);
    factors worded by tables.times, as every ratio ('1.002x over', not '1x over')."""
    if measured <= 0:
        ratio = math.inf if op == "<=" else 0.0
    else:
        ratio = measured / threshold if op == ">=" else threshold / measured
    if ratio >= 1:
        return ratio, f"{tables.times(ratio)} {'over' if op == '>=' else 'under'}", MET
    if ratio <= 0.5:
        return ratio, f"missed by {tables.times(1 / ratio)}" if ratio else "missed", MISSED
    off = (1 - ratio) if op == ">=" else (1 / ratio - 1)
    # under 1%, two figures: a near miss is not 'missed by 0%'
    return ratio, f"missed by {off:.0%}" if off >= 0.01 else f"missed by {off * 100:.2g}%", MISSED


def evaluate(study: summarize.Study, targets: list[Target]) -> pd.DataFrame:
    """One row per target: threshold, measured value, margin and status (with the reason)."""
    rows = []
    for t in targets:
        m = MEASURE[t.kind](study, t)
        row = {"target": t.label, "kind": t.kind, "subject": m.subject, "op": t.op}
        row |= {"threshold": t.threshold, "unit": UNITS[t.kind], "measured": m.value}
        if m.value is None or pd.isna(m.value):
            row |= {"ratio": None, "margin": "–", "status": NOT_MEASURED, "reason": m.reason}
        else:
            ratio, text, status = margin(t.op, t.threshold, m.value)
            row |= {"ratio": ratio, "margin": text, "status": status, "reason": None}
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def _value(value: float, unit: str, extra: int = 0) -> str:
    """``value`` in its unit, with ``extra`` digits beyond the usual (0% or 3 figures; a value
    of more digits whole, never as an exponent)."""
    if unit == "of copy GB/s":
        return f"{value:.{extra}%} {unit}"
    figures = 3 + extra
    text = f"{value:,.0f}" if abs(value) >= 10**figures else f"{value:.{figures}g}"
    return f"{text}x" if unit == "x" else f"{text} {unit}"


def _measured(value: float, threshold: float, unit: str) -> str:
    """The measured value as the table shows it, with the digits that tell it from a threshold
    it does not equal: a near miss written at the threshold's own rounding ('70%' under '>= 70%')
    would read as met."""
    for extra in range(6):
        if value == threshold or _value(value, unit, extra) != _value(threshold, unit, extra):
            return _value(value, unit, extra)
    return _value(value, unit, extra)


def display_table(df: pd.DataFrame) -> pd.DataFrame:
    """The evaluated targets as a reader sees them: one line each, the reason where not measured."""
    out = pd.DataFrame(
        {
            "target": df["target"],
            "threshold": [
                f"{o} {_value(v, u)}"
                for o, v, u in zip(df["op"], df["threshold"], df["unit"], strict=True)
            ],
            "measured": [
                "–" if pd.isna(v) else _measured(v, t, u)
                for v, t, u in zip(df["measured"], df["threshold"], df["unit"], strict=True)
            ],
            "margin": df["margin"],
            "status": [
                f"{s}: {r}" if s == NOT_MEASURED else s
                for s, r in zip(df["status"], df["reason"], strict=True)
            ],
            "measured on": df["subject"],
        }
    )
    return out.set_index("target")


def published(study_root: str | Path) -> pd.DataFrame | None:
    """The targets a published study was judged by, as its own report wrote them (its own
    configuration's targets, which another study's configuration need not share); None where
    the folder has no such table."""
    path = layout.table_path(study_root, "report", "targets")
    return pd.read_csv(path) if path.is_file() else None


def notes(study_root: str | Path) -> str | None:
    """The free-text NOTES.md of a study folder (why targets were missed), if there is one."""
    path = Path(study_root) / "NOTES.md"
    return path.read_text() if path.is_file() else None


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="decodecliff-targets", description=__doc__.split("\n")[0])
    ap.add_argument("study", type=Path, help="a study folder (results/ or a published copy)")
    ap.add_argument("--config", type=Path, required=True, help="YAML with a `targets` list")
    ap.add_argument("--out", type=Path, help="write the table as CSV here")
    args = ap.parse_args(argv)
    try:
        cfg = yaml.safe_load(args.config.read_text()) or {}
        if not cfg.get("targets"):
            raise ValueError(f"{args.config}: no `targets` list")
        study = summarize.load_study(args.study)
        table = evaluate(study, parse(cfg["targets"]))
    except (OSError, yaml.YAMLError, ValueError) as exc:
        print(f"targets: {exc}", file=sys.stderr)
        return 1
    if args.out:
        summarize.write_table(table, args.out, parquet=False)
    with pd.option_context("display.width", 200, "display.max_colwidth", 80):
        print(display_table(table).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
