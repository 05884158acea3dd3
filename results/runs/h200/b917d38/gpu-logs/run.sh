#!/bin/bash
# The persistent MLP kernel (kernels/csrc/mlp_stream.cu) at the tree of b917d38 on one NVIDIA H200
# (driver 580.159.04, torch 2.11.0+cu130, Triton 3.6.0, nvcc 13.0), carry .whl .sgl, from the
# repository root. (mlp_stream.json's env.git reads 7d04547: the machine's copy of the
# repository's history lagged its files.)
source scripts/gpu_env.sh
python3 scripts/mlp_stream_bench.py --out $OUT/mlp --variants base DCMLP_L2_256 DCMLP_TILE_N=32 \
  DCMLP_TILE_N=32+DCMLP_L2_256 DCMLP_STAMPS+DCMLP_TILE_N=32+DCMLP_L2_256 \
  DCMLP_STAMPS+DCMLP_L2_256 --repeats 20 > $OUT/mlp.log 2>&1
