#!/bin/bash
# The three device calls of run 9fc7499, on one NVIDIA H100 (carry .whl .sgl), from the repository
# root of 9fc7499 on the GPU machine:
# 1. the split counts at short contexts with the short-context plan (short-splits/)
bash scripts/gpu_backends_run.sh 9fc7499 short-splits
# 2. the custom kernel's and the backend contract's GPU tests (tests/pytest_gpu_custom_contract.log)
GPU_TESTS_S=110 bash scripts/gpu_tests.sh tests/test_custom_gpu.py tests/test_backend_contract.py
# 3. the engine's GPU tests, cut at 120 s by the lease's device time (tests/pytest_gpu_engine_cut.log)
GPU_TESTS_S=120 bash scripts/gpu_tests.sh tests/test_engine_gpu.py
