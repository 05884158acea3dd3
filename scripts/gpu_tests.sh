#!/bin/bash
# The GPU tests on a lent GPU (carry: .whl .sgl, as scripts/gpu_backends_run.sh says), with this
# tree's kernel library: the tests given, else every test marked gpu (only the files that hold
# one: the others import the study's stack, which the machine lacks). GPU_TESTS_S: pytest's limit
# (default 480 s: the installs and the build come first in a call's 600). Log: $OUT/pytest_gpu.log.
# The whole -m gpu set took about 8 minutes on an H100 (run results/runs/h100/25a2d66): give it two
# calls, the engine's and the Triton baseline's files in the second.
#   scripts/gpu_tests.sh [PYTEST_ARGS...]
#   scripts/gpu_tests.sh -m gpu tests/test_backend_contract.py tests/test_custom_gpu.py tests/test_custom_op.py
#   scripts/gpu_tests.sh -m gpu tests/test_engine_gpu.py tests/test_triton_gpu.py
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
decodecliff build-kernel --arch 90 --require 90 --out results/build > "$OUT/build.log" 2>&1 || tail -3 "$OUT/build.log"
export DECODECLIFF_KERNEL_LIB=$PWD/results/build/libdecodecliff_mla.so
if [ $# -eq 0 ]; then
  files=$(grep -l "mark.gpu" tests/test_*.py) || { echo "no test file marks a test gpu"; exit 1; }
  set -- -m gpu $files
fi
timeout "${GPU_TESTS_S:-480}" python3 -m pytest -q -n 0 -p no:cacheprovider -rfs --durations=10 "$@" \
  > "$OUT/pytest_gpu.log" 2>&1
echo "rc $?"; grep -E "passed|failed|Error" "$OUT/pytest_gpu.log" | tail -n 15
