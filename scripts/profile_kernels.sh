#!/usr/bin/env bash
# Nsight Compute profile of the custom kernel's variants at the study's main shapes (one GPU call).
#   OUT=dir scripts/profile_kernels.sh "v1:185000:16:8" "v4:185000:1:8:batch=4:splits=132" ...
#   (VARIANT:SHAPE, VARIANT one of v1..v5 as `decodecliff check-kernel --variants` takes it, not
#    auto; SHAPE as its --launch takes it: CTX:Q_LEN:HEADS[:PAGE_SIZE][:tree][:batch=B][:splits=S])
#   SM120_MODEL=1: the sm_120-model library (sm_120's registers and 100 KB per SM, on this GPU)
# InstructionStats and SourceCounters give the executed instructions and where warps stall: the
# dynamic side of the static loop counts build-kernel records (kernels/sass.py). Each report is
# also saved (ncu_NAME.ncu-rep) for `ncu --import ... --page source --print-source sass`.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-results/kernel-profile}
mkdir -p "$OUT"
model=(); [ -n "${SM120_MODEL:-}" ] && model=(--arch 90 --require 90 --sm120-model 90)
python3 -m decodecliff.cli build-kernel --out build/kernels "${model[@]}" > "$OUT/build.txt" 2>&1 \
  || { cat "$OUT/build.txt"; exit 1; }
[ -n "${SM120_MODEL:-}" ] && export DECODECLIFF_KERNEL_LIB=$PWD/build/kernels/libdecodecliff_mla_sm120model.so
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section LaunchStats
  --section InstructionStats --section SourceCounters --print-details all"
for spec in "$@"; do
  v=${spec%%:*} shape=${spec#*:}
  name="${v}_$(tr ':=' '__' <<< "$shape")"
  "$NCU" --clock-control none -k regex:mla_attn --launch-skip 1 --launch-count 1 $SECTIONS \
    -f -o "$OUT/ncu_$name" \
    python3 -m decodecliff.cli check-kernel --variants "$v" --launch "$shape" --launches 3 \
    > "$OUT/ncu_$name.log" 2>&1
  echo "== $name rc $?"
  "$NCU" -i "$OUT/ncu_$name.ncu-rep" --print-details all > "$OUT/ncu_$name.txt" 2>&1
  # executed instructions and stall samples per SASS instruction (the dynamic loop)
  "$NCU" -i "$OUT/ncu_$name.ncu-rep" --page source --print-source sass --csv \
    > "$OUT/ncu_${name}_sass.csv" 2>&1 || echo "no per-instruction page: see ncu_${name}_sass.csv"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Bank|Shared|No Eligible|L1/TEX Hit|L2 Hit|Executed Ipc A|Executed Instructions" "$OUT/ncu_$name.txt" | head -25
done
