#!/bin/bash
# The GPU tests on a lent GPU (carry: .whl .sgl, as scripts/gpu_backends_run.sh says), with this
# tree's kernel library: the tests given, else every test marked gpu (only the files that hold
# one: the others import the study's stack, which the machine lacks). GPU_TESTS_S: the limit
# (default 540 s of a call's 600). Log: $OUT/pytest_gpu.log.
#   scripts/gpu_tests.sh [PYTEST_ARGS...]
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
decodecliff build-kernel --arch 90 --require 90 --out results/build > "$OUT/build.log" 2>&1 || tail -3 "$OUT/build.log"
export DECODECLIFF_KERNEL_LIB=$PWD/results/build/libdecodecliff_mla.so
if [ $# -eq 0 ]; then
  set -- -m gpu $(grep -l "mark.gpu" tests/test_*.py)
fi
timeout "${GPU_TESTS_S:-540}" python3 -m pytest -q -n 0 -p no:cacheprovider -rfs --durations=10 "$@" \
  > "$OUT/pytest_gpu.log" 2>&1
echo "rc $?"; grep -E "passed|failed|Error" "$OUT/pytest_gpu.log" | tail -n 15
