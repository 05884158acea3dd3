#!/bin/bash
# Three device calls on one NVIDIA H100 80GB HBM3 lease (driver 580.159.04, torch 2.11.0+cu130,
# Triton 3.6.0, nvcc 13.0), carry .whl .sgl .run, the tree of 9b83003 as a `git archive` in
# .run/head/ (call 1 followed an H200 study call that found an H100 and stopped: REQUIRE_GPU,
# rc 3). v4 on a ragged decode batch of four (185k, 3/4, 1/2, 1/4 of it; page 1 scattered):
# its plan (shared splits) against set even splits.
#   call 1: Nsight Compute of the attention kernel alone (profile-ragged/, the .txt reports;
#           the .ncu-rep files and per-instruction pages are not kept);
#   call 2: the attention and combine kernels of the second launch, ncu-combine.txt;
#   call 3: the same shapes timed as bench-kernels times them (graph replay, L2 flushed before
#           each), short-ragged/.
#   bash run.sh 1|2|3      (from .run/head/, a tree of 9b83003 beside .whl and .sgl)
call=${1:?call 1..3}
case $call in
1) bash scripts/gpu_backends_run.sh 9b83003 profile-ragged ;;
2) export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
   for s in 185000:1:8:batch=4 185000:1:8:batch=4:splits=132 185000:1:8:batch=4:splits=66 \
       185000:1:16:batch=4 185000:1:16:batch=4:splits=132 65536:1:8:batch=4 \
       65536:1:8:batch=4:splits=132; do
     ncu --clock-control none -k regex:mla_ --launch-skip 2 --launch-count 2 --section SpeedOfLight \
       --section LaunchStats python3 -m decodecliff.cli check-kernel --variants v4 --launch $s \
       --launches 3 >> $OUT/ncu_combine.txt 2>&1
   done ;;
3) RAGGED_CONTEXTS="65536 185000" RAGGED_MODES=decode RAGGED_HEADS="8 16" \
     RAGGED_SPLITS="66 104 132" BUDGET_S=300 bash scripts/gpu_backends_run.sh 9b83003 short-ragged ;;
esac
