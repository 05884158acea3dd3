"""A study's NOTES.md, rendered from its result files: the targets and the arithmetic behind them.

    python -m decodecliff.analysis.notes STUDY --config CONFIG.yaml [--sweep SWEEP.csv] \
        --out STUDY/NOTES.md

Every number comes from the study's tables (summarize.load_study; the end-to-end ones from the
summary table given with ``--sweep``, the config's points, where the study's sweep/ folder may
still hold points of an earlier config) through the template
``workflow/report/notes.md.j2``; nothing in the notes is typed. The template holds the prose, the
numbers are computed here: per server configuration at the longest context, the server's own
step time beside the client's, the attention share of the step (the kernel benchmark's time per
layer times the layers) and the step's floor (weights and latent KV read once at the measured
copy rate), so the reader can check every product and ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jinja2
import pandas as pd
import yaml

from ..engine.config import DEFAULT_GEMM
from . import floors, summarize, tables, targets
from .style import backend_of

TEMPLATE = Path(__file__).resolve().parents[3] / "workflow" / "report" / "notes.md.j2"
FLOOR_TERMS = {"FLOPs": "its FLOPs at the matmul rate", "bytes": "its latent KV at the copy rate"}
BENCH_PRESET = "kimi-k2-tp8-rank"  # the model whose shapes the kernel benchmark times
VERIFY_MODE = "chain16"


def modelled(series: pd.Series) -> pd.Series:
    """Whether each kernel series ran as configured for sm_120 ("custom (v5-sm120-s16)")."""
    return series.str.contains("-sm120", regex=False)


def _num(value, fmt: str | None = None) -> str:
    """``value`` in ``fmt``, else as tables.num writes it; "–" where none was measured."""
    if fmt is None or value is None or pd.isna(value):
        return tables.num(value)
    return format(float(value), fmt)


def markdown(df: pd.DataFrame) -> str:
    """A pipe table of ``df`` (index included when it is named)."""
    if df.index.name:
        df = df.reset_index()
    head = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in df.to_numpy()]
    return "\n".join([head, rule, *body])


def _attention_ms(
    kernels: pd.DataFrame,
    backend: str,
    page: int,
    ctx: int,
    variant: str | None = None,
    model: str | None = None,
) -> dict | None:
    """The kernel benchmark's ``backend`` verify time per layer nearest to ``ctx``: the series of
    the server's ``variant`` where the bench timed it (flashinfer (fa2)), else the backend's
    unlabelled series where it has one ("custom": what its auto rule runs), else the fastest. A
    server run as configured for another GPU (``model``: sm120) takes only the series timed that
    way ("flashinfer (fa2-sm120)", "custom (auto-sm120)"), and no other server takes those."""
    if kernels.empty:
        return None
    rows = tables.ok(kernels)
    rows = rows[(rows["backend"] == backend) & (rows["mode"] == VERIFY_MODE)]
    rows = rows[(rows["heads"] == 8) & (rows["page_size"] == page)]
    if model:
        rows = rows[rows["series"] == f"{backend} ({variant or 'auto'}-{model})"]
    else:
        rows = rows[~modelled(rows["series"])]
    if variant and not model and (rows["series"] == f"{backend} ({variant})").any():
        rows = rows[rows["series"] == f"{backend} ({variant})"]
    elif not model:
        # a custom server on "auto" runs the unlabelled series, not the pinned variant (v4, v5)
        # that happens to be timed fastest at this context (tables.as_run)
        rows = tables.as_run(rows, backend)
    if rows.empty:
        return None
    near = min(rows["ctx"].unique(), key=lambda c: abs(c / ctx - 1))
    if abs(near / ctx - 1) > 0.1:
        return None
    best = rows[rows["ctx"] == near].sort_values("ms").iloc[0]
    return {"ms": float(best["ms"]), "ctx": int(near), "series": best["series"]}


def _per_step_ms(rate: object) -> float | None:
    """1,000 / a rate in steps per second; None where it is missing or zero."""
    return 1e3 / float(rate) if pd.notna(rate) and rate else None


def server_rows(study: summarize.Study) -> list[dict]:
    """Per server configuration at its longest ok context: the step, its parts and its floor."""
    sweep, kernels = tables.ok(study.sweep), study.kernels
    copy_gbs, matmul = study.ceilings.get("copy_gbs"), study.ceilings.get("matmul_tflops")
    out = []
    for server in dict.fromkeys(study.sweep["server"]):
        rows = sweep[sweep["server"] == server].sort_values("requested_ctx")
        if rows.empty:
            continue
        r = rows.iloc[-1]
        ctx, layers = int(r["requested_ctx"]), r.get("num_layers")
        # both steps from a median of rates (1 / verify steps per second): a median of step
        # times beside 1 / a median of rates differ by more than the host's share when a point
        # holds few requests
        step_ms, client_ms = (
            _per_step_ms(r.get(key)) for key in ("verify_steps_s_server", tables.PRIMARY)
        )
        row = {
            "server": server,
            "ctx": ctx,
            "ctx_label": tables.ctx_label(ctx),
            "requests": int(r.get("requests", 1)),
            "verify_steps": _num(r.get("verify_steps"), ".0f"),
            "steps_s_client": _num(r.get(tables.PRIMARY)),
            "steps_s_server": _num(r.get("verify_steps_s_server")),
            "step_ms_server": _num(step_ms, ",.1f"),
            "step_ms_client": _num(client_ms, ",.1f"),
            "host_ms": "–",
            "accept": _num(r.get("spec_accept_length")),
        }
        # with K streams a request also waits while the others' prefill chunks run: not host time
        alone = int(r.get("concurrency", 1) or 1) == 1
        if client_ms is not None and step_ms is not None and alone:
            row["host_ms"] = _num(client_ms - step_ms, ",.1f")
        if r.get("preset") != BENCH_PRESET:  # other shapes than the kernel benchmark's
            out.append(row)
            continue
        variant, model = (
            v if isinstance(v, str) else None for v in (r.get("backend_variant"), r.get("model"))
        )
        att = _attention_ms(
            kernels, str(r.get("backend")), int(r.get("page_size") or 1), ctx, variant, model
        )
        if att and pd.notna(layers):
            total = att["ms"] * int(layers)
            share = total / step_ms if pd.notna(step_ms) and step_ms else None
            row |= {
                "layers": int(layers),
                "attention_layer_ms": _num(att["ms"]),
                "attention_series": att["series"],
                "attention_ctx": tables.ctx_label(att["ctx"]),
                "attention_ms": _num(total, ",.1f"),
                "attention_share": "–" if share is None else f"{share:.0%}",
                "attention_over": share is not None and share > 1,
            }
        floor = floors.step_floor(r, ctx, copy_gbs, matmul) if copy_gbs and matmul else None
        if floor is not None:
            row |= {
                "floor_ms": _num(floor.ms, ",.2f"),
                "floor_weights_ms": _num(floor.weights_ms, ",.2f"),
                "floor_attention_ms": _num(floor.attention_ms, ",.2f"),
                "floor_attention_by": FLOOR_TERMS[floor.attention_by],
                # times(): a step 0.2% over its floor is '1.002x', not '1'
                "over_floor": tables.times(step_ms / floor.ms) if pd.notna(step_ms) else "–",
            }
        out.append(row)
    return out


def kernel_rows(study: summarize.Study) -> list[dict]:
    """The verify kernel at the largest context: each backend's time, speedup, roofline share."""
    kernels = tables.ok(study.kernels)
    if kernels.empty:
        return []
    sel = kernels[(kernels["mode"] == VERIFY_MODE) & (kernels["heads"] == 8)]
    sel = sel[sel["page_size"] == 1]
    if sel.empty:
        return []
    ctx = int(sel["ctx"].max())
    at = sel[sel["ctx"] == ctx].sort_values("ms")
    triton = at[at["backend"] == "triton"]
    base = float(triton["ms"].min()) if len(triton) else None
    return [
        {
            "series": r["series"],
            "ctx_label": tables.ctx_label(ctx),
            "ms": _num(r["ms"]),
            "floor_ms": _num(r.get("floor_ms")),
            "roofline": "–" if pd.isna(r.get("roofline_frac")) else f"{r['roofline_frac']:.1%}",
            "speedup": "–" if base is None else tables.times(base / r["ms"]),
        }
        for _, r in at.iterrows()
    ]


