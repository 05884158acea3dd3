#!/bin/bash
# The device calls of run 7dd8e8c, on one NVIDIA H100 (one lease, calls 1-3), each from the
# repository root of 7dd8e8c on the GPU machine (carry .whl .sgl, and 4b8be48's src/ as
# ../before/src). env.git reads "-dirty" in every file: the copy sat inside another checkout,
# whose status git read, as in runs 4b8be48 and 0ca320e.
# 1. a ragged batch of four at 1k-185k as 7dd8e8c plans it (short-ragged/short-ragged.json), as
#    4b8be48's host code plans it on the same library (short-ragged-before.json), then the custom
#    kernel's GPU tests: 115 passed in 10.7 s (pytest_custom_gpu.log). The call's JSON did not
#    come back (too many files), so call 2 measured the part again; its files are the ones here.
PLAN_BEFORE=$PWD/../before/src PLAN_BEFORE_REV=4b8be48 bash scripts/gpu_backends_run.sh 7dd8e8c \
  short-ragged ragged-v5
GPU_TESTS_S=100 bash scripts/gpu_tests.sh tests/test_custom_gpu.py
# 2. the same two parts again (short-ragged/, ragged-v5/ragged-v5.json; run.log the printed tables)
PLAN_BEFORE=$PWD/../before/src PLAN_BEFORE_REV=4b8be48 bash scripts/gpu_backends_run.sh 7dd8e8c \
  short-ragged ragged-v5
# 3. ragged-v5's grid at 64k and 185k (ragged-v5/ragged-v5-long.json), the part's command with
#    these contexts and split counts:
LD_PRELOAD=$PWD/results/build/libdecodecliff_smem_shim.so decodecliff bench-kernels --device cuda \
  --backends custom flashinfer --sm120-model --flashinfer-backends fa2 fa3 --repeats 20 --quiet \
  --custom-variants auto v5 --custom-splits 4 8 16 32 --contexts 65536 185000 --modes chain16 \
  --page-sizes 1 --heads 64 --batch 4 --ragged --max-seconds-per-point 30 \
  --out ragged-v5/ragged-v5-long.json
