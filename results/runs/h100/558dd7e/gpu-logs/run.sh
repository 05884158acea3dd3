#!/bin/bash
# The four device calls of run 558dd7e, in order, on one NVIDIA H100 (carry .whl .sgl; see
# scripts/gpu_backends_run.sh). Each wrote under /tmp/o, which stayed between the calls of the
# warm machine, and returned it as one tar; v5-patches/ holds call 1's files, v5-landed/ those of
# calls 2-4 (built from 558dd7e's tree with the two winning patches applied; the library of
# call 2 stayed in results/build for calls 3 and 4).
#   bash run.sh 1|2|3|4      (from the repository root of 558dd7e, on the GPU machine)
call=${1:?call 1..4}
REAL=$OUT; export OUT=/tmp/o; mkdir -p $OUT; trap 'tar -C /tmp -cf $REAL/x.tar o' EXIT
case $call in
1) BUDGET_S=400 V5_PATCHES="full-tile-branch 16-warps+full-tile-branch copy-in-phase1+full-tile-branch 16-warps" \
     bash scripts/gpu_backends_run.sh 558dd7e v5-patches ;;
*) export DECODECLIFF_GIT_REV=558dd7e+copy-in-phase1+full-tile-branch
   source scripts/gpu_env.sh
   export DECODECLIFF_KERNEL_LIB=$PWD/results/build/libdecodecliff_mla.so
   SHIM=$PWD/results/build/libdecodecliff_smem_shim.so
   SM="decodecliff bench-kernels --device cuda --sm120-model --repeats 20 --contexts 185000 --page-sizes 1 --quiet"
   case $call in
   2) for p in copy-in-phase1 full-tile-branch; do
        git apply notes/kernel-v5/v5-$p.patch 2>/dev/null || patch -s -p1 < notes/kernel-v5/v5-$p.patch
      done
      mkdir -p results/build && rm -f results/build/*.so
      decodecliff build-kernel --arch 90 --require 90 --out results/build --sm120-model 90 > $OUT/build.log 2>&1
      LD_PRELOAD=$SHIM timeout 150 $SM --backends custom flashinfer --flashinfer-backends fa2 fa3 \
        --max-seconds-per-point 30 --custom-variants auto --modes chain16 decode --heads 8 \
        --batch 4 --ragged --out $OUT/ragged.json > $OUT/ragged.log 2>&1 ;;
   3) LD_PRELOAD=$SHIM timeout 140 $SM --backends custom flashinfer --flashinfer-backends fa2 fa3 \
        --max-seconds-per-point 20 --custom-variants auto --modes chain16 --heads 8 16 64 \
        --out $OUT/shapes.json > $OUT/shapes.log 2>&1 ;;
   4) timeout 100 $SM --backends custom --max-seconds-per-point 20 --custom-variants v4 v5 auto \
        --modes decode chain16 tree64 --heads 8 64 --out $OUT/auto.json > $OUT/auto.log 2>&1 ;;
   esac ;;
esac