# (view, the custom kernel's series, which peer series count, whether its rows are listed): every
# peer of the GPU's own build; those an sm_120 has the instructions for (no wgmma: fa3 left out);
# FlashInfer's fa2 as it configures itself for sm_120, beside the custom kernel so configured
WGMMA = ("flashinfer (fa3)",)
PEER_VIEWS = (
    ("on this GPU", "custom", lambda s: ~modelled(s), False),
    ("on this GPU without wgmma", "custom", lambda s: ~modelled(s) & ~s.isin(WGMMA), True),
    ("in the sm_120 model", "custom (auto-sm120)", lambda s: s == "flashinfer (fa2-sm120)", True),
)


def peer_rows(study: summarize.Study) -> tuple[list[dict], str]:
    """Each mode and context (8 heads, page size 1, one request) where a peer's kernel is faster
    than the custom kernel as the engine runs it (tables.kernel_vs_peers over each view's series),
    in the listed views of PEER_VIEWS, and a line counting such points in every view."""
    good = tables.ok(study.kernels)
    if good.empty:
        return [], "No kernel point ran."
    good = good[(good["heads"] == 8) & (good["page_size"] == 1) & (good["batch"] == 1)]
    rows, counts = [], []
    for view, custom, counted, listed in PEER_VIEWS:
        # the view's custom series alone, so kernel_vs_peers takes it as the kernel as run
        compared = tables.kernel_vs_peers(
            good[(good["series"] == custom) | counted(good["series"])]
        )
        if compared.empty:
            continue
        wins = compared[compared["peer_over_custom"] < 1]
        counts.append(f"{len(wins)} of {len(compared)} points {view}")
        rows += [_peer_row(view.split(" ", 1)[1], r) for _, r in wins.iterrows() if listed]
    if not counts:
        return rows, "No custom point ran beside a peer."
    return rows, "A peer is faster at " + "; ".join(counts) + "."


