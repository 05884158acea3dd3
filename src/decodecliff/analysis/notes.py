"""A study's NOTES.md, rendered from its result files: the targets and the arithmetic behind them.

    python -m decodecliff.analysis.notes STUDY --config CONFIG.yaml --out STUDY/NOTES.md

Every number comes from the study's tables (summarize.load_study) through the template
``workflow/report/notes.md.j2``; nothing in the notes is typed. The template holds the prose, the
numbers are computed here: per server configuration at the longest context, the server's own
step time beside the client's, the attention share of the step (the kernel benchmark's time per
layer times the layers) and the step's floor (weights and latent KV read once at the measured
copy rate), so the reader can check every product and ratio.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jinja2
import pandas as pd
import yaml

from . import summarize, tables, targets

TEMPLATE = Path(__file__).resolve().parents[3] / "workflow" / "report" / "notes.md.j2"
LATENT_BYTES = 576 * 2  # one latent KV row in bf16 (512 + 64 rope)
BENCH_PRESET = "kimi-k2-tp8-rank"  # the model whose shapes the kernel benchmark times
VERIFY_MODE = "chain16"


def _num(value, fmt: str = ".3g") -> str:
    return "–" if value is None or pd.isna(value) else format(float(value), fmt)


def markdown(df: pd.DataFrame) -> str:
    """A pipe table of ``df`` (index included when it is named)."""
    if df.index.name:
        df = df.reset_index()
    head = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in df.to_numpy()]
    return "\n".join([head, rule, *body])


def _attention_ms(
    kernels: pd.DataFrame, backend: str, page: int, ctx: int, variant: str | None = None
) -> dict | None:
    """The kernel benchmark's ``backend`` verify time per layer nearest to ``ctx``: the series of
    the server's ``variant`` where the bench timed it (flashinfer (fa2)), else the fastest."""
    if kernels.empty:
        return None
    rows = tables.ok(kernels)
    rows = rows[(rows["backend"] == backend) & (rows["mode"] == VERIFY_MODE)]
    rows = rows[(rows["heads"] == 8) & (rows["page_size"] == page)]
    if variant and (rows["series"] == f"{backend} ({variant})").any():
        rows = rows[rows["series"] == f"{backend} ({variant})"]
    if rows.empty:
        return None
    near = min(rows["ctx"].unique(), key=lambda c: abs(c / ctx - 1))
    if abs(near / ctx - 1) > 0.1:
        return None
    best = rows[rows["ctx"] == near].sort_values("ms").iloc[0]
    return {"ms": float(best["ms"]), "ctx": int(near), "series": best["series"]}


def server_rows(study: summarize.Study) -> list[dict]:
    """Per server configuration at its longest ok context: the step, its parts and its floor."""
    sweep, kernels = tables.ok(study.sweep), study.kernels
    copy_gbs = study.ceilings.get("copy_gbs")
    out = []
    for server in dict.fromkeys(study.sweep["server"]):
        rows = sweep[sweep["server"] == server].sort_values("requested_ctx")
        if rows.empty:
            continue
        r = rows.iloc[-1]
        ctx, layers = int(r["requested_ctx"]), r.get("num_layers")
        step_ms = r.get("verify_step_ms_server")
        client_ms = 1e3 / r[tables.PRIMARY] if pd.notna(r.get(tables.PRIMARY)) else None
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
        if client_ms and pd.notna(step_ms):
            row["host_ms"] = _num(client_ms - step_ms, ",.1f")
        if r.get("preset") != BENCH_PRESET:  # other shapes than the kernel benchmark's
            out.append(row)
            continue
        variant = r.get("backend_variant")
        att = _attention_ms(
            kernels, str(r.get("backend")), int(r.get("page_size") or 1), ctx,
            variant if isinstance(variant, str) else None,
        )  # fmt: skip
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
        weights = r.get("weight_bytes")
        if copy_gbs and pd.notna(weights) and pd.notna(layers):
            kv = ctx * LATENT_BYTES * int(layers)
            floor = (float(weights) + kv) / (copy_gbs * 1e9) * 1e3
            row |= {
                "floor_ms": _num(floor, ",.2f"),
                "weights_gb": _num(float(weights) / 1e9, ".3g"),
                "kv_gb": _num(kv / 1e9, ".3g"),
                "copy_gbs": _num(copy_gbs, ",.0f"),
                "over_floor": _num(step_ms / floor) if pd.notna(step_ms) else "–",
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
            "speedup": "–" if base is None else f"{base / r['ms']:.3g}x",
        }
        for _, r in at.iterrows()
    ]


def context(study: summarize.Study, name: str, cfg: dict) -> dict:
    """Everything the template shows, as text."""
    sweep = study.sweep
    checked = targets.evaluate(study, targets.parse(cfg.get("targets")))
    env = study.bench_env or {}
    servers = server_rows(study)
    gits = tables.short_commits(sweep.get("git", pd.Series(dtype=str)))
    return {
        "name": name,
        "device": env.get("gpu") or "CPU",
        "commits": ", ".join(f"`{g}`" for g in gits) or "–",
        "bench_commit": f"`{str(env.get('git'))[:7]}`" if env.get("git") else "–",
        "counts": tables.counts(sweep),
        "targets": markdown(targets.display_table(checked).drop(columns=["measured on"])),
        "missed": checked[checked["status"] != targets.MET].to_dict("records"),
        "kernels": kernel_rows(study),
        "servers": servers,
        "over_100": any(s.get("attention_over", False) for s in servers),
        "accept": _num(tables.ok(sweep)["spec_accept_length"].median())
        if len(tables.ok(sweep))
        else "–",
    }


def render(
    study_root: str | Path, cfg: dict, name: str | None = None, template: Path = TEMPLATE
) -> str:
    """The notes of the study folder, from ``template`` (Jinja2, Markdown)."""
    study = summarize.load_study(study_root)
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
        "--config", type=Path, required=True, help="the study's YAML (its targets); - for stdin"
    )
    ap.add_argument("--name", help="the study's name (default: the config's study.name)")
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
        text = render(args.study, cfg, name, args.template)
    except (OSError, yaml.YAMLError, ValueError, jinja2.TemplateError) as exc:
        print(f"notes: {exc}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
