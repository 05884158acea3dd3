#!/bin/bash
# The GPU tests of the backend contract, the custom kernel's torch ops and the peers' fidelity on a
# lent GPU (carry: .whl .sgl, as scripts/gpu_backends_run.sh says). Log: $OUT/pytest_gpu.log.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/.sgl:$PWD/src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m decodecliff.cli "$@"\n' > /tmp/bin/decodecliff
chmod +x /tmp/bin/decodecliff && export PATH=/tmp/bin:$PATH
decodecliff build-kernel --arch 90 --require 90 --out results/build > "$OUT/build.log" 2>&1 || tail -3 "$OUT/build.log"
export DECODECLIFF_KERNEL_LIB=$PWD/results/build/libdecodecliff_mla.so
timeout 150 python3 -m pytest -q -n 0 -p no:cacheprovider "$@" > "$OUT/pytest_gpu.log" 2>&1
echo "rc $?"; grep -E "passed|failed|Error" "$OUT/pytest_gpu.log" | tail -n 15
