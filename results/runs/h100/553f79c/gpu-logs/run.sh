#!/bin/bash
# Whether v4's ragged decode plan is slower in replays (run h100/9b83003: 194-230 us) or only
# measured so. One NVIDIA H100 80GB HBM3 lease (driver 580.159.04, torch 2.11.0+cu130, Triton
# 3.6.0, nvcc 13.0), carry .whl .sgl .run, from .run/head/ (a `git archive` of 553f79c); call 1
# followed an H200 study call that found an H100 and stopped (REQUIRE_GPU, rc 3). Call 2's first
# try found no library (the carried .run/head replaced the built one) and is not kept.
#   call 1: scripts/ragged_plan_replays.py at 8 and 16 heads (replays-h8/, replays-h16/);
#   call 2: bench-kernels on the point alone, v4 timed first and auto (the same launch) second,
#           at 20 and 60 repeats (order/).
#   bash run.sh 1|2
call=${1:?call 1..2}
source scripts/gpu_env.sh
python3 -m decodecliff.cli build-kernel --out build/kernels
case $call in
1) for h in 8 16; do python3 scripts/ragged_plan_replays.py --out $OUT/h$h --heads $h --repeats 60; done ;;
2) for r in 20 60; do decodecliff bench-kernels --device cuda --backends custom --custom-variants v4 \
     auto --custom-splits 104 --contexts 185000 --modes decode --page-sizes 1 --heads 8 --batch 4 \
     --ragged --repeats $r --out $OUT/order_r$r.json; done ;;
esac
