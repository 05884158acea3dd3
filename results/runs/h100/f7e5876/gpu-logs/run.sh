#!/bin/bash
# The device call of run f7e5876, on one NVIDIA H100 (one lease, a call that named nvidia-h200),
# from the repository root of 7fe4732 with .run/head = f7e5876's src/, scripts/ and tests/ with
# RAGGED_SLOTS_PER_REQUEST = 16 (a candidate, not landed: its env.git reads f7e5876+slots16) and
# .run/before/src = f7e5876's src/ (8 slots; carry .whl .sgl .run). The H200 study call stopped at
# once (study-h200-check.log: not an H200, rc 3), then short-ragged ran twice over ragged batches
# (ctx down to ctx / batch), 1k-185k, auto as the candidate plans it beside 16 forced even splits,
# FlashInfer, and auto as f7e5876 plans it (short-ragged-before.json), same library, both builds:
# four requests at 16 heads (short-ragged-b4/) and eight at 8 and 64 heads (short-ragged-b8/).
REQUIRE_GPU=H200 BUDGET_S=420 CALL_S=560 bash .run/gpu_study_run.sh 7fe4732 scripts/study-h200.txt \
  triton-graph-p1:185000 custom-graph-p1:185000 > $OUT/study.log 2>&1; rc=$?
[ $rc = 3 ] || exit 0
cd .run/head && ln -sf ../../.whl ../../.sgl .
R=$OUT C="$(cat COMMIT)" CTX="1024 4096 16384 65536 185000"
mkdir -p $R/b4 $R/b8
OUT=$R/b4 PLAN_BEFORE=$PWD/../before/src PLAN_BEFORE_REV="${C%+*}" RAGGED_BATCH=4 RAGGED_HEADS="16" \
  RAGGED_CONTEXTS="$CTX" RAGGED_SPLITS="16" bash scripts/gpu_backends_run.sh "$C" short-ragged > $R/b4.log 2>&1
OUT=$R/b8 PLAN_BEFORE=$PWD/../before/src PLAN_BEFORE_REV="${C%+*}" RAGGED_BATCH=8 RAGGED_HEADS="8 64" \
  RAGGED_CONTEXTS="$CTX" RAGGED_SPLITS="16" bash scripts/gpu_backends_run.sh "$C" short-ragged > $R/b8.log 2>&1
