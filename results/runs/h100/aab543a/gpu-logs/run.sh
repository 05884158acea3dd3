#!/bin/bash
# The warm-up check (bench/timing.py busy_for, bfcf3eb): run h100/553f79c's call 2 again at aab543a.
# One NVIDIA H100 80GB HBM3 lease (driver 580.159.04, torch 2.11.0+cu130, Triton 3.6.0, nvcc 13.0),
# carry .whl .sgl .run, from .run/head/ (a `git archive` of aab543a), after an H200 study call that
# found an H100 and stopped (REQUIRE_GPU, rc 3). v4 is timed first, auto (the same launch) second.
source scripts/gpu_env.sh
python3 -m decodecliff.cli build-kernel --out build/kernels
for r in 20 60; do decodecliff bench-kernels --device cuda --backends custom --custom-variants v4 \
  auto --custom-splits 104 --contexts 185000 --modes decode --page-sizes 1 --heads 8 --batch 4 \
  --ragged --repeats $r --out $OUT/order_r$r.json; done
