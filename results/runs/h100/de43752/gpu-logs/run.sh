#!/bin/bash
# One NVIDIA H100 80GB HBM3 lease (driver 580.159.04, torch 2.11.0+cu130, Triton 3.6.0, nvcc 13.0),
# carry .whl .sgl .run: after an H200 study call that found an H100 and stopped (REQUIRE_GPU, rc 3),
# from the repository root, with .run/head a `git archive` of de43752 (the combine change) and
# .run/base one of 24d14b8 (src only): CALL_S=520 bash .run/combine_ab.sh (this file).
# ab.tgz: bench-kernels JSON and logs (ab_{base,new}_{1,2}: one request; abr_: four ragged).
# The combine kernel before (.run/base) and after (.run/head): built for sm_90, the new one
# checked (float64, NaN-poisoned, planted masks, compute-sanitizer), then both timed by
# bench-kernels, interleaved base/new twice, and the combine alone under Nsight Compute.
T0=$(date +%s); el() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
left() { echo $(( ${CALL_S:-540} - ($(date +%s) - T0) )); }
cd .run/head && source scripts/gpu_env.sh
for v in new base; do
  src=$PWD/src; [ $v = base ] && src=$PWD/../base/src
  el build $v
  PYTHONPATH=/tmp/site:$src python3 -m decodecliff.cli build-kernel --arch 90 --require 90 --out /tmp/$v > $OUT/build_$v.log 2>&1 || tail -5 $OUT/build_$v.log
done
lib() { echo /tmp/$1/libdecodecliff_mla.so; }
el check new
DECODECLIFF_KERNEL_LIB=$(lib new) timeout 150 python3 -m decodecliff.cli check-kernel --quick --variants v1 v4 v5 --no-timing --sanitize --out $OUT/check > $OUT/check.log 2>&1; echo "check rc $?"; tail -4 $OUT/check.log
B="bench-kernels --device cuda --backends custom --custom-variants auto --page-sizes 1 --repeats 20 --quiet"
for i in 1 2; do for v in base new; do
  [ $(left) -lt 60 ] && break 2
  el bench $v $i
  DECODECLIFF_KERNEL_LIB=$(lib $v) timeout $(left) decodecliff $B --contexts 1024 16384 185000 --modes decode chain16 --heads 8 64 --out $OUT/ab_${v}_$i.json > $OUT/ab_${v}_$i.log 2>&1
  DECODECLIFF_KERNEL_LIB=$(lib $v) timeout $(left) decodecliff $B --contexts 185000 --modes decode chain16 --heads 8 --batch 4 --ragged --out $OUT/abr_${v}_$i.json >> $OUT/ab_${v}_$i.log 2>&1
done; done
for sv in 185000:16:8/v5 185000:1:8:batch=4/v4 1024:16:8/v1; do s=${sv%/*}; var=${sv#*/}; for v in base new; do
  [ $(left) -lt 30 ] && break 2
  DECODECLIFF_KERNEL_LIB=$(lib $v) timeout $(left) ncu --clock-control none -k regex:mla_ --launch-skip 2 --launch-count 2 --section SpeedOfLight python3 -m decodecliff.cli check-kernel --variants $var --launch $s --launches 3 2>&1 | grep -E "mla_|Duration|DRAM Thr" | sed "s/^/$v $s /" >> $OUT/ncu_combine.txt
done; done
el done
cd $OUT && tar -czf ab.tgz ab_*.json abr_*.json ab_*.log check && rm -rf ab_*.json abr_*.json ab_*.log check