def _peer_row(view: str, r: pd.Series) -> dict:
    """A kernel_vs_peers row where the peer is faster, as the notes' table shows it."""
    return {
        "view": view, "mode": r["mode"], "ctx_label": tables.ctx_label(r["ctx"]),
        "custom_ms": _num(r["custom_ms"]), "peer": r["best_peer"], "peer_ms": _num(r["peer_ms"]),
        # times(): a lead under 0.5% keeps its digits ('1.002x'); two decimals wrote '1.00x'
        "ratio": tables.times(r["custom_ms"] / r["peer_ms"]), "floor_ms": _num(r["floor_ms"]),
    }  # fmt: skip


def _floor_term(row: pd.Series) -> str:
    """Which term sets a kernel point's floor: its bytes at the copy rate, or its FLOPs at the
    matmul rate (each recovered from the point's attained rate: bytes = GB/s x ms)."""
    by_bytes = row["gbs"] * row["ms"] / row["copy_gbs"]
    by_flops = row["tflops"] * row["ms"] / row["matmul_tflops"]
    if by_flops > by_bytes:
        return f"FLOPs at {_num(row['matmul_tflops'], ',.0f')} TFLOP/s"
    return f"bytes at {_num(row['copy_gbs'], ',.0f')} GB/s"


def _kernel_text(row: pd.Series) -> str:
    """'custom 0.26 ms, 3.9x its floor (0.0659 ms, set by bytes at 4,228 GB/s: 25% of the
    roofline)'."""
    over = tables.times(row["ms"] / row["floor_ms"])
    return (
        f"{row['series']} {_num(row['ms'])} ms, {over} its floor ({_num(row['floor_ms'])} ms, "
        f"set by {_floor_term(row)}: {row['floor_ms'] / row['ms']:.0%} of the roofline)"
    )


def _kernel_why(kernels: pd.DataFrame, t: targets.Target) -> str | None:
    """What limits a missed kernel target, from the kernel table."""
    good = tables.ok(kernels)
    if good.empty:
        return None
    good = good[(good["heads"] == t.heads) & (good["page_size"] == t.page_size)]
    if t.mode:
        good = good[good["mode"] == t.mode]
    if t.kind in ("kernel_ms", "kernel_copy_fraction"):
        rows = tables.as_run(good, t.backend)  # the series the target measured
        if rows.empty:
            return None
        near = min(rows["ctx"].unique(), key=lambda c: abs(c / t.ctx - 1))
        row = rows[rows["ctx"] == near].sort_values("ms").iloc[0]
        text = _kernel_text(row)
        if t.kind == "kernel_ms" and t.threshold < row["floor_ms"]:
            text += f"; the target ({_num(t.threshold)} ms) is below the floor"
        return text
    speed = tables.kernel_speedup(good, t.baseline, t.backend)
    if t.ctx:
        near = min(speed["ctx"].unique(), key=lambda c: abs(c / t.ctx - 1), default=None)
        speed = speed[speed["ctx"] == near]
    else:
        speed = speed[speed["ctx"] >= t.from_ctx]
    if speed.empty:
        return None
    per_point = speed.loc[speed.groupby(tables.KERNEL_KEYS)["speedup"].idxmin()]
    worst = per_point.loc[per_point["speedup"].idxmin()]
    at = good[(good["mode"] == worst["mode"]) & (good["ctx"] == worst["ctx"])]
    cand = at[at["series"] == worst["candidate"]].iloc[0]
    base = at[at["series"] == worst["baseline"]].iloc[0]
    bound = base["ms"] / cand["floor_ms"]
    reach = "" if bound >= t.threshold else f", short of the target's {tables.times(t.threshold)}"
    return (
        f"the worst point, {worst['mode']} at {tables.ctx_label(worst['ctx'])}: "
        f"{_kernel_text(cand)}; {_kernel_text(base)}; {t.backend} at its floor would be "
        f"{tables.times(bound)} over it{reach}"
    )


