#!/bin/bash
# The GPU tests of the backend contract, the custom kernel's torch ops and the peers' fidelity on a
# lent GPU (carry: .whl .sgl, as scripts/gpu_backends_run.sh says). Log: $OUT/pytest_gpu.log.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
decodecliff build-kernel --arch 90 --require 90 --out results/build > "$OUT/build.log" 2>&1 || tail -3 "$OUT/build.log"
export DECODECLIFF_KERNEL_LIB=$PWD/results/build/libdecodecliff_mla.so
timeout 150 python3 -m pytest -q -n 0 -p no:cacheprovider "$@" > "$OUT/pytest_gpu.log" 2>&1
echo "rc $?"; grep -E "passed|failed|Error" "$OUT/pytest_gpu.log" | tail -n 15
