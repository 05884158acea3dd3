#!/bin/bash
# The two device calls of run 079dab1, on one NVIDIA H100 (carry .whl .sgl), from the repository
# root of 079dab1 on the GPU machine:
# 1. the split counts at short contexts, beside each variant's own plan and FlashInfer (short-splits/)
bash scripts/gpu_backends_run.sh 079dab1 short-splits
# 2. the custom server's step anatomy with cuBLAS, for the norm kernels' weight load (engine-fused/)
FUSED_TESTS=0 FUSED_RUNS="cublas" bash scripts/gpu_backends_run.sh 079dab1 engine-fused
