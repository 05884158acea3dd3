"""Where the study's files land, relative to the working directory of `snakemake`."""

from __future__ import annotations

RESULTS = "results"
KERNEL_LIB = f"{RESULTS}/build/libdecodecliff_mla.so"
BUILD_INFO = f"{RESULTS}/build/build.json"
KERNEL_BENCH = f"{RESULTS}/kernels/bench.json"
FLASHINFER_SM120 = f"{RESULTS}/kernels/flashinfer_sm120.json"  # FlashInfer MLA built for sm_120?
SUMMARY_DIR = f"{RESULTS}/summary"
SUMMARY_KERNELS = f"{SUMMARY_DIR}/kernels.csv"
SUMMARY_SWEEP = f"{SUMMARY_DIR}/sweep.csv"
ENGINE_BENCH = f"{RESULTS}/engine/bench.json"
NOTEBOOK_DIR = f"{RESULTS}/notebooks"
REPORT = f"{RESULTS}/report.html"
NOTES = f"{RESULTS}/NOTES.md"


def point_file(server: str, ctx: int | str) -> str:
    """One context point's file (the sweep_point rule's output)."""
    return f"{RESULTS}/sweep/{server}/ctx{ctx}.json"


def server_log(server: str, ctx: int | str) -> str:
    """The log of the server launched for one point, beside its file: a point's own, as points of
    one server may run at once (a cluster's jobs) and the sweep reads the log of its launch."""
    return f"{RESULTS}/sweep/{server}/server-{server}-ctx{ctx}.log"
