#!/bin/bash
# The device calls of run 7fe4732, in order, on NVIDIA H200s (carry .whl .sgl), from the
# repository root of 7fe4732:
#   v5-patches/  call 1: the one-barrier patch against v5 as landed
#   sm120/       call 2: the issue-24 table (sm120) and the ragged batch (sm120-more)
#   calls 3-5:   the study's first keys, merged into ../ (python -m decodecliff.study.runs merge;
#                call 5 wrote its study.tar into $OUT itself, without the wrapping tar)
#   calls 6-8:   a later lease; the runner of main at 7d04547 (unchanged to 3447786), copied to .run/
#                and sent beside the tree of 7fe4732 (carry .whl .sgl .run); the runner's keys
#                past BUDGET_S (call 8: the sm120 pair) were not started and are measured later
#   calls 9-12:  a later lease, the same runner (unchanged to 67a60f2) beside the same tree; each
#                call rebuilt the kernel first (build_kernel: the record merged is call 3's, the
#                rebuild alike but for the folders), and the runner's keys past BUDGET_S were
#                not started (call 9: flashinfer-graph-p1:185000, call 10-11: triton-graph-p1:32000)
#   calls 13-15: a later lease, the same runner (unchanged to a209d52 but for a comment) beside the
#                same tree; call 13's last key was past BUDGET_S, not started, and led call 14.
#                Call 15 ran bench_engine in two parts, merged after by `python -m
#                decodecliff.bench.engine_merge`
#   bash run.sh 1|...|15
call=${1:?call 1..15}
study=scripts/study-h200.txt
keys() { local k="" s; for s in ${@:2}; do k="$k $s:$1"; done; echo $k; }
REAL=$OUT; export OUT=/tmp/o$call; mkdir -p $OUT; trap 'tar -C /tmp -cf $REAL/x.tar o$call' EXIT
case $call in
1) V5_PATCHES=one-barrier BUDGET_S=420 bash scripts/gpu_backends_run.sh 7fe4732 v5-patches ;;
2) BUDGET_S=420 bash scripts/gpu_backends_run.sh 7fe4732 sm120 sm120-more ;;
3) BUDGET_S=400 bash scripts/gpu_study_run.sh 7fe4732 $study build_kernel bench_kernels \
     custom-graph-p1:1024 flashinfer-graph-p1:1024 sglang-graph-p1:1024 ;;
4) BUDGET_S=440 bash scripts/gpu_study_run.sh 7fe4732 $study $(keys 1024 custom-p1 \
     custom-defrag-p1 custom-sm120-graph-p1 flashinfer-fa3-graph-p1 flashinfer-sm120-graph-p1 \
     triton-graph-p1 triton-p1) $(keys 11000 custom-graph-p1 flashinfer-graph-p1 \
     flashinfer-fa3-graph-p1 custom-sm120-graph-p1 flashinfer-sm120-graph-p1 sglang-graph-p1 \
     custom-p1 custom-defrag-p1 triton-graph-p1 triton-p1) ;;
5) BUDGET_S=230 bash scripts/gpu_study_run.sh 7fe4732 $study $(keys 32000 custom-graph-p1 \
     flashinfer-graph-p1 flashinfer-fa3-graph-p1 custom-sm120-graph-p1 flashinfer-sm120-graph-p1 \
     custom-p1 custom-defrag-p1) ;;
6) REQUIRE_GPU=H200 BUDGET_S=420 CALL_S=560 bash .run/gpu_study_run.sh 7fe4732 $study \
     triton-graph-p1:185000 custom-graph-p1:185000 ;;
7) REQUIRE_GPU=H200 BUDGET_S=420 CALL_S=560 bash .run/gpu_study_run.sh 7fe4732 $study \
     triton-p1:185000 custom-defrag-p1:185000 custom-p1:64000 ;;
8) REQUIRE_GPU=H200 BUDGET_S=140 CALL_S=215 bash .run/gpu_study_run.sh 7fe4732 $study \
     $(keys 64000 custom-graph-p1 flashinfer-graph-p1 flashinfer-fa3-graph-p1 \
     custom-sm120-graph-p1 flashinfer-sm120-graph-p1) ;;
9) REQUIRE_GPU=H200 BUDGET_S=400 CALL_S=560 bash .run/gpu_study_run.sh 7fe4732 $study build_kernel \
     sglang-graph-p1:185000 custom-p1:185000 flashinfer-graph-p1:185000 ;;
10) REQUIRE_GPU=H200 BUDGET_S=450 CALL_S=580 bash .run/gpu_study_run.sh 7fe4732 $study build_kernel \
     flashinfer-graph-p1:185000 $(keys 128000 triton-p1 sglang-graph-p1 triton-graph-p1) \
     triton-graph-p1:32000 ;;
11) REQUIRE_GPU=H200 BUDGET_S=470 CALL_S=585 bash .run/gpu_study_run.sh 7fe4732 $study build_kernel \
     $(keys 185000 flashinfer-fa3-graph-p1 flashinfer-sm120-graph-p1 custom-sm120-graph-p1) \
     $(keys 128000 custom-defrag-p1 custom-p1) triton-graph-p1:32000 ;;
12) REQUIRE_GPU=H200 BUDGET_S=95 CALL_S=160 bash .run/gpu_study_run.sh 7fe4732 $study build_kernel \
     $(keys 64000 custom-sm120-graph-p1 flashinfer-sm120-graph-p1 custom-defrag-p1) ;;
13) REQUIRE_GPU=H200 BUDGET_S=470 CALL_S=580 bash .run/gpu_study_run.sh 7fe4732 $study build_kernel \
     custom-graph-p1:128000 triton-p1:64000 sglang-graph-p1:64000 triton-graph-p1:64000 \
     flashinfer-sm120-graph-p1:128000 triton-graph-p1:32000 flashinfer-fa3-graph-p1:128000 ;;
14) REQUIRE_GPU=H200 BUDGET_S=480 CALL_S=580 bash .run/gpu_study_run.sh 7fe4732 $study build_kernel \
     $(keys 128000 flashinfer-fa3-graph-p1 flashinfer-graph-p1 custom-sm120-graph-p1) \
     $(keys 32000 sglang-graph-p1 triton-p1) ;;
15) python scripts/study_commands.py --split-engine $study slow='triton sglang' fast='custom \
     custom:model=sm120 flashinfer:backend=fa2 flashinfer:backend=fa3 flashinfer:backend=fa2,model=sm120' \
     > scripts/study-h200-engine.txt
    REQUIRE_GPU=H200 BUDGET_S=500 CALL_S=500 bash .run/gpu_study_run.sh 7fe4732 \
     scripts/study-h200-engine.txt build_kernel bench_engine_fast bench_engine_slow ;;
esac
