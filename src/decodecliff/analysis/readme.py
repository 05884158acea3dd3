"""Write the README's headline section from a published study's result files.

    python -m decodecliff.analysis.readme results/published/h100 README.md

(the study the README's headline marker names; any published study folder, such as
results/published/h200, makes the section the same way from its own files)

Replaces what stands between ``<!-- headline:start ... -->`` and ``<!-- headline:end -->``, so the
README's numbers are always the published study's own: the headline figure (drawn again into the
study's figures/compare/headline.png by the function its report uses), the three sentences under
it and the end-to-end table, computed from its raw point files by the functions its report and
its rendered NOTES.md use.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import pandas as pd

from . import figures, headline, layout, style, summarize, tables, targets

START, END = "<!-- headline:start", "<!-- headline:end -->"
REFERENCE = Path(__file__).resolve().parents[3] / "data/reference/seed-rtx-pro-6000-triton.csv"
NEEDS = ("kernels/bench.json", "tables/report/targets.csv")  # a published study's, and points


def markdown_table(df: pd.DataFrame, labels: int = 1) -> str:
    """A markdown table: the first ``labels`` columns left-aligned, numbers right-aligned."""
    cells = [[str(c) for c in df.columns], *[[str(v) for v in row] for row in df.to_numpy()]]
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    align = [":---" if i < labels else "---:" for i in range(len(df.columns))]
    lines.insert(1, "|" + "|".join(align) + "|")
    return "\n".join(lines)


README_BACKENDS = ("triton", "sglang", "flashinfer", "custom")  # torch and cuBLAS: in the report


def kernel_rows(study: Path, contexts: list[int]) -> pd.DataFrame:
    """Decode and 16-token chain verify ms per layer, 8 heads, page size 1, at the contexts: the
    Triton baseline, SGLang's and FlashInfer's kernels and the custom kernel as the figures draw
    them (decode at SGLang's split count, the custom kernel as its auto rule runs it), each mode
    under its floor (bytes at the measured copy rate or FLOPs at the matmul rate)."""
    kernels = summarize.load_study(study).kernels
    keep = kernels[(kernels["heads"] == 8) & (kernels["page_size"] == 1)]
    keep = keep[keep["mode"].isin(["decode", "chain16"]) & keep["backend"].isin(README_BACKENDS)]
    keep = figures.main_series(keep)
    table = tables.kernel_headline(keep, contexts).reset_index()
    cols = [c for c in table.columns if c not in ("heads", "q_len", "series", "page_size")]
    floors = keep[keep["ctx"].isin(contexts)].groupby(["mode", "ctx"])["floor_ms"].min()
    rows = []
    for mode, group in table.groupby("mode", sort=False):
        floor = {tables.ctx_label(c): tables.num(ms) for c, ms in floors[mode].items()}
        rows.append({"mode": mode, "backend": "**floor**", **floor})
        rows += group.rename(columns={"series": "backend"}).to_dict("records")
    out = pd.DataFrame(rows)[["mode", "backend", *cols[1:]]]
    return out.rename(columns={c: f"{c} (ms)" for c in cols[1:]})


def end_to_end(study: Path) -> tuple[pd.DataFrame, str, str | None, pd.DataFrame]:
    """The end-to-end headline (verify steps/s, median and min–max), what it rests on, its
    baseline server and the points themselves, computed from the study's raw point files by the
    same functions as its report and notes."""
    loaded = summarize.load_study(study)
    sweep = loaded.sweep
    baseline = tables.baseline_server(sweep)
    headline = tables.sweep_headline(sweep, baseline, loaded.ceilings)
    return headline.reset_index(), tables.counts(sweep), baseline, sweep


def _distinct(sweep: pd.DataFrame, col: str) -> list:
    return sorted(sweep[col].dropna().unique()) if col in sweep else []


def workload(sweep: pd.DataFrame) -> tuple[str, str]:
    """What the end-to-end points ran ("synthetic `kimi-k2-tp8-rank`, 16-token verify steps") and
    what their measured acceptance makes of tok/s, from the points' own columns."""
    good = tables.ok(sweep)
    presets = [f"`{p}`" for p in _distinct(good, "preset")]
    model = "synthetic model, preset not recorded"
    if presets:
        model = f"synthetic {tables.listed(presets)}"
    drafts = [f"{int(d)}" for d in _distinct(good, "draft_tokens")]
    steps = "verify steps of unrecorded length"
    if drafts:
        sizes = tables.listed([*(f"{d}-" for d in drafts[:-1]), drafts[-1]])  # "8- and 16"-token
        steps = f"{sizes}-token verify steps"
    accept = pd.to_numeric(good.get("spec_accept_length", pd.Series(dtype=float))).dropna()
    if accept.empty:
        tok_s = "The points record no acceptance, so their tok/s may differ from these numbers"
    elif (accept == 1).all():  # only the bonus token: one token per verify step
        tok_s = "With random weights no draft token is accepted, so tok/s are the same numbers"
    else:
        lo, hi = tables.num(accept.min()), tables.num(accept.max())
        span = lo if lo == hi else f"{lo}–{hi}"
        tok_s = (
            f"The servers emit {span} tokens per verify step (the bonus token included), so "
            "tok/s are these numbers times that"
        )
    return f"{model}, {steps}", tok_s


def targets_text(table: pd.DataFrame, rel: str) -> str:
    """The targets met, missed (by how much) and not measured (why), 'none' for an empty list."""

    def of(status: str, detail: str | None) -> list[str]:
        rows = table[table["status"] == status]
        if detail is None:
            return rows["target"].tolist()
        pairs = zip(rows["target"], rows[detail], strict=True)
        return [t if pd.isna(d) else f"{t} ({d})" for t, d in pairs]

    met, missed = of(targets.MET, None), of(targets.MISSED, "margin")
    unmeasured = of(targets.NOT_MEASURED, "reason")
    parts = [f"met: {'; '.join(met) or 'none'}", f"Missed: {'; '.join(missed) or 'none'}"]
    if unmeasured:
        parts.append(f"Not measured: {'; '.join(unmeasured)}")
    why = "Why, and what would close them" if missed or unmeasured else "How each was measured"
    return f"**Targets**: {'. '.join(parts)}. {why}: [`{rel}/NOTES.md`]({rel}/NOTES.md)."


def measured_at(commits: list[str], rel: str) -> str:
    shas = ", ".join(f"`{c}`" for c in commits)
    if len(commits) == 1:
        return f"commit {shas}"
    return f"commits {shas} (which measured what: [`{rel}/RUNS.md`]({rel}/RUNS.md))"


def headline_png(study: Path) -> Path:
    """Where the study's headline figure lies (its compare notebook draws it there)."""
    return layout.figure_path(study, "compare", "headline")


def draw_headline(study: Path, reference: Path = REFERENCE) -> Path:
    """Draw the study's headline figure into the study folder, as its compare notebook does."""
    style.apply()
    loaded = summarize.load_study(study)
    ref, _ = summarize.reference_table(reference)
    name = study.resolve().name  # "h200" also where the study is given as "."
    title = f"{summarize.study_title(name, loaded.sweep)}: verify steps/s against context"
    fig = headline.figure(loaded.sweep, ref, title, loaded.ceilings)
    return figures.save(fig, headline_png(study))


def engine_doc(study: Path) -> dict | None:
    """The study's engine bench (the step anatomy the sentences quote), None where it has none."""
    engine_json = study / "engine/bench.json"
    return json.loads(engine_json.read_text()) if engine_json.is_file() else None


def finding(study: Path, rel: str, doc: dict | None, reference: Path = REFERENCE) -> list[str]:
    """The headline figure (linked) and the three sentences under it (``doc``: engine_doc's)."""
    loaded = summarize.load_study(study)
    sweep = loaded.sweep
    ref, _ = summarize.reference_table(reference)
    png = headline_png(study).relative_to(study).as_posix()
    alt = headline.alt_text(sweep)
    sentences = headline.sentences(sweep, headline.engine_rows(doc), ref, loaded.ceilings)
    return [f"![{alt}]({rel}/{png})", "", *[line for s in sentences for line in (s, "")]]


def section(study: Path, name: str | None = None) -> str:
    """The headline section; ``name`` is how the README links the study (default: its path)."""
    env = json.loads((study / "kernels/bench.json").read_text())["env"]
    table, counts, baseline, sweep = end_to_end(study)
    engine = engine_doc(study)
    commits = tables.short_commits(
        [*sweep["git"], env["git"], *([engine["env"]["git"]] if engine else [])]
    )
    kernels = kernel_rows(study, [1024, 16384, 65536, 185000])
    ran, tok_s = workload(sweep)
    # the speedups after the '·' are over the Triton server: none where it did not run
    over = f"; after the `·`, the speedup over the Triton server `{baseline}`" if baseline else ""
    rel = name or study.as_posix()
    return "\n".join(
        [
            f"{START} — generated from {rel} by `python -m decodecliff.analysis.readme` -->",
            *finding(study, rel, engine),
            f"Measured on one {env['gpu']} ({env['gpu_capability']}), driver {env['driver']}, "
            f"torch {env['torch']}, Triton {env['triton']}, {measured_at(commits, rel)}; "
            f"the full report is [`{rel}/report.html`]({rel}/report.html).",
            "",
            f"**End to end** ({ran}): verify steps per second on the client's clock, the fastest "
            "server at the longest context first, under the floor's (the weights read once at "
            "the measured copy rate, each layer's attention at the copy rate or the matmul rate, "
            f"the larger){over}. {tok_s}; {counts}.",
            "",
            markdown_table(table),
            "",
            "**Attention per layer** (8 heads, page size 1 scattered; the floor is each point's "
            "bytes at the measured copy rate or its FLOPs at the measured matmul rate, the "
            "larger; `-sm120`: configured within sm_120's shared memory, as on an RTX PRO 6000):",
            "",
            markdown_table(kernels, labels=2),
            "",
            targets_text(pd.read_csv(study / "tables/report/targets.csv"), rel),
            END,
        ]
    )


def update(readme: Path, study: Path) -> None:
    """Rewrite ``readme``'s headline section from ``study``, its links relative to the README's
    folder, and redraw the study's headline figure; a study or README that cannot make the
    section stops with a one-line SystemExit before either file changes."""
    if not readme.is_file():
        raise SystemExit(f"{readme}: no such README")
    text = readme.read_text()
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{readme}: no headline markers ({START} ... {END})")
    if not study.is_dir():
        raise SystemExit(f"{study}: no such study folder")
    lacking = [need for need in NEEDS if not (study / need).is_file()]
    if not any((study / "sweep").glob("*/ctx*.json")):
        lacking.append("sweep/<server>/ctx<N>.json")
    if lacking:
        raise SystemExit(f"{study}: not a published study, it lacks {', '.join(lacking)}")
    rel = Path(os.path.relpath(study, readme.parent)).as_posix()
    try:
        new = section(study, rel)  # first: a section that fails leaves the figure as it was
    except summarize.ResultError as exc:
        raise SystemExit(f"{study}: {exc}") from None
    draw_headline(study)
    readme.write_text(pattern.sub(lambda _: new, text))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("study", type=Path, help="a published study folder")
    p.add_argument("readme", type=Path)
    args = p.parse_args(argv)
    update(args.readme, args.study)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
