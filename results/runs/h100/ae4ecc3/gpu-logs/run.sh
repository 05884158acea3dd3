#!/bin/bash
# The device calls of run ae4ecc3 (the H100 study, config/h200.yaml:config/h100.yaml), in order,
# on NVIDIA H100 80GB HBM3 (one lease; env.txt). Each call sent main's working tree with three
# ignored folders (carry .whl .sgl .run): .run/ held main's gpu_study_run.sh and gpu_env.sh (as at
# ae4ecc3) and, in .run/head/, a `git archive ae4ecc3 src scripts tests pyproject.toml
# notes/kernel-v5` with links
# to ../../.whl and ../../.sgl; the keys ran there, each call's study.tar merged into ../ with
# `python -m decodecliff.study.runs merge`. Each call first asked for an H200 (the H200 study of
# 7fe4732, REQUIRE_GPU=H200), which stopped at once (exit 3): the lent GPU was an H100.
#   bash run.sh 1|2|3      (from the repository root, with .run/ laid out as above)
call=${1:?call 1..3}
keys() { local k="" s; for s in ${@:2}; do k="$k $s:$1"; done; echo $k; }
study() {  # BUDGET_S CALL_S KEY...: the study's keys at .run/head's tree
  (cd .run/head && REQUIRE_GPU=H100 BUDGET_S=$1 CALL_S=$2 \
    bash ../gpu_study_run.sh ae4ecc3 scripts/study-h200.txt "${@:3}")
}
case $call in
1) study 330 550 build_kernel bench_kernels triton-graph-p1:1024 custom-graph-p1:1024 ;;
   # bench_kernels took 378 s, past BUDGET_S: the two points were not started
2) study 420 520 build_kernel $(keys 1024 triton-graph-p1 custom-graph-p1 flashinfer-graph-p1 \
     flashinfer-fa3-graph-p1 sglang-graph-p1 triton-p1 custom-p1 custom-defrag-p1 \
     custom-sm120-graph-p1 flashinfer-sm120-graph-p1) $(keys 11000 custom-graph-p1 \
     flashinfer-graph-p1 flashinfer-fa3-graph-p1 custom-sm120-graph-p1 flashinfer-sm120-graph-p1 \
     custom-p1 custom-defrag-p1 sglang-graph-p1 triton-graph-p1 triton-p1) ;;
   # keys past BUDGET_S not started: custom-defrag-p1, sglang-graph-p1, triton-graph-p1 and
   # triton-p1 at 11k
3) study 100 140 build_kernel $(keys 11000 custom-defrag-p1 sglang-graph-p1 triton-graph-p1 \
     triton-p1) ;;
   # triton-p1:11000 not started (past BUDGET_S)
esac
