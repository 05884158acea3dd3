#!/bin/bash
# The persistent MLP kernel with packed weights (DCMLP_PACKED), on an NVIDIA H100 80GB HBM3
# (driver 580.159.04, torch 2.11.0+cu130, Triton 3.6.0, nvcc 13.0), carry .whl .sgl .run, run from
# .run/head/ (a `git archive` of ed640f9) after an H200 study call found an H100 and stopped
# (REQUIRE_GPU, rc 3). Every variant passed its checks (float64, bit-identical, counters ready).
source scripts/gpu_env.sh
python3 scripts/mlp_stream_bench.py --out $OUT/mlp --repeats 20 --variants base DCMLP_PACKED \
  DCMLP_PACKED+DCMLP_BULK DCMLP_PACKED+DCMLP_TILE_N=32 DCMLP_PACKED+DCMLP_BULK+DCMLP_TILE_N=32 \
  DCMLP_STAMPS+DCMLP_PACKED > $OUT/mlp.log 2>&1
