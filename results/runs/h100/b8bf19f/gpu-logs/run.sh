#!/bin/bash
# The device call of run b8bf19f, on one NVIDIA H100 (one lease, a call that named nvidia-h200),
# from the repository root of 7fe4732 with b8bf19f's src/, scripts/ and tests/ as .run/head and
# 6e2ed72's src/ (before the long-split rule) as .run/before/src (carry .whl .sgl .run). The H200
# study call stopped at once (study-h200-check.log: not an H200, rc 3), then short-ragged ran the
# shapes whose auto plan the long-split rule changes and no run had timed, at 64k and 185k, auto
# as b8bf19f plans it beside 16 forced even splits, FlashInfer, and auto as 6e2ed72 plans it
# (short-ragged-before.json), same library, both builds: two requests, chain16 and tree64 at 8 and
# 16 heads (short-ragged-b2/), and sixteen, decode at 64 heads (short-ragged-b16/).
REQUIRE_GPU=H200 BUDGET_S=420 CALL_S=560 bash .run/gpu_study_run.sh 7fe4732 scripts/study-h200.txt \
  triton-graph-p1:185000 custom-graph-p1:185000 > $OUT/study.log 2>&1; rc=$?
[ $rc = 3 ] || exit 0
cd .run/head && ln -sf ../../.whl ../../.sgl .
R=$OUT C="$(cat COMMIT)" CTX="65536 185000"
mkdir -p $R/b2 $R/b16
OUT=$R/b2 PLAN_BEFORE=$PWD/../before/src PLAN_BEFORE_REV=6e2ed72 RAGGED_BATCH=2 RAGGED_MODES="chain16 tree64" \
  RAGGED_HEADS="8 16" RAGGED_CONTEXTS="$CTX" RAGGED_SPLITS="16" \
  bash scripts/gpu_backends_run.sh "$C" short-ragged > $R/b2.log 2>&1
OUT=$R/b16 PLAN_BEFORE=$PWD/../before/src PLAN_BEFORE_REV=6e2ed72 RAGGED_BATCH=16 RAGGED_MODES="decode" \
  RAGGED_HEADS="64" RAGGED_CONTEXTS="$CTX" RAGGED_SPLITS="16" \
  bash scripts/gpu_backends_run.sh "$C" short-ragged > $R/b16.log 2>&1
