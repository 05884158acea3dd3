#!/bin/bash
# The one device call of run 3cef60c, on one NVIDIA H100 (carry .whl .sgl): the custom server's
# step anatomy with the folded GEMMs, auto and cuBLAS, in that order, after the weight GEMMs'
# tuning began timing each choice as a CUDA graph replays it; files in engine-fused/.
#   bash run.sh      (from the repository root of 3cef60c, on the GPU machine)
REAL=$OUT; export OUT=/tmp/o6; mkdir -p $OUT; trap 'tar -C /tmp -cf $REAL/x.tar o6' EXIT
FUSED_TESTS=0 FUSED_RUNS="fused auto cublas" bash scripts/gpu_backends_run.sh 3cef60c engine-fused
