"""The persistent MLP kernel (kernels/csrc/mlp_stream.cu) checked and timed beside cuBLAS (GPU).

    python scripts/mlp_stream_bench.py --out DIR [--layers 8] [--repeats 30]

Builds the kernel for this GPU (with and without the down weights' prefetch across the grid
barrier), checks it against float64 on random data (outputs poisoned with NaN first, two calls
bit-identical, the counters left ready: a second call gives the same), over several shapes, row
counts and grids, then times one layer's MLP at Kimi K2's rank shapes (16 rows, hidden 7168,
inter 2304) as the engine runs it with cuBLAS (gate|up GEMM, silu * up, down GEMM; weights [K, N]
and [N, K]) and as the one kernel, each over ``--layers`` layers of distinct weights captured in a
CUDA graph (the L2 flushed before each replay), beside the floor: the weights' bytes at the
measured copy rate. Prints a table; writes ``mlp_stream.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from decodecliff import envinfo
from decodecliff.bench import roofline, timing
from decodecliff.engine import fused
from decodecliff.engine.config import PRESETS
from decodecliff.kernels.build import CSRC, find_nvcc, nvcc_command

PTR, INT = ctypes.c_void_p, ctypes.c_int
SIGNATURE = [PTR] * 8 + [INT] * 4 + [PTR]
KIMI = PRESETS["kimi-k2-tp8-rank"]  # the timed shape: its hidden and MLP widths, 16 rows
HIDDEN, INTER, ROWS = KIMI.hidden, KIMI.mlp_dim, 16


def build(out: Path, defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    major, minor = torch.cuda.get_device_capability()
    lib = out / ("libmlp_stream" + "".join(f"_{d.lower()}" for d in defines) + ".so")
    cmd = nvcc_command(find_nvcc(), [10 * major + minor], lib, defines, CSRC / "mlp_stream.cu")
    done = subprocess.run(cmd, capture_output=True, text=True)
    (out / f"{lib.stem}.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        sys.exit(f"nvcc failed: {done.stderr[-2000:]}")
    handle = ctypes.CDLL(str(lib))
    handle.dcmlp_mlp.argtypes, handle.dcmlp_mlp.restype = SIGNATURE, INT
    handle.dcmlp_partial_bytes.argtypes, handle.dcmlp_partial_bytes.restype = (
        [INT] * 3,
        ctypes.c_longlong,
    )
    if hasattr(handle, "dcmlp_read_stamps"):
        handle.dcmlp_read_stamps.argtypes = [PTR]
    handle.dcmlp_counter_ints.argtypes, handle.dcmlp_counter_ints.restype = [INT] * 2, INT
    return handle


def pack(w: torch.Tensor, tile_n: int, tile_k: int, gated: bool) -> torch.Tensor:
    """``w`` [n, k] as a DCMLP_PACKED build reads it: chunk by chunk in streaming order (row
    block, then column block), a gate|up block's rows its gate rows then the up rows of the same
    columns, each chunk's 16 B pieces XOR-swizzled by row (dcmlp_packed in the kernel's source)."""
    n, k = w.shape
    if gated:  # [gate|up, block, row] -> [block, gate|up, row]
        w = w[torch.arange(n, device=w.device).view(2, n // tile_n, tile_n // 2).transpose(0, 1)]
        w = w.reshape(n, k)
    chunks = w.view(n // tile_n, tile_n, k // tile_k, tile_k // 8, 8).transpose(1, 2)
    row = torch.arange(tile_n, device=w.device).view(-1, 1)
    piece = torch.arange(tile_k // 8, device=w.device).view(1, -1)
    return (
        chunks[:, :, row, piece ^ (row % 8)].contiguous().view(-1)
    )  # stored[r, q] = w[r, q ^ r%8]


def weights_for(
    lib: ctypes.CDLL, w_gu: torch.Tensor, w_down: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """The weights as this build reads them: packed where it was built DCMLP_PACKED."""
    if not lib.dcmlp_packed():
        return w_gu, w_down
    tiles = lib.dcmlp_tile_n(), lib.dcmlp_tile_k()
    return pack(w_gu, *tiles, gated=True), pack(w_down, *tiles, gated=False)


class Mlp:
    """The kernel's call with its workspace for one (hidden, inter, grid)."""

    def __init__(self, lib: ctypes.CDLL, hidden: int, inter: int, grid: int, dev: torch.device):
        self.lib, self.hidden, self.inter, self.grid = lib, hidden, inter, grid
        nbytes = lib.dcmlp_partial_bytes(hidden, inter, grid)
        self.partials = torch.full((nbytes // 4,), float("nan"), device=dev)  # never read unset
        self.counters = torch.zeros(
            lib.dcmlp_counter_ints(hidden, inter), dtype=torch.int32, device=dev
        )

    def __call__(
        self, x: torch.Tensor, w_gu: torch.Tensor, w_down: torch.Tensor,
        residual: torch.Tensor | None, h: torch.Tensor, y: torch.Tensor,
    ) -> None:  # fmt: skip
        rc = self.lib.dcmlp_mlp(
            x.data_ptr(), w_gu.data_ptr(), w_down.data_ptr(),
            None if residual is None else residual.data_ptr(), h.data_ptr(), y.data_ptr(),
            self.partials.data_ptr(), self.counters.data_ptr(), x.shape[0], self.hidden,
            self.inter, self.grid, torch.cuda.current_stream().cuda_stream,
        )  # fmt: skip
        if rc:
            raise RuntimeError(f"dcmlp_mlp: cudaError {rc}")


def counters_ready(counters: torch.Tensor) -> bool:
    """Every count zero again after a call but the barrier's generation (third from the end: the
    arrivals, the barrier's count and generation, the two queues)."""
    others = torch.ones_like(counters, dtype=torch.bool)
    others[-3] = False
    return bool((counters[others] == 0).all())


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30))


