#!/usr/bin/env bash
# Nsight Compute profile of the custom kernel's variants at the study's main shapes (one GPU call).
#   OUT=dir scripts/profile_kernels.sh "v1:185000:16:8" "v2:185000:1:8" ...   (variant:ctx:L:heads[:tree])
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-results/kernel-profile}
mkdir -p "$OUT"
python3 -m decodecliff.cli build-kernel --out build/kernels > "$OUT/build.txt" 2>&1 || { cat "$OUT/build.txt"; exit 1; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section LaunchStats --print-details all"
for spec in "$@"; do
  IFS=: read -r v ctx L H tree <<< "$spec"
  shape="$ctx:$L:$H"; [ "${tree:-}" = tree ] && shape="$shape:tree"
  name="${v}_${ctx}_L${L}_H${H}${tree:+_tree}"
  "$NCU" --clock-control none -k regex:mla_attn --launch-skip 1 --launch-count 1 $SECTIONS \
    python3 -m decodecliff.cli check-kernel --variants "$v" --launch "$shape" --launches 3 \
    > "$OUT/ncu_$name.txt" 2>&1
  echo "== $name rc $?"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Bank|Shared|No Eligible|L1/TEX Hit|L2 Hit|Executed Ipc A" "$OUT/ncu_$name.txt" | head -25
done
