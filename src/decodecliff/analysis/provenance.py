"""Where the numbers came from: machine, versions, commit, and what ran where (or why not)."""

from __future__ import annotations

import pandas as pd

ENV_ROWS = [
    ("gpu", "GPU"),
    ("gpu_capability", "compute capability"),
    ("driver", "NVIDIA driver"),
    ("cuda_runtime", "CUDA (torch build)"),
    ("torch", "PyTorch"),
    ("triton", "Triton"),
    ("python", "Python"),
    ("cpu", "CPU"),
    ("cpu_count", "CPU cores"),
    ("host", "host"),
    ("git", "commit"),
]


def values(series: pd.Series | None) -> str:
    """The distinct non-null values, comma-separated ('none' when all are null)."""
    if series is None:
        return "–"
    vals = [str(v) for v in dict.fromkeys(series.dropna())]
    return ", ".join(vals) if vals else "none"


def environment(bench_env: dict, sweep: pd.DataFrame, build: dict | None = None) -> pd.DataFrame:
    """One row per property; a column per stage (kernel build, microbenchmark, end-to-end sweep)."""
    build_env = (build or {}).get("env") or {}
    rows = []
    for key, label in ENV_ROWS:
        rows.append(
            {
                "": label,
                "kernel build": values(pd.Series([build_env.get(key)])) if build_env else "–",
                "kernel microbenchmark": values(pd.Series([bench_env.get(key)])),
                "end-to-end sweep": values(sweep[key]) if key in sweep else "–",
            }
        )
    return pd.DataFrame(rows).set_index("")


def _reasons(group: pd.DataFrame) -> str:
    bad = group[group["status"] != "ok"]
    counts = bad.groupby(["status", "reason"], dropna=False).size()
    return "; ".join(f"{s} x{n}: {r}" for (s, r), n in counts.items()) or "–"


def _summary(df: pd.DataFrame, by: str, device: pd.Series) -> pd.DataFrame:
    df = df.assign(device=device)
    rows = []
    for name, g in df.groupby(by, sort=False):
        status = g["status"].value_counts()
        rows.append(
            {
                by: name,
                "ran on": values(g["device"]),
                "ok": int(status.get("ok", 0)),
                "failed": int(status.get("failed", 0)),
                "skipped": int(status.get("skipped", 0)),
                "why not": _reasons(g),
            }
        )
    return pd.DataFrame(rows)


def what_ran(kernels: pd.DataFrame, sweep: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per backend (microbenchmark) and per server configuration (sweep): device and outcomes."""
    out = {}
    if len(kernels):
        device = kernels["device"].fillna("cpu") if "device" in kernels else "unknown"
        out["kernel microbenchmark"] = _summary(kernels, "backend", device)
    if len(sweep):
        gpu = sweep["gpu"] if "gpu" in sweep else pd.Series(None, index=sweep.index)
        out["end-to-end sweep"] = _summary(sweep, "server", gpu.fillna("cpu"))
    return out


def build_facts(build: dict) -> pd.DataFrame:
    """The kernel build's flat facts (compiler, targets requested and found in the SASS)."""
    skip = {"env", "schema", "log", "command"}
    rows = [
        (k, ", ".join(map(str, v)) if isinstance(v, list) else v)
        for k, v in build.items()
        if k not in skip
        and not isinstance(v, dict)
        and not (isinstance(v, list) and any(isinstance(x, dict | list) for x in v))
    ]
    return pd.DataFrame(rows, columns=["item", "value"]).set_index("item")


def build_kernels(build: dict) -> pd.DataFrame:
    """Per kernel and architecture: registers, shared memory, spills (ptxas) and the main loop's
    instruction mix (kernels/sass.py, as ``loop <count>`` columns), when recorded."""
    records = build.get("kernels")
    if not isinstance(records, list) or not records:
        return pd.DataFrame()
    rows = []
    for k in records:
        loop = k.get("main_loop") or {}
        rows.append({**{key: v for key, v in k.items() if key != "main_loop"},
                     **{f"loop {key}": v for key, v in loop.items()}})  # fmt: skip
    return pd.DataFrame(rows)
