#!/bin/bash
# The device call of run 64827e0, on one NVIDIA H100 (one lease, a call that named nvidia-h200),
# from the repository root of 7fe4732 with 64827e0's src/, scripts/ and tests/ as .run/head and
# 64827e0's src/ with RAGGED_SHARE_WAVES = 2 as .run/alt/src (carry .whl .sgl .run). The H200
# study call stopped at once (study-h200-check.log: not an H200, rc 3), then .run/head ran the
# short-ragged part over four ragged requests (ctx, 3/4, 1/2, 1/4) at 16k, 64k and 185k: auto as
# 64827e0 plans it (a ragged batch's tokens shared over one wave), forced to 16-264 even splits,
# FlashInfer beside it, and auto as the alt tree plans it (the tokens shared over two waves;
# short-ragged-before.json, whose env.git reads 64827e0+share2), same library, both builds:
REQUIRE_GPU=H200 BUDGET_S=420 CALL_S=560 bash .run/gpu_study_run.sh 7fe4732 scripts/study-h200.txt \
  triton-graph-p1:185000 custom-graph-p1:185000 > $OUT/study.log 2>&1; rc=$?
[ $rc = 3 ] || exit 0
cd .run/head && ln -sf ../../.whl ../../.sgl .
PLAN_BEFORE=$PWD/../alt/src PLAN_BEFORE_REV="$(cat COMMIT)+share2" RAGGED_CONTEXTS="16384 65536 185000" \
  RAGGED_HEADS="8 16 64" RAGGED_SPLITS="16 32 66 132 264" \
  bash scripts/gpu_backends_run.sh "$(cat COMMIT)" short-ragged > $OUT/head.log 2>&1
