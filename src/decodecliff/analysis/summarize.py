"""Raw result JSON -> tidy tables: one row per kernel point, one row per sweep point.

Failed and skipped points stay in the tables with their status and reason: a missing number is a
result too. ``python -m decodecliff.analysis.summarize --help`` writes the tables of one study.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from decodecliff.sweep import metrics as sweep_metrics

KERNEL_SCHEMA = "decodecliff.kernel-bench/"
SWEEP_SCHEMA = "decodecliff.sweep-point/"
SERVER_KEYS = ("backend", "page_size", "cuda_graph", "defrag", "spec", "gemm")
ENV_KEYS = ("gpu", "gpu_capability", "driver", "torch", "triton", "cuda_runtime", "git", "host")
# metrics whose spread over a point's requests the summary gives (as <key>_min, <key>_max)
SPREAD_KEYS = (
    "verify_steps_s_client", "verify_steps_s_server", "decode_tok_s", "ttft_s", "prefill_tok_s",
    "itl_ms_p50",
)  # fmt: skip
# the metrics every sweep table has, NaN where no point measured them: a study whose every point
# failed or was skipped still has the columns the tables and figures read
METRIC_KEYS = (
    *sweep_metrics.SUMMARY_KEYS, "verify_steps", "spec_verify_ct", "round_tok_s",
    *(f"{k}_{end}" for k in SPREAD_KEYS for end in ("min", "max")),
)  # fmt: skip
AFTER_KEYS = ("defrag_runs", "defrag_pages_moved", "request_fragmentation", "cuda_graphs_captured")
_CTX_FILE = re.compile(r"^ctx(\d+)\.json$")


class ResultError(ValueError):
    """A result file is missing, unreadable or not of the expected schema."""


def read_json(path: str | Path, schema_prefix: str | None = None) -> dict:
    """The parsed file, checked against the schema tag when one is given."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ResultError(f"{path}: no such result file") from exc
    except json.JSONDecodeError as exc:
        raise ResultError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ResultError(f"{path}: expected a JSON object, got {type(data).__name__}")
    schema = str(data.get("schema", ""))
    if schema_prefix and not schema.startswith(schema_prefix):
        raise ResultError(f"{path}: schema {schema!r}, expected {schema_prefix}N")
    return data


def _env_columns(env: dict | None) -> dict:
    env = env or {}
    return {k: env.get(k) for k in ENV_KEYS}


def ceilings_of(kernels: pd.DataFrame) -> dict:
    """The measured ceilings a kernel table carries on every row (empty without them)."""
    keys = [k for k in ("copy_gbs", "matmul_tflops") if k in kernels]
    rows = kernels[keys].dropna() if keys else pd.DataFrame()
    return {k: float(rows[k].iloc[0]) for k in keys} if len(rows) else {}


def kernel_table(bench: dict) -> pd.DataFrame:
    """One row per microbenchmark point, with the machine's measured ceilings on every row."""
    ceilings = bench.get("ceilings") or {}
    env = _env_columns(bench.get("env"))
    rows = []
    for point in bench.get("points", []):
        row = dict(point)
        config = row.get("triton_config")
        row["series"] = f"{row['backend']} ({config})" if config else row["backend"]
        row["copy_gbs"] = ceilings.get("copy_gbs")
        row["matmul_tflops"] = ceilings.get("matmul_tflops")
        row["device"] = ceilings.get("device")
        rows.append(row | env)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    for col in ("status", "reason", "triton_config"):
        if col not in df:
            df[col] = None
    df["status"] = df["status"].fillna("ok")
    return df


def _server_meta(name: str, point: dict, servers: dict[str, dict]) -> dict:
    """Backend, page size, graphs, defrag, spec of a point's server: config first, then the file."""
    recorded = point.get("config") if isinstance(point.get("config"), dict) else {}
    extra = recorded.get("extra") if isinstance(recorded.get("extra"), dict) else {}
    info = point.get("server_info") if isinstance(point.get("server_info"), dict) else {}
    # the server's own description last: a study without its config still says what ran
    sources = [servers.get(name, {}), extra.get("server", {}), extra, recorded, info]
    meta = {}
    for key in SERVER_KEYS:
        value = next((s[key] for s in sources if isinstance(s, dict) and key in s), None)
        meta[key] = json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value
    detail = info.get("attention_backend_detail")  # what the server's backend says it ran
    meta["backend_variant"] = _variant(detail) if isinstance(detail, dict) else None
    # "sm120": the backend ran as configured on sm_120 (kernels/sm120_model.py)
    meta["model"] = detail.get("model") if isinstance(detail, dict) else None
    return meta


def _variant(detail: dict) -> str | None:
    """The kernel-bench label of what a backend ran: its ``variant``, else the older fields that
    named it (sglang's ``kernel``, triton's ``arch_config``)."""
    return detail.get("variant") or detail.get("kernel") or detail.get("arch_config")


