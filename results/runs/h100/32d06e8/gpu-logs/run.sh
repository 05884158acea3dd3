#!/bin/bash
# The GPU tests at 32d06e8 (the long-split plan rule landed), on one NVIDIA H100 80GB HBM3 (driver
# 580.159.04, torch 2.11.0+cu130, Triton 3.6.0), two calls on one warm machine, from the
# repository root of 7fe4732 with 32d06e8's src/, scripts/ and tests/ as .run/head (carry .whl
# .sgl .run):
cd .run/head && ln -sf ../../.whl ../../.sgl .
# 1. the custom kernel's GPU tests: 115 passed (pytest_custom_gpu.log)
GPU_TESTS_S=150 bash scripts/gpu_tests.sh tests/test_custom_gpu.py
# 2. the engine's GPU tests: 41 passed and none failed before the 140 s limit cut the run on a
#    cold Triton cache (pytest_engine_gpu_cut.log; the session's device time ended there)
GPU_TESTS_S=140 bash scripts/gpu_tests.sh tests/test_engine_gpu.py