def engine_rows(root: Path) -> list[dict]:
    """The engine bench's step anatomy rows (engine/bench.json), [] where the study has none."""
    path = Path(root) / "engine" / "bench.json"
    if not path.is_file():
        return []
    return [r for r in json.loads(path.read_text()).get("rows", []) if "step_ms" in r]


def _anatomy(
    rows: list[dict],
    backend: str,
    graphs: bool,
    ctx: int,
    gemm: str,
    label: str | None = None,
    mode: str = "chain",
) -> str | None:
    """'custom, CUDA graphs, 185k: step 21.1 ms (floor 6.27) = attention 15.8 (4.02) + ...': the
    rows of the backend's configuration named ``label`` where the bench has it, else of its
    first on the same GEMM path, of the step ``mode`` (the engine bench's: decode, chain, tree)."""
    path = "graphs" if graphs else "eager"
    mine = [
        r for r in rows
        if backend_of(str(r.get("backend", ""))) == backend and r.get("path") == path
        and r.get("gemm", DEFAULT_GEMM) == gemm and r.get("mode", "chain") == mode
    ]  # fmt: skip
    mine = [r for r in mine if r["backend"] == label] or mine
    if not mine:
        return None
    near = min({r["context"] for r in mine}, key=lambda c: abs(c / ctx - 1))
    if abs(near / ctx - 1) > 0.1:
        return None
    r = next(r for r in mine if r["context"] == near)
    parts = [
        f"{what} {_ms(r[f'{key}_ms'])} ({_ms(r[f'{key}_floor_ms'])})"
        for what, key in (("attention", "attention"), ("GEMMs", "gemm"), ("rest", "rest"))
    ]
    if r["attention_ms"] < r["attention_floor_ms"]:  # eager: the GPU waited for the host
        parts[0] = (
            f"attention hidden in host time (it adds {_ms(r['attention_ms'])}, under its floor "
            f"{_ms(r['attention_floor_ms'])})"
        )
    return (
        f"{r['backend']} {'CUDA graphs' if graphs else 'eager'} at {tables.ctx_label(near)}: "
        f"step {_ms(r['step_ms'])} ({_ms(r['step_floor_ms'])}) = {' + '.join(parts)} ms"
    )


def _ms(value: float) -> str:
    """Three significant digits, without an exponent (1,290 rather than 1.29e+03)."""
    return _num(value, ",.0f") if abs(value) >= 100 else _num(value)


# a server's speculation (its config's spec.mode) -> the engine bench's mode of that step
STEP_MODES = {"none": "decode", "chain": "chain", "tree": "tree"}


def _step_mode(spec: object) -> str:
    """The engine bench's mode of a server's verify step: its spec's, a chain where unrecorded."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError:
            spec = None
    mode = spec.get("mode") if isinstance(spec, dict) else None
    return STEP_MODES.get(mode, "chain")


def _server_anatomy(study: summarize.Study, rows: list[dict], server: str, ctx: int) -> str:
    sweep = study.sweep[study.sweep["server"] == server]
    if sweep.empty or not rows:
        return ""
    first = sweep.iloc[0]
    graphs = str(first.get("cuda_graph")).strip().lower() in ("true", "1", "1.0")
    backend, gemm = str(first.get("backend")), tables.server_gemm(study.sweep, server)
    label = tables.engine_label(study.sweep, server) if backend == "custom" else None
    text = _anatomy(rows, backend, graphs, ctx, gemm, label, _step_mode(first.get("spec")))
    return f"`{server}`: {text}" if text else ""


def why_rows(
    study: summarize.Study, checked: pd.DataFrame, specs: list, anatomy: list[dict] | None = None
) -> list[dict]:
    """Per missed target, what limits it: a kernel target's point against its floor (and the term
    that sets the floor); an end-to-end target's step anatomy from the engine bench (``anatomy``:
    its rows; default: the study's engine/bench.json)."""
    rows = engine_rows(study.root) if anatomy is None else anatomy
    out = []
    for spec, (_, row) in zip(specs, checked.iterrows(), strict=True):
        if row["status"] != targets.MISSED:
            continue
        if spec.kind.startswith("kernel"):
            why = _kernel_why(study.kernels, spec)
        else:
            server = spec.server or targets.candidate_server(study.sweep, spec.backend)
            found = [_server_anatomy(study, rows, server, spec.ctx)]
            if spec.kind == "decode_speedup":  # the baseline the target was measured against
                base = targets.baseline_of(study.sweep, server, spec)
                found.append(_server_anatomy(study, rows, base, spec.ctx) if base else "")
            if spec.kind == "verify_steps_per_s":
                found.append(f"the target's {_num(spec.threshold)} steps/s is a step of "
                             f"{_ms(1e3 / spec.threshold)} ms")  # fmt: skip
            why = "; ".join(f for f in found if f) or None
        out.append({"target": row["target"], "why": why or "no measurement to explain it"})
    return out


