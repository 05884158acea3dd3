"""Derived tables: speedups, the headline tables and the lists of points that did not run."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from ..engine.config import DEFAULT_GEMM, gemm_label
from . import floors

KERNEL_KEYS = ["heads", "mode", "q_len", "page_size", "batch", "ctx"]
NOT_OK_COLUMNS = {
    "kernels": ["backend", "triton_config", "mode", "q_len", "heads", "page_size", "ctx"],
    "sweep": ["server", "backend", "requested_ctx"],
}


def ok(df: pd.DataFrame) -> pd.DataFrame:
    """The points that produced a number."""
    return df[df["status"] == "ok"] if len(df) else df


def as_run(df: pd.DataFrame, backend: str) -> pd.DataFrame:
    """The backend's points as the engine runs it: its unlabelled series ("custom": the variant
    its auto rule picks) where it has one, else every series (the Triton baseline's configs)."""
    rows = df[df["backend"] == backend] if len(df) else df
    own = rows[rows["series"] == backend] if "series" in rows else rows
    return own if len(own) else rows


def not_ok(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Failed and skipped points with their reasons ('kernels' or 'sweep' columns)."""
    cols = [c for c in NOT_OK_COLUMNS[kind] if c in df] + ["status", "reason"]
    if not len(df):
        return pd.DataFrame(columns=cols)
    return df.loc[df["status"] != "ok", cols].reset_index(drop=True)


def mode_order(kernels: pd.DataFrame) -> list[str]:
    """Modes from plain decode to the largest verify (by query tokens per request)."""
    q = kernels.groupby("mode")["q_len"].max().sort_values(kind="stable")
    return list(q.index)


def kernel_speedup(
    kernels: pd.DataFrame, baseline: str = "triton", candidate: str = "custom"
) -> pd.DataFrame:
    """``candidate`` over each ``baseline`` series at equal shape, page size and context."""
    good = ok(kernels)
    base = good[good["backend"] == baseline]
    cand = ok(as_run(kernels, candidate))  # auto that failed is not replaced by a pinned variant
    cols = KERNEL_KEYS + ["baseline", "baseline_ms", "candidate", "candidate_ms", "speedup"]
    if base.empty or cand.empty:
        return pd.DataFrame(columns=cols)
    merged = cand[KERNEL_KEYS + ["series", "ms"]].merge(
        base[KERNEL_KEYS + ["series", "ms"]], on=KERNEL_KEYS, suffixes=("_c", "_b")
    )
    merged = merged.rename(
        columns={"series_b": "baseline", "ms_b": "baseline_ms", "series_c": "candidate"}
    ).rename(columns={"ms_c": "candidate_ms"})
    merged["speedup"] = merged["baseline_ms"] / merged["candidate_ms"]
    return merged[cols].sort_values(KERNEL_KEYS).reset_index(drop=True)


def key_contexts(
    available: Iterable[float], wanted: Iterable[int] | None = None, most: int = 5
) -> list[int]:
    """The contexts to tabulate: the wanted ones that ran, else a spread ending at the largest."""
    have = sorted({int(c) for c in available})
    picked = [c for c in (wanted or []) if c in have]
    if picked or not have:
        return picked
    if len(have) <= most:
        return have
    step = (len(have) - 1) / (most - 1)
    return sorted({have[round(i * step)] for i in range(most)})


def ctx_label(ctx: float) -> str:
    """1024 -> '1k', 185000 -> '185k', 131072 and 128000 -> '128k': contexts as people say them."""
    ctx = int(ctx)
    if ctx >= 1000 and ctx % 1000 == 0:
        return f"{ctx // 1000}k"
    if ctx >= 1000 and ctx % 1024 == 0:
        return f"{ctx // 1024}k"
    if ctx >= 1000:
        return f"{ctx / 1000:.0f}k" if ctx >= 9500 else f"{ctx / 1000:.1f}k"
    return str(ctx)


def listed(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" and {items[-1]}"


def num(value: float | None) -> str:
    """A rate, a time or a ratio as people read it: 147, 44.8, 0.546, 1,817 (not 1.82e+03), and
    "–" where none was measured."""
    if value is None or pd.isna(value):
        return "–"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def times(ratio: float) -> str:
    """'84x', '1.73x', '0.967x'; a lead of under 0.5% keeps the digits that show it ('1.004x',
    not '1x'). Three figures below 10x: two would print a 5% lead as '1.1x' and 1.97x as '2x'.
    Every speedup and ratio the analysis prints with an 'x' is worded here, but a target's
    measured value (targets._measured), which keeps the digits that tell it from its threshold."""
    if ratio >= 10:
        return f"{ratio:,.0f}x"
    return f"{ratio:.4g}x" if f"{ratio:.3g}" == "1" else f"{ratio:.3g}x"


def _cell(row: pd.Series, value: str) -> str:
    return num(row[value]) if row["status"] == "ok" else str(row["status"])


# A kernel time whose repeats spread wider than this (half of slowest - fastest, over the median)
# shows its range: a shared CPU's times move; a GPU's replays agree within a few percent.
SPREAD_SHOWN = 0.1


def _ms_cell(row: pd.Series) -> str:
    """ms per layer, as 'median (min–max)' where the repeats spread past SPREAD_SHOWN."""
    lo, hi = row.get("ms_min"), row.get("ms_max")
    known = row["status"] == "ok" and pd.notna(lo) and pd.notna(hi)  # older files lack them
    wide = known and (hi - lo) / 2 > SPREAD_SHOWN * row["ms"]
    return spread(row, "ms") if wide else _cell(row, "ms")


def kernel_headline(
    kernels: pd.DataFrame, contexts: list[int], heads: int | None = None
) -> pd.DataFrame:
    """ms per layer per head count, mode, backend and page size at the key contexts, with each
    time's range where it spreads past SPREAD_SHOWN.

    Every head count that ran (8 = one TP8 rank, 64 = TP1), or only ``heads`` when given.
    """
    if kernels.empty or not contexts:
        return pd.DataFrame()
    df = kernels[kernels["ctx"].isin(contexts)].copy()
    if heads is not None:
        df = df[df["heads"] == heads]
    df["value"] = df.apply(_ms_cell, axis=1)
    df["context"] = df["ctx"].map(ctx_label)
    order = {m: i for i, m in enumerate(mode_order(kernels))}
    df["_mode"] = df["mode"].map(order)
    df = df.sort_values(["heads", "_mode", "backend", "series", "page_size", "ctx"])
    table = df.pivot_table(
        index=["heads", "mode", "q_len", "series", "page_size"],
        columns="context",
        values="value",
        aggfunc="first",
        sort=False,
    )
    table = table[[ctx_label(c) for c in contexts if ctx_label(c) in table.columns]]
    table.columns.name = "ms per layer, context:"
    return table


def baseline_server(sweep: pd.DataFrame, name: str | None = None) -> str | None:
    """The one server configuration a table's speedups are over (sweep_speedup): ``name``, else
    a Triton server comparable to the servers the headline compares. Speedups are taken only at
    equal streams, so it is one of one stream per round, as those servers are (a Triton server
    of several streams would leave them all without a speedup), without defragmentation, and
    with CUDA graphs where one ran, as SGLang serves and as headline.baseline_server picks; the
    first in the table's order (by name) among equals, any Triton server where none is one
    stream. One baseline for every row: an eager server's speedup is over it too, which is why
    the tables name it; None where no Triton server ran."""
    servers = list(dict.fromkeys(sweep["server"])) if len(sweep) else []
    if name:
        if name not in servers:
            raise ValueError(f"baseline server {name!r} not in the sweep results {servers}")
        return name
    triton = [s for s in servers if (sweep.loc[sweep["server"] == s, "backend"] == "triton").any()]
    if not triton:
        return None
    streams, defrag, graphs = (
        _concurrency(sweep),
        server_flags(sweep, "defrag"),
        server_flags(sweep, "cuda_graph"),
    )
    # min keeps the first of equals: the table's order
    return min(triton, key=lambda s: (streams.get(s, 1) != 1, defrag[s], not graphs[s]))


def comparable(sweep: pd.DataFrame) -> pd.DataFrame:
    """The rows of servers run as the headline compares them: one stream per round, without
    defragmentation (studies that predate either setting ran that way)."""
    if "defrag" in sweep:
        sweep = sweep[~sweep["defrag"].map(flag)]
    if "concurrency" in sweep:
        sweep = sweep[sweep["concurrency"].fillna(1) == 1]
    return sweep


def flag(value: object) -> bool:
    """A setting's truth as a results table holds it (a bool, a number, 'true' text or NaN)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value) and not pd.isna(value)


def server_flags(sweep: pd.DataFrame, column: str) -> dict[str, bool]:
    """Server -> whether its setting ``column`` is on (False where the table does not say)."""
    if column not in sweep:
        return {s: False for s in dict.fromkeys(sweep["server"])}
    first = sweep.groupby("server", sort=False)[column].first()
    return {s: flag(v) for s, v in first.items()}


# The primary end-to-end number: verify steps per second on the client's clock (tokens/s are
# these steps times the tokens each emits: tokens_said).
PRIMARY = "verify_steps_s_client"
PRIMARY_LABEL = "verify steps/s"
FLOOR_LABEL = f"floor {PRIMARY_LABEL}"
NO_DRAFT = "random weights accept no draft"  # every point drawn reads 1 token per verify step


def accepted_per_step(sweep: pd.DataFrame) -> pd.Series:
    """Tokens per verify step (``spec_accept_length``: the bonus token included, so 1 is no
    draft token accepted) of the points that give a verify-step rate (ok, ``PRIMARY`` recorded),
    those the figures draw; empty where none records it."""
    good = ok(sweep)
    if "spec_accept_length" not in good or PRIMARY not in good:
        return pd.Series(dtype=float)
    good = good.dropna(subset=[PRIMARY])
    return pd.to_numeric(good["spec_accept_length"], errors="coerce").dropna()


def acceptance_said(sweep: pd.DataFrame) -> str | None:
    """What the points drawn show of drafts: 'random weights accept no draft' where each reads 1
    token per verify step (as ``num`` prints it: a draft in a thousand steps is none), the
    tokens per verify step they measured otherwise, None where none records it. The one rule the
    report, its figures and the notes say it by."""
    accepted = accepted_per_step(sweep)
    if accepted.empty:
        return None
    if all(num(a) == "1" for a in accepted):
        return NO_DRAFT
    lo, hi = num(accepted.min()), num(accepted.max())
    return f"measured: {lo if lo == hi else f'{lo}–{hi}'} tokens per verify step"


def tokens_said(sweep: pd.DataFrame) -> str:
    """A sentence (no final stop) on how the points' tokens/s relate to their verify steps/s, as
    their recorded acceptance shows it (acceptance_said): equal where every point accepted no
    draft, verify steps/s times the tokens per verify step they measured where they accepted
    more, and that they may differ where none records its acceptance."""
    said = acceptance_said(sweep)
    if said is None:
        return (
            "The points record no acceptance (tokens per verify step), so their tokens/s may "
            "differ from their verify steps/s"
        )
    if said == NO_DRAFT:
        return (
            f"{said[0].upper()}{said[1:]} (1 token per verify step, the bonus token alone), so "
            "tokens/s equal verify steps/s here; a real drafter's acceptance length multiplies "
            "every server alike"
        )
    return (
        f"Drafts are accepted ({said}, the bonus token included), so tokens/s are verify "
        "steps/s times that"
    )


def spread(row: pd.Series, key: str) -> str:
    """'median (min–max)' of a point's requests, the median alone for one request or a tie."""
    if row["status"] != "ok":
        return str(row["status"])
    value = row.get(key)
    if value is None or pd.isna(value):
        return "–"
    lo, hi = row.get(f"{key}_min"), row.get(f"{key}_max")
    text = num(value)
    if lo is None or hi is None or pd.isna(lo) or pd.isna(hi):
        return text
    lo_text, hi_text = num(lo), num(hi)
    return text if lo_text == hi_text else f"{text} ({lo_text}–{hi_text})"


def sweep_speedup(sweep: pd.DataFrame, baseline: str | None, metric: str = PRIMARY) -> pd.DataFrame:
    """``metric`` (medians) of every server over the baseline server's at the same requested
    context and concurrency (streams at once); other concurrencies get no speedup."""
    cols = ["server", "requested_ctx", "status", metric]
    out_cols = cols + [f"baseline_{metric}", "speedup"]
    if baseline is None or sweep.empty:
        return pd.DataFrame(columns=out_cols)
    k = _concurrency(sweep)
    base = sweep.loc[sweep["server"] == baseline, ["requested_ctx", "status", metric]]
    base = base.rename(columns={"status": "baseline_status", metric: f"baseline_{metric}"})
    out = sweep[cols].merge(base, on="requested_ctx", how="left")
    out["speedup"] = out[metric] / out[f"baseline_{metric}"]
    # a failed point may carry a failing request's partial rate: no speedup from it either side
    out.loc[(out["status"] != "ok") | (out["baseline_status"] != "ok"), "speedup"] = float("nan")
    same = k.reindex(out["server"]).to_numpy() == k.get(baseline, 1)
    out.loc[~same, "speedup"] = float("nan")
    return out[out["server"] != baseline][out_cols].reset_index(drop=True)


def _concurrency(sweep: pd.DataFrame) -> pd.Series:
    """Streams per round of each server (1 for studies that predate the setting)."""
    if "concurrency" not in sweep:
        return pd.Series(1, index=list(dict.fromkeys(sweep["server"])))
    return sweep.groupby("server", sort=False)["concurrency"].max().fillna(1).astype(int)


def sweep_headline(
    sweep: pd.DataFrame, baseline: str | None, ceilings: Mapping | None = None
) -> pd.DataFrame:
    """A row per server, fastest at the longest context first, under the row of the step's
    floor (given the ceilings); a column per context. A cell is the server's verify steps/s,
    median (min–max) over its requests, then after a '·' its speedup over the baseline's
    median at the same context and concurrency."""
    if sweep.empty:
        return pd.DataFrame()
    k = _concurrency(sweep)
    speed = sweep_speedup(sweep, baseline).set_index(["server", "requested_ctx"])["speedup"]
    keys = pd.MultiIndex.from_frame(sweep[["server", "requested_ctx"]])
    texts = sweep.apply(lambda r: spread(r, PRIMARY), axis=1)
    cells = [
        text if pd.isna(x) else f"{text} · {times(x)}"
        for text, x in zip(texts, speed.reindex(keys), strict=True)
    ]
    table = sweep.assign(cell=cells).pivot_table(
        index="server", columns="requested_ctx", values="cell", aggfunc="first", sort=True
    )
    table = table.reindex(_fastest_last_first(sweep)).fillna("not in the sweep")
    table.index = [s if k.get(s, 1) == 1 else f"{s} ({k[s]} streams)" for s in table.index]
    floor = floors.steps_s(sweep, ceilings or {})
    if not floor.empty:
        row = floor.reindex(table.columns).map(num)
        table = pd.concat([row.to_frame(FLOOR_LABEL).T, table])
    table.columns = [f"{ctx_label(c)} ({int(c):,})" for c in table.columns]
    table.index.name = "server"
    return table


def _fastest_last_first(sweep: pd.DataFrame) -> list[str]:
    """The servers by their medians from the longest context down: the fastest at the longest
    context first, ties and servers without a point there ordered by the next one, and so on."""
    rates = ok(sweep).pivot_table(
        index="server", columns="requested_ctx", values=PRIMARY, aggfunc="first"
    )
    rates = rates.reindex(list(dict.fromkeys(sweep["server"])))
    longest_first = sorted(rates.columns, reverse=True)
    if not longest_first:
        return list(rates.index)
    order = rates.sort_values(longest_first, ascending=False, na_position="last", kind="stable")
    return list(order.index)


def short_commits(revs: Iterable[str | float | None]) -> list[str]:
    """The distinct commits among ``revs`` as sorted 7-digit hashes ('-dirty' marks dropped)."""
    return sorted({str(r)[:7] for r in revs if pd.notna(r)})


def counts(sweep: pd.DataFrame) -> str:
    """What the end-to-end numbers rest on: requests and verify steps per point, as a sentence."""
    good = ok(sweep)
    if good.empty:
        return "no end-to-end point ran"
    n = good["requests"] if "requests" in good else pd.Series(1, index=good.index)
    steps = good["verify_steps"] if "verify_steps" in good else pd.Series(dtype=float)

    def span(v: pd.Series, what: str) -> str:
        v = v.dropna().astype(int)
        if v.empty:
            return f"{what}s not reported"
        lo, hi = int(v.min()), int(v.max())
        return f"{lo} {what}{'' if hi == 1 else 's'}" if lo == hi else f"{lo}–{hi} {what}s"

    return (
        f"each point rests on n = {span(n, 'request')} and {span(steps, 'verify step')} "
        "(summed over its requests); a cell is the median, the min–max over the requests in "
        "brackets"
    )


LONG_COLUMNS = {
    "requested_ctx": "context",
    "concurrency": "streams",
    "verify_steps_s_client": "verify steps/s (client)",
    "verify_steps_s_server": "verify steps/s (server step time)",
    "decode_tok_s": "tok/s",
    "round_tok_s": "end-to-end tok/s, all streams",
    "tok_s_at_tau": "tok/s at tau",
    "ttft_s": "TTFT (s)",
    "requests": "requests",
    "verify_steps": "verify steps",
    "defrag_runs": "defrag runs",
    "defrag_pages_moved": "pages moved",
    "cuda_graphs_captured": "graphs captured",
}


def sweep_long(sweep: pd.DataFrame, tau: float) -> pd.DataFrame:
    """One line per server and context with every end-to-end number and what it rests on."""
    if sweep.empty:
        return pd.DataFrame(columns=["server", *LONG_COLUMNS.values()])
    df = sweep.copy()
    df["tok_s_at_tau"] = df[PRIMARY] * tau
    out = pd.DataFrame({"server": df["server"]})
    for key, label in LONG_COLUMNS.items():
        if key in ("verify_steps_s_client", "verify_steps_s_server", "decode_tok_s", "ttft_s"):
            out[label] = df.apply(lambda r, k=key: spread(r, k), axis=1)
        elif key == "tok_s_at_tau":  # a failed point's partial rate is no rate: its status
            out[f"tok/s at tau={tau:g}"] = df.apply(lambda r: _cell(r, "tok_s_at_tau"), axis=1)
        elif key == "requested_ctx":
            out[label] = df[key].map(ctx_label)
        elif key == "round_tok_s":  # a round's tokens over its wall time, prefill included
            col = df[key] if key in df else pd.Series(None, index=df.index, dtype=float)
            out[label] = [num(v) for v in col]
        else:
            col = df[key] if key in df else pd.Series(None, index=df.index)
            out[label] = ["–" if pd.isna(v) else str(int(v)) for v in col]
    return out.reset_index(drop=True)


PEERS = ("sglang", "flashinfer", "cublas")  # what a user could pick instead of the custom kernel


def kernel_vs_peers(kernels: pd.DataFrame, candidate: str = "custom") -> pd.DataFrame:
    """Per shape and context: ``candidate`` beside the fastest peer series, each against the floor.

    ``*_of_floor`` is floor ms / ms (1 = at the roofline floor); ``peer_over_custom`` > 1 means
    the candidate is faster. Points where no peer or no candidate ran are left out.
    """
    good = ok(kernels)
    cols = KERNEL_KEYS + ["floor_ms", "custom_ms", "custom_of_floor", "best_peer", "peer_ms"]
    cols += ["peer_of_floor", "peer_over_custom"]
    cand = ok(as_run(kernels, candidate))
    peers = good[good["backend"].isin(PEERS)].reset_index(drop=True)  # idxmin needs unique labels
    if cand.empty or peers.empty:
        return pd.DataFrame(columns=cols)
    best = peers.loc[peers.groupby(KERNEL_KEYS)["ms"].idxmin(), KERNEL_KEYS + ["series", "ms"]]
    merged = cand[KERNEL_KEYS + ["floor_ms", "ms"]].merge(best, on=KERNEL_KEYS, suffixes=("", "_p"))
    merged = merged.rename(columns={"ms": "custom_ms", "series": "best_peer", "ms_p": "peer_ms"})
    merged["custom_of_floor"] = merged["floor_ms"] / merged["custom_ms"]
    merged["peer_of_floor"] = merged["floor_ms"] / merged["peer_ms"]
    merged["peer_over_custom"] = merged["peer_ms"] / merged["custom_ms"]
    return merged[cols].sort_values(KERNEL_KEYS).reset_index(drop=True)


def fidelity(kernels: pd.DataFrame, contexts: list[int]) -> pd.DataFrame:
    """The study's Triton baseline beside SGLang's own kernel as SGLang runs it, page size 1, per
    mode and head count at ``contexts``: ms per layer of each and baseline over SGLang (1 = the
    same; a table without SGLang's kernels is empty)."""
    pairs = {"decode": ("triton (grouped-sglang)", "sglang (decode-sglang)")}
    good = ok(kernels)
    good = good[(good["page_size"] == 1) & good["ctx"].isin(contexts)]
    rows = []
    for (mode, heads), df in good.groupby(["mode", "heads"], sort=False):
        ours, theirs = pairs.get(mode, (None, "sglang (extend)"))
        if ours is None:  # the Triton extend kernel in the block config of this GPU
            arch = sorted(s for s in set(df["series"]) if re.fullmatch(r"triton \(sm\d+\)", s))
            cap = df["gpu_capability"].dropna() if "gpu_capability" in df else pd.Series()
            native = f"triton ({str(cap.iloc[0]).replace('_', '')})" if len(cap) else None
            ours = native if native in arch else (arch[0] if arch else None)
        a = df[df["series"] == ours].set_index("ctx")["ms"]
        b = df[df["series"] == theirs].set_index("ctx")["ms"]
        for ctx in sorted(set(a.index) & set(b.index)):
            rows.append({
                "mode": mode, "heads": heads, "context": ctx_label(ctx), "baseline": ours,
                "baseline ms": a[ctx], "SGLang's kernel": theirs, "SGLang ms": b[ctx],
                "baseline / SGLang": a[ctx] / b[ctx],
            })  # fmt: skip
    return pd.DataFrame(rows)


def flashinfer_sm120(path: str | Path) -> str:
    """One sentence of FlashInfer's sm_120 build check (the kernels notebook's
    flashinfer_sm120.csv): how its fa2 MLA kernel configures itself within sm_120's shared
    memory, beside its configuration on sm_90 (an H100's or H200's 228 KB per SM)."""
    if not Path(path).is_file():
        return "FlashInfer's sm_120 build was not checked in this study."
    row = pd.read_csv(path).iloc[0]
    if row["status"] != "ok":
        return f"FlashInfer's sm_120 build check {row['status']}: {row['reason']}."
    sm120, h200 = json.loads(row["sm120_config"]), json.loads(row["h200_config"])
    fits = "fits" if row["fits"] else "does not fit"
    return (
        f"FlashInfer {row['flashinfer']}'s fa2 MLA kernel, compiled for sm_120 (no GPU needed), "
        f"configures itself to {_stages(sm120)} in {int(row['smem_per_block']):,} B of shared "
        f"memory per block ({fits} sm_120's {int(row['smem_limit_per_block']):,} B; "
        f"{int(row['registers'])} registers, {int(row['spill_bytes'])} B of spill); on sm_90 "
        f"(an H100's or H200's 228 KB per SM) it takes {_stages(h200)} in "
        f"{int(row['h200_smem_per_block']):,} B."
    )


def _stages(config: dict) -> str:
    stages = int(config["stages"])
    return f"{stages} stage{'s' if stages > 1 else ''} of {config['cta_tile_kv']}-token KV tiles"


def _recorded(sweep: pd.DataFrame, server: str, key: str) -> str | None:
    """What a server's first good point recorded under ``key`` (a string), else None."""
    good = ok(sweep)
    if key not in good:
        return None
    values = good.loc[good["server"] == server, key].dropna()
    return values.iloc[0] if len(values) and isinstance(values.iloc[0], str) else None


def server_gemm(sweep: pd.DataFrame, server: str) -> str:
    """The weight GEMMs' path a server recorded (``/get_server_info``'s gemm); the default where
    its points predate the record."""
    return _recorded(sweep, server, "gemm") or DEFAULT_GEMM


def engine_label(sweep: pd.DataFrame, server: str) -> str:
    """The engine bench's label of a custom server's configuration: "custom", its sm_120
    build's "custom (sm120)", and its weight GEMMs' path where the server recorded another than
    the default ("custom + fused GEMMs")."""
    model = _recorded(sweep, server, "model")
    label = f"custom ({model})" if model else "custom"
    return gemm_label(label, server_gemm(sweep, server))