def point_requests(point: dict) -> list[dict]:
    """The recorded requests of a point; a file of schema /1 held one, in its top-level fields."""
    if "requests" in point:
        return list(point["requests"])
    if point.get("status") != "ok":
        return []
    m = dict(point.get("metrics") or {})
    meta = point.get("meta_info") or {}
    m |= sweep_metrics.step_rates(m, sweep_metrics.server_figures(meta)[0])
    return [{"round": 0, "stream": 0, "error": None, "metrics": m, "meta_info": meta}]


def _spread(requests: list[dict]) -> dict:
    """min and max over the requests of each metric whose spread the report shows."""
    out = {}
    for key in SPREAD_KEYS:
        values = [r["metrics"].get(key) for r in requests if r["metrics"].get(key) is not None]
        out[f"{key}_min"] = min(values) if values else None
        out[f"{key}_max"] = max(values) if values else None
    return out


def _after_point(point: dict) -> dict:
    """What the server did during the point, from its info read afterwards (None: not read)."""
    after = point.get("server_info_after")
    if not isinstance(after, dict) or "invalid" in after:
        return dict.fromkeys(AFTER_KEYS)
    frag = after.get("fragmentation") if isinstance(after.get("fragmentation"), dict) else {}
    graphs = after.get("cuda_graphs_captured")
    return {
        "defrag_runs": frag.get("defrag_runs"),
        "defrag_pages_moved": frag.get("defrag_pages_moved"),
        "request_fragmentation": frag.get("request_fragmentation"),
        "cuda_graphs_captured": len(graphs) if isinstance(graphs, list) else None,
    }


def sweep_row(path: str | Path, servers: dict[str, dict] | None = None) -> dict:
    """One tidy row of a sweep point file results/sweep/{server}/ctx{N}.json.

    An ok point's numbers are medians over its requests, with min and max of the main ones
    (``SPREAD_KEYS``), ``requests`` and ``verify_steps`` saying what they rest on; a point of
    schema /1 had one request (``requests`` 1).
    """
    path = Path(path)
    point = read_json(path, SWEEP_SCHEMA)
    server = point.get("name") or path.parent.name  # the point's server configuration
    metrics = dict(point.get("metrics") or {})
    requests = point_requests(point)
    if point.get("status", "ok") == "ok" and requests:
        metrics = sweep_metrics.point_summary(requests) | {
            k: v for k, v in metrics.items() if k == "round_tok_s"
        }
        metrics |= _spread(requests)
    row = {
        "server": server,
        **_server_meta(server, point, servers or {}),
        "requested_ctx": point.get("requested_ctx"),
        "prompt_tokens": point.get("prompt_tokens", metrics.get("prompt_tokens")),
        "gen_tokens": point.get("gen_tokens"),
        "concurrency": point.get("concurrency", 1),
        "status": point.get("status", "ok"),
        "reason": point.get("reason"),
        "requests": len(requests),
    }
    for key, value in metrics.items():
        if key not in row and not isinstance(value, dict | list):
            row[key] = value
    info = point.get("server_info") if isinstance(point.get("server_info"), dict) else {}
    row |= {k: info.get(k) for k in ("preset", "num_layers", "vocab_size", "weight_bytes")}
    row["draft_tokens"] = info.get("speculative_num_draft_tokens")  # the step's floor
    row |= _after_point(point)
    row |= {"started_at": point.get("started_at"), "finished_at": point.get("finished_at")}
    return row | _env_columns(point.get("env")) | {"file": str(path)}


def request_rows(path: str | Path) -> list[dict]:
    """One tidy row per recorded request of a point file."""
    point = read_json(path, SWEEP_SCHEMA)
    server = point.get("name") or Path(path).parent.name
    rows = []
    for i, req in enumerate(point_requests(point)):
        row = {"server": server, "requested_ctx": point.get("requested_ctx"), "request": i}
        row |= {"round": req.get("round"), "stream": req.get("stream")}
        row |= {"status": "ok" if req.get("error") is None else "failed", "error": req.get("error")}
        metrics = {k: v for k, v in req["metrics"].items() if not isinstance(v, dict | list)}
        rows.append(row | metrics)
    return rows


