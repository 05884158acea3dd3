#!/bin/bash
# The device calls of the persistent MLP kernel (kernels/csrc/mlp_stream.cu) on one NVIDIA H100
# 80GB HBM3 (driver 580.159.04, torch 2.11.0+cu130, Triton 3.6.0, nvcc 13.0), carry .whl .sgl, from
# the repository root. The tree was 3447786's with the edits b917d38 commits made as far as each
# call: call 2 the empty-run fix of the finisher; call 3 the STAGES and STAMPS options; call 4 the
# WARPS option (dropped from b917d38: no faster) and the grid's co-residency check. (The points'
# env.git reads 7d04547: the machine's copy of the repository's history lagged its files.)
# Call 1 ran the same script before the empty-run fix: one small-shape check failed (NaN), so
# nothing was timed; its log is not kept.
#   bash run.sh 2|3|4
call=${1:?call 2..4}
source scripts/gpu_env.sh
case $call in
2) python3 scripts/mlp_stream_bench.py --out $OUT/mlp 2>&1 | tee $OUT/mlp.log ;;
3) timeout 300 python3 scripts/mlp_stream_bench.py --out $OUT/mlp \
     --variants base DCMLP_STAGES=6 DCMLP_STAMPS --repeats 20 2>&1 | tee $OUT/mlp.log
   # cut at 300 s: STAGES=6 (one CTA an SM) was launched at grid 264, which cannot be resident,
   # and its barrier waited for ever (the launcher now refuses such a grid); then Nsight Compute:
   ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
     --section SchedulerStats --section LaunchStats --print-details all -k regex:mlp_stream \
     --launch-skip 3 --launch-count 1 python3 scripts/mlp_stream_bench.py --out /tmp/p \
     --profile --variants base > $OUT/ncu.txt 2>&1 ;;
4) python3 scripts/mlp_stream_bench.py --out $OUT/mlp --variants base DCMLP_WARPS=8 DCMLP_STAMPS \
     DCMLP_STAMPS+DCMLP_WARPS=8 --repeats 20 2>&1 | tee $OUT/mlp.log ;;
esac
