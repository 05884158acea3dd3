#!/bin/bash
# The device calls of run 70e9975 on one NVIDIA H100 (carry .whl .sgl), from the repository root
# of 70e9975 on the GPU machine:
#   kernels/  call 1: the baseline and SGLang's kernels (int32 indices, as SGLang passes them),
#             FlashInfer fa2 and fa3 and the custom kernel (auto: the 384-token v5 threshold),
#             decode and chain16, 8 heads, page 1, 1k to 185k
#   tests/    call 2: the GPU tests (-m gpu) with the kernel library of this commit, stopped by
#             the call's own 170 s limit at 51% (163 passed, 2 skipped, none failed); the test
#             files needing the study's stack (snakemake, jsonschema, jupytext, openai), which
#             the machine lacks, left out
#   bash run.sh 1|2
call=${1:?call 1..2}
case $call in
1) REAL=$OUT; export OUT=/tmp/o2; mkdir -p $OUT; trap 'tar -C /tmp -cf $REAL/x.tar o2' EXIT
   BUDGET_S=400 bash scripts/gpu_backends_run.sh 70e9975 kernels ;;
2) source scripts/gpu_env.sh
   mkdir -p results/build
   DECODECLIFF_GIT_REV=70e9975 decodecliff build-kernel --arch 90 --require 90 --out results/build
   export DECODECLIFF_KERNEL_LIB=$PWD/results/build/libdecodecliff_mla.so DECODECLIFF_GIT_REV=70e9975
   ig=""
   for f in study_commands server_faults study_config sweep_server ipc_engine server_api \
       sweep_point notebooks sweep_cli; do ig="$ig --ignore=tests/test_$f.py"; done
   timeout 170 python3 -m pytest -q -n 0 -p no:cacheprovider tests $ig -m gpu -rf > $OUT/gpu.log 2>&1 ;;
esac
