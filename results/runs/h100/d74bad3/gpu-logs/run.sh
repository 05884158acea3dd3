#!/bin/bash
# The one device call of run d74bad3, on one NVIDIA H100 (carry .whl .sgl): v5 as landed ("base")
# and with each patch of notes/kernel-v5/ named below applied, built, checked in both builds and
# timed at 185k; its files are in v5-patches/.
#   bash run.sh      (from the repository root of d74bad3, on the GPU machine)
REAL=$OUT; export OUT=/tmp/o5; mkdir -p $OUT; trap 'tar -C /tmp -cf $REAL/x.tar o5' EXIT
BUDGET_S=330 V5_PATCHES="phase2-among-phase1 phase2-among-phase1-odd" \
  bash scripts/gpu_backends_run.sh d74bad3 v5-patches
