#!/bin/bash
# The device call of run db266f4, on one NVIDIA H100 (one lease, a call that named nvidia-h200),
# from the repository root of 7fe4732 with db266f4's src/, scripts/ and tests/ as .run/head (carry
# .whl .sgl .run). The H200 study call stopped at once (study-h200-check.log: not an H200, rc 3),
# then .run/head timed tree64 at 16 heads over a ragged batch of four (4k and 185k down to a
# quarter), v5 forced to 2, 4 and 8 splits beside auto's own plan (4 splits), both builds
# (ragged-v5-tree/; run.log):
REQUIRE_GPU=H200 BUDGET_S=420 bash .run/gpu_study_run.sh 7fe4732 scripts/study-h200.txt \
  triton-graph-p1:185000 custom-graph-p1:185000 > $OUT/study.log 2>&1; rc=$?
[ $rc = 3 ] || exit 0
cd .run/head && ln -sf ../../.whl ../../.sgl . \
  && TREE_HEADS=16 bash scripts/gpu_backends_run.sh "$(cat COMMIT)" ragged-v5-tree > $OUT/head.log 2>&1
