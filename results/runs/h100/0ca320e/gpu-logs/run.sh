#!/bin/bash
# The device call of run 0ca320e, on one NVIDIA H100 (carry .whl .sgl), from the repository root of
# 0ca320e on the GPU machine: a ragged batch of four at 1k-16k with the short-context rule
# extended to ragged batches (short-ragged.json), and auto as planned with the rule switched off,
# the plan of ad925f8 (short-ragged-before.json), same library, same call
bash scripts/gpu_backends_run.sh 0ca320e short-ragged
# (short-ragged-before.json records env.git of the measuring tree; the plan is the one named above)
