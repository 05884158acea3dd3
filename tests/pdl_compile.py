"""Compile the engine's chained kernels for a GPU this machine need not have; print what PTX holds.

    TRITON_INTERPRET=0 python tests/pdl_compile.py ARCH

Prints one JSON object: for the weight GEMM (plain, and making silu(gate) * up as it loads), the
per-head GEMM and the add+RMSNorm kernel, with and without ``pdl``, whether the PTX waits for the
kernel before (griddepcontrol.wait), lets the next one launch (griddepcontrol.launch_dependents)
and prefetches to L2.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import torch
import triton
from triton.backends.compiler import GPUTarget

from decodecliff.engine import fused_triton, skinny_gemm

GEMM_SIGNATURE = {
    "x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "ws_ptr": "*fp32", "ticket_ptr": "*i32",
    **{name: "i32" for name in ("M", "N", "K", "sxm", "sxk", "swk", "swn", "sym", "syn")},
    "prefetch_k": "i32", "g_ptr": "*bf16", "ss_ptr": "*fp32", "eps": "fp32",
}  # fmt: skip
HEADS_SIGNATURE = {
    "x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16",
    **{name: "i32" for name in ("M", "K", "N", "sxm", "sxh", "sxk", "swh", "swk", "swn")},
    **{name: "i32" for name in ("sym", "syh", "syn")},
    "r_ptr": "*bf16", "cs_ptr": "*fp32", "ro_ptr": "*bf16",
    **{name: "i32" for name in ("srm", "srh", "som", "soh")},
}  # fmt: skip
NORM_SIGNATURE = {
    "x_ptr": "*bf16", "d_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16",
    **{name: "i32" for name in ("n", "x_stride", "d_stride", "out_stride")}, "eps": "fp32",
}  # fmt: skip


def ptx(fn, signature: dict, constexprs: dict, arch: int) -> str:
    sig = {**signature, **{name: "constexpr" for name in constexprs}}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32)).asm["ptx"]


LOADS = ("ld.global", "cp.async", "ld.volatile.global", "atom.global")


def features(text: str) -> dict:
    """What the PTX holds, and whether its first load from global memory (or atomic) comes after
    the wait and its prefetches before it (the text's order: these kernels wait in their entry
    block)."""
    wait = text.find("griddepcontrol.wait")
    loads = [i for i in (text.find(op) for op in LOADS) if i >= 0]
    prefetch = text.find("prefetch.global.L2")
    return {
        "wait": wait >= 0,
        "launch_dependents": "griddepcontrol.launch_dependents" in text,
        "prefetch_l2": prefetch >= 0,
        "loads_after_wait": wait >= 0 and bool(loads) and min(loads) > wait,
        "prefetch_before_wait": 0 <= prefetch < wait,
    }


def main(arch: int) -> dict:
    out = {}
    cfg = skinny_gemm.Config(32, 256, 2)
    for pdl in (False, True):
        for layout, strides in (("kn", (4096, 1)), ("nk", (1, 4096))):
            w = torch.empty_strided((4096, 1024), strides, dtype=torch.bfloat16, device="meta")
            plan = skinny_gemm.prefetch_plan(replace(cfg, pdl=pdl), w)
            del plan["prefetch_k"]  # an argument, not a constant
            gemm = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 2, **plan}
            for glu in (False, True):  # the down projection's input made as it loads, or not
                name = f"gemm {layout}{' glu' if glu else ''} pdl={pdl}"
                fold = skinny_gemm.Fold(glu=glu).constants()
                out[name] = features(
                    ptx(skinny_gemm._skinny_gemm_kernel, GEMM_SIGNATURE, {**gemm, **fold}, arch)
                )
        for rope in (0, 32):  # the per-head GEMM alone, and with the queries' rope folded in
            heads = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "PDL": pdl, "ROPE_HALF": rope}
            out[f"head_gemm rope={rope} pdl={pdl}"] = features(
                ptx(skinny_gemm._head_gemm_kernel, HEADS_SIGNATURE, heads, arch)
            )
        norm = {"HAS_DELTA": True, "BLOCK": 8192, "PDL": pdl}
        out[f"add_rms_norm pdl={pdl}"] = features(
            ptx(fused_triton._add_rms_norm_kernel, NORM_SIGNATURE, norm, arch)
        )
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))
