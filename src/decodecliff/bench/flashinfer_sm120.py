"""Does FlashInfer's MLA kernel build for sm_120 within its 99 KB of shared memory? (no GPU needed)

FlashInfer's fa2 MLA kernel (``BatchMLAPagedAttentionKernel`` in the installed package's JIT
sources, ``data/include/flashinfer/attention/mla.cuh``) picks its tile configuration at launch from
the GPU's shared memory per SM (``DISPATCH_SMEM_CONFIG``). This reads those thresholds from the
source, takes the configuration an sm_120 GPU (100 KB per SM, 99 KB per block) would get and the
one an H200 gets, compiles the kernel for sm_120 with nvcc (``ptxas -v``: registers, spills) and
measures the shared storage each configuration needs with a host program built from the same
headers. The JSON it writes says whether it builds, how much shared memory a block needs, and
whether that fits. Needs nvcc and the ``flashinfer-python`` package files (not its import).

    python -m decodecliff.bench.flashinfer_sm120 --out results/kernels/flashinfer_sm120.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from decodecliff.jsonio import write_json

SCHEMA = "decodecliff.flashinfer-sm120/1"
SM120_SMEM_PER_SM = 102_400  # cudaDevAttrMaxSharedMemoryPerMultiprocessor on sm_120
SM120_SMEM_PER_BLOCK = 101_376  # the most one block may opt in to (99 KB)
H200_SMEM_PER_SM = 233_472  # sm_90: 228 KB per SM
CONFIG_RE = re.compile(
    r"smem_limit_per_sm >= (\d+)\)\s*\{\s*\\\s*constexpr uint32_t NUM_STAGES = (\d+);\s*\\\s*"
    r"constexpr uint32_t CTA_TILE_KV = (\d+);\s*\\\s*constexpr bool QK_SHARD = (true|false);"
)
SOURCE = """#include <cstdio>
#include <flashinfer/attention/mla.cuh>
#include <flashinfer/attention/mla_params.cuh>
using namespace flashinfer;
using Params = MLAParams<nv_bfloat16, nv_bfloat16, nv_bfloat16, int32_t>;
template <uint32_t S, uint32_t KV, bool SHARD>
using KT = mla::KernelTraits<true, S, SHARD, 512, 64, 64, KV, nv_bfloat16, nv_bfloat16,
                             nv_bfloat16, int32_t>;
// the causal bf16 kernel (Kimi K2 absorbed MLA: 512 latent + 64 rope) in sm_120's configuration
template __global__ void mla::BatchMLAPagedAttentionKernel<KT<{s}, {kv}, {shard}>, Params>(
    const __grid_constant__ Params);
int main() {{
  std::printf("%zu %zu\\n", sizeof(typename KT<{s}, {kv}, {shard}>::SharedStorage),
              sizeof(typename KT<{hs}, {hkv}, {hshard}>::SharedStorage));
}}
"""


def smem_configs(mla_cuh: str) -> list[dict]:
    """DISPATCH_SMEM_CONFIG's branches, largest threshold first."""
    found = [
        {
            "min_smem_per_sm": int(m),
            "stages": int(s),
            "cta_tile_kv": int(kv),
            "qk_shard": sh == "true",
        }
        for m, s, kv, sh in CONFIG_RE.findall(mla_cuh)
    ]
    if not found:
        raise ValueError("no DISPATCH_SMEM_CONFIG branches found in mla.cuh")
    return sorted(found, key=lambda c: -c["min_smem_per_sm"])


def pick(configs: list[dict], smem_per_sm: int) -> dict | None:
    return next((c for c in configs if smem_per_sm >= c["min_smem_per_sm"]), None)


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def ptxas_report(log: str) -> dict:
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return {
        "registers": int(regs[-1]) if regs else None,
        "spill_bytes": sum(int(a) + int(b) for a, b in spills) if spills else None,
    }


def check(root: Path, nvcc: str, work: Path) -> dict:
    """Build the sm_120 kernel and measure both configurations' shared storage."""
    include = root / "data" / "include"
    configs = smem_configs((include / "flashinfer" / "attention" / "mla.cuh").read_text())
    sm120, h200 = pick(configs, SM120_SMEM_PER_SM), pick(configs, H200_SMEM_PER_SM)
    result: dict = {"configs": configs, "sm120_config": sm120, "h200_config": h200}
    if sm120 is None:
        return result | {"builds": False, "error": "no configuration for 102,400 B per SM"}
    src = work / "mla_sm120.cu"
    fmt = lambda c: (c["stages"], c["cta_tile_kv"], str(c["qk_shard"]).lower())  # noqa: E731
    (s, kv, shard), (hs, hkv, hshard) = fmt(sm120), fmt(h200 or sm120)
    src.write_text(SOURCE.format(s=s, kv=kv, shard=shard, hs=hs, hkv=hkv, hshard=hshard))
    cmd = [nvcc, "-std=c++17", "-arch=sm_120", "-Xptxas", "-v", f"-I{include}"]
    cmd += [f"-I{root / 'data' / 'cutlass' / 'include'}", "-o", str(work / "mla_sm120"), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    result |= {"command": " ".join(cmd[:-3] + ["mla_sm120.cu"]), "builds": done.returncode == 0}
    if done.returncode != 0:
        return result | {"error": done.stderr[-2000:]}
    result |= ptxas_report(done.stderr + done.stdout)
    sizes = subprocess.run([str(work / "mla_sm120")], capture_output=True, text=True).stdout.split()
    smem, h200_smem = int(sizes[0]), int(sizes[1])
    return result | {
        "smem_per_block": smem,
        "h200_smem_per_block": h200_smem if h200 else None,
        "fits": smem <= SM120_SMEM_PER_BLOCK,
    }


def run(out: Path) -> dict:
    doc: dict = {"schema": SCHEMA, "arch": "sm_120", "smem_per_sm": SM120_SMEM_PER_SM}
    doc["smem_limit_per_block"] = SM120_SMEM_PER_BLOCK
    spec = importlib.util.find_spec("flashinfer")
    nvcc = shutil.which("nvcc")
    if spec is None or not spec.submodule_search_locations:
        doc |= {"status": "skipped", "reason": "flashinfer-python is not installed (extra: peers)"}
    elif nvcc is None:
        doc |= {"status": "skipped", "reason": "nvcc is not on PATH"}
    else:
        root = Path(next(iter(spec.submodule_search_locations)))
        doc["flashinfer"] = importlib.metadata.version("flashinfer-python")
        doc["nvcc"] = nvcc_version(nvcc)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            doc |= check(root, nvcc, Path(tmp))
        doc["seconds"] = round(time.perf_counter() - start, 1)
        doc["status"] = "ok" if doc.get("builds") else "failed"
        doc["reason"] = doc.pop("error", None)
    write_json(out, doc)
    return doc


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="flashinfer_sm120", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("results/kernels/flashinfer_sm120.json"))
    doc = run(p.parse_args(argv).out)
    keys = ("status", "reason", "builds", "smem_per_block", "fits", "registers", "sm120_config")
    print(json.dumps({k: doc.get(k) for k in keys}))
    return 0  # a failed build is a finding, recorded in the JSON


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
