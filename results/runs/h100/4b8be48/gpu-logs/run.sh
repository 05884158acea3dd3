#!/bin/bash
# The device call of run 4b8be48, on one NVIDIA H100 (carry .whl .sgl, and ad925f8's src/ as
# ../before/src), from the repository root of 4b8be48 on the GPU machine:
# 1. a ragged batch of four at 1k-185k as 4b8be48 plans it (short-ragged/short-ragged.json), and as
#    ad925f8's host code plans it on the same library (short-ragged/short-ragged-before.json)
PLAN_BEFORE=$PWD/../before/src bash scripts/gpu_backends_run.sh 4b8be48 short-ragged
# 2. the engine's and the custom kernel's GPU tests: 163 passed in 214 s (the log did not come back)
GPU_TESTS_S=280 bash scripts/gpu_tests.sh tests/test_engine_gpu.py tests/test_custom_gpu.py
# (short-ragged-before.json records env.git of the measuring tree; the plan is the one named above)
