"""Write the README's headline section from a published study's report tables.

    python -m decodecliff.analysis.readme results/published/h200 README.md

Replaces what stands between ``<!-- headline:start ... -->`` and ``<!-- headline:end -->``, so the
README's numbers are always the published study's own: the end-to-end table is computed from its
raw point files by the functions its report and its rendered NOTES.md use.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd

from . import summarize, tables

START, END = "<!-- headline:start", "<!-- headline:end -->"


def markdown_table(df: pd.DataFrame) -> str:
    cells = [[str(c) for c in df.columns], *[[str(v) for v in row] for row in df.to_numpy()]]
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("---:" for _ in df.columns) + "|")
    return "\n".join(lines)


def kernel_rows(study: Path, contexts: list[str]) -> pd.DataFrame:
    """Verify (16-token chain) and decode ms per layer, 8 heads, page size 1, key contexts."""
    table = pd.read_csv(study / "tables/report/kernels_at_key_contexts.csv")
    keep = table[(table["heads"] == 8) & (table["page_size"] == 1)]
    keep = keep[keep["mode"].isin(["chain16", "decode"])]
    cols = [c for c in contexts if c in keep.columns]
    out = keep[["mode", "series", *cols]].rename(columns={"series": "backend"})
    return out.rename(columns={c: f"{c} (ms)" for c in cols})


def end_to_end(study: Path) -> tuple[pd.DataFrame, str, str, list[str]]:
    """The end-to-end headline (verify steps/s, median and min–max), what it rests on, its
    baseline server and the commits its points record, computed from the study's raw point files
    by the same functions as its report and notes."""
    sweep = summarize.load_study(study).sweep
    baseline = tables.baseline_server(sweep)
    headline = tables.sweep_headline(sweep, baseline)
    return headline.reset_index(), tables.counts(sweep), baseline, list(sweep["git"])


def measured_at(commits: list[str], rel: str) -> str:
    shas = ", ".join(f"`{c}`" for c in commits)
    if len(commits) == 1:
        return f"commit {shas}"
    return f"commits {shas} (which measured what: [`{rel}/README.md`]({rel}/README.md))"


def section(study: Path, name: str | None = None) -> str:
    """The headline section; ``name`` is how the README links the study (default: its path)."""
    env = json.loads((study / "kernels/bench.json").read_text())["env"]
    headline, counts, baseline, revs = end_to_end(study)
    commits = tables.short_commits([*revs, env["git"]])
    targets = pd.read_csv(study / "tables/report/targets.csv")
    kernels = kernel_rows(study, ["1k", "16k", "64k", "185k"])
    met = targets[targets["status"] == "met"]["target"].tolist()
    missed = targets[targets["status"] == "missed"][["target", "margin"]]
    rel = name or study.as_posix()
    return "\n".join(
        [
            f"{START} — generated from {rel} by `python -m decodecliff.analysis.readme` -->",
            f"Measured on one {env['gpu']} ({env['gpu_capability']}), driver {env['driver']}, "
            f"torch {env['torch']}, Triton {env['triton']}, {measured_at(commits, rel)}; "
            f"the full report is [`{rel}/report.html`]({rel}/report.html).",
            "",
            "**End to end** (synthetic `kimi-k2-tp8-rank`, 16-token verify steps: verify steps "
            f"per second on the client's clock and the speedup over the Triton server "
            f"`{baseline}`; with random weights no draft token is accepted, so tok/s are the same "
            f"numbers; {counts}):",
            "",
            markdown_table(headline),
            "",
            "**Attention per layer** (8 heads, page size 1 scattered):",
            "",
            markdown_table(kernels),
            "",
            "**Targets**: met: "
            + ("; ".join(met) or "none")
            + ". Missed: "
            + "; ".join(f"{t} ({m})" for t, m in missed.itertuples(index=False))
            + f". Why, and what would close them: [`{rel}/NOTES.md`]({rel}/NOTES.md).",
            END,
        ]
    )


def update(readme: Path, study: Path) -> None:
    text = readme.read_text()
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{readme}: no headline markers ({START} ... {END})")
    readme.write_text(pattern.sub(lambda _: section(study), text))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("study", type=Path, help="a published study folder")
    p.add_argument("readme", type=Path)
    args = p.parse_args(argv)
    update(args.readme, args.study)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
