#!/bin/bash
# One GPU call: v4 beside v3 (checks, sanitizer, GPU tests), v4's profile, then every peer at 185k.
#   bash results/published/h200/gpu-logs/kernel-v4/run.sh COMMIT   (carry: .whl)
# .whl holds sglang 0.5.23, flashinfer-python 0.5.3 and apache-tvm-ffi 0.1.15.post2 (PyPI wheels,
# installed without their dependencies; sha256 in ../peers/env.txt).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 DECODECLIFF_GIT_REV=$1
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m decodecliff.cli "$@"\n' > /tmp/bin/decodecliff
chmod +x /tmp/bin/decodecliff && export PATH=/tmp/bin:$PATH
T0=$(date +%s); el() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
echo "commit $1"
el build
decodecliff build-kernel --arch 90 --require 90 --out build/kernels > /tmp/build.txt 2>&1 || { cat /tmp/build.txt; exit 1; }
cp build/kernels/build.json $OUT/
export DECODECLIFF_KERNEL_LIB=$PWD/build/kernels/libdecodecliff_mla.so
el check
timeout 200 decodecliff check-kernel --quick --sanitize --variants v3 v4 --out /tmp/check > /dev/null 2>&1
cp /tmp/check/check.json /tmp/check/check.log $OUT/; tail -n 30 /tmp/check/check.log
el tests
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 0 tests/test_custom_gpu.py 2>&1 | tail -n 4 | tee $OUT/pytest_custom_gpu.log
el ncu
timeout 120 ncu --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section ComputeWorkloadAnalysis --section SchedulerStats --section Occupancy \
  -k regex:mla_attn_kernel --launch-skip 1 --launch-count 1 \
  python3 -m decodecliff.cli check-kernel --launch 185000:16:8 --variants v4 --launches 3 > $OUT/ncu_v4_L16_H8.txt 2>&1
grep -E "Duration|Shared Memory|Issue Slots Busy|Compute \(SM\) Throughput|Registers Per|Stall|Warp Cycles Per Issued" $OUT/ncu_v4_L16_H8.txt | head -n 20
el bench
timeout 240 decodecliff bench-kernels --device cuda --backends custom sglang flashinfer cublas \
  --custom-variants v3 v4 --contexts 185000 --page-sizes 1 --modes decode chain16 tree64 --heads 8 64 \
  --repeats 10 --warmup 2 --max-seconds-per-point 10 --out $OUT/bench.json 2>&1 | grep -v "^\[" | tee $OUT/bench.log
el done
