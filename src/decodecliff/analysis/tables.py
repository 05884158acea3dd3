"""Derived tables: speedups, the headline tables and the lists of points that did not run."""

from __future__ import annotations

import pandas as pd

KERNEL_KEYS = ["heads", "mode", "q_len", "page_size", "batch", "ctx"]
NOT_OK_COLUMNS = {
    "kernels": ["backend", "triton_config", "mode", "q_len", "heads", "page_size", "ctx"],
    "sweep": ["server", "backend", "requested_ctx"],
}


def ok(df: pd.DataFrame) -> pd.DataFrame:
    """The points that produced a number."""
    return df[df["status"] == "ok"] if len(df) else df


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
    cand = good[good["backend"] == candidate]
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


def key_contexts(available, wanted=None, most: int = 5) -> list[int]:
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
        return f"{ctx / 1000:.0f}k"
    return str(ctx)


def _cell(row: pd.Series, value: str, fmt: str) -> str:
    if row["status"] != "ok":
        return str(row["status"])
    return "–" if pd.isna(row[value]) else format(row[value], fmt)


def kernel_headline(
    kernels: pd.DataFrame, contexts: list[int], heads: int | None = None
) -> pd.DataFrame:
    """ms per layer per head count, mode, backend and page size at the key contexts.

    Every head count that ran (8 = one TP8 rank, 64 = TP1), or only ``heads`` when given.
    """
    if kernels.empty or not contexts:
        return pd.DataFrame()
    df = kernels[kernels["ctx"].isin(contexts)].copy()
    if heads is not None:
        df = df[df["heads"] == heads]
    df["value"] = df.apply(lambda r: _cell(r, "ms", ".3g"), axis=1)
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
    """The server configuration the others are compared to: ``name``, else the Triton one."""
    servers = list(dict.fromkeys(sweep["server"])) if len(sweep) else []
    if name:
        if name not in servers:
            raise ValueError(f"baseline server {name!r} not in the sweep results {servers}")
        return name
    triton = [s for s in servers if (sweep.loc[sweep["server"] == s, "backend"] == "triton").any()]
    return triton[0] if triton else None


def sweep_speedup(sweep: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """Decode tok/s of every server over the baseline server's at the same requested context."""
    cols = ["server", "requested_ctx", "status", "decode_tok_s"]
    if baseline is None or sweep.empty:
        return pd.DataFrame(columns=cols + ["baseline_decode_tok_s", "speedup"])
    base = sweep.loc[sweep["server"] == baseline, ["requested_ctx", "status", "decode_tok_s"]]
    base = base.rename(
        columns={"status": "baseline_status", "decode_tok_s": "baseline_decode_tok_s"}
    )
    out = sweep[cols].merge(base, on="requested_ctx", how="left")
    out["speedup"] = out["decode_tok_s"] / out["baseline_decode_tok_s"]
    return out[out["server"] != baseline].reset_index(drop=True)


def sweep_headline(sweep: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """Per context: each server's decode tok/s, then each one's speedup over the baseline."""
    if sweep.empty:
        return pd.DataFrame()
    df = sweep.copy()
    df["value"] = df.apply(lambda r: _cell(r, "decode_tok_s", ".3g"), axis=1)
    servers = list(dict.fromkeys(df["server"]))
    table = df.pivot_table(
        index="requested_ctx", columns="server", values="value", aggfunc="first", sort=True
    )[servers]
    table.columns = [f"{s} decode tok/s" for s in servers]
    speed = sweep_speedup(sweep, baseline)
    for server in servers:
        if server == baseline:
            continue
        s = speed[speed["server"] == server].set_index("requested_ctx")["speedup"]
        table[f"{server} vs {baseline}"] = s.reindex(table.index).map(
            lambda v: "–" if pd.isna(v) else f"{v:.3g}x"
        )
    table.index = [f"{ctx_label(c)} ({int(c):,})" for c in table.index]
    table.index.name = "context (tokens)"
    return table