def request_table(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Every recorded request of the given point files."""
    rows = [row for p in paths for row in request_rows(p)]
    return pd.DataFrame(rows, columns=None if rows else ["server", "requested_ctx", "request"])


def sweep_table(paths: Iterable[str | Path], servers: Sequence[dict] | None = None) -> pd.DataFrame:
    """One row per sweep point, ordered by server and context; ``ctx`` is the context it ran at."""
    by_name = {s["name"]: s for s in servers or []}
    df = pd.DataFrame([sweep_row(p, by_name) for p in paths])
    if df.empty:
        return pd.DataFrame(columns=["server", "requested_ctx", "ctx", "status", "reason"])
    df = df.assign(**{k: float("nan") for k in METRIC_KEYS if k not in df})
    # A failed point may never have built its prompt: place it at the context it asked for.
    df.insert(
        df.columns.get_loc("prompt_tokens") + 1,
        "ctx",
        df["prompt_tokens"].fillna(df["requested_ctx"]),
    )
    return df.sort_values(["server", "requested_ctx"], kind="stable").reset_index(drop=True)


def sweep_files(sweep_dir: str | Path) -> list[Path]:
    """Every results/sweep/{server}/ctx{N}.json under ``sweep_dir``."""
    return sorted(p for p in Path(sweep_dir).glob("*/ctx*.json") if _CTX_FILE.match(p.name))


def reference_table(path: str | Path) -> tuple[pd.DataFrame, str]:
    """The published reference table and its source (the file's leading ``#`` lines)."""
    path = Path(path)
    if not path.is_file():
        raise ResultError(f"{path}: reference table not found")
    lines = path.read_text().splitlines()
    source = " ".join(ln.lstrip("#").strip() for ln in lines if ln.startswith("#"))
    df = pd.read_csv(path, comment="#")
    missing = {"actual_ctx", "decode_tok_s"} - set(df.columns)
    if missing:
        raise ResultError(f"{path}: reference table lacks columns {sorted(missing)}")
    return df, source


def write_table(df: pd.DataFrame, csv_path: str | Path, parquet: bool = True) -> list[Path]:
    """Write ``df`` as CSV (and Parquet beside it when pyarrow is installed)."""
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(csv_path, index=False)
    written = [csv_path]
    if parquet:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            return written
        pq = csv_path.with_suffix(".parquet")
        # Mixed None/str/number object columns do not round-trip; Parquet gets them as text.
        obj = [c for c in df.columns if df[c].dtype == object]
        df.astype({c: "string" for c in obj}).to_parquet(pq, index=False)
        written.append(pq)
    return written


@dataclass
class Study:
    """The result tables of one study folder (this run's results/ or a published copy)."""

    root: Path
    kernels: pd.DataFrame
    sweep: pd.DataFrame
    build: dict = field(default_factory=dict)
    bench_env: dict = field(default_factory=dict)
    ceilings: dict = field(default_factory=dict)


def study_title(name: str, sweep: pd.DataFrame, published: bool = False) -> str:
    """How figures and tables name a study: 'embedded-cpu (CPU)', 'published h200 (NVIDIA H200)'."""
    gpus = [str(g) for g in dict.fromkeys(sweep["gpu"].dropna())] if "gpu" in sweep else []
    return f"{'published ' if published else ''}{name} ({', '.join(gpus) or 'CPU'})"


def load_study(root: str | Path) -> Study:
    """A study folder's tables, computed from its raw JSON (summary/*.csv where there is none)."""
    root = Path(root)
    if not root.is_dir():
        raise ResultError(f"{root}: study folder not found")
    bench_path, build_path = root / "kernels" / "bench.json", root / "build" / "build.json"
    bench = read_json(bench_path, KERNEL_SCHEMA) if bench_path.is_file() else {}
    # The raw files win: a study published by an older analysis reads as this one computes it.
    if bench or not (root / "summary" / "kernels.csv").is_file():
        kernels = kernel_table(bench)
    else:
        kernels = pd.read_csv(root / "summary" / "kernels.csv")
    points = sweep_files(root / "sweep")
    if points or not (root / "summary" / "sweep.csv").is_file():
        sweep = sweep_table(points)
    else:
        sweep = pd.read_csv(root / "summary" / "sweep.csv")
    build = read_json(build_path) if build_path.is_file() else {}
    return Study(root, kernels, sweep, build, bench.get("env") or {}, bench.get("ceilings") or {})


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="decodecliff-summarize", description=__doc__)
    ap.add_argument("--bench", type=Path, help="results/kernels/bench.json")
    ap.add_argument("--sweep", type=Path, nargs="*", default=[], help="sweep point files")
    ap.add_argument("--sweep-dir", type=Path, help="or: every {server}/ctx{N}.json under this")
    ap.add_argument("--servers", default="[]", help="JSON list of the config's server entries")
    ap.add_argument("--out", type=Path, required=True, help="folder for kernels.csv, sweep.csv")
    ap.add_argument("--no-parquet", action="store_true")
    args = ap.parse_args(argv)
    try:
        servers = json.loads(args.servers)
        paths = list(args.sweep) + (sweep_files(args.sweep_dir) if args.sweep_dir else [])
        kernels = kernel_table(read_json(args.bench, KERNEL_SCHEMA)) if args.bench else None
        sweep = sweep_table(paths, servers)
    except (ResultError, json.JSONDecodeError) as exc:
        print(f"summarize: {exc}", file=sys.stderr)
        return 1
    if kernels is not None:
        for p in write_table(kernels, args.out / "kernels.csv", not args.no_parquet):
            print(f"wrote {p} ({len(kernels)} rows)")
    for p in write_table(sweep, args.out / "sweep.csv", not args.no_parquet):
        print(f"wrote {p} ({len(sweep)} rows)")
    requests = request_table(paths)
    for p in write_table(requests, args.out / "requests.csv", parquet=False):
        print(f"wrote {p} ({len(requests)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
