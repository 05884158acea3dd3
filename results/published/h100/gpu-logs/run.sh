#!/bin/bash
# The device calls of run ae4ecc3 (the H100 study, config/h200.yaml:config/h100.yaml), in order,
# on NVIDIA H100 80GB HBM3: calls 1-3 in one lease, 4-7 in another, 8-12 in a third, 13-16 in a
# fourth, 17 in a fifth (env.txt, the same in all five).
# Each call sent main's working tree with three ignored folders (carry .whl .sgl .run): .run/ held
# main's gpu_study_run.sh and gpu_env.sh (as at ae4ecc3) and, in .run/head/, a `git archive
# ae4ecc3 src scripts pyproject.toml` (calls 1-3 also tests/ and notes/kernel-v5, which the keys
# do not read) with links to ../../.whl and ../../.sgl; .sgl/ held sglang 0.5.23's files (from
# call 4 without sglang/kernels/ops/attention/{dsv4,flash_attn,fa4_sm120,fla,linear,dsa,
# minimax_sparse,cutedsl_gdn_mtp_ring.py}, which the Triton attention kernels do not import, to
# keep the call under 64 MiB). The keys ran there, each call's study.tar merged into ../ with `python -m
# decodecliff.study.runs merge`. Calls 1-4 first asked for an H200
# (the H200 study of 7fe4732, REQUIRE_GPU=H200), which stopped at once (exit 3): the lent GPU was
# an H100. Calls 8-12 went through a picker in .run/ that read the lent GPU's name and ran the H200
# study's keys in .run/h200/ (a `git archive 7fe4732 src scripts pyproject.toml`) on an H200 or
# these keys in .run/head/ on an H100; the third lease lent an H100. From call 8 the
# commands file is .run/head/scripts/study-h200-engine.txt: study-h200.txt with the two halves of
# bench_engine as keys (bench_engine_slow, bench_engine_fast; ../README.md shows how it is made).
# Calls 13 and 17 named the picker's H200 keys too (call 1 of the H200 study's plan); the fourth
# and fifth leases lent an H100. Call 15 first ran the custom kernel's ragged GPU tests at main's b0bbac9
# (`source scripts/gpu_env.sh && python3 -m pytest -q tests/test_custom_gpu.py -k ragged`: 6
# passed), which write nothing here.
#   bash run.sh 1..17     (from the repository root, with .run/ laid out as above)
call=${1:?call 1..17}
keys() { local k="" s; for s in ${@:2}; do k="$k $s:$1"; done; echo $k; }
study() {  # BUDGET_S CALL_S KEY...: the study's keys at .run/head's tree
  (cd .run/head && REQUIRE_GPU=H100 BUDGET_S=$1 CALL_S=$2 \
    bash ../gpu_study_run.sh ae4ecc3 "${S:-scripts/study-h200.txt}" "${@:3}")
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
4) study 470 575 build_kernel triton-graph-p1:185000 custom-graph-p1:185000 custom-defrag-p1:64000 \
     custom-graph-p1:32000 flashinfer-fa3-graph-p1:32000 ;;
5) study 505 575 build_kernel triton-p1:185000 sglang-graph-p1:185000 flashinfer-graph-p1:32000 \
     custom-sm120-graph-p1:32000 custom-p1:32000 flashinfer-sm120-graph-p1:32000 ;;
   # the last two not started (past BUDGET_S)
6) study 390 480 build_kernel custom-defrag-p1:185000 custom-p1:185000 flashinfer-graph-p1:185000 \
     custom-p1:32000 flashinfer-sm120-graph-p1:32000 ;;
   # the last two not started (past BUDGET_S)
7) study 50 80 build_kernel custom-p1:32000 flashinfer-sm120-graph-p1:32000 \
     custom-sm120-graph-p1:64000 ;;
   # custom-sm120-graph-p1:64000 not started (past BUDGET_S)
8) S=scripts/study-h200-engine.txt study 440 580 build_kernel triton-p1:128000 \
     sglang-graph-p1:128000 triton-graph-p1:128000 triton-graph-p1:32000 ;;
   # triton-graph-p1:32000 not started (past BUDGET_S)
9) S=scripts/study-h200-engine.txt study 300 580 build_kernel bench_engine_slow bench_engine_fast ;;
   # bench_engine_slow took 378 s: bench_engine_fast not started (past BUDGET_S)
10) S=scripts/study-h200-engine.txt study 400 560 build_kernel bench_engine_fast \
     triton-graph-p1:32000 ;;
11) S=scripts/study-h200-engine.txt study 300 420 build_kernel custom-sm120-graph-p1:185000 \
     flashinfer-fa3-graph-p1:185000 custom-graph-p1:64000 flashinfer-graph-p1:64000 \
     flashinfer-fa3-graph-p1:64000 ;;
   # flashinfer-fa3-graph-p1:64000 not started (past BUDGET_S)
12) S=scripts/study-h200-engine.txt study 90 130 build_kernel flashinfer-fa3-graph-p1:64000 \
     custom-sm120-graph-p1:64000 flashinfer-sm120-graph-p1:64000 ;;
13) study 440 580 build_kernel flashinfer-sm120-graph-p1:185000 custom-defrag-p1:128000 \
     custom-p1:128000 custom-graph-p1:128000 triton-p1:64000 flashinfer-fa3-graph-p1:128000 ;;
   # flashinfer-fa3-graph-p1:128000 not started (past BUDGET_S)
14) study 360 430 build_kernel flashinfer-fa3-graph-p1:128000 sglang-graph-p1:64000 \
     triton-graph-p1:64000 flashinfer-sm120-graph-p1:128000 flashinfer-graph-p1:128000 \
     custom-sm120-graph-p1:128000 sglang-graph-p1:32000 triton-p1:32000 custom-p1:64000 \
     triton-p1:11000 ;;
   # the last four not started (past BUDGET_S)
15) study 50 110 build_kernel triton-p1:11000 sglang-graph-p1:32000 triton-p1:32000 ;;
   # the last two not started (past BUDGET_S)
16) study 100 140 build_kernel sglang-graph-p1:32000 triton-p1:32000 ;;
17) study 470 580 build_kernel custom-defrag-p1:32000 custom-p1:64000 ;;
esac
