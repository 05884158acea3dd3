#!/bin/bash
# The device calls of run 7d6ba07, on one NVIDIA H100 (one lease), from the repository root of
# 7d6ba07 on the GPU machine (carry .whl .sgl, and 7dd8e8c's src/ as ../before/src: the plan of
# 8 even splits). env.git reads "-dirty": the copy sat inside another checkout, as in run 7dd8e8c.
# 1. a ragged batch of four at 1k-185k as 7d6ba07 plans it (short-ragged/short-ragged.json) and as
#    7dd8e8c's host code plans it on the same library (short-ragged-before.json), then the custom
#    kernel's and the engine's GPU tests: the 115 custom tests and 41 engine tests passed, none
#    failed, before the 200 s limit cut the run (pytest_custom_engine_gpu_cut.log; a cold Triton
#    cache on a fresh machine)
PLAN_BEFORE=$PWD/../before/src PLAN_BEFORE_REV=7dd8e8c bash scripts/gpu_backends_run.sh 7d6ba07 \
  short-ragged
GPU_TESTS_S=200 bash scripts/gpu_tests.sh tests/test_custom_gpu.py tests/test_engine_gpu.py
# 2. the engine's GPU tests again on the same machine: 48 passed in 33.5 s (pytest_engine_gpu.log)
GPU_TESTS_S=225 bash scripts/gpu_tests.sh tests/test_engine_gpu.py
