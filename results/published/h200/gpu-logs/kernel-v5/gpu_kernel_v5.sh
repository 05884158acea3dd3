#!/bin/bash
# One GPU call for kernel v5 beside v4: build (sm_90), correctness against float64 (fixed + random
# shapes, planted masks, CUDA-graph replay, NaN-poisoned outputs), the GPU tests, timing side by
# side, and Nsight Compute on one launch of each.
#   [CHECK_VARIANTS="v1 v4 v5"] bash scripts/gpu_kernel_v5.sh STAGE...
#   (stages: check tests bench ncu sanitize; check times CHECK_VARIANTS, default v4 v5)
# Logs go to $OUT (the device machine's return folder; /tmp/out elsewhere).
set -o pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/bin
printf '#!/bin/sh\nexec python3 -m decodecliff.cli "$@"\n' > /tmp/bin/decodecliff
chmod +x /tmp/bin/decodecliff && export PATH=/tmp/bin:$PATH
T0=$(date +%s)
el() { echo "== $(($(date +%s) - T0)) s: $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
el build
decodecliff build-kernel --arch 90 --require 90 --out build/kernels > "$OUT/build.txt" 2>&1 || {
  cat "$OUT/build.txt"
  exit 1
}
grep -E "v4|v5|combine" "$OUT/build.txt"
export DECODECLIFF_KERNEL_LIB=$PWD/build/kernels/libdecodecliff_mla.so
ok=1
for stage in "$@"; do
  case $stage in
    check)
      el check
      timeout 300 decodecliff check-kernel --quick --variants ${CHECK_VARIANTS:-v4 v5} \
        --out /tmp/check > /dev/null 2>&1
      echo "check-kernel rc $?"
      cp /tmp/check/check.json /tmp/check/check.log "$OUT/"
      grep -c "^.*ok  " /tmp/check/check.log | sed 's/^/ok lines: /'
      if grep -q FAIL /tmp/check/check.log; then
        ok=0
        grep FAIL /tmp/check/check.log | head -n 20
      fi
      tail -n 22 /tmp/check/check.log
      ;;
    tests)
      el tests
      timeout 150 python3 -m pytest -q -p no:cacheprovider -n 0 tests/test_custom_gpu.py \
        -k "v5 or auto or agree" 2>&1 | tail -n 5 | tee "$OUT/pytest_custom_gpu.log"
      ;;
    bench)
      [ $ok = 1 ] || continue
      el bench
      timeout 200 decodecliff bench-kernels --device cuda --backends custom \
        --custom-variants v4 v5 --contexts 1024 185000 --page-sizes 1 \
        --modes decode chain16 tree64 --heads 8 64 --repeats 10 --warmup 2 \
        --max-seconds-per-point 8 --out "$OUT/bench.json" 2>&1 | grep -v "^\[" > "$OUT/bench.log"
      grep -E "│ custom" "$OUT/bench.log" | awk -F'│' '{print $3, $4, $5, $6, $7, $8, $14}'
      ;;
    ncu)
      [ $ok = 1 ] || continue
      el ncu
      for v in v5; do
        timeout 100 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
          --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
          --section ComputeWorkloadAnalysis --section SchedulerStats --section Occupancy \
          --section LaunchStats --print-details all \
          --metrics "regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$" \
          -k regex:mla_ --launch-skip 2 --launch-count 2 \
          python3 -m decodecliff.cli check-kernel --launch 185000:16:8 --variants $v --launches 3 \
          > "$OUT/ncu_${v}_L16_H8.txt" 2>&1
        grep -E "mla_|Duration|Registers Per|Issue Slots Busy|Warp Cycles Per Issued|Achieved Active|highest-utilized|wavefronts_mem_shared.sum |bank_conflicts_pipe_lsu_mem_shared.sum |stalled_(barrier|short|long|wait|math|mio)[a-z_]*ratio|DRAM Throughput" \
          "$OUT/ncu_${v}_L16_H8.txt" | head -n 30
      done
      ;;
    sanitize)
      [ $ok = 1 ] || continue
      el sanitize
      timeout 200 decodecliff check-kernel --quick --sanitize --no-timing --cases 0 --variants v5 \
        --out /tmp/san > /dev/null 2>&1
      echo "sanitize rc $?"
      cp /tmp/san/check.log "$OUT/sanitize.log"
      grep -iE "sanitizer|hazard|error" /tmp/san/check.log | tail -n 8
      ;;
  esac
done
el done