def context(study: summarize.Study, name: str, cfg: dict) -> dict:
    """Everything the template shows, as text."""
    sweep = study.sweep
    specs = targets.parse(cfg.get("targets"))
    checked = targets.evaluate(study, specs)
    env = study.bench_env or {}
    servers = server_rows(study)
    gits = tables.short_commits(sweep.get("git", pd.Series(dtype=str)))
    return {
        "name": name,
        "device": env.get("gpu") or "CPU",
        "on_cpu": not env.get("gpu"),
        "commits": ", ".join(f"`{g}`" for g in gits) or "–",
        "bench_commit": f"`{str(env.get('git'))[:7]}`" if env.get("git") else "–",
        "counts": tables.counts(sweep),
        "targets": markdown(targets.display_table(checked).drop(columns=["measured on"])),
        "missed": checked[checked["status"] != targets.MET].to_dict("records"),
        # an engine bench an earlier config left on disk is not this study's (the rule reads it
        # only while the config has an engine section)
        "why": why_rows(study, checked, specs, None if "engine" in cfg else []),
        "kernels": kernel_rows(study),
        "peer_wins": peer_rows(study),
        "servers": servers,
        "over_100": any(s.get("attention_over", False) for s in servers),
        **acceptance(sweep),
    }


def acceptance(sweep: pd.DataFrame) -> dict:
    """The median over the points drawn of tokens per verify step (``accept``, as text) and
    whether drafts were accepted (``accepted``: None where no point recorded it, False where the
    report says none was, tables.acceptance_said, so tokens/s are verify steps/s): the notes say
    which, not always the former."""
    accepted = tables.accepted_per_step(sweep)
    if accepted.empty:
        return {"accept": "–", "accepted": None}
    return {
        "accept": _num(accepted.median()),
        "accepted": tables.acceptance_said(sweep) != tables.NO_DRAFT,
    }


def render(
    study_root: str | Path,
    cfg: dict,
    name: str | None = None,
    template: Path = TEMPLATE,
    sweep: str | Path | None = None,
) -> str:
    """The notes of the study folder, from ``template`` (Jinja2, Markdown).

    ``sweep``: the study's summary table (summary/sweep.csv), written from the config's points;
    without it, every point file under the folder's sweep/ counts, a point an earlier config
    left there included.
    """
    study = summarize.load_study(study_root)
    if sweep is not None:
        study.sweep = pd.read_csv(sweep)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(template).parent),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    ctx = context(study, name or Path(study_root).name, cfg)
    return env.get_template(Path(template).name).render(**ctx)


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="decodecliff-notes", description=__doc__.split("\n")[0])
    ap.add_argument("study", type=Path, help="a study folder (results/ or a published copy)")
    ap.add_argument(
        "--config",
        type=Path,
        required=True,
        help="the study's YAML (its targets, its engine section); - for stdin",
    )
    ap.add_argument("--name", help="the study's name (default: the config's study.name)")
    ap.add_argument(
        "--sweep", type=Path, help="its summary/sweep.csv (default: every sweep/*/ctx*.json)"
    )
    ap.add_argument("--template", type=Path, default=TEMPLATE, help="the Jinja2 template")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        text = sys.stdin.read() if str(args.config) == "-" else args.config.read_text()
        cfg = yaml.safe_load(text) or {}
        if "targets" not in cfg:
            schema = TEMPLATE.parents[1] / "schemas" / "config.schema.yaml"
            cfg["targets"] = yaml.safe_load(schema.read_text())["properties"]["targets"]["default"]
        name = args.name or (cfg.get("study") or {}).get("name")
        text = render(args.study, cfg, name, args.template, args.sweep)
    except (OSError, yaml.YAMLError, ValueError, jinja2.TemplateError) as exc:
        print(f"notes: {exc}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
