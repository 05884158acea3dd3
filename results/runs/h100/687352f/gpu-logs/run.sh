#!/bin/bash
# The device calls of the persistent MLP kernel's queue and bulk-copy options
# (kernels/csrc/mlp_stream.cu) on an NVIDIA H100 80GB HBM3 (driver 580.159.04, torch 2.11.0+cu130,
# Triton 3.6.0, nvcc 13.0), carry .whl .sgl, from the repository root. Calls 1 and 2 ran the tree
# of 66ac469, call 3 that of 687352f (the loop reads a queue's unit boundary from a flag on the
# chunk id instead of dividing). Calls 1-2 were one lease, call 3 another; cuBLAS read 40.6-40.7 us in
# every one. Call 3 ran from .run/head/ (a `git archive` of 687352f) after an H200 study call
# found an H100 and stopped (REQUIRE_GPU, rc 3); its env.txt is the one kept here. (The json's
# env.git reads 66ac469-dirty in every call: the machine's copy of the history, not the tree.)
#   bash run.sh 1|2|3
call=${1:?call 1..3}
source scripts/gpu_env.sh
case $call in
1) python3 scripts/mlp_stream_bench.py --out $OUT/mlp --variants base DCMLP_QUEUE=2 DCMLP_BULK \
     DCMLP_BULK+DCMLP_QUEUE=2 DCMLP_STAMPS+DCMLP_BULK+DCMLP_QUEUE=2 > $OUT/mlp.log 2>&1 ;;
2) for i in 1 2; do python3 scripts/mlp_stream_bench.py --out $OUT/mlp$i --repeats 20 --variants \
     base DCMLP_QUEUE=2 DCMLP_QUEUE=1 DCMLP_BULK DCMLP_STAMPS DCMLP_STAMPS+DCMLP_QUEUE=2 \
     > $OUT/mlp$i.log 2>&1; done ;;  # kept: both logs, the first's mlp_stream.json
3) python3 scripts/mlp_stream_bench.py --out $OUT/mlp --repeats 20 --variants base DCMLP_QUEUE=4 \
     DCMLP_QUEUE=6 DCMLP_QUEUE=9 DCMLP_STAMPS+DCMLP_QUEUE=6 DCMLP_BULK+DCMLP_TILE_N=32 \
     DCMLP_TILE_N=32 > $OUT/mlp.log 2>&1 ;;
esac
