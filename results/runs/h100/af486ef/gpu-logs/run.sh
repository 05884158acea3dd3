#!/bin/bash
# The four device calls of run af486ef, in order, on one NVIDIA H100 (carry .whl .sgl). Each wrote
# under its own /tmp folder and returned it as one tar:
#   engine-fused/  call 1 (its tests hit their 150 s limit on a cold Triton cache; call 3 ran
#                  them again, warm: pytest_fused_warm.log, 7 passed)
#   sm120/, profile-sm120/  call 2;  sm120-more/  call 4
#   bash run.sh 1|2|3|4      (from the repository root of af486ef, on the GPU machine)
call=${1:?call 1..4}
REAL=$OUT; export OUT=/tmp/o$call; mkdir -p $OUT; trap 'tar -C /tmp -cf $REAL/x.tar o$call' EXIT
case $call in
1) bash scripts/gpu_backends_run.sh af486ef engine-fused ;;
2) BUDGET_S=330 bash scripts/gpu_backends_run.sh af486ef sm120 profile-sm120 ;;
3) source scripts/gpu_env.sh
   timeout 330 python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_engine_gpu.py -k gemm_fold \
     --durations=15 > $OUT/pytest_fused.log 2>&1 ;;
4) bash scripts/gpu_backends_run.sh af486ef sm120-more ;;
esac