def random_mlp(
    dev: torch.device, seed: int, hidden: int = HIDDEN, inter: int = INTER, rows: int = ROWS,
    with_residual: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """x, the gate|up and down weights (scaled by 1 / sqrt(fan-in)) and a residual or None."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    rnd = lambda *s, scale=1.0: (torch.randn(*s, generator=gen, device=dev) * scale).bfloat16()  # noqa: E731
    x = rnd(rows, hidden)
    w_gu = rnd(2 * inter, hidden, scale=hidden**-0.5)
    w_down = rnd(hidden, inter, scale=inter**-0.5)
    return x, w_gu, w_down, rnd(rows, hidden) if with_residual else None


def check(
    lib: ctypes.CDLL, dev: torch.device, hidden: int, inter: int, rows: int, grid: int,
    with_residual: bool, seed: int,
) -> dict:  # fmt: skip
    x, w_gu, w_down, residual = random_mlp(dev, seed, hidden, inter, rows, with_residual)
    mlp = Mlp(lib, hidden, inter, grid, dev)
    w_in = weights_for(lib, w_gu, w_down)
    outs = []
    for _ in range(3):  # the third call: the counters were left ready by the second
        h = torch.full((rows, inter), float("nan"), device=dev, dtype=torch.bfloat16)
        y = torch.full((rows, hidden), float("nan"), device=dev, dtype=torch.bfloat16)
        mlp(x, *w_in, residual, h, y)
        torch.cuda.synchronize()
        outs.append((h.clone(), y.clone()))
    h, y = outs[0]
    g = x.double() @ w_gu.double().t()
    h_ref = torch.nn.functional.silu(g[:, :inter]) * g[:, inter:]
    # y from the kernel's own h: the down GEMM checked apart from h's rounding
    y_ref = h.double() @ w_down.double().t() + (0 if residual is None else residual.double())
    identical = all(torch.equal(a, outs[0][0]) and torch.equal(b, outs[0][1]) for a, b in outs[1:])
    result = {
        "hidden": hidden, "inter": inter, "rows": rows, "grid": grid,
        "residual": with_residual, "h_rel_err": rel_err(h, h_ref), "y_rel_err": rel_err(y, y_ref),
        "nan": bool(h.isnan().any() or y.isnan().any()), "identical": identical,
        "counters_zero": counters_ready(mlp.counters),
    }  # fmt: skip
    result["ok"] = (
        not result["nan"] and identical and result["counters_zero"]
        and result["h_rel_err"] < 1e-2 and result["y_rel_err"] < 1e-2
    )  # fmt: skip
    return result


def time_layers(
    libs: dict[str, ctypes.CDLL], dev: torch.device, layers: int, repeats: int, grid: int,
    copy_gbs: float,
) -> list[dict]:  # fmt: skip
    ws = [random_mlp(dev, seed=1 + layer)[1:3] for layer in range(layers)]
    kn = [(a.t().contiguous(), b.t().contiguous()) for a, b in ws]
    x = random_mlp(dev, seed=0)[0]
    h, y = x.new_empty(ROWS, INTER), x.new_empty(ROWS, HIDDEN)
    floor = sum(w.numel() for w in ws[0]) * 2 / (copy_gbs * 1e9) * 1e6  # one layer's weights

    def cublas(weights, transposed):
        def step():
            for a, b in weights:
                act = fused.silu_mul(x @ (a.t() if transposed else a))
                torch.mm(act, b.t() if transposed else b, out=y)

        return step

    def ours(kernel, weights):
        def step():
            for a, b in weights:
                kernel(x, a, b, None, h, y)

        return step

    runs = {"cublas [K, N]": cublas(kn, False), "cublas [N, K]": cublas(ws, True)}
    for label, handle in libs.items():
        weights = [weights_for(handle, a, b) for a, b in ws]  # packed once a build, for each grid
        for g in (grid, 2 * grid)[: handle.dcmlp_ctas_per_sm()]:  # co-resident grids only
            runs[f"{label} grid {g}"] = ours(Mlp(handle, HIDDEN, INTER, g, dev), weights)
    rows_out = []
    for label, step in runs.items():
        times = timing.graph_times_ms(step, repeats, warmup=2)
        us = statistics.median(times) * 1e3 / layers
        rows_out.append(
            {"impl": label, "us_per_layer": us, "floor_us": floor, "x_floor": us / floor}
        )
    return rows_out


def cold_calls(lib: ctypes.CDLL, dev: torch.device, grid: int, calls: int) -> None:
    """``calls`` calls of one layer at the timed shape, the L2 flushed before each (the weights
    come from memory, as in the step)."""
    x, w_gu, w_down, _ = random_mlp(dev, seed=0)
    h, y = x.new_empty(ROWS, INTER), x.new_empty(ROWS, HIDDEN)
    mlp = Mlp(lib, HIDDEN, INTER, grid, dev)
    w_in = weights_for(lib, w_gu, w_down)
    flush = torch.empty(2**28, dtype=torch.uint8, device=dev)
    for _ in range(calls):
        flush.zero_()
        mlp(x, *w_in, None, h, y)
    torch.cuda.synchronize()


def stamps(lib: ctypes.CDLL, dev: torch.device, grid: int) -> dict:
    """Each CTA's clock at start, gate|up done, barrier passed and end, one layer (us, medians
    and extremes over CTAs, from the earliest start)."""
    cold_calls(lib, dev, grid, 3)
    host = (ctypes.c_ulonglong * (4096 * 4))()
    assert lib.dcmlp_read_stamps(host) == 0
    t = torch.tensor(list(host), dtype=torch.float64).view(4096, 4)[:grid]
    t = (t - t[:, 0].min()) / 1e3
    q = lambda v: {"min": float(v.min()), "median": float(v.median()), "max": float(v.max())}  # noqa: E731
    return {
        "start": q(t[:, 0]), "gate_up_done": q(t[:, 1]), "barrier_passed": q(t[:, 2]),
        "end": q(t[:, 3]), "barrier_wait": q(t[:, 2] - t[:, 1]), "down": q(t[:, 3] - t[:, 2]),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument(
        "--variants", nargs="+", default=["base", "DCMLP_NO_PREFETCH"],
        help="builds to check and time: defines joined by +, or base",
    )  # fmt: skip
    ap.add_argument("--profile", action="store_true", help="only call the first variant 5 times")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    libs = {
        v: build(args.out, tuple(d for d in v.split("+") if d != "base")) for v in args.variants
    }
    if args.profile:  # what Nsight Compute records: the first variant, nothing else timed
        cold_calls(next(iter(libs.values())), dev, sms, 5)
        return
    lib = next(iter(libs.values()))
    per_sm = lib.dcmlp_ctas_per_sm()
    checks = []
    for hidden, inter, rows, grid, res in [
        (HIDDEN, INTER, ROWS, sms, True), (HIDDEN, INTER, 5, sms, False),
        (HIDDEN, INTER, ROWS, 2 * sms, True), (512, 256, 16, sms, True), (512, 256, 3, 7, True),
        (1024, 768, 16, 1, True), (HIDDEN, INTER, ROWS, 97, False),
    ]:  # fmt: skip
        for name, handle in libs.items():
            if (
                grid > sms * handle.dcmlp_ctas_per_sm()
                or inter % handle.dcmlp_tile_k()
                or handle.dcmlp_queue_unit() > min(hidden, inter) // handle.dcmlp_tile_k()
                or (name != args.variants[0] and grid not in (sms, 2 * sms))  # the timed grids
            ):
                continue
            c = check(handle, dev, hidden, inter, rows, grid, res, seed=len(checks))
            checks.append({"variant": name, **c})
            print(
                f"check {name} h={hidden} i={inter} rows={rows} grid={grid}: ok={c['ok']} "
                f"h_err={c['h_rel_err']:.2e} y_err={c['y_rel_err']:.2e} identical={c['identical']}"
            )
    ceil = {"copy_gbs": roofline.copy_bandwidth_gbs(dev)}
    timed = (
        time_layers(libs, dev, args.layers, args.repeats, sms, ceil["copy_gbs"])
        if all(c["ok"] for c in checks if c["hidden"] == HIDDEN)  # the timed shape's checks
        else []
    )
    print(f"copy rate {ceil['copy_gbs']:.0f} GB/s; {per_sm} CTAs an SM; one layer's MLP, 16 rows:")
    for r in timed:
        print(
            f"  {r['impl']:<40} {r['us_per_layer']:7.1f} us  floor {r['floor_us']:5.1f}"
            f"  {r['x_floor']:.2f}x"
        )
    stamped = {}
    for name, handle in libs.items():
        if "DCMLP_STAMPS" in name:
            stamped[name] = stamps(handle, dev, sms)
            print(f"stamps {name} (us from the first CTA's start): {json.dumps(stamped[name])}")
    record = {
        "env": envinfo.collect(), "ceilings": ceil, "checks": checks, "timed": timed,
        "stamps": stamped, "layers": args.layers, "repeats": args.repeats,
    }  # fmt: skip
    (args.out / "mlp_stream.json").write_text(json.dumps(record, indent=1))
    sys.exit(0 if checks and all(c["ok"] for c in checks) else 1)


if __name__ == "__main__":
    main()
