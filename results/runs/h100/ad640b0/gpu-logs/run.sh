#!/bin/bash
# v5's loader with a row's last 8 chunks copied by four whole warps
# (notes/kernel-v5/v5-loader-full-warps.patch) against v5 as landed, on one NVIDIA H100 80GB HBM3
# lease (driver 580.159.04, torch 2.11.0+cu130, Triton 3.6.0, nvcc 13.0), carry .whl .sgl .run,
# run from .run/head/ (a `git archive` of ad640b0; call 1 followed an H200 study call that found an
# H100 and stopped: REQUIRE_GPU, rc 3).
#   call 1: the patch did not apply (git apply, run in a subdirectory of the machine's copy of the
#           repository, changed nothing and exited 0: both builds read 628 SASS), so both sets are
#           v5 as landed, a record of the bench's noise; gpu_backends_run.sh now checks that a
#           patch changed the source;
#   call 2: the same with `git init` in .run/head first: the patch applied (640 SASS).
#   bash run.sh 1|2
call=${1:?call 1..2}
[ "$call" = 2 ] && git init -q .
V5_PATCHES=loader-full-warps BUDGET_S=300 bash scripts/gpu_backends_run.sh ad640b0 v5-patches
